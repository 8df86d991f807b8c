"""``FramingLimits``: the receiver's guards, a value users construct (capsvc.FramingLimits).

Its own module, and pure Python, because capsvc.framing is compiled by mypyc: a compiled
dataclass checks its fields' declared types on entry, with mypyc's own TypeError that names
no field, before ``__post_init__`` can say which limit is wrong (and with a ValueError, as
the pure-Python build does). capsvc.framing re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FramingLimits"]


@dataclass(frozen=True, slots=True)
class FramingLimits:
    """Receiver guards (rpc-protocol.md §1, C++ ``capnp::ReaderOptions`` defaults).

    ``max_segments`` is inclusive: C++ ``readMessage`` requires *fewer than 512*
    segments, i.e. at most 511. ``max_message_words`` bounds the sum of the segment
    sizes (C++ uses the traversal limit, 8 Mi words = 64 MiB). The last two are handed to
    pycapnp readers through :func:`capsvc.framing.read_limits_kwargs`.
    """

    max_segments: int = 511
    max_message_words: int = 8 * 1024 * 1024
    traversal_limit_words: int = 8 * 1024 * 1024
    nesting_limit: int = 64

    def __post_init__(self) -> None:
        for name in ("max_segments", "traversal_limit_words", "nesting_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"FramingLimits.{name} must be a positive int, got {value!r}")
        if not isinstance(self.max_message_words, int) or self.max_message_words < 0:
            raise ValueError(
                "FramingLimits.max_message_words must be a non-negative int, "
                f"got {self.max_message_words!r}"
            )
