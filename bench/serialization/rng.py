"""The suite's random number generator (xorshift128) and int32 arithmetic.

Theory of operation
-------------------
Upstream draws every request from one process-wide xorshift128 generator on four 32-bit
words (specs/benchmarks.md §1.1), never reseeded during a run. :class:`Xorshift128` is a
plain implementation of that step; :meth:`Xorshift128.stream` is the fast path the input
generators use: a generator function whose state lives in local variables, so a draw is
one ``next()`` instead of four attribute reads and writes. Both produce the same sequence
(the spec's test vector is in tests/bench).

``rand(n)`` is "next output mod n" (bias accepted) and ``rand_double(r)`` scales by
``r / 4294967295.0`` so its range is [0, r] inclusive (§1.1); the generators inline these
two formulas, the methods exist for tests and readability.

The suite computes in C int32 semantics in eval (§1.2, §4): add, subtract and multiply
wrap modulo 2**32, division truncates toward zero, the remainder takes the dividend's
sign, and both return INT32_MAX on a zero divisor or on INT32_MIN / -1. Python's ``//``
and ``%`` floor, so :func:`div32` and :func:`mod32` work on magnitudes.
"""

from __future__ import annotations

from collections.abc import Generator

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "SEED",
    "UINT32_MAX",
    "Xorshift128",
    "div32",
    "mod32",
    "wrap32",
]

# §1.1: the initial state words x, y, z, w.
SEED = (0x1D2ACD47, 0x58CA3E14, 0xF563F232, 0x0BC76199)
UINT32_MAX = 0xFFFFFFFF
INT32_MAX = 0x7FFFFFFF
INT32_MIN = -0x80000000
_MASK = 0xFFFFFFFF


class Xorshift128:
    """xorshift128 on 32-bit words, seeded as upstream (§1.1)."""

    __slots__ = ("w", "x", "y", "z")

    def __init__(self, seed: tuple[int, int, int, int] = SEED) -> None:
        self.x, self.y, self.z, self.w = seed

    def next(self) -> int:
        """The next 32-bit output (the new ``w``)."""
        # §1.1: t = x ^ (x << 11); shift the state down; w ^= (w >> 19) ^ t ^ (t >> 8).
        x = self.x
        t = (x ^ (x << 11)) & _MASK
        w = self.w
        self.x, self.y, self.z = self.y, self.z, w
        w = w ^ (w >> 19) ^ t ^ (t >> 8)
        self.w = w
        return w

    def rand(self, n: int) -> int:
        """``next() % n``: uniform enough, bias accepted (§1.1)."""
        return self.next() % n

    def rand_double(self, r: float) -> float:
        """``next() * r / UINT32_MAX``: in [0, r] inclusive (§1.1)."""
        return self.next() * r / 4294967295.0

    def stream(self) -> Generator[int, None, None]:
        """An endless iterator over the outputs, continuing from (and advancing) this state.

        Local-variable state makes a draw about a quarter cheaper than :meth:`next`.
        The object's own fields are written back only when the iterator is closed or
        garbage-collected; do not mix the two interfaces on one generator.
        """
        x, y, z, w = self.x, self.y, self.z, self.w
        try:
            while True:
                t = (x ^ (x << 11)) & _MASK
                x = y
                y = z
                z = w
                w = w ^ (w >> 19) ^ t ^ (t >> 8)
                yield w
        finally:
            self.x, self.y, self.z, self.w = x, y, z, w


def wrap32(value: int) -> int:
    """Reduce an integer to int32 two's-complement range (C wrap-around, §4 step 4)."""
    value &= _MASK
    return value - 0x100000000 if value & 0x80000000 else value


def div32(a: int, b: int) -> int:
    """C int32 division, guarded (§1.2): INT32_MAX for b == 0 and for INT32_MIN / -1."""
    if b == 0 or (a == INT32_MIN and b == -1):
        return INT32_MAX
    q = abs(a) // abs(b)  # truncate toward zero: divide the magnitudes, then fix the sign
    return -q if (a < 0) != (b < 0) else q


def mod32(a: int, b: int) -> int:
    """C int32 remainder, guarded (§1.2): the sign of the dividend; INT32_MAX as div32."""
    if b == 0 or (a == INT32_MIN and b == -1):
        return INT32_MAX
    r = abs(a) % abs(b)
    return -r if a < 0 else r
