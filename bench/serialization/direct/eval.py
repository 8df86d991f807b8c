"""eval with direct segment access (specs/benchmarks.md §4; wire.py for the encoding).

Theory of operation
-------------------
Expression (checked against schemas/bench/eval.capnp at start-up): 2 data words and 2
pointers. Bytes 0-1 op, 2-3 the ``left`` union's tag, 4-7 ``left.value``, 8-11
``right.value``, 12-13 the ``right`` tag; pointer 0 is ``left.expression``, pointer 1
``right.expression``. Tag 0 selects ``value``, 1 ``expression``.

The writer lays the tree out in preorder in one segment after the root pointer, one
4-word node after another. A left child therefore always starts right after its parent
(its pointer's offset is the constant 1); a right child starts after the parent's whole
left subtree, which the recursion returns. Each node is one ``Struct.pack`` into a list of
parts, filled in once its children are placed, and the parts are joined once. Pointers
are packed and read as whole 64-bit words (fewer objects than two halves).

The server reads a node with one ``unpack_from`` and recurses into the side whose tag says
``expression``: a forward struct pointer of the Expression's size is followed inline, any
other (far, null, backward) takes the general path. int32 semantics as everywhere (§1.2).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from bench.serialization import eval as eval_bench
from bench.serialization.base import CheckFailed
from bench.serialization.direct.wire import (
    POINTER,
    LayoutError,
    Message,
    check_layout,
    root_struct,
    struct_target,
)
from bench.serialization.rng import div32, mod32

__all__ = ["DirectEval"]

_NODE = ("<HHiiH2xqq", (
    "op", "left.$which", "left.value", "right.value", "right.$which",
    "left.expression", "right.expression",
))  # fmt: skip
_RESULT = ("<i4x", ("value",))
_RESPONSE = struct.Struct("<iIi4x")  # root pointer + EvaluationResult
_ROOT = struct.Struct("<iI")
_FORWARD_STRUCT = 0x80000003  # pointer bits that must be 0 for a forward struct pointer


class DirectEval:
    """eval on raw segments; messages are ``list[bytes]`` (wire.Message when built)."""

    format = "capnp-direct"

    def __init__(self) -> None:
        schema = eval_bench.load_schema()
        self._expression_type = schema.Expression
        self._result_type = schema.EvaluationResult
        node_hi = check_layout(schema.Expression, *_NODE)
        self._result_hi = check_layout(schema.EvaluationResult, *_RESULT)
        if node_hi != 2 | 2 << 16 or self._result_hi != 1:
            raise LayoutError("Expression must be 2+2 words and EvaluationResult 1 word")
        self._node_hi = node_hi
        node = struct.Struct(_NODE[0])
        self._node_pack = node.pack
        self._node_read = node.unpack_from
        self._write = self._make_writer()
        self._evaluate = self._make_evaluator()

    # ------------------------------------------------------------------ client

    def setup(self, inputs: tuple[tuple[int, ...], int]) -> tuple[Message, int]:
        tokens, value = inputs
        parts: list[bytes] = [_ROOT.pack(0, self._node_hi)]  # root -> the node at word 1
        self._write(iter(tokens).__next__, parts, 1)
        return Message([b"".join(parts)], self._expression_type), value

    def _make_writer(self) -> Callable[[Callable[[], int], list[bytes], int], int]:
        struct_ptr = self._node_hi << 32  # a struct pointer to an Expression, offset 0
        left_child = struct_ptr | 1 << 2  # offset 1 from pointer 0: right after the parent
        node_pack = self._node_pack

        def write(nxt: Callable[[], int], parts: list[bytes], word: int) -> int:
            """Write the node at ``word`` and its subtrees; return the next free word."""
            index = len(parts)
            parts.append(b"")  # this node's slot, packed once its children are placed
            op = nxt()
            free = word + 4
            left = nxt()
            if left:
                left_tag = left_ptr = 0
            else:
                left_tag, left_ptr = 1, left_child  # the left child starts at word + 4
                free = write(nxt, parts, free)
            right = nxt()
            if right:
                right_tag = right_ptr = 0
            else:
                # pointer 1 sits at word + 3; the child starts at the next free word
                right_tag, right_ptr = 1, struct_ptr | (free - word - 4) << 2
                free = write(nxt, parts, free)
            parts[index] = node_pack(op, left_tag, left, right, right_tag, left_ptr, right_ptr)
            return free

        return write

    # ------------------------------------------------------------------ server

    def handle(self, request: list[bytes]) -> Message:
        seg, word = root_struct(request, self._node_hi)
        value = 0 if word < 0 else self._evaluate(request, request[seg], seg, word)
        return Message([_RESPONSE.pack(0, 1, value)], self._result_type)

    def _make_evaluator(self) -> Callable[[list[bytes], bytes, int, int], int]:
        node_hi = self._node_hi
        node_read = self._node_read

        def evaluate(segments: list[bytes], buf: bytes, seg: int, word: int) -> int:
            op, left_tag, left, right, right_tag, left_ptr, right_ptr = node_read(buf, word * 8)
            if left_tag:
                if left_ptr & _FORWARD_STRUCT == 0 and left_ptr >> 32 == node_hi:
                    left = evaluate(segments, buf, seg, word + 3 + ((left_ptr & 0xFFFFFFFF) >> 2))
                else:
                    left = evaluate_far(segments, seg, word + 2, left_ptr)
            if right_tag:
                if right_ptr & _FORWARD_STRUCT == 0 and right_ptr >> 32 == node_hi:
                    right = evaluate(segments, buf, seg, word + 4 + ((right_ptr & 0xFFFFFFFF) >> 2))
                else:
                    right = evaluate_far(segments, seg, word + 3, right_ptr)
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

        def evaluate_far(segments: list[bytes], seg: int, ptr: int, pointer: int) -> int:
            """Slow path: far, null or backward pointers (null: defaults, 0 + 0 = 0)."""
            lo, hi = POINTER.unpack(pointer.to_bytes(8, "little", signed=True))
            seg, word = struct_target(segments, seg, ptr, lo, hi, node_hi)
            return 0 if word < 0 else evaluate(segments, segments[seg], seg, word)

        return evaluate

    def check(self, response: list[bytes], expectation: int) -> None:
        seg, word = root_struct(response, self._result_hi)
        value = 0 if word < 0 else struct.unpack_from("<i", response[seg], word * 8)[0]
        if value != expectation:
            raise CheckFailed(f"eval: value {value}, expected {expectation}")
