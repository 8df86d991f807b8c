"""Tests for capsvc.framing: stream framing round trips, arbitrary splits, limits, alignment."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path
from typing import Any

import capnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capsvc.errors import FramingError, LocalProtocolError
from capsvc.framing import (
    DEFAULT_LIMITS,
    FrameDecoder,
    FramingLimits,
    encode_message,
    encode_messages,
    read_limits_kwargs,
)

testing = capnp.load(str(Path(__file__).parent / "schemas" / "testing.capnp"))

MARKER = 0x5EC7E7AB  # a distinctive Int32 we can find in the encoded bytes


# -- helpers ---------------------------------------------------------------------------


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer``: lets the tests read the address behind any buffer."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def buffer_address(obj: Any) -> int:
    """The memory address of the first byte of a buffer (what pycapnp's alignment test sees)."""
    view = _PyBuffer()
    _get_buffer(obj, ctypes.byref(view), 0)  # PyBUF_SIMPLE, as pycapnp asks
    try:
        return view.buf or 0
    finally:
        _release_buffer(ctypes.byref(view))


def drain(decoder: FrameDecoder) -> list[list[bytes]]:
    out = []
    while (message := decoder.next_message()) is not None:
        out.append([bytes(segment) for segment in message])
    return out


def holder(n: int, *, first_segment_words: int | None = None) -> Any:
    kwargs = {} if first_segment_words is None else {"num_first_segment_words": first_segment_words}
    message = testing.Holder.new_message(**kwargs)
    message.name = f"holder number {n} " * (n % 5 + 1)
    message.extra.number = MARKER
    items = message.init("items", n % 4)
    for i, item in enumerate(items):
        item.name = "x" * (i * 9)
    return message


def serialize(message: Any) -> tuple[list[bytes], bytes]:
    """pycapnp's own segments and framed bytes of one builder.

    pycapnp warns (an error under filterwarnings=error) when a builder is serialized twice,
    because re-setting fields after a write leaks space; we do not, so clear the flag.
    """
    segments = list(message.to_segments())
    message.clear_write_flag()
    return segments, message.to_bytes()


def header(sizes: list[int]) -> bytes:
    """A raw segment table (§1), independent of the code under test."""
    raw = struct.pack(f"<{len(sizes) + 1}I", len(sizes) - 1, *sizes)
    return raw + b"\0" * (-len(raw) % 8)


def raw_message(sizes: list[int], fill: int = 0xAB) -> bytes:
    return header(sizes) + bytes([fill]) * (8 * sum(sizes))


# -- sanity of the test helper itself ----------------------------------------------------


def test_buffer_address_helper_agrees_with_ctypes() -> None:
    data = bytes(range(64))
    expected = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    assert expected is not None
    assert buffer_address(data) == expected
    assert buffer_address(memoryview(data)[24:]) == expected + 24


# -- encoding ------------------------------------------------------------------------------


def test_encode_single_segment_matches_pycapnp() -> None:
    segments, framed = serialize(holder(3))
    assert len(segments) == 1
    assert encode_message(segments) == framed


@pytest.mark.parametrize("first_words", [1, 2, 3, 5])
def test_encode_multi_segment_matches_pycapnp(first_words: int) -> None:
    segments, framed = serialize(holder(7, first_segment_words=first_words))
    assert len(segments) > 1
    assert encode_message(segments) == framed
    # every kind of segment container is accepted
    assert encode_message([bytearray(s) for s in segments]) == framed
    assert encode_message([memoryview(s) for s in segments]) == framed


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6])
def test_header_padding(count: int) -> None:
    sizes = list(range(count))
    segments = [bytes([i]) * (8 * i) for i in sizes]
    encoded = encode_message(segments)
    assert encoded == header(sizes) + b"".join(segments)
    assert len(header(sizes)) % 8 == 0


