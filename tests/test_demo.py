"""The calculator demo (capsvc.demo), served in-process and driven by a capsvc client.

The demo is written on the generated stubs (capsvc.generated.calculator_capnp); most tests
drive it with the generated typed client, the last section with a dynamic client
(``capsvc.load_schema``), so both paths stay tested against it. The server listens on a
real loopback socket (tcp:127.0.0.1:0); one test runs both ends over in-memory streams to
look at both sides' tables.
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import capsvc
from capsvc import demo
from capsvc.demo import Call, Literal, Parameter, PreviousResult
from capsvc.generated.calculator_capnp import Calculator
from capsvc.transport.memory import memory_stream_pair

CallParams = Calculator.Function.CallParams.Reader
CallResults = Calculator.Function.CallResults.Builder


@pytest.fixture
async def calc(nursery: trio.Nursery) -> AsyncIterator[Calculator.Client]:
    address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", demo.bootstrap())
    async with capsvc.connect(address) as conn:
        client = conn.bootstrap(demo.CALCULATOR)
        assert isinstance(client, Calculator.Client)
        yield client
        client.close()


async def value_of(calc: Calculator.Client, expr: demo.Expr | float) -> float:
    return await demo.read_value(demo.evaluate(calc, expr))


class Recorder(Calculator.Function.Server):
    """A client-hosted Function: applies ``function`` and counts its calls."""

    def __init__(self, function: Any) -> None:
        self.function = function
        self.calls: list[list[float]] = []

    async def call(self, params: CallParams, results: CallResults) -> None:
        args = list(params.params)
        self.calls.append(args)
        results.value = float(self.function(*args))


# ------------------------------------------------------------------------ basics
async def test_literal(calc: Calculator.Client) -> None:
    assert await value_of(calc, Literal(123.0)) == 123.0


async def test_literal_with_raw_api(calc: Calculator.Client) -> None:
    request = calc.evaluate_request()
    request.params.expression.literal = 1.5
    promise = request.send()
    results = await promise
    assert (await results.value.read()).value == 1.5


@pytest.mark.parametrize(
    ("op", "expected"),
    [("add", 46.0), ("subtract", -22.0), ("multiply", 408.0), ("divide", 12.0 / 34.0)],
)
async def test_operators(calc: Calculator.Client, op: str, expected: float) -> None:
    function = demo.get_operator(calc, op)
    assert await value_of(calc, Call(function, (12.0, 34.0))) == expected
    # The operator is also callable directly.
    assert (await function.call(params=[12.0, 34.0])).value == expected


@pytest.mark.parametrize(
    ("a", "b", "check"),
    [
        (1.0, 0.0, lambda v: v == math.inf),
        (-1.0, 0.0, lambda v: v == -math.inf),
        (1.0, -0.0, lambda v: v == -math.inf),
        (0.0, 0.0, math.isnan),
    ],
)
async def test_divide_by_zero_is_ieee_division(
    calc: Calculator.Client, a: float, b: float, check: Any
) -> None:
    # The C++ sample computes `params[0] / params[1]` on doubles: no error, inf or nan.
    divide = demo.get_operator(calc, "divide")
    assert check(await value_of(calc, Call(divide, (a, b))))


async def test_unknown_operator_fails(calc: Calculator.Client) -> None:
    request = calc.getOperator_request()
    request.params.op = 7  # an enumerant from a newer schema, say
    with pytest.raises(capsvc.Failed, match="Unknown operator 7"):
        await request.send().func.call(params=[1.0, 2.0])


# -------------------------------------------------------------------- pipelining
async def test_pipelining_on_an_unawaited_value(calc: Calculator.Client) -> None:
    add = demo.get_operator(calc, "add")
    multiply = demo.get_operator(calc, "multiply")
    product = demo.evaluate(calc, Call(multiply, (4.0, 6.0)))  # not awaited
    plus3 = demo.evaluate(calc, Call(add, (PreviousResult(product), 3.0)))
    plus5 = demo.evaluate(calc, Call(add, (PreviousResult(product), 5.0)))
    assert await demo.read_value(plus3) == 27.0
    assert await demo.read_value(plus5) == 29.0
    assert await demo.read_value(product) == 24.0


async def test_chain_of_previous_results(calc: Calculator.Client) -> None:
    add = demo.get_operator(calc, "add")
    value = demo.evaluate(calc, 1.0)
    for _ in range(10):
        value = demo.evaluate(calc, Call(add, (PreviousResult(value), PreviousResult(value))))
    assert await demo.read_value(value) == 1024.0


async def test_previous_result_alone(calc: Calculator.Client) -> None:
    first = demo.evaluate(calc, 7.0)
    assert await value_of(calc, PreviousResult(first)) == 7.0


async def test_resolved_capabilities_go_back_to_the_server(calc: Calculator.Client) -> None:
    # Awaited results: the server gets its own exports back inside the expression.
    add = (await calc.getOperator(op=Calculator.Operator.add)).func
    request = calc.evaluate_request()
    request.params.init_expression().literal = 5.0
    value = (await request.send()).value
    assert await value_of(calc, Call(add, (PreviousResult(value), 1.0))) == 6.0


async def test_client_hosted_value(calc: Calculator.Client) -> None:
    add = demo.get_operator(calc, "add")
    assert await value_of(calc, Call(add, (PreviousResult(demo.ValueImpl(2.5)), 1.0))) == 3.5


async def test_many_concurrent_evaluations(calc: Calculator.Client) -> None:
    add = demo.get_operator(calc, "add")
    results: dict[int, float] = {}

    async def one(n: int) -> None:
        results[n] = await value_of(calc, Call(add, (float(n), Call(add, (float(n), 1.0)))))

    # Real time: the calc server listens on a real socket; this only bounds a hang.
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for n in range(100):
                nursery.start_soon(one, n)
    assert results == {n: 2.0 * n + 1.0 for n in range(100)}


# --------------------------------------------------------------------- functions
async def test_def_function_with_nested_calls(calc: Calculator.Client) -> None:
    add = demo.get_operator(calc, "add")
    multiply = demo.get_operator(calc, "multiply")
    x, y = Parameter(0), Parameter(1)
    # f(x, y) = x * 100 + y;  g(x) = f(x, x + 1) * 2
    f = demo.def_function(calc, 2, Call(add, (Call(multiply, (x, 100.0)), y)))
    g = demo.def_function(calc, 1, Call(multiply, (Call(f, (x, Call(add, (x, 1.0)))), 2.0)))
    result = await value_of(calc, Call(add, (Call(f, (12.0, 34.0)), Call(g, (21.0,)))))
    assert result == 1234.0 + 4244.0
    assert (await f.call(params=[1.0, 2.0])).value == 102.0
    assert (await g.call(params=[1.0])).value == 204.0


async def test_function_body_outlives_its_message(calc: Calculator.Client) -> None:
    # The body holds capabilities (a Value and an operator): they must stay usable after
    # defFunction returned and after the client dropped its own references.
    add = demo.get_operator(calc, "add")
    base = demo.evaluate(calc, 1000.0)
    f = demo.def_function(calc, 1, Call(add, (PreviousResult(base), Parameter(0))))
    await f.call(params=[0.0])  # make sure the definition arrived
    add.close()
    base.close()
    gc.collect()
    for n in (1.0, 2.0, 3.0):
        assert (await f.call(params=[n])).value == 1000.0 + n


async def test_zero_parameter_function(calc: Calculator.Client) -> None:
    f = demo.def_function(calc, 0, Literal(42.0))
    assert await value_of(calc, Call(f, ())) == 42.0


# --------------------------------------------------------------------- callbacks
async def test_client_hosted_callback(calc: Calculator.Client) -> None:
    add = demo.get_operator(calc, "add")
    power = demo.PowerFunction()
    assert await value_of(calc, Call(add, (Call(power, (2.0, 4.0)), 3.0))) == 19.0
    assert power.calls == 1


async def test_callback_inside_a_defined_function(calc: Calculator.Client) -> None:
    square = Recorder(lambda a, b: a**b)
    f = demo.def_function(calc, 1, Call(square, (Parameter(0), 2.0)))
    assert await value_of(calc, Call(f, (3.0,))) == 9.0
    assert await value_of(calc, Call(f, (5.0,))) == 25.0
    assert square.calls == [[3.0, 2.0], [5.0, 2.0]]


async def test_call_arguments_are_evaluated_concurrently(calc: Calculator.Client) -> None:
    # Each callback waits until both have started: sequential evaluation would hang.
    started = 0
    both = trio.Event()

    class Meet(Calculator.Function.Server):
        async def call(self, params: CallParams, results: CallResults) -> None:
            nonlocal started
            started += 1
            if started == 2:
                both.set()
            await both.wait()
            results.value = params.params[0]

    add = demo.get_operator(calc, "add")
    meet = Meet()
    # Real time: over the real socket to the calc server, a guard against the hang that
    # sequential evaluation would be (never on a jumping clock, which would fire it while
    # the kernel still carries the calls).
    with trio.fail_after(10):
        assert await value_of(calc, Call(add, (Call(meet, (1.0,)), Call(meet, (2.0,))))) == 3.0


async def test_callback_error_reaches_the_caller_with_its_type(calc: Calculator.Client) -> None:
    class Busy(Calculator.Function.Server):
        async def call(self, params: CallParams, results: CallResults) -> None:
            raise capsvc.Overloaded("the client's function is busy")

    add = demo.get_operator(calc, "add")
    with pytest.raises(capsvc.Overloaded, match="the client's function is busy"):
        await value_of(calc, Call(add, (Call(Busy(), ()), 1.0)))


# ------------------------------------------------------------------------ errors
async def test_parameter_index_out_of_range(calc: Calculator.Client) -> None:
    f = demo.def_function(calc, 1, Parameter(1))
    with pytest.raises(capsvc.Failed, match="Parameter index out-of-range"):
        await value_of(calc, Call(f, (5.0,)))


async def test_parameter_outside_a_function(calc: Calculator.Client) -> None:
    with pytest.raises(capsvc.Failed, match="Parameter index out-of-range"):
        await value_of(calc, Parameter(0))


async def test_defined_function_wrong_param_count(calc: Calculator.Client) -> None:
    f = demo.def_function(calc, 2, Parameter(0))
    with pytest.raises(capsvc.Failed, match="Wrong number of parameters"):
        await f.call(params=[1.0])
    with pytest.raises(capsvc.Failed, match="Wrong number of parameters"):
        await value_of(calc, Call(f, (1.0, 2.0, 3.0)))


@pytest.mark.parametrize("count", [0, 1, 3])
async def test_operator_wrong_param_count(calc: Calculator.Client, count: int) -> None:
    add = demo.get_operator(calc, "add")
    with pytest.raises(capsvc.Failed, match="Wrong number of parameters"):
        await add.call(params=[1.0] * count)


async def test_negative_param_count_is_rejected(calc: Calculator.Client) -> None:
    request = calc.defFunction_request()
    request.params.paramCount = -1
    request.params.body.literal = 1.0
    with pytest.raises(capsvc.Failed, match="paramCount must not be negative"):
        await request.send()


async def test_error_in_one_branch_is_not_wrapped(calc: Calculator.Client) -> None:
    add = demo.get_operator(calc, "add")
    bad = demo.def_function(calc, 1, Parameter(0))
    expr = Call(add, (Call(bad, ()), Call(add, (1.0, 2.0))))
    with pytest.raises(capsvc.Failed) as caught:
        await value_of(calc, expr)
    assert "Wrong number of parameters" in caught.value.reason
    assert "ExceptionGroup" not in caught.value.reason
    assert "nursery" not in caught.value.reason


async def test_error_inside_a_value_propagates(calc: Calculator.Client) -> None:
    broken = demo.evaluate(calc, Parameter(3))
    add = demo.get_operator(calc, "add")
    with pytest.raises(capsvc.Failed, match="Parameter index out-of-range"):
        await value_of(calc, Call(add, (PreviousResult(broken), 1.0)))


# -------------------------------------------------------------- tour and infix
async def test_tour(calc: Calculator.Client) -> None:
    lines: list[str] = []
    found = await demo.run_tour(calc, lines.append)
    assert found == {
        "literal": 123.0,
        "add": 46.0,
        "pipelining": 27.0,
        "functions": 5478.0,
        "callback": 19.0,
    }
    assert len(lines) == 5
    assert lines[-1].endswith("= 19  (pow called 1 time)")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2 + 3 * 4", 14.0),
        ("(1 + 2) * -3", -9.0),
        ("-(1 + 2)", -3.0),
        ("+4", 4.0),
        ("7 / 2", 3.5),
        ("2 ** 10 - 1", 1023.0),
        ("1 - 2 - 3", -4.0),
        ("1e3 / 8", 125.0),
    ],
)
async def test_evaluate_infix(calc: Calculator.Client, text: str, expected: float) -> None:
    assert await demo.evaluate_infix(calc, text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "x + 1",
        "1 if 2 else 3",
        "True + 1",
        "'a' * 3",
        "7 % 2",
        "7 // 2",
        "1 +",
        "",
        "(" * 30 + "1" + "+1)" * 30,
        "1" + "0" * 400,
        "1 +" * 10_000 + "1",
    ],
)
def test_parse_infix_rejects(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the message varies by case
        demo.parse_infix(text)


def test_parse_infix_shape() -> None:
    assert demo.parse_infix("1 + 2 * 3") == ("add", 1.0, ("multiply", 2.0, 3.0))
    assert demo.parse_infix("-2") == -2.0
    assert demo.parse_infix("-(2 ** 3)") == ("multiply", -1.0, ("pow", 2.0, 3.0))


def test_format_number() -> None:
    assert demo.format_number(14.0) == "14"
    assert demo.format_number(-3.0) == "-3"
    assert demo.format_number(0.5) == "0.5"
    assert demo.format_number(math.inf) == "inf"
    assert demo.format_number(1e300) == "1e+300"


def test_schema_path() -> None:
    assert demo.schema_path("calculator.capnp").name == "calculator.capnp"
    assert demo.schema_path("echo.capnp").is_file()
    with pytest.raises(capsvc.SchemaError, match="not found"):
        demo.schema_path("no-such.capnp")


# --------------------------------------------------------------- reference counts
async def test_tables_empty_after_the_tour() -> None:
    left, right = memory_stream_pair()
    async with (
        capsvc.open_connection(left, bootstrap=demo.bootstrap()) as server,
        capsvc.open_connection(right) as client,
    ):
        calc = client.bootstrap(demo.CALCULATOR)
        await demo.run_tour(calc, lambda _line: None)
        assert await demo.evaluate_infix(calc, "2 ** 3 + 1") == 9.0
        calc.close()
        gc.collect()
        # In-memory streams: once every task is blocked, every Release and Finish has been
        # delivered (no timer, no socket); no duration to guess.
        await trio.testing.wait_all_tasks_blocked()
        empty = {"questions": 0, "answers": 0, "exports": 0, "imports": 0, "embargoes": 0}
        assert client.session.table_sizes() == empty
        assert server.session.table_sizes() == empty


# ------------------------------------------------------- the dynamic path, same server
@pytest.fixture
async def dynamic_calc(nursery: trio.Nursery) -> AsyncIterator[Any]:
    """A dynamic client (load_schema, pycapnp builders) of the demo's typed server."""
    address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", demo.bootstrap())
    schema = capsvc.load_schema(demo.schema_path("calculator.capnp"))
    async with capsvc.connect(address) as conn:
        client = conn.bootstrap(schema.Calculator)
        assert isinstance(client, capsvc.Client)
        yield schema, client
        client.close()


