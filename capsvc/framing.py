"""Cap'n Proto stream framing: the segment table, encode and decode, with receiver limits.

Theory of operation
-------------------
On a byte stream every Cap'n Proto message is sent as (rpc-protocol.md §1, serialize.c++):

1. a little-endian ``u32``: segment count - 1;
2. one ``u32`` per segment: its size in 8-byte words;
3. 4 zero bytes when the count is even, so the header ends on an 8-byte boundary;
4. the segment bodies, back to back.

This module is sans-I/O (it imports neither trio nor socket): the connection driver feeds it
whatever bytes the transport produced and asks for complete messages.

Decoding (:class:`FrameDecoder`):

- Incoming bytes are appended to one ``bytearray``; a read offset marks what has been
  consumed. The consumed prefix is dropped only when it is at least as large as the
  unread rest, so every byte is moved a bounded number of times (no quadratic copying
  however the stream is split, one byte per ``feed`` included). One exception, in the
  compiled build: a ``bytes`` feed that arrives while nothing is buffered is kept as it
  is until ``next_message``, which cuts a whole one-segment message at its start
  straight out of it (the common receive: one message) and appends whatever else it
  holds to the buffer, as a feed would.
- The header is validated as soon as its bytes are present and *before* any body byte is
  waited for (§1 "Check the size before allocating"): a segment count over
  ``max_segments`` or a total over ``max_message_words`` raises :class:`FramingError` at
  once, even while the table itself is still arriving (the sizes seen so far already
  exceed the limit). Hence the buffer never holds more than one header, one allowed body
  and one ``feed``'s worth of data, provided the caller drains ``next_message()`` until it
  returns ``None`` after each ``feed`` (the connection reader does).
- A large body (``_LARGE_BODY`` bytes or more) that has not all arrived is *collected*
  instead: the part already buffered is moved out, and later feeds are kept in a list
  until the body is complete, which is then joined into its ``bytes`` object in one copy
  (the bytes beyond it go back to the buffer). A feed of ``_WHOLE_PART`` bytes or more is
  a part as it is; smaller ones are gathered into one ``bytearray`` part, so a body that
  arrives a byte at a time holds about its own size, not an object per byte (42 bytes of
  heap per byte received, before). Without the parts, a 160 KiB message arriving in
  64 KiB pipe reads was copied into the growing buffer (reallocated as it grew), then out
  of it.
- A complete message's body is copied out once into a fresh ``bytes`` object: a
  one-segment message's segment is that object, and the segments of a longer one are
  ``memoryview`` slices of it at multiples of 8 bytes. CPython
  allocates ``bytes`` storage 16-byte aligned, so every segment is 8-byte aligned and
  pycapnp's ``from_segments`` reads it in place (it copies only unaligned segments). The
  views are read-only and stay valid however the decoder's buffer moves afterwards.
- Errors are final: after a :class:`FramingError` the stream position is unknown, so the
  decoder refuses all further work (§1: never skip past a bad message, capnproto #407).
- ``feed_eof()`` marks the end of the stream; a partial message still buffered then makes
  ``next_message()`` raise instead of returning ``None`` forever.

Encoding (:func:`encode_message`, :func:`encode_messages`) builds the header with one
``struct.pack`` and joins header and segments into a single ``bytes`` object, so the
coalescing writer can send many messages with one ``send_all`` (§1 send side).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Final, TypeAlias

from capsvc._build import COMPILED
from capsvc.errors import FramingError, LocalProtocolError
from capsvc.limits import FramingLimits, Limits


def _native_split() -> Callable[[bytearray | bytes, int, int], bytes | None] | None:
    """The C split of the common message (capsvc/codec/_native.c), in the compiled build
    only."""
    if not COMPILED:
        return None
    from capsvc.codec import _native

    return _native.one_segment


# Final: the compiled build keeps these in C statics, with no dict lookup per use.
_SPLIT_ONE: Final = _native_split()

__all__ = [
    "DEFAULT_LIMITS",
    "FrameDecoder",
    "FramingLimits",
    "Limits",
    "Segment",
    "encode_message",
    "encode_messages",
    "read_limits_kwargs",
]

Segment: TypeAlias = bytes | bytearray | memoryview
"""Anything holding one segment's bytes (a whole number of 8-byte words)."""

