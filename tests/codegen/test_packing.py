"""capsvc.codec.packing against libcapnp's packing (pycapnp), both ways, and hostile input.

Messages are built by pycapnp with a ``List(UInt64)`` of words drawn to exercise every
packing case: zero words and runs of them (up to and past the 256-word limit of one run),
all-ones words followed by words with one zero byte or none (raw runs, past their
255-word limit too), and ordinary words with any pattern of zero bytes.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsvc.codec import packing
from capsvc.errors import DecodeError, FramingError
from capsvc.framing import encode_message
from tests.codegen.conftest import Generated, native_module

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))


NATIVE = native_module()


class _Ways:
    """``pack`` and ``unpack`` one way: in C (what the compiled build runs) with the byte
    shuffle where the CPU has it (``c``) and without (``c-plain``), a word at a time
    (what it falls back on to name a fault) or in bulk passes (the pure-Python build);
    all run in either build here, C wherever it was built."""

    def __init__(self, way: str) -> None:
        self.way = way

    def _c(self) -> Any:
        assert NATIVE is not None
        NATIVE.use_shuffle(self.way == "c")
        return NATIVE

    def pack(self, data: bytes) -> bytes:
        if len(data) & 7 or not data:
            return packing.pack(data)
        if self.way.startswith("c"):
            try:
                return self._c().pack(data)  # type: ignore[no-any-return]
            finally:
                NATIVE.use_shuffle(True)  # type: ignore[union-attr]
        return packing._pack_words(data) if self.way == "words" else packing._pack_bulk(data)

    def unpack(self, data: bytes, max_words: int = packing.DEFAULT_MAX_WORDS) -> bytes:
        if self.way.startswith("c"):
            try:
                words = self._c().unpack(data, max_words)
            finally:
                NATIVE.use_shuffle(True)  # type: ignore[union-attr]
            if words is None:  # C decodes no faulty stream: Python names the fault...
                packing._unpack_words(data, max_words)
                raise AssertionError("C refused a stream Python decodes")  # ...if faulty
            return words  # type: ignore[no-any-return]
        if self.way == "words":
            return packing._unpack_words(data, max_words)
        return packing._unpack_bulk(data, max_words)


WAYS = [
    pytest.param(_Ways(way), id=way)
    for way in (["c", "c-plain"] if NATIVE is not None else []) + ["words", "bulk"]
]


@pytest.fixture(scope="module")
def lists(generated: Generated) -> Any:
    # pycapnp's kitchen.capnp as conftest loaded it (loading a schema twice aborts libcapnp)
    return generated.reference.Lists


def _word(mask: int, fill: int) -> int:
    """A word whose byte ``i`` is non-zero exactly when bit ``i`` of ``mask`` is set."""
    return sum(((fill + 31 * i) % 255 + 1) << (8 * i) for i in range(8) if mask >> i & 1)


# A run of identical-shaped words: (how many, which bytes are non-zero, their values).
_RUN = st.tuples(
    st.sampled_from([1, 2, 3, 255, 256, 257, 600]),
    st.one_of(st.sampled_from([0x00, 0xFF, 0x7F, 0xFE, 0xEF, 0x01, 0x80]), st.integers(0, 255)),
    st.integers(0, 254),
)
WORDS = st.lists(_RUN, max_size=8).map(
    lambda runs: [_word(mask, fill + k) for count, mask, fill in runs for k in range(count)]
)


def _message(lists: Any, words: list[int]) -> Any:
    message = lists.new_message()
    message.init("u64s", len(words))
    for index, word in enumerate(words):
        message.u64s[index] = word
    return message


@pytest.mark.parametrize("way", WAYS)
def test_pack_writes_what_libcapnp_writes(lists: Any, way: _Ways) -> None:
    @SETTINGS
    @given(words=WORDS)
    def check(words: list[int]) -> None:
        message = _message(lists, words)
        framed = message.to_bytes()
        message.clear_write_flag()
        packed = way.pack(framed)
        assert packed == message.to_bytes_packed()  # byte for byte: the same choices
        assert list(lists.from_bytes_packed(packed).u64s) == words

    check()


def test_the_public_pack_is_libcapnps(lists: Any) -> None:
    message = _message(lists, [0, 0, 1, 2**64 - 1, 0x0100000000000001])
    framed = message.to_bytes()
    message.clear_write_flag()
    packed = packing.pack(framed)
    assert packed == message.to_bytes_packed()
    message.clear_write_flag()
    assert packing.unpack(packed) == message.to_bytes()


@pytest.mark.parametrize("way", WAYS)
def test_unpack_reads_what_libcapnp_writes(lists: Any, way: _Ways) -> None:
    @SETTINGS
    @given(words=WORDS)
    def check(words: list[int]) -> None:
        message = _message(lists, words)
        packed = message.to_bytes_packed()
        message.clear_write_flag()
        assert way.unpack(packed) == message.to_bytes()

    check()


@pytest.mark.parametrize("way", WAYS)
def test_arbitrary_words_round_trip(way: _Ways) -> None:
    @SETTINGS
    @given(data=st.binary(max_size=400).map(lambda b: b[: len(b) & ~7]))
    def check(data: bytes) -> None:
        assert way.unpack(way.pack(data)) == data
        assert way.pack(data) == _Ways("bulk" if way.way != "bulk" else "words").pack(data)

    check()


@pytest.mark.parametrize("way", WAYS)
def test_non_canonical_encodings_unpack(way: _Ways) -> None:
    unpack = way.unpack
    # A writer may mark zero bytes as present, and use runs of length 0.
    assert unpack(bytes([0x03, 0, 7])) == bytes([0, 7, 0, 0, 0, 0, 0, 0])
    assert unpack(bytes([0xFF, *range(1, 9), 0])) == bytes(range(1, 9))
    assert unpack(bytes([0x00, 0, 0x00, 1])) == bytes(24)
    assert unpack(bytes([0xFF, *range(1, 9), 1, *range(8)])) == bytes(range(1, 9)) + bytes(range(8))


def test_pack_needs_whole_words() -> None:
    with pytest.raises(ValueError, match="whole words"):
        packing.pack(b"1234567")
    assert packing.pack(b"") == b""
    assert packing.unpack(b"") == b""


@pytest.mark.parametrize(
    "data",
    [
        bytes([0x01]),  # a tag without its byte
        bytes([0x0F, 1, 2]),  # four bytes promised, two there
        bytes([0x00]),  # a zero run without its count
        bytes([0xFF, 1, 2, 3]),  # an all-ones word cut short
        bytes([0xFF, *range(1, 9)]),  # ... without its raw count
        bytes([0xFF, *range(1, 9), 2, *range(8)]),  # two raw words promised, one there
        bytes([0x02, 5, 0xFF]),  # a good word, then a truncated one
    ],
)
@pytest.mark.parametrize("way", WAYS)
def test_truncated_input_is_a_decode_error(data: bytes, way: _Ways) -> None:
    with pytest.raises(DecodeError, match="ends inside"):
        way.unpack(data)


@pytest.mark.parametrize("way", WAYS)
def test_zero_runs_cannot_exceed_the_limit(way: _Ways) -> None:
    # Two bytes make 256 words: a small hostile input asks for a lot of memory.
    bomb = bytes([0x00, 255]) * 4096  # 8 KiB in, 8 MiB out
    with pytest.raises(DecodeError, match="more than 1000 words"):
        way.unpack(bomb, max_words=1000)
    assert len(way.unpack(bomb[:8], max_words=1024)) == 1024 * 8


@pytest.mark.parametrize("way", WAYS)
def test_ordinary_words_count_against_the_limit(way: _Ways) -> None:
    unpack = way.unpack
    with pytest.raises(DecodeError, match="more than 3 words"):
        unpack(bytes([0x01, 9]) * 4, max_words=3)
    with pytest.raises(DecodeError, match="more than 3 words"):
        unpack(bytes([0xFF, *range(1, 9), 3, *bytes(24)]), max_words=3)
    assert unpack(bytes([0x01, 9]) * 3, max_words=3) == bytes([9, 0, 0, 0, 0, 0, 0, 0]) * 3


@pytest.mark.parametrize("way", WAYS)
def test_a_limit_beyond_a_machine_word_is_no_limit(way: _Ways) -> None:
    # The compiled unpacker counts words in machine integers: a limit too large for one
    # (here 2**70) must not overflow, it just never binds.
    assert way.unpack(bytes([0x00, 3]), max_words=1 << 70) == bytes(32)


@pytest.mark.skipif(NATIVE is None, reason="no C compiler here: there is no C unpacker")
@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=300), max_words=st.sampled_from([0, 1, 5, 64, 1 << 20]))
def test_c_and_python_unpack_any_bytes_alike(data: bytes, max_words: int) -> None:
    """Any bytes at all: C decodes exactly what Python decodes, and gives up (for Python
    to name the fault) exactly where Python raises."""
    assert NATIVE is not None
    try:
        expected: bytes | None = packing._unpack_words(data, max_words)
    except DecodeError:
        expected = None
    assert NATIVE.unpack(data, max_words) == expected
    NATIVE.use_shuffle(False)
    try:
        assert NATIVE.unpack(data, max_words) == expected  # the plain loop too
    finally:
        NATIVE.use_shuffle(True)


@pytest.mark.skipif(NATIVE is None, reason="no C compiler here: there is no C packer")
@pytest.mark.parametrize("words", [100, 104_857, 104_858, 140_000], ids=str)
def test_c_packs_large_messages_as_python_does(words: int) -> None:
    """Messages either side of the C packer's scratch buffer limit (1 MiB of worst-case
    output, about 104,857 words: smaller ones are packed in it, then copied out; larger in
    place): the same bytes as Python's packer, the framed form too, and they unpack."""
    assert NATIVE is not None
    rng = random.Random(words)
    kinds = (0, 0xFF, 0x0F, 0xF0, 0x81)
    data = b"".join(
        _word(rng.choice(kinds) if rng.random() < 0.7 else rng.randrange(256), n).to_bytes(
            8, "little"
        )
        for n in range(words)
    )
    assert NATIVE.pack(data) == packing._pack_words(data)
    framed = NATIVE.pack_framed(data)
    assert framed == packing._pack_words(encode_message([data]))
    assert NATIVE.unpack_segment(framed, packing.DEFAULT_MAX_WORDS) == data