async def test_dynamic_client_literal_and_dict_params(dynamic_calc: Any) -> None:
    _, calc = dynamic_calc
    value = (await calc.evaluate(expression={"literal": 5.0})).value
    assert (await value.read()).value == 5.0


async def test_dynamic_client_pipelining_and_a_dynamic_callback(dynamic_calc: Any) -> None:
    schema, calc = dynamic_calc

    class Square(capsvc.Server, interface=schema.Calculator.Function):
        async def call(self, params: Any, results: Any) -> float:
            return float(params.params[0]) ** 2

    add = calc.getOperator(op="add").func  # not awaited
    product = calc.evaluate_request()
    product.params.expression.literal = 4.0
    four = product.send().value  # not awaited either
    request = calc.evaluate_request()
    call = request.params.expression.init("call")
    call.function = add
    params = call.init("params", 2)
    params[0].previousResult = four
    inner = params[1].init("call")
    inner.function = Square()
    inner.init("params", 1)[0].literal = 3.0
    assert (await request.send().value.read()).value == 13.0


async def test_dynamic_client_unknown_operator(dynamic_calc: Any) -> None:
    _, calc = dynamic_calc
    request = calc.getOperator_request()
    request.params.op = 7
    with pytest.raises(capsvc.Failed, match="Unknown operator 7"):
        await request.send().func.call(params=[1.0, 2.0])


