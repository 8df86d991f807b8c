"""eval through the generated codecs (``capsvc gen schemas/bench/eval.capnp``).

Theory of operation
-------------------
Two ways a user of ``capsvc gen`` writes it, through the generated API only. ``capsvc``
(``CapsvcEval``) works on whole rows: the client builds the tree as nested
``Expression.Row`` tuples (op, then each side's group in its place: its value and its
expression, one of them None as a union member not set reads), which the codec encodes
with one ``Expression.encode``; the server is given the whole tree as rows (the codec's
``Expression.row_decoder()`` on the pipe, ``Expression.row`` elsewhere), evaluates them
as the msgpack format does its nested lists (specs/benchmarks.md §8), and answers with
an ``EvaluationResult.Row``, which the client is given as a row too. ``capsvc-fields``
(``CapsvcFieldsEval``) is what follows: the client builds the tree recursively from the
preorder tokens of eval.py as plain values (a dict per node, ``{"value": v}`` or
``{"expression": ...}`` per side) and encodes it with one ``Expression.new_message``;
the server evaluates it recursively, dispatching on each side's ``which()`` (§4
"Server"), in int32 semantics (§1.2).
"""

from __future__ import annotations

from collections.abc import Callable

from bench.serialization.base import CheckFailed
from bench.serialization.eval import EvalInput
from bench.serialization.generated.eval_capnp import EvaluationResult, Expression, Operation
from bench.serialization.rng import div32, mod32

__all__ = ["CapsvcEval", "CapsvcFieldsEval", "evaluate", "evaluate_row"]


def _build(nxt: Callable[[], int]) -> Expression.Init:
    """An expression from the preorder tokens, as plain values (``Expression.Init``)."""
    op = nxt()
    value = nxt()  # a leaf value 1..128, or 0: a child's tokens follow
    left: Expression.Left.Init = {"value": value} if value else {"expression": _build(nxt)}
    value = nxt()
    right: Expression.Right.Init = {"value": value} if value else {"expression": _build(nxt)}
    return {"op": op, "left": left, "right": right}


def evaluate(node: Expression.Reader) -> int:
    """The value of an expression tree, in int32 semantics (§4 "Server", §1.2)."""
    first = node.left
    left = first.value if first.which() == "value" else evaluate(first.expression)
    second = node.right
    right = second.value if second.which() == "value" else evaluate(second.expression)
    op = node.op
    if op is _ADD:
        value = (left + right) & 0xFFFFFFFF
    elif op is _SUBTRACT:
        value = (left - right) & 0xFFFFFFFF
    elif op is _MULTIPLY:
        value = (left * right) & 0xFFFFFFFF
    elif op is _DIVIDE:
        return div32(left, right)
    else:
        return mod32(left, right)
    return value - 0x100000000 if value & 0x80000000 else value  # wrap to int32


def _build_row(nxt: Callable[[], int]) -> Expression.Row:
    """An expression from the preorder tokens, as a row (``Expression.Row``: op, then
    each side's group spliced in, its value and its expression, the member not set None).
    Each shape is one tuple display: no variable for a member left None."""
    op = _OPERATIONS[nxt()]
    left = nxt()  # a leaf value 1..128, or 0: a child's tokens follow
    if left:
        if right := nxt():
            return (op, left, None, right, None)
        return (op, left, None, None, _build_row(nxt))
    left_child = _build_row(nxt)
    if right := nxt():
        return (op, None, left_child, right, None)
    return (op, None, left_child, None, _build_row(nxt))


_OPERATIONS = tuple(Operation)  # by code: an IntEnum call costs ~0.5 µs
# An enum read back is its member, compared by identity, as Python compares enum members:
# an IntEnum's ``==`` with an int misses CPython's fast path for exact ints (about 1.5 µs
# more per 33-node tree in evaluate_row, which compares up to four times per node).
_ADD, _SUBTRACT, _MULTIPLY, _DIVIDE = (
    Operation.add,
    Operation.subtract,
    Operation.multiply,
    Operation.divide,
)


def evaluate_row(node: Expression.Row) -> int:
    """``evaluate`` on a row: a side whose value is None holds an expression."""
    op, left, left_child, right, right_child = node
    if left is None:
        assert left_child is not None
        left = evaluate_row(left_child)
    if right is None:
        assert right_child is not None
        right = evaluate_row(right_child)
    if op is _ADD:
        value = (left + right) & 0xFFFFFFFF
    elif op is _SUBTRACT:
        value = (left - right) & 0xFFFFFFFF
    elif op is _MULTIPLY:
        value = (left * right) & 0xFFFFFFFF
    elif op is _DIVIDE:
        return div32(left, right)
    else:
        return mod32(left, right)
    return value - 0x100000000 if value & 0x80000000 else value  # wrap to int32


class CapsvcEval:
    """eval on generated rows: one call builds the tree, one reads it."""

    format = "capsvc"

    def setup(self, inputs: EvalInput) -> tuple[Expression.Row, int]:
        tokens, value = inputs
        return _build_row(iter(tokens).__next__), value  # (the codec encodes it)

    def handle(self, request: Expression.Row | Expression.Reader) -> EvaluationResult.Row:
        # The codec gives rows (eval.CAPSVC_ROW_MESSAGES: ``row_decoder()`` on the pipe); a
        # reader, as tests give one, is read whole first.
        if type(request) is not tuple:
            request = Expression.row(request)
        return (evaluate_row(request),)

    def check(
        self, response: EvaluationResult.Row | EvaluationResult.Reader, expectation: int
    ) -> None:
        value = response[0] if type(response) is tuple else response.value
        if value != expectation:
            raise CheckFailed(f"eval: value {value}, expected {expectation}")


class CapsvcFieldsEval:
    """eval on generated builders and readers, a field at a time."""

    format = "capsvc-fields"

    def setup(self, inputs: EvalInput) -> tuple[Expression.Builder, int]:
        tokens, value = inputs
        return Expression.new_message(**_build(iter(tokens).__next__)), value

    def handle(self, request: Expression.Reader) -> EvaluationResult.Builder:
        response = EvaluationResult.new_message()
        response.value = evaluate(request)
        return response

    def check(self, response: EvaluationResult.Reader, expectation: int) -> None:
        value = response.value
        if value != expectation:
            raise CheckFailed(f"eval: value {value}, expected {expectation}")