_WORD: Final = 8
_FIRST_WORD: Final = struct.Struct("<II")  # segment count - 1, size of segment 0 (§1 items 1-2)
_SMALL_BODY: Final = 4096  # bodies up to this size are copied out through a bytearray slice
_LARGE_BODY: Final = 65536  # bodies from this size on are collected in parts while they arrive
_WHOLE_PART: Final = 4096  # a feed this big is one part as it is; smaller ones are gathered


DEFAULT_LIMITS: Final[Limits] = Limits()


def read_limits_kwargs(limits: Limits = DEFAULT_LIMITS) -> dict[str, int]:
    """Keyword arguments for pycapnp readers (``from_segments`` and friends).

    §1: "traversal and nesting (64) limits while reading".
    """
    return {
        "traversal_limit_in_words": limits.traversal_limit_words,
        "nesting_limit": limits.nesting_limit,
    }


def _header_bytes(count: int) -> int:
    """Size of the segment table for ``count`` segments, padding included (§1 items 1-3)."""
    return _WORD * (count // 2 + 1)


class FrameDecoder:
    """Incremental decoder of a stream of framed messages. See the module docstring."""

    __slots__ = (
        "_buf",
        "_eof",
        "_error",
        "_header",
        "_limits",
        "_max_words",
        "_parts",
        "_parts_len",
        "_pending",
        "_pos",
    )

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._max_words = limits.max_message_words
        self._buf = bytearray()
        self._pos = 0  # read offset into _buf: bytes before it are consumed
        self._eof = False
        self._error: FramingError | None = None
        # The validated header of the message at _pos once it has been parsed, kept while
        # its body arrives: (header bytes, segment sizes in words, body bytes).
        self._header: tuple[int, tuple[int, ...], int] | None = None
        # A large body being collected (module docstring): its parts so far, and their
        # bytes; None when no body is being collected (``_buf`` holds everything).
        self._parts: list[bytes | bytearray | memoryview] | None = None
        self._parts_len = 0
        # A fed ``bytes`` object kept as it is while nothing else is buffered (compiled
        # build): when it is one whole message, as a receive most often is, its body is
        # cut out of it with no copy into ``_buf`` and back out.
        self._pending: bytes | None = None

    @property
    def limits(self) -> Limits:
        return self._limits

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as part of a message."""
        buffered = len(self._buf) - self._pos
        pending = self._pending
        if pending is not None:
            buffered += len(pending)
        header = self._header
        if self._parts is not None and header is not None:  # a body being collected
            buffered += header[0] + self._parts_len  # (its header was consumed from _buf)
        return buffered

    @property
    def eof(self) -> bool:
        return self._eof

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the stream (any split is fine)."""
        if self._error is not None:
            raise self._error
        if self._eof:
            raise LocalProtocolError("FrameDecoder.feed() called after feed_eof()")
        if not data:
            return
        parts = self._parts
        header = self._header
        if parts is not None and header is not None and self._parts_len < header[2]:
            # A view's len() counts items, which a cast view makes wider than bytes.
            size = data.nbytes if type(data) is memoryview else len(data)
            last = parts[-1]
            if size >= _WHOLE_PART:
                # Kept as it is (a copy only of a buffer the caller may reuse).
                parts.append(data if type(data) is bytes else bytes(data))
            elif type(last) is bytearray:
                last += data  # small feeds gathered: not an object per feed (memory)
            else:
                parts.append(bytearray(data))
            self._parts_len += size
            return
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._buf += pending
        elif (
            type(data) is bytes
            and not self._buf
            and header is None
            and parts is None
            and _SPLIT_ONE is not None
        ):
            self._pending = data  # (bytes are immutable: nothing to copy)
            return
        self._buf += data

    def feed_eof(self) -> None:
        """The stream has ended; no more data will be fed."""
        self._eof = True

    def next_message(self) -> list[bytes | memoryview] | None:
        """The segments of the next complete message, or ``None`` if more data is needed.

        Raises :class:`FramingError` for a header over the limits, or after ``feed_eof()``
        when an incomplete message is buffered. Once raised, it is raised again by every
        later call.
        """
        if self._error is not None:
            raise self._error
        header = self._header
        one_segment = _SPLIT_ONE
        pending = self._pending
        if pending is not None and one_segment is not None:
            # What one feed brought, alone: a whole one-segment message at its start is
            # cut out of it directly; anything else joins the buffer as any feed does.
            self._pending = None
            body = one_segment(pending, 0, self._max_words)
            if body is not None:
                used = _WORD + len(body)
                if used < len(pending):
                    with memoryview(pending) as view:
                        self._buf += view[used:]
                return [body]
            self._buf += pending
        if header is None and one_segment is not None:
            # The common case in one C call: a whole one-segment message within the limit
            # is here (a new bytes body). Anything else goes the way below.
            body = one_segment(self._buf, self._pos, self._max_words)
            if body is not None:
                self._consume(self._pos + _WORD + len(body))
                return [body]
        if header is None:
            header = self._parse_header()
            if header is None:
                if self._eof and self.buffered:
                    self._fail(
                        "connection closed in the middle of a message "
                        f"({self.buffered} bytes of an incomplete segment table buffered)"
                    )
                return None
            self._header = header
        header_len, sizes, body_len = header
        if self._parts is not None:
            return self._collected(sizes, body_len)
        buf = self._buf
        start = self._pos + header_len
        end = start + body_len
        if len(buf) < end:
            if self._eof:
                self._fail(
                    "connection closed in the middle of a message "
                    f"(received {len(buf) - start} of its {body_len} body bytes)"
                )
            if body_len >= _LARGE_BODY:
                # Collect the rest as it comes: what is here moves out once, and the
                # buffer is left empty for the feeds after the body.
                with memoryview(buf) as view:
                    self._parts = [view[start:].tobytes()]
                self._parts_len = len(buf) - start
                buf.clear()
                self._pos = 0
            return None
        self._header = None
        # Copy the body out into a fresh bytes object: its storage is 16-byte aligned in CPython,
        # so every segment slice below starts on an 8-byte boundary (zero-copy in pycapnp).
        if body_len <= _SMALL_BODY:
            body = bytes(buf[start:end])  # two small copies beat a memoryview's set-up cost
        else:
            with memoryview(buf) as view:
                body = view[start:end].tobytes()
        self._consume(end)
        return _split(body, sizes)

    def _collected(self, sizes: tuple[int, ...], body_len: int) -> list[bytes | memoryview] | None:
        """The message whose large body is being collected, once all of it is here."""
        parts = self._parts
        assert parts is not None
        if self._parts_len < body_len:
            if self._eof:
                self._fail(
                    "connection closed in the middle of a message "
                    f"(received {self._parts_len} of its {body_len} body bytes)"
                )
            return None
        # Feeds stop going to the parts once the body is complete, so whatever lies beyond
        # it is in the last part: back to the (empty) buffer with it.
        excess = self._parts_len - body_len
        if excess:
            last = memoryview(parts[-1])
            parts[-1] = last[: len(last) - excess]
            self._buf[:0] = last[len(last) - excess :]
        body = b"".join(parts)
        self._parts = None
        self._parts_len = 0
        self._header = None
        return _split(body, sizes)

    # -- internals ---------------------------------------------------------------------

    def _fail(self, message: str) -> None:
        self._error = FramingError(message)
        raise self._error

    def _consume(self, end: int) -> None:
        """Mark ``_buf[:end]`` consumed; compact when the dead prefix outweighs the rest."""
        buf = self._buf
        if end >= len(buf):
            buf.clear()
            self._pos = 0
        elif end >= len(buf) - end:
            # The moved tail is no bigger than what was consumed since the last compaction,
            # so each byte is moved at most once on average: linear overall.
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end

    def _parse_header(self) -> tuple[int, tuple[int, ...], int] | None:
        """Parse and validate the segment table at the read offset, if enough is present."""
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if available < _WORD:
            return None
        count_minus_one, first = _FIRST_WORD.unpack_from(buf, pos)
        count = count_minus_one + 1  # at least 1 by construction (§1 item 1)
        limits = self._limits
        # §1 receiver guard: C++ requires fewer than 512 segments (max_segments inclusive).
        if count > limits.max_segments:
            self._fail(
                f"message has {count} segments, over the limit of {limits.max_segments} "
                "(Limits.max_segments)"
            )
        if count == 1:
            self._check_total(first, complete=True)
            return _WORD, (first,), first * _WORD
        header_len = _header_bytes(count)
        if available < header_len:
            # Check the sizes already present: a table announcing too much is refused before
            # the rest of it (let alone the body) arrives (§1: check before allocating).
            present = min(count, (available - 4) // 4)
            self._check_total(sum(struct.unpack_from(f"<{present}I", buf, pos + 4)), complete=False)
            return None
        sizes = struct.unpack_from(f"<{count}I", buf, pos + 4)
        total = sum(sizes)
        self._check_total(total, complete=True)
        return header_len, sizes, total * _WORD

    def _check_total(self, words: int, complete: bool) -> None:
        # §1 receiver guard: total size <= traversal limit (C++: "Message is too large").
        limit = self._limits.max_message_words
        if words > limit:
            what = "announces" if complete else "announces at least"
            self._fail(
                f"message {what} {words} words ({words * _WORD} bytes), over the limit of "
                f"{limit} words (Limits.max_message_words)"
            )


def _split(body: bytes, sizes: tuple[int, ...]) -> list[bytes | memoryview]:
    """A message's segments from its body."""
    if len(sizes) == 1:
        # The bytes themselves, not a view: slicing and decoding a Text from ``bytes``
        # costs half what it does from a memoryview (generated readers, codegen.md §4).
        return [body]
    whole = memoryview(body)
    segments: list[bytes | memoryview] = []
    offset = 0
    for words in sizes:
        size = words * _WORD
        segments.append(whole[offset : offset + size])
        offset += size
    return segments


def _segment_size(segment: Segment) -> int:
    size = segment.nbytes if isinstance(segment, memoryview) else len(segment)
    if size % _WORD:
        raise ValueError(f"segment of {size} bytes is not a whole number of 8-byte words")
    return size // _WORD


def _append_framed(parts: list[Segment], segments: Sequence[Segment]) -> None:
    count = len(segments)
    if count == 0:
        raise ValueError("a message has at least one segment")
    sizes = [_segment_size(segment) for segment in segments]
    # §1: count - 1, the sizes in words, then 4 zero bytes when the count is even.
    padding = "" if count % 2 else "4x"
    parts.append(struct.pack(f"<{count + 1}I{padding}", count - 1, *sizes))
    parts.extend(segments)


_ONE_SEGMENT: Final = struct.Struct("<II")


def encode_message(segments: Sequence[Segment]) -> bytes:
    """One framed message (segment table + bodies) as a single ``bytes`` object."""
    if len(segments) == 1:  # the common case, without the general table builder
        segment = segments[0]
        return _ONE_SEGMENT.pack(0, _segment_size(segment)) + segment
    parts: list[Segment] = []
    _append_framed(parts, segments)
    return b"".join(parts)


def encode_messages(messages: Iterable[Sequence[Segment]]) -> bytes:
    """Several framed messages back to back, in order, as one ``bytes`` (one write)."""
    parts: list[Segment] = []
    for segments in messages:
        _append_framed(parts, segments)
    return b"".join(parts)