def test_encode_messages_is_concatenation() -> None:
    messages = [holder(i, first_segment_words=2).to_segments() for i in range(5)]
    assert encode_messages(messages) == b"".join(encode_message(m) for m in messages)
    assert encode_messages([]) == b""


def test_encode_rejects_bad_segments() -> None:
    with pytest.raises(ValueError, match="at least one segment"):
        encode_message([])
    with pytest.raises(ValueError, match="12 bytes"):
        encode_message([b"\0" * 8, b"\0" * 12])


# -- decoding ------------------------------------------------------------------------------


def test_decode_pycapnp_bytes_and_read_back() -> None:
    for first_words in (None, 2):
        message = holder(6, first_segment_words=first_words)
        expected, framed = serialize(message)
        decoder = FrameDecoder()
        decoder.feed(framed)
        segments = decoder.next_message()
        assert segments is not None
        assert [bytes(s) for s in segments] == expected
        reader = testing.Holder.from_segments(segments, **read_limits_kwargs(DEFAULT_LIMITS))
        assert reader.name == message.name
        assert reader.extra.number == MARKER
        assert [item.name for item in reader.items] == [item.name for item in message.items]
        assert decoder.next_message() is None
        assert decoder.buffered == 0


def test_decode_one_byte_at_a_time() -> None:
    messages = [serialize(holder(i, first_segment_words=(2 if i % 2 else None))) for i in range(6)]
    stream = b"".join(framed for _, framed in messages)
    decoder = FrameDecoder()
    got: list[list[bytes]] = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        got.extend(drain(decoder))
    assert got == [segments for segments, _ in messages]
    assert decoder.buffered == 0


segment_lists = st.lists(
    st.lists(
        st.binary(max_size=40).map(lambda b: b + b"\0" * (-len(b) % 8)), min_size=1, max_size=6
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(messages=segment_lists, data=st.data())
def test_random_splits(messages: list[list[bytes]], data: st.DataObject) -> None:
    stream = encode_messages(messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    assert _fed_in_pieces(stream, cuts) == messages


def _fed_in_pieces(
    stream: bytes, cuts: list[int], after_each: Any = None
) -> list[list[bytes | memoryview]]:
    """The messages a decoder gives for ``stream`` fed in pieces ending at ``cuts`` (and at
    the end), then the end of the stream; ``after_each(decoder, cut, got)`` checks it
    after each piece."""
    decoder = FrameDecoder()
    got: list[list[bytes | memoryview]] = []
    previous = 0
    for cut in [*cuts, len(stream)]:
        decoder.feed(stream[previous:cut])
        previous = cut
        got.extend(drain(decoder))
        if after_each is not None:
            after_each(decoder, cut, got)
    decoder.feed_eof()
    assert decoder.next_message() is None
    return got


def test_large_message_in_small_chunks() -> None:
    # 4 MiB in 4 KiB feeds: with quadratic copying this would move gigabytes.
    body = bytes(range(256)) * (4 * 1024 * 4)
    stream = encode_message([body, body[: 8 * 1000]])
    decoder = FrameDecoder()
    got = []
    for i in range(0, len(stream), 4096):
        decoder.feed(stream[i : i + 4096])
        got.extend(drain(decoder))
    assert got == [[body, body[: 8 * 1000]]]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([1, 7, 8191, 8192, 8193, 20_000, 70_000]), max_size=4),
    data=st.data(),
)
def test_large_bodies_collected_from_any_split(sizes: list[int], data: st.DataObject) -> None:
    """Bodies of 64 KiB and more are collected in parts while they arrive (framing.py): any
    split of a stream of large and small messages, feeds that end a body and start the
    next message included, gives back every message whole, in order, aligned."""
    messages = [
        [bytes([index + 1]) * (8 * words), bytes(8 * (index % 3))]
        for index, words in enumerate(sizes)
    ]
    stream = encode_messages(messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))

    def check(decoder: FrameDecoder, cut: int, got: list[list[bytes | memoryview]]) -> None:
        returned = sum(len(encode_message(m)) for m in messages[: len(got)])
        assert decoder.buffered == cut - returned  # every byte not returned yet

    got = _fed_in_pieces(stream, cuts, check)
    assert got == messages
    for segments in got:
        assert all(buffer_address(segment) % 8 == 0 for segment in segments)


