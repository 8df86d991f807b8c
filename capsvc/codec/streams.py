"""``RootDecoder`` and ``RowDecoder``: the roots of a byte stream of framed messages, read
as they arrive (as readers, or as rows).

Theory of operation
-------------------
What msgpack's ``Unpacker`` is to msgpack, for one root type of a generated module: a
pipe, socket or file delivers bytes in arbitrary pieces, ``feed`` takes each piece, and
``next()`` gives the root reader of the next complete message (None while more bytes
are needed), so a reader loop is ``feed`` once per receive and ``next`` until None.
Generated ``T.decoder()`` makes one for ``T.Reader``.

It is the framing decoder (capsvc.framing.FrameDecoder: the segment table checked against
``Limits.max_segments`` and ``max_message_words`` before any body byte is waited for, a
bounded buffer, errors that are final) joined to the root read of generated ``T.read``
(``traversal_limit_words`` and ``nesting_limit`` per message), in one compiled call per
message: the two steps a Python loop would otherwise join cost a Python call each.

A framing fault raises :class:`~capsvc.errors.FramingError` (and again on every later
call: the stream's position is lost); a message whose content is malformed raises
:class:`~capsvc.errors.DecodeError` from its fields' reads, as ``T.read`` does. Packed
streams carry no length before a message's end, so they are read whole
(``T.read_multiple_bytes_packed``), not here.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from capsvc.codec.plans import StructPlan
from capsvc.codec.reading import R, StructReader, read_segments
from capsvc.codec.rows import root_row
from capsvc.framing import DEFAULT_LIMITS, FrameDecoder, Limits

__all__ = ["DEFAULT_LIMITS", "Limits", "RootDecoder", "RowDecoder"]

W = TypeVar("W", bound=tuple[Any, ...])


class _Frames:
    """What both decoders share: the framing decoder, fed bytes, and each message's read
    limits."""

    __slots__ = ("_frames", "_nesting", "_traversal")

    def __init__(self, limits: Limits) -> None:
        self._frames = FrameDecoder(limits)
        self._traversal = limits.traversal_limit_words
        self._nesting = limits.nesting_limit

    @property
    def limits(self) -> Limits:
        return self._frames.limits

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as part of a message."""
        return self._frames.buffered

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the stream (any split is fine)."""
        self._frames.feed(data)

    def feed_eof(self) -> None:
        """The stream has ended: a message still incomplete makes ``next`` raise."""
        self._frames.feed_eof()


class RootDecoder(_Frames, Generic[R]):
    """The ``cls`` roots of a stream of framed messages; see the module docstring."""

    __slots__ = ("_cls",)

    def __init__(self, cls: type[R], limits: Limits = DEFAULT_LIMITS) -> None:
        super().__init__(limits)
        self._cls = cls

    def next(self) -> R | None:
        """The root of the next complete message, or None while more bytes are needed."""
        segments = self._frames.next_message()
        if segments is None:
            return None
        return read_segments(self._cls, segments, self._traversal, self._nesting, True)

    def __iter__(self) -> RootDecoder[R]:
        return self

    def __next__(self) -> R:
        """Each root complete so far (iteration stops while more bytes are needed, and
        can go on after the next ``feed``)."""
        root = self.next()
        if root is None:
            raise StopIteration
        return root


class RowDecoder(_Frames, Generic[W]):
    """The roots of a stream of framed messages as rows of ``plan``'s struct (``cls`` its
    generated reader, for what C leaves to Python); see the module docstring."""

    __slots__ = ("_cls", "_plan")

    def __init__(
        self, cls: type[StructReader], plan: StructPlan, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        super().__init__(limits)
        self._cls = cls
        self._plan = plan

    def next(self) -> W | None:
        """The row of the next complete message's root, or None while more bytes are
        needed."""
        segments = self._frames.next_message()
        if segments is None:
            return None
        row: Any = root_row(self._cls, self._plan, segments, self._traversal, self._nesting)
        return row  # type: ignore[no-any-return]

    def __iter__(self) -> RowDecoder[W]:
        return self

    def __next__(self) -> W:
        """Each row complete so far (iteration stops while more bytes are needed, and can
        go on after the next ``feed``)."""
        row = self.next()
        if row is None:
            raise StopIteration
        return row
