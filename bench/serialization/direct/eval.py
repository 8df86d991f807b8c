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
parts, filled in once its children are placed, and the parts are joined once (measured
faster than one ``pack`` of all nodes with a repeated format). Pointers are packed and
read as whole 64-bit words.

The server unpacks every node of the segment in one ``iter_unpack`` and evaluates them
from the last to the first, so that a node's children (always later, in preorder) are
done before it: a flat loop, no recursion and no ``unpack_from`` per node. This needs the
segment to be the root pointer followed by nothing but 4-word nodes and every child
pointer to be a forward struct pointer onto that grid (our writer's and libcapnp's
single-segment layout); otherwise (far, null or backward pointers, other data) the
general path recurses one ``unpack_from`` at a time. Nodes nothing points to would be
evaluated too, harmlessly. int32 semantics as everywhere (§1.2).
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


_MAX_NODES = 4096  # larger trees (eval's have at most 511 nodes) take the general path


class _Irregular(Exception):
    """The segment is not a plain preorder run of nodes: use the general path."""


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
        self._node_read = node.unpack_from
        self._root = _ROOT.pack(0, node_hi)  # root -> the node at word 1
        self._node_pack = node.pack
        self._node_iter = node.iter_unpack
        # forward child pointers onto the node grid, as whole words -> nodes ahead
        struct_ptr = node_hi << 32
        self._left_steps = {struct_ptr | (16 * d - 12): -d for d in range(1, _MAX_NODES)}
        self._right_steps = {struct_ptr | (16 * d - 16): -d for d in range(1, _MAX_NODES)}
        self._write = self._make_writer()
        self._evaluate = self._make_evaluator()

    # ------------------------------------------------------------------ client

    def setup(self, inputs: tuple[tuple[int, ...], int]) -> tuple[Message, int]:
        tokens, value = inputs
        parts: list[bytes] = [self._root]  # root -> the node at word 1
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
        buf = request[0]
        try:
            if buf[:8] != self._root or len(buf) % 32 != 8:
                raise _Irregular
            value = self._evaluate_flat(buf)
        except (_Irregular, KeyError, IndexError):
            seg, word = root_struct(request, self._node_hi)
            value = 0 if word < 0 else self._evaluate(request, request[seg], seg, word)
        return Message([_RESPONSE.pack(0, 1, value)], self._result_type)

    def _evaluate_flat(self, buf: bytes) -> int:
        """Every node after the root pointer, last first; returns the first node's value.

        A child pointer of node ``j`` onto node ``j + d`` (d >= 1) reads, as a whole word,
        ``hi << 32 | (4d - 3) << 2`` (left, pointer 0) or ``hi << 32 | (4d - 4) << 2``
        (right, pointer 1); ``_left_steps`` / ``_right_steps`` map those words to ``-d``,
        and any other word raises ``KeyError``. ``values`` holds the values of the nodes
        after ``j``, the nearest last, so node ``j + d``'s is ``values[-d]`` (IndexError
        past the last node).
        """
        with memoryview(buf) as view:
            nodes = list(self._node_iter(view[8:]))
        left_steps = self._left_steps
        right_steps = self._right_steps
        values: list[int] = []
        push = values.append
        for op, left_tag, left, right, right_tag, left_ptr, right_ptr in reversed(nodes):
            if left_tag:
                left = values[left_steps[left_ptr]]
            if right_tag:
                right = values[right_steps[right_ptr]]
            if op == 0:
                value = (left + right) & 0xFFFFFFFF
            elif op == 1:
                value = (left - right) & 0xFFFFFFFF
            elif op == 2:
                value = (left * right) & 0xFFFFFFFF
            elif op == 3:
                push(div32(left, right))
                continue
            else:
                push(mod32(left, right))
                continue
            push(value - 0x100000000 if value & 0x80000000 else value)  # int32 (§4)
        return values[-1]

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
