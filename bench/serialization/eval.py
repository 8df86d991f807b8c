"""eval, the "pointer-heavy" benchmark (specs/benchmarks.md §4).

Theory of operation
-------------------
A request is a random arithmetic expression tree: ``make(depth)`` draws an operation,
then for each side either a leaf (probability ``depth/8``, value 1..128) or a child built
completely by ``make(depth + 1)`` before anything else is drawn (§4 "Request"). The
client expects the tree's value in int32 semantics (§1.2); the server evaluates the tree
it received and returns the value.

:func:`generate` consumes the RNG, computes the expectation as upstream's ``make`` does,
and records the tree as a flat preorder token list: ``op``, then for each side either the
leaf value (1..128, never 0) or ``0`` followed by the child's tokens. Both formats rebuild
their own tree from these tokens in ``setup``, so neither is handed a ready-made structure
(a nested tuple *is* msgpack's message).

- capnp: each side is a union group; the server dispatches on ``_which_str()`` of the
  group (§4 "Server"). Field objects of the groups are looked up once.
- msgpack (§8): an Expression is ``(op, left, right)`` where a side is an int (a value) or
  a nested tuple (an expression); EvaluationResult is a bare int.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from bench.serialization import schemas
from bench.serialization.base import CheckFailed
from bench.serialization.rng import div32, mod32, wrap32

__all__ = [
    "MSGPACK_RAW",
    "MSGPACK_SINGLE_FLOAT",
    "REQUEST_TYPE",
    "RESPONSE_TYPE",
    "CapnpEval",
    "MsgpackEval",
    "apply_op",
    "count_nodes",
    "generate",
    "load_schema",
]

REQUEST_TYPE = "Expression"
RESPONSE_TYPE = "EvaluationResult"
MSGPACK_SINGLE_FLOAT = False
MSGPACK_RAW = False  # no strings
# The capsvc format's cases read whole messages as rows (typed/eval.py): its codec gives
# them the rows (``T.row_decoder()`` on the pipe), as msgpack's gives its tuples.
CAPSVC_ROW_MESSAGES = True

EvalInput = tuple[tuple[int, ...], int]


def load_schema() -> Any:
    return schemas.load("eval")


def _add(a: int, b: int) -> int:
    return wrap32(a + b)


def _subtract(a: int, b: int) -> int:
    return wrap32(a - b)


def _multiply(a: int, b: int) -> int:
    return wrap32(a * b)


# §4 enum Operation order: add, subtract, multiply, divide, modulus.
_OPS: tuple[Callable[[int, int], int], ...] = (_add, _subtract, _multiply, div32, mod32)


def apply_op(op: int, left: int, right: int) -> int:
    """``op(left, right)`` in int32 semantics (§4 step 4, §1.2)."""
    return _OPS[op](left, right)


def _make(nxt: Callable[[], int], append: Callable[[int], None], depth: int) -> int:
    """Upstream's ``make(node, depth)``: draw a node, record its tokens, return its value."""
    op = nxt() % 5  # §4 step 1
    append(op)
    if nxt() % 8 < depth:  # §4 step 2: a leaf 1..128, else a complete child
        left = nxt() % 128 + 1
        append(left)
    else:
        append(0)
        left = _make(nxt, append, depth + 1)
    if nxt() % 8 < depth:  # §4 step 3: the same rule on the right
        right = nxt() % 128 + 1
        append(right)
    else:
        append(0)
        right = _make(nxt, append, depth + 1)
    return _OPS[op](left, right)  # §4 step 4: int32 semantics


def generate(draws: Iterator[int], iterations: int) -> list[EvalInput]:
    """Per iteration: the tree's preorder tokens and its value (§4 "Request")."""
    nxt = draws.__next__
    requests = []
    for _ in range(iterations):
        tokens: list[int] = []
        value = _make(nxt, tokens.append, 0)  # the root has depth 0
        requests.append((tuple(tokens), value))
    return requests


def count_nodes(tokens: tuple[int, ...]) -> int:
    """Number of Expression nodes in a token list (each node has one op token)."""
    nxt = iter(tokens).__next__

    def count() -> int:
        nxt()  # op
        nodes = 1
        for _ in range(2):  # left, then right: 0 announces a child's tokens
            if nxt() == 0:
                nodes += count()
        return nodes

    return count()