def test_a_large_body_cut_short_by_the_end_of_the_stream() -> None:
    stream = encode_message([bytes(8 * 10_000)])
    decoder = FrameDecoder()
    decoder.feed(stream[:30_000])
    assert decoder.next_message() is None
    decoder.feed(stream[30_000:70_000])  # collected: not in the buffer
    assert decoder.next_message() is None
    assert decoder.buffered == 70_000
    decoder.feed_eof()
    with pytest.raises(FramingError, match="received 69992 of its 80000 body bytes"):
        decoder.next_message()


def test_zero_word_message_is_legal_framing() -> None:
    decoder = FrameDecoder()
    decoder.feed(header([0]) + header([0, 0, 0]))
    first = decoder.next_message()
    second = decoder.next_message()
    assert first is not None
    assert [len(s) for s in first] == [0]
    assert second is not None
    assert [len(s) for s in second] == [0, 0, 0]
    assert decoder.next_message() is None


def test_segments_survive_later_feeds() -> None:
    decoder = FrameDecoder()
    one, two = holder(1).to_bytes(), holder(2).to_bytes()
    decoder.feed(one + two[:5])
    segments = decoder.next_message()
    assert segments is not None
    decoder.feed(two[5:] + b"\0" * 100_000)  # forces the internal buffer to move
    assert decoder.next_message() is not None
    assert bytes(segments[0]) == one[8:]


# -- alignment -----------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    skew=st.integers(0, 7),
    first_words=st.integers(1, 6),
    n=st.integers(0, 20),
    piece=st.integers(1, 600),
)
def test_segments_are_8_byte_aligned(skew: int, first_words: int, n: int, piece: int) -> None:
    framed = raw_message([1]) + holder(n, first_segment_words=first_words).to_bytes()
    # Feed memoryviews that start at a misaligned address, in arbitrary pieces.
    backing = memoryview(b"\0" * skew + framed)[skew:]
    decoder = FrameDecoder()
    messages = []
    for i in range(0, len(framed), piece):
        decoder.feed(backing[i : i + piece])
        while (message := decoder.next_message()) is not None:
            messages.append(message)
    assert len(messages) == 2
    for segments in messages:
        for segment in segments:
            assert buffer_address(segment) % 8 == 0


def test_pycapnp_reads_segments_in_place() -> None:
    """End to end: the reader sees a change made to our segment afterwards, so no copy."""
    message = holder(3, first_segment_words=2)
    decoder = FrameDecoder()
    decoder.feed(message.to_bytes())
    segments = decoder.next_message()
    assert segments is not None
    reader = testing.Holder.from_segments(segments)
    assert reader.extra.number == MARKER
    marker = struct.pack("<i", MARKER)
    (where,) = [(i, bytes(s).index(marker)) for i, s in enumerate(segments) if marker in bytes(s)]
    index, offset = where
    ctypes.memmove(buffer_address(segments[index]) + offset, struct.pack("<i", 12345), 4)
    assert reader.extra.number == 12345


# -- limits ----------------------------------------------------------------------------------


def test_default_limits_match_cpp() -> None:
    assert DEFAULT_LIMITS == FramingLimits()
    assert DEFAULT_LIMITS.max_segments == 511  # C++: fewer than 512 segments
    assert DEFAULT_LIMITS.max_message_words == 8 * 1024 * 1024
    assert read_limits_kwargs() == {
        "traversal_limit_in_words": 8 * 1024 * 1024,
        "nesting_limit": 64,
    }
    assert read_limits_kwargs(FramingLimits(traversal_limit_words=10, nesting_limit=3)) == {
        "traversal_limit_in_words": 10,
        "nesting_limit": 3,
    }


