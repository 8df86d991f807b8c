"""ID allocation for the question, export and embargo tables.

rpc-protocol.md §3: allocate the lowest free ID (C++ keeps a min-heap of freed IDs) and
reuse an ID only after both directions are done with it; the caller decides when that is
and only then calls ``free``.
"""

from __future__ import annotations

import heapq


class IdAllocator:
    """Hands out the lowest free non-negative integer; freed IDs are reused lowest first."""

    __slots__ = ("_free", "_next")

    def __init__(self) -> None:
        self._next = 0
        self._free: list[int] = []

    def allocate(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        value = self._next
        self._next += 1
        return value

    def free(self, value: int) -> None:
        heapq.heappush(self._free, value)

    @property
    def in_use(self) -> int:
        """How many IDs are allocated and not yet freed."""
        return self._next - len(self._free)