def _general_segment(data: bytes, max_words: int) -> bytes | None:
    """What the general way reads from a packed framed message: its one segment, or None
    (a fault, or several segments)."""
    from capsvc.codec.reading import unframe

    try:
        segments = unframe(packing._unpack_words(data, max_words))
    except (DecodeError, FramingError):
        return None
    return bytes(segments[0]) if len(segments) == 1 else None


#: A packed segment table for a segment of 0..40 words, then anything: most such streams
#: get past the table into the checked decoding of the segment.
_TABLE_THEN_ANYTHING = st.tuples(st.integers(0, 40), st.binary(max_size=300)).map(
    lambda pair: packing.pack(encode_message([bytes(pair[0] * 8)])[:8]) + pair[1]
)


@pytest.mark.skipif(NATIVE is None, reason="no C compiler here: there is no C unpacker")
@settings(max_examples=500, deadline=None)
@given(
    data=st.one_of(st.binary(max_size=300), _TABLE_THEN_ANYTHING),
    max_words=st.sampled_from([0, 1, 5, 64, 1 << 20]),
)
def test_c_unpack_segment_reads_only_what_the_general_way_reads(
    data: bytes, max_words: int
) -> None:
    """``unpack_segment`` (one pass, every read and write checked) on any bytes: what it
    returns is what the general way reads; None where that way faults (which it then
    names). Both loops, shuffle and plain."""
    assert NATIVE is not None
    expected = _general_segment(data, max_words)
    for shuffle in (True, False):
        NATIVE.use_shuffle(shuffle)
        try:
            found = NATIVE.unpack_segment(data, max_words)
        finally:
            NATIVE.use_shuffle(True)
        if expected is None:
            assert found is None
        else:
            assert found in (None, expected)  # None: a table packed unusually, left to Python