@pytest.mark.parametrize("field", ["max_segments", "traversal_limit_words", "nesting_limit"])
def test_limits_validated(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        FramingLimits(**{field: 0})
    with pytest.raises(ValueError, match="max_message_words"):
        FramingLimits(max_message_words=-1)


def test_segment_count_at_and_over_the_default_limit() -> None:
    decoder = FrameDecoder()
    decoder.feed(raw_message([0] * 511))
    segments = decoder.next_message()
    assert segments is not None
    assert len(segments) == 511
    decoder.feed(header([0] * 512)[:8])  # only the first word: the count is enough
    with pytest.raises(FramingError, match=r"512 segments.*limit of 511"):
        decoder.next_message()


@pytest.mark.parametrize("limit", [1, 2, 3, 4])
def test_segment_count_custom_limit(limit: int) -> None:
    decoder = FrameDecoder(FramingLimits(max_segments=limit))
    decoder.feed(raw_message([1] * limit))
    assert decoder.next_message() is not None
    decoder.feed(raw_message([1] * (limit + 1)))
    with pytest.raises(
        FramingError, match=rf"^message has {limit + 1} segments, over the limit of {limit} "
    ):
        decoder.next_message()


def test_huge_segment_count_refused_from_first_word() -> None:
    decoder = FrameDecoder()
    decoder.feed(struct.pack("<II", 0xFFFF_FFFF, 0))
    with pytest.raises(FramingError, match=r"^message has 4294967296 segments, over the limit"):
        decoder.next_message()


@pytest.mark.parametrize("sizes", [[10], [4, 6], [3, 3, 4], [0, 0, 0, 10]])
def test_total_size_at_and_over_limit(sizes: list[int]) -> None:
    limits = FramingLimits(max_message_words=10)
    decoder = FrameDecoder(limits)
    decoder.feed(raw_message(sizes))
    segments = decoder.next_message()
    assert segments is not None
    assert [len(s) // 8 for s in segments] == sizes
    over = [*sizes[:-1], sizes[-1] + 1]
    decoder.feed(raw_message(over))
    with pytest.raises(FramingError, match=r"11 words \(88 bytes\).*limit of 10 words"):
        decoder.next_message()


def test_huge_body_refused_from_header_alone() -> None:
    decoder = FrameDecoder()
    decoder.feed(header([0xFFFF_FFFF]))  # 32 GiB announced, nothing else sent
    with pytest.raises(FramingError, match=r"^message announces 4294967295 words \("):
        decoder.next_message()
    assert decoder.buffered == 8


def test_huge_body_refused_before_the_table_is_complete() -> None:
    decoder = FrameDecoder()
    table = header([1, 0xFFFF_FFFF, 1])
    decoder.feed(table[:9])
    assert decoder.next_message() is None  # only segment 0's size is known: 1 word
    decoder.feed(table[9:12])
    with pytest.raises(FramingError, match=r"^message announces at least 4294967296 words"):
        decoder.next_message()


def test_default_total_limit_at_and_over() -> None:
    limit = DEFAULT_LIMITS.max_message_words
    decoder = FrameDecoder()
    decoder.feed(header([limit - 1, 1]))
    assert decoder.next_message() is None  # legal: waiting for 64 MiB of body
    decoder = FrameDecoder()
    decoder.feed(header([limit - 1, 2]))
    with pytest.raises(FramingError, match=rf"^message announces {limit + 1} words \("):
        decoder.next_message()


def test_errors_are_final() -> None:
    decoder = FrameDecoder(FramingLimits(max_segments=1))
    decoder.feed(header([1, 1]))
    with pytest.raises(FramingError) as first:
        decoder.next_message()
    with pytest.raises(FramingError) as again:
        decoder.next_message()
    assert again.value is first.value
    with pytest.raises(FramingError):
        decoder.feed(raw_message([1]))


# -- end of stream ---------------------------------------------------------------------------


def test_clean_eof() -> None:
    decoder = FrameDecoder()
    decoder.feed(raw_message([1]))
    decoder.feed_eof()
    assert decoder.eof
    assert decoder.next_message() is not None  # a complete message is still delivered
    assert decoder.next_message() is None
    assert decoder.next_message() is None


@pytest.mark.parametrize(
    ("cut", "detail"),
    [
        (3, "3 bytes of an incomplete segment table"),
        (12, "12 bytes of an incomplete segment table"),
        (16, "received 0 of its 24 body bytes"),
        (39, "received 23 of its 24 body bytes"),
    ],
)
def test_truncated_stream(cut: int, detail: str) -> None:
    stream = raw_message([1, 2])
    assert len(stream) == 40
    decoder = FrameDecoder()
    decoder.feed(raw_message([1]) + stream[:cut])
    assert decoder.next_message() is not None
    assert decoder.next_message() is None
    decoder.feed_eof()
    with pytest.raises(FramingError, match="connection closed in the middle of a message") as e:
        decoder.next_message()
    assert detail in str(e.value)


def test_feed_after_eof_is_a_local_error() -> None:
    decoder = FrameDecoder()
    decoder.feed_eof()
    with pytest.raises(LocalProtocolError):
        decoder.feed(b"x")


# -- memory bound --------------------------------------------------------------------------


def test_buffer_stays_bounded() -> None:
    chunk = 65536
    messages = [
        raw_message([size % 7, size % 1000 + 1], fill=size % 256) for size in range(0, 40000, 97)
    ]
    messages.append(raw_message([20000]))  # one message bigger than a chunk
    stream = b"".join(messages)
    biggest = max(len(m) for m in messages)
    decoder = FrameDecoder()
    count = 0
    peak = 0
    for i in range(0, len(stream), chunk):
        decoder.feed(stream[i : i + chunk])
        peak = max(peak, decoder.buffered, len(decoder._buf))
        count += len(drain(decoder))
        # after draining, at most one partial message remains
        assert decoder.buffered < biggest
        # the consumed prefix is never bigger than what is still unread
        assert len(decoder._buf) <= 2 * decoder.buffered + 8 or decoder._pos == 0
    assert count == len(messages)
    assert peak <= biggest + chunk


def test_a_large_body_fed_a_byte_at_a_time_holds_about_its_size() -> None:
    """A large body (collected in parts) that arrives one byte per feed, as a peer
    dribbling one packet per byte makes it: the decoder holds about the bytes received,
    not an object per feed (it held 42 bytes of heap per byte before)."""
    import tracemalloc

    body = bytes(range(256)) * 1024  # 256 KiB: over _LARGE_BODY
    message = struct.pack("<II", 0, len(body) // 8) + body
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        decoder.feed(message[:4096])
        assert decoder.next_message() is None
        for at in range(4096, len(message) - 1):
            decoder.feed(message[at : at + 1])
        assert decoder.next_message() is None
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoder.buffered == len(message) - 1
    assert held < 3 * len(message)
    decoder.feed(message[-1:])
    assert decoder.next_message() == [body]


@pytest.mark.parametrize("size", [1000, 200_000])
def test_a_cast_memoryview_feeds_its_bytes(size: int) -> None:
    """A memoryview whose items are wider than a byte (``cast("Q")``) is fed as the bytes
    it holds, on the buffered path and on the large-body path alike."""
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    body += bytes(-len(body) % 8)
    message = struct.pack("<II", 0, len(body) // 8) + body
    decoder = FrameDecoder()
    decoder.feed(message[:8192] if size > 8192 else message[:8])
    fed = len(message[:8192]) if size > 8192 else 8
    assert decoder.next_message() is None
    view = memoryview(bytearray(message[fed:])).cast("Q")
    for at in range(0, len(view), 512):
        decoder.feed(view[at : at + 512])
    assert decoder.next_message() == [body]
    assert decoder.buffered == 0
