#!/usr/bin/env python3
"""Reference-side calculator client for interop tests: pycapnp (libcapnp's C++ RPC).

Usage:
    python tests/peers/pycapnp_calc_client.py HOST:PORT

Runs the sequence of Cap'n Proto's calculator-client sample against a
Calculator bootstrap:

  literal     evaluate(123), read it                                   -> 123
  add         getOperator(add) and evaluate(add(12, 34)); nothing is
              awaited before the final read (all pipelined)            -> 46
  pipelining  evaluate(4 * 6) -> a Value promise; then evaluate
              (previousResult + 3) and (previousResult + 5) on the
              still-unresolved Value                                   -> 27 (29 checked too)
  functions   f(x, y) = x * 100 + y, g(x) = f(x, x + 1) * 2 via
              defFunction; evaluate f(12, 34) + g(21)                 -> 5478
  callback    a client-hosted Function computing pow(x, y) inside a
              call expression: pow(2, 4) + 3; the server calls back   -> 19

Prints ``ok <step> <value>`` per step and exits 0 when every value is right;
prints ``FAIL <step>: ...`` to stdout and exits 1 otherwise. The whole run is
bounded by 30 s.
"""

import argparse
import asyncio
import os
import sys
import traceback

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

calc_capnp = capnp.load(os.path.join(ROOT, "schemas", "calculator.capnp"))
Calculator = calc_capnp.Calculator

OVERALL_TIMEOUT = 30.0


class StepFailed(Exception):
    pass


def fmt(value):
    return format(value, "g")


def check(step, got, want):
    if got != want:
        raise StepFailed(f"{step}: got {got!r}, expected {want!r}")
    print(f"ok {step} {fmt(got)}", flush=True)


class PowerFunction(Calculator.Function.Server):
    """A Function hosted by the client: pow(x, y). The server calls it back."""

    def __init__(self):
        self.calls = 0

    async def call(self, params, _context, **kwargs):
        if len(params) != 2:
            raise capnp.KjException("Wrong number of parameters.")
        self.calls += 1
        return params[0] ** params[1]


def set_call(expr, function, *args):
    """Fill `expr` as a call of `function`. Each arg is a float (a literal),
    a ("param", i) pair, a ("prev", value_cap) pair or a nested
    ("call", function, args...) tuple."""
    call = expr.init("call")
    call.function = function
    params = call.init("params", len(args))
    for slot, arg in zip(params, args, strict=True):
        if isinstance(arg, (int, float)):
            slot.literal = float(arg)
        elif arg[0] == "param":
            slot.parameter = arg[1]
        elif arg[0] == "prev":
            slot.previousResult = arg[1]
        elif arg[0] == "call":
            set_call(slot, arg[1], *arg[2:])
        else:
            raise ValueError(f"bad argument {arg!r}")


async def step_literal(calc):
    request = calc.evaluate_request()
    request.expression.literal = 123
    # evaluate(...).value is a pipelined Value; read() goes out at once.
    value = (await request.send().value.read()).value
    check("literal", value, 123.0)


async def step_add(calc):
    add = calc.getOperator(op="add").func  # promise, not awaited
    request = calc.evaluate_request()
    set_call(request.expression, add, 12, 34)
    value = (await request.send().value.read()).value
    check("add", value, 46.0)


async def step_pipelining(calc):
    add = calc.getOperator(op="add").func
    multiply = calc.getOperator(op="multiply").func

    request = calc.evaluate_request()
    set_call(request.expression, multiply, 4, 6)
    product = request.send().value  # a Value promise: 24, not resolved yet

    plus3 = calc.evaluate_request()
    set_call(plus3.expression, add, ("prev", product), 3)
    plus5 = calc.evaluate_request()
    set_call(plus5.expression, add, ("prev", product), 5)

    r3, r5 = await asyncio.gather(plus3.send().value.read(), plus5.send().value.read())
    if r5.value != 29.0:
        raise StepFailed(f"pipelining: (4 * 6) + 5 gave {r5.value!r}, expected 29")
    check("pipelining", r3.value, 27.0)


async def step_functions(calc):
    add = calc.getOperator(op="add").func
    multiply = calc.getOperator(op="multiply").func

    # f(x, y) = x * 100 + y
    f_request = calc.defFunction_request()
    f_request.paramCount = 2
    set_call(f_request.body, add, ("call", multiply, ("param", 0), 100), ("param", 1))
    f = f_request.send().func

    # g(x) = f(x, x + 1) * 2
    g_request = calc.defFunction_request()
    g_request.paramCount = 1
    set_call(g_request.body, multiply, ("call", f, ("param", 0), ("call", add, ("param", 0), 1)), 2)
    g = g_request.send().func

    # f(12, 34) + g(21)
    request = calc.evaluate_request()
    set_call(request.expression, add, ("call", f, 12, 34), ("call", g, 21))
    value = (await request.send().value.read()).value
    check("functions", value, 1234.0 + 4244.0)


async def step_callback(calc):
    add = calc.getOperator(op="add").func
    power = PowerFunction()
    request = calc.evaluate_request()
    set_call(request.expression, add, ("call", power, 2, 4), 3)
    value = (await request.send().value.read()).value
    if power.calls != 1:
        raise StepFailed(
            f"callback: the local pow function was called {power.calls} times, expected 1"
        )
    check("callback", value, 19.0)


STEPS = [
    ("literal", step_literal),
    ("add", step_add),
    ("pipelining", step_pipelining),
    ("functions", step_functions),
    ("callback", step_callback),
]


async def run_steps(host, port):
    stream = await capnp.AsyncIoStream.create_connection(host=host, port=port)
    client = capnp.TwoPartyClient(stream)
    calc = client.bootstrap().cast_as(Calculator)
    for name, step in STEPS:
        try:
            await step(calc)
        except StepFailed:
            raise
        except Exception as exc:
            raise StepFailed(f"{name}: {type(exc).__name__}: {exc}") from exc


async def main(host, port):
    try:
        await asyncio.wait_for(run_steps(host, port), OVERALL_TIMEOUT)
    except StepFailed as exc:
        print(f"FAIL {exc}", flush=True)
        return 1
    except TimeoutError:
        print(f"FAIL timeout: the sequence did not finish within {OVERALL_TIMEOUT:g} s", flush=True)
        return 1
    except Exception as exc:
        traceback.print_exc()
        print(f"FAIL error: {type(exc).__name__}: {exc}", flush=True)
        return 1
    return 0


def parse_address(text):
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", type=parse_address, metavar="HOST:PORT")
    args = parser.parse_args()
    sys.exit(asyncio.run(capnp.run(main(*args.address))))