@pytest.fixture(params=["c", "python"] if NATIVE is not None else ["python"])
def message_way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``pack_message`` and ``unpack_message`` in C (in either build, where it was built)
    or in Python."""
    monkeypatch.setattr(packing, "_native", NATIVE if request.param == "c" else None)
    way: str = request.param
    return way


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(segment=WORDS.map(lambda words: b"".join(w.to_bytes(8, "little") for w in words)))
def test_a_framed_message_packs_and_unpacks_without_the_framed_copy(
    message_way: str, segment: bytes
) -> None:
    """``pack_message`` (``to_bytes_packed``) writes what packing the framed message writes,
    and ``unpack_message`` (``from_bytes_packed``) gives back the segment in C (None in
    Python: the general way reads it)."""
    framed = encode_message([segment])
    packed = packing.pack_message(segment)
    assert packed == packing.pack(framed)
    assert packing.unpack(packed) == framed
    found = packing.unpack_message(packed)
    assert found == ([segment] if message_way == "c" else None)


@pytest.mark.parametrize(
    "framed",
    [
        encode_message([b"\x01" * 8, b"\x02" * 16]),  # two segments: the general way's
        b"\x00\x00\x00\x00\x05\x00\x00\x00" + b"\x01" * 8,  # a table promising more words
        b"\x00\x00\x00\x00\x00\x00\x00\x00\x07" * 1,  # not whole words
    ],
    ids=["two segments", "short of its table", "ragged"],
)
def test_what_unpack_message_cannot_read_is_left_to_the_general_way(
    message_way: str, framed: bytes
) -> None:
    packed = packing.pack(framed + bytes(-len(framed) % 8))
    assert packing.unpack_message(packed) is None
    assert packing.unpack_message(packed[:-1]) is None  # truncated
