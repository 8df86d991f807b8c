"""eval through the generated codecs (``capsvc gen schemas/bench/eval.capnp``).

Theory of operation
-------------------
What a user of ``capsvc gen`` writes: the client builds the tree recursively from the
preorder tokens of eval.py as plain values (a dict per node, ``{"value": v}`` or
``{"expression": ...}`` per side) and encodes it with one ``Expression.new_message``;
the server evaluates it recursively, dispatching on each side's ``which()`` (§4
"Server"), in int32 semantics (§1.2).
"""

from __future__ import annotations

from collections.abc import Callable

from bench.serialization.base import CheckFailed
from bench.serialization.eval import EvalInput
from bench.serialization.generated.eval_capnp import EvaluationResult, Expression
from bench.serialization.rng import div32, mod32

__all__ = ["CapsvcEval", "evaluate"]


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
    side = node.left
    left = side.value if side.which() == "value" else evaluate(side.expression)
    side = node.right
    right = side.value if side.which() == "value" else evaluate(side.expression)
    op = node.op
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


class CapsvcEval:
    """eval on generated builders and readers."""

    format = "capsvc"

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