# --------------------------------------------------------------------------- msgpack


def _msgpack_build(nxt: Callable[[], int]) -> tuple[Any, Any, Any]:
    op = nxt()
    left: Any = nxt()
    if not left:
        left = _msgpack_build(nxt)
    right: Any = nxt()
    if not right:
        right = _msgpack_build(nxt)
    return (op, left, right)


def _msgpack_evaluate(expression: Any) -> int:
    op, left, right = expression
    if left.__class__ is not int:
        left = _msgpack_evaluate(left)
    if right.__class__ is not int:
        right = _msgpack_evaluate(right)
    if op == 0:
        value = (left + right) & 0xFFFFFFFF
    elif op == 1:
        value = (left - right) & 0xFFFFFFFF
    elif op == 2:
        value = (left * right) & 0xFFFFFFFF
    elif op == 3:
        return div32(left, right)
    else:
        return mod32(left, right)
    return value - 0x100000000 if value & 0x80000000 else value  # wrap to int32 (§4)


class MsgpackEval:
    """§8: Expression is ``(op, left, right)``; a side is an int or a nested tuple."""

    format = "msgpack"

    def setup(self, inputs: EvalInput) -> tuple[Any, int]:
        tokens, value = inputs
        return _msgpack_build(iter(tokens).__next__), value

    def handle(self, request: Any) -> int:
        return _msgpack_evaluate(request)

    def check(self, response: Any, expectation: int) -> None:
        if response != expectation:
            raise CheckFailed(f"eval: value {response!r}, expected {expectation}")


# --------------------------------------------------------------------------- capnp


class CapnpEval:
    """pycapnp: union groups, dispatch on ``_which_str()``, by-field fast paths."""

    format = "capnp"

    def __init__(self) -> None:
        schema = load_schema()
        expression = schema.Expression
        self._expression_type = expression
        self._result_type = schema.EvaluationResult
        self._result_value = schemas.field(schema.EvaluationResult, "value")
        op_f = schemas.field(expression, "op")
        left_f = schemas.field(expression, "left")
        right_f = schemas.field(expression, "right")
        left_value_f = schemas.group_field(expression, "left", "value")
        left_expr_f = schemas.group_field(expression, "left", "expression")
        right_value_f = schemas.group_field(expression, "right", "value")
        right_expr_f = schemas.group_field(expression, "right", "expression")

        def build(node: Any, nxt: Callable[[], int]) -> None:
            node._set_by_field(op_f, nxt())
            value = nxt()
            if value:
                node._get_by_field(left_f)._set_by_field(left_value_f, value)
            else:
                build(node._get_by_field(left_f)._init_by_field(left_expr_f), nxt)
            value = nxt()
            if value:
                node._get_by_field(right_f)._set_by_field(right_value_f, value)
            else:
                build(node._get_by_field(right_f)._init_by_field(right_expr_f), nxt)

        def evaluate(node: Any) -> int:
            get = node._get_by_field
            op = get(op_f).raw
            side = get(left_f)
            if side._which_str() == "value":
                left = side._get_by_field(left_value_f)
            else:
                left = evaluate(side._get_by_field(left_expr_f))
            side = get(right_f)
            if side._which_str() == "value":
                right = side._get_by_field(right_value_f)
            else:
                right = evaluate(side._get_by_field(right_expr_f))
            if op == 0:
                value = (left + right) & 0xFFFFFFFF
            elif op == 1:
                value = (left - right) & 0xFFFFFFFF
            elif op == 2:
                value = (left * right) & 0xFFFFFFFF
            elif op == 3:
                return div32(left, right)
            else:
                return mod32(left, right)
            return value - 0x100000000 if value & 0x80000000 else value  # wrap to int32

        self._build = build
        self._evaluate = evaluate

    def setup(self, inputs: EvalInput) -> tuple[Any, int]:
        tokens, value = inputs
        message = self._expression_type.new_message()
        self._build(message, iter(tokens).__next__)
        return message, value

    def handle(self, request: Any) -> Any:
        response = self._result_type.new_message()
        response._set_by_field(self._result_value, self._evaluate(request))
        return response

    def check(self, response: Any, expectation: int) -> None:
        value = response._get_by_field(self._result_value)
        if value != expectation:
            raise CheckFailed(f"eval: value {value}, expected {expectation}")
