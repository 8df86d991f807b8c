"""The built-in demo service: Cap'n Proto's canonical calculator, served and called by capsvc.

Theory of operation
-------------------
``schemas/calculator.capnp`` is the schema of the calculator sample shipped with the C++
reference implementation; this module implements the *server* sample's semantics on the
typed server bases generated from it (``capsvc gen``: capsvc.generated.calculator_capnp),
and a small client side, on the generated typed clients, used by ``capsvc call``:

- ``Calculator.evaluate(expression)`` evaluates an expression tree and returns a ``Value``
  capability holding the number (so a client can feed it into the next call without
  waiting: promise pipelining).
- An ``Expression`` is a union: ``literal``; ``previousResult`` (a ``Value``, read with a
  call); ``parameter`` (an index into the arguments of the function whose body is being
  evaluated; out of range fails); ``call`` (evaluate the argument expressions, concurrently
  when more than one needs the network, then call the ``Function``).
- ``defFunction(paramCount, body)`` returns a ``Function`` that checks its argument count and
  evaluates ``body`` with the parameters bound. ``getOperator(op)`` returns a two-argument
  ``Function`` for add/subtract/multiply/divide. Division is IEEE double division, as in
  the C++ sample: ``x / 0`` is ``±inf`` and ``0 / 0`` is ``nan``, never an error.

Incoming expressions are converted at once into a plain Python tree (:data:`Expr`: the
dataclasses below), holding typed clients (``Calculator.Value.Client``,
``Calculator.Function.Client``) for the capabilities inside. A ``defFunction`` body
therefore outlives the message it arrived in, and its capabilities stay referenced for as
long as the function does. The same tree, with clients or local server objects at the
capability leaves, is what the client side writes into requests (:func:`fill_expression`).

Client side: :func:`run_tour` walks through the C++ calculator-client sample's steps
(literal, operators, pipelining, defined functions, a client-hosted callback);
:func:`evaluate_infix` parses an infix expression with :mod:`ast` (numbers, ``+ - * /``,
``**`` via a client-hosted ``pow`` callback, parentheses, unary signs; nothing else) and
evaluates it remotely in one pipelined burst.

The demo needs no schema file at run time (the generated module is the schema). For the
dynamic path (``capsvc.load_schema``), schemas are found by :func:`schema_path`: first
``capsvc/schemas/`` (for an installed package), then the repository's ``schemas/`` next to
the package directory.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from capsvc.errors import Failed, SchemaError
from capsvc.generated.calculator_capnp import Calculator

__all__ = [
    "CALCULATOR",
    "CalculatorImpl",
    "Call",
    "Expr",
    "FunctionImpl",
    "Literal",
    "OperatorImpl",
    "Parameter",
    "PowerFunction",
    "PreviousResult",
    "ValueImpl",
    "bootstrap",
    "def_function",
    "evaluate",
    "evaluate_expr",
    "evaluate_infix",
    "fill_expression",
    "format_number",
    "get_operator",
    "parse_infix",
    "read_expression",
    "read_value",
    "run_tour",
    "schema_path",
]

_PACKAGE_DIR = Path(__file__).resolve().parent


def schema_path(name: str) -> Path:
    """The path of one of capsvc's own schemas (``"calculator.capnp"``, ``"echo.capnp"``).

    Looks in ``capsvc/schemas/`` (where package data would be installed), then in the
    ``schemas/`` directory beside the package (a source checkout).

    Raises:
        SchemaError: the schema is in neither place.
    """
    candidates = (_PACKAGE_DIR / "schemas" / name, _PACKAGE_DIR.parent / "schemas" / name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise SchemaError(f"schema {name!r} not found (tried {tried})")


CALCULATOR = Calculator
"""The ``Calculator`` interface, generated (``conn.bootstrap(CALCULATOR)`` is a typed client)."""

ValueCap = Calculator.Value.Client | Calculator.Value.Server
"""A ``Value`` capability: a client of one, or a local server object (when building)."""
FunctionCap = Calculator.Function.Client | Calculator.Function.Server
"""A ``Function`` capability: a client of one, or a local server object (when building)."""


# ----------------------------------------------------------------- expression trees
@dataclass(frozen=True, slots=True)
class Literal:
    """A constant number."""

    value: float


@dataclass(frozen=True, slots=True)
class PreviousResult:
    """The number held by a ``Value`` capability (a client, or a server when building)."""

    value: ValueCap


@dataclass(frozen=True, slots=True)
class Parameter:
    """The ``index``-th argument of the function whose body is being evaluated."""

    index: int


@dataclass(frozen=True, slots=True)
class Call:
    """``function`` (a ``Function`` capability) applied to the values of ``params``."""

    function: FunctionCap
    params: tuple[Expr | float, ...]


Expr = Literal | PreviousResult | Parameter | Call
"""An expression tree: the Python form of ``Calculator.Expression``."""

_KNOWN_KINDS = ("literal", "previousResult", "parameter", "call")


def read_expression(reader: Calculator.Expression.Reader) -> Expr:
    """Convert an ``Expression`` reader into a tree that no longer needs the message."""
    kind = reader.which()
    if kind == "literal":
        return Literal(reader.literal)
    if kind == "previousResult":
        return PreviousResult(reader.previousResult)
    if kind == "parameter":
        return Parameter(reader.parameter)
    if kind == "call":
        call = reader.call
        return Call(call.function, tuple(read_expression(p) for p in call.params))
    raise Failed(f"Unknown expression type (expected one of {', '.join(_KNOWN_KINDS)}).")


def fill_expression(builder: Calculator.Expression.Builder, expr: Expr | float) -> None:
    """Write ``expr`` into an ``Expression`` builder (a bare number is a literal)."""
    if isinstance(expr, int | float):
        builder.literal = float(expr)
    elif isinstance(expr, Literal):
        builder.literal = expr.value
    elif isinstance(expr, Parameter):
        builder.parameter = expr.index
    elif isinstance(expr, PreviousResult):
        builder.set_previousResult(expr.value)
    elif isinstance(expr, Call):
        call = builder.call
        call.set_function(expr.function)
        slots = call.init_params(len(expr.params))
        for index, param in enumerate(expr.params):
            fill_expression(slots[index], param)
    else:
        raise TypeError(f"not an expression: {expr!r}")


def _value_client(value: ValueCap) -> Calculator.Value.Client:
    """A client of ``value`` (a local server object is called through the engine too)."""
    if isinstance(value, Calculator.Value.Server):
        return Calculator.Value.Client(value._capsvc_hook())
    return value


def _function_client(function: FunctionCap) -> Calculator.Function.Client:
    if isinstance(function, Calculator.Function.Server):
        return Calculator.Function.Client(function._capsvc_hook())
    return function


async def evaluate_expr(expr: Expr | float, params: Sequence[float] = ()) -> float:
    """Evaluate ``expr`` with ``params`` bound to its ``Parameter`` leaves.

    Raises:
        capsvc.Failed: a parameter index is out of range (or a called capability failed:
            its error propagates unchanged).
    """
    if isinstance(expr, int | float):
        return float(expr)
    if isinstance(expr, Literal):
        return expr.value
    if isinstance(expr, Parameter):
        if expr.index >= len(params):
            raise Failed(
                f"Parameter index out-of-range: parameter {expr.index} requested, "
                f"the function has {len(params)}."
            )
        return params[expr.index]
    if isinstance(expr, PreviousResult):
        return await read_value(_value_client(expr.value))
    args = await _evaluate_all(expr.params, params)
    return (await _function_client(expr.function).call(params=args)).value


async def _evaluate_all(exprs: Sequence[Expr | float], params: Sequence[float]) -> list[float]:
    """Evaluate sibling expressions; those that need calls run concurrently."""
    values = [0.0] * len(exprs)
    remote: list[int] = []
    for index, expr in enumerate(exprs):
        if isinstance(expr, PreviousResult | Call):
            remote.append(index)
        else:
            values[index] = await evaluate_expr(expr, params)
    if len(remote) == 1:
        values[remote[0]] = await evaluate_expr(exprs[remote[0]], params)
    elif remote:
        thunks = [_bind(evaluate_expr, exprs[i], params) for i in remote]
        for index, value in zip(remote, await _gather(thunks), strict=True):
            values[index] = value
    return values


def _bind(
    function: Callable[[Expr | float, Sequence[float]], Awaitable[float]],
    expr: Expr | float,
    params: Sequence[float],
) -> Callable[[], Awaitable[float]]:
    return lambda: function(expr, params)


async def _gather(thunks: Sequence[Callable[[], Awaitable[float]]]) -> list[float]:
    """Run ``thunks`` concurrently; the first error cancels the rest and is raised as is.

    (A bare nursery would wrap the error in an ExceptionGroup, and the caller would see
    "Exceptions from Trio nursery" instead of the calculator's reason.)
    """
    results = [0.0] * len(thunks)
    errors: list[Exception] = []

    async def run(index: int, thunk: Callable[[], Awaitable[float]]) -> None:
        try:
            results[index] = await thunk()
        except Exception as error:
            errors.append(error)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for index, thunk in enumerate(thunks):
            nursery.start_soon(run, index, thunk)
    if errors:
        raise errors[0]
    return results


# ----------------------------------------------------------------------- the server
def _divide(a: float, b: float) -> float:
    """IEEE 754 double division, as C++ does it: no exception for a zero divisor."""
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


_OPERATORS: dict[str, Callable[[float, float], float]] = {
    "add": operator.add,
    "subtract": operator.sub,
    "multiply": operator.mul,
    "divide": _divide,
}


class ValueImpl(Calculator.Value.Server):
    """A computed number, held by the server."""

    def __init__(self, value: float) -> None:
        self.value = value

    def read(
        self,
        params: Calculator.Value.ReadParams.Reader,
        results: Calculator.Value.ReadResults.Builder,
    ) -> None:
        results.value = self.value

    def __repr__(self) -> str:
        return f"ValueImpl({self.value!r})"


def _arguments(params: Calculator.Function.CallParams.Reader) -> list[float]:
    return list(params.params)


class FunctionImpl(Calculator.Function.Server):
    """A function defined by ``defFunction``: ``body`` with ``param_count`` parameters."""

    def __init__(self, param_count: int, body: Expr) -> None:
        self.param_count = param_count
        self.body = body

    async def call(
        self,
        params: Calculator.Function.CallParams.Reader,
        results: Calculator.Function.CallResults.Builder,
    ) -> None:
        args = _arguments(params)
        if len(args) != self.param_count:
            raise Failed(
                f"Wrong number of parameters: the function takes {self.param_count}, "
                f"got {len(args)}."
            )
        results.value = await evaluate_expr(self.body, args)


class OperatorImpl(Calculator.Function.Server):
    """One of the four arithmetic operators, as a two-parameter Function."""

    def __init__(self, op: str) -> None:
        if op not in _OPERATORS:
            raise Failed(f"Unknown operator {op!r}.")
        self.op = op
        self._apply = _OPERATORS[op]

    def call(
        self,
        params: Calculator.Function.CallParams.Reader,
        results: Calculator.Function.CallResults.Builder,
    ) -> None:
        args = _arguments(params)
        if len(args) != 2:
            raise Failed(f"Wrong number of parameters: {self.op} takes 2, got {len(args)}.")
        results.value = self._apply(args[0], args[1])


class CalculatorImpl(Calculator.Server):
    """The calculator's bootstrap object."""

    async def evaluate(
        self, params: Calculator.EvaluateParams.Reader, results: Calculator.EvaluateResults.Builder
    ) -> None:
        expr = read_expression(params.expression)
        results.value = ValueImpl(await evaluate_expr(expr))

    def defFunction(
        self,
        params: Calculator.DefFunctionParams.Reader,
        results: Calculator.DefFunctionResults.Builder,
    ) -> None:
        count = params.paramCount
        if count < 0:
            raise Failed(f"paramCount must not be negative, got {count}.")
        results.func = FunctionImpl(count, read_expression(params.body))

    def getOperator(
        self,
        params: Calculator.GetOperatorParams.Reader,
        results: Calculator.GetOperatorResults.Builder,
    ) -> None:
        op = params.op
        if op.name not in _OPERATORS:  # an enumerant this schema does not know
            raise Failed(f"Unknown operator {int(op)}.")
        results.func = OperatorImpl(op.name)


def bootstrap() -> CalculatorImpl:
    """The demo's bootstrap object (what ``capsvc serve`` serves with no APP)."""
    return CalculatorImpl()


# ---------------------------------------------------------------------- the client
class PowerFunction(Calculator.Function.Server):
    """A Function hosted by the *client*: ``pow(x, y)``. The server calls it back."""

    def __init__(self) -> None:
        self.calls = 0

    def call(
        self,
        params: Calculator.Function.CallParams.Reader,
        results: Calculator.Function.CallResults.Builder,
    ) -> None:
        args = _arguments(params)
        if len(args) != 2:
            raise Failed(f"Wrong number of parameters: pow takes 2, got {len(args)}.")
        self.calls += 1
        results.value = _c_pow(args[0], args[1])


def _c_pow(x: float, y: float) -> float:
    """C's ``pow``: overflow gives ``±inf``, ``0 ** -n`` gives ``inf``, never an exception."""
    try:
        return math.pow(x, y)
    except OverflowError:
        odd = y.is_integer() and int(y) % 2 == 1
        return -math.inf if x < 0 and odd else math.inf
    except ValueError:  # 0 ** negative, or a negative base with a fractional exponent
        return math.inf if x == 0.0 else math.nan


def evaluate(calc: Calculator.Client, expr: Expr | float) -> Calculator.Value.Client:
    """Send ``calc.evaluate(expr)`` and return the pipelined ``Value`` (no round trip yet)."""
    request = calc.evaluate_request()
    fill_expression(request.params.init_expression(), expr)
    return request.send().value


def def_function(
    calc: Calculator.Client, param_count: int, body: Expr | float
) -> Calculator.Function.Client:
    """Send ``calc.defFunction`` and return the pipelined ``Function``."""
    request = calc.defFunction_request()
    request.params.paramCount = param_count
    fill_expression(request.params.init_body(), body)
    return request.send().func


def get_operator(calc: Calculator.Client, op: str) -> Calculator.Function.Client:
    """Send ``calc.getOperator(op)`` and return the pipelined ``Function``.

    Raises:
        ValueError: ``op`` is not one of add, subtract, multiply, divide.
    """
    try:
        code = Calculator.Operator[op]
    except KeyError:
        raise ValueError(f"unknown operator {op!r}") from None
    return calc.getOperator(op=code).func


async def read_value(value: Calculator.Value.Client) -> float:
    """Read a ``Value`` capability (the one round trip a pipelined chain needs)."""
    return (await value.read()).value


def format_number(value: float) -> str:
    """``14`` for 14.0, ``0.5`` for 0.5, ``inf``/``nan`` as Python spells them."""
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


async def run_tour(calc: Calculator.Client, emit: Callable[[str], None]) -> dict[str, float]:
    """Walk through the calculator-client sample, emitting one line per step.

    Returns each step's result by name (``literal``, ``add``, ``pipelining``,
    ``functions``, ``callback``).
    """
    found: dict[str, float] = {}

    def show(step: str, what: str, value: float, note: str = "") -> None:
        found[step] = value
        line = f"{len(found)}. {step:<11} {what:<58} = {format_number(value)}"
        emit(line + (f"  ({note})" if note else ""))

    value = await read_value(evaluate(calc, Literal(123.0)))
    show("literal", "evaluate(123).value.read()", value)

    add = get_operator(calc, "add")
    value = await read_value(evaluate(calc, Call(add, (12.0, 34.0))))
    show("add", "add = getOperator(add); evaluate(add(12, 34))", value, "pipelined, 1 wait")

    multiply = get_operator(calc, "multiply")
    product = evaluate(calc, Call(multiply, (4.0, 6.0)))  # a Value promise, not awaited
    plus3 = evaluate(calc, Call(add, (PreviousResult(product), 3.0)))
    value = await read_value(plus3)
    show("pipelining", "v = evaluate(4 * 6) (not awaited); evaluate(v + 3)", value)

    x, y = Parameter(0), Parameter(1)
    f = def_function(calc, 2, Call(add, (Call(multiply, (x, 100.0)), y)))
    g = def_function(calc, 1, Call(multiply, (Call(f, (x, Call(add, (x, 1.0)))), 2.0)))
    value = await read_value(evaluate(calc, Call(add, (Call(f, (12.0, 34.0)), Call(g, (21.0,))))))
    show("functions", "f(x,y) = x*100 + y; g(x) = f(x, x+1) * 2; f(12,34) + g(21)", value)

    power = PowerFunction()
    value = await read_value(evaluate(calc, Call(add, (Call(power, (2.0, 4.0)), 3.0))))
    times = "1 time" if power.calls == 1 else f"{power.calls} times"
    show("callback", "pow hosted here; evaluate(pow(2, 4) + 3)", value, f"pow called {times}")
    return found


# ---------------------------------------------------------------- infix expressions
_MAX_INFIX_LENGTH = 10_000
_MAX_INFIX_DEPTH = 20  # each level is 2 pointer hops; the reader's nesting limit is 64

_BINARY_OPS: dict[type[ast.operator], str] = {
    ast.Add: "add",
    ast.Sub: "subtract",
    ast.Mult: "multiply",
    ast.Div: "divide",
    ast.Pow: "pow",
}

Infix = float | tuple[str, "Infix", "Infix"]
"""A parsed infix expression: a number, or ``(operator, left, right)``."""


def parse_infix(text: str) -> Infix:
    """Parse arithmetic like ``"2 + 3 * (4 - 1) / 2 ** 3"`` safely (no evaluation).

    Raises:
        ValueError: anything but numbers, ``+ - * / **``, unary signs and parentheses.
    """
    if len(text) > _MAX_INFIX_LENGTH:
        raise ValueError(f"expression too long ({len(text)} characters)")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as error:
        raise ValueError(f"cannot parse {text!r}: {getattr(error, 'msg', error)}") from None
    return _convert(tree.body, 0)


def _convert(node: ast.expr, depth: int) -> Infix:
    if depth > _MAX_INFIX_DEPTH:
        raise ValueError(f"expression nested too deeply (more than {_MAX_INFIX_DEPTH} levels)")
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"not a number: {ast.unparse(node)}")
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"number too large: {ast.unparse(node)[:40]}") from None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        operand = _convert(node.operand, depth)
        sign = -1.0 if isinstance(node.op, ast.USub) else 1.0
        if isinstance(operand, float):
            return sign * operand
        return operand if sign > 0 else ("multiply", -1.0, operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        op = _BINARY_OPS[type(node.op)]
        return (op, _convert(node.left, depth + 1), _convert(node.right, depth + 1))
    raise ValueError(f"unsupported syntax: {ast.unparse(node)[:60]!r} (use numbers, + - * / **)")


def _operators_in(tree: Infix, found: set[str]) -> set[str]:
    if not isinstance(tree, float):
        found.add(tree[0])
        _operators_in(tree[1], found)
        _operators_in(tree[2], found)
    return found


async def evaluate_infix(calc: Calculator.Client, text: str) -> float:
    """Evaluate infix ``text`` on the calculator, in a single pipelined burst.

    Each operator the expression uses is fetched once with ``getOperator`` (not awaited);
    ``**`` goes to a client-hosted :class:`PowerFunction`, so the server calls back.
    """
    tree = parse_infix(text)
    functions: dict[str, FunctionCap] = {}
    for op in sorted(_operators_in(tree, set())):
        functions[op] = PowerFunction() if op == "pow" else get_operator(calc, op)

    return await read_value(evaluate(calc, _infix_to_expr(tree, functions)))


def _infix_to_expr(node: Infix, functions: dict[str, FunctionCap]) -> Expr | float:
    if isinstance(node, float):
        return node
    left = _infix_to_expr(node[1], functions)
    right = _infix_to_expr(node[2], functions)
    return Call(functions[node[0]], (left, right))