def test_get_operator_rejects_unknown_names() -> None:
    with pytest.raises(ValueError, match="unknown operator 'modulo'"):
        demo.get_operator(None, "modulo")  # type: ignore[arg-type]  # fails before any call


def test_the_demo_runs_without_the_schema_files(tmp_path: Path) -> None:
    """An installed package has no schemas/ beside it: the generated module is the schema."""
    root = Path(demo.__file__).resolve().parents[1]
    shutil.copytree(root / "capsvc", tmp_path / "capsvc", ignore=shutil.ignore_patterns("*.pyc"))
    script = """
import trio, capsvc
from capsvc import demo
from capsvc.transport.memory import memory_stream_pair

async def main():
    left, right = memory_stream_pair()
    async with capsvc.open_connection(left, bootstrap=demo.bootstrap()), \\
            capsvc.open_connection(right) as conn:
        calc = conn.bootstrap(demo.CALCULATOR)
        found = await demo.run_tour(calc, lambda line: None)
        print(found["functions"], await demo.evaluate_infix(calc, "2**3"), demo.__file__)

trio.run(main)
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # Real time: a subprocess (in-memory streams inside it); the timeout bounds a hang.
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"5478.0 8.0 {tmp_path / 'capsvc' / 'demo.py'}\n"
    assert not (tmp_path / "schemas").exists()
