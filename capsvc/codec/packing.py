"""Cap'n Proto packing: the packed encoding of a message's words, both ways.

Strategy: the packed encoding (capnproto.org/encoding.html#packing) turns every 8-byte
word into a *tag* byte whose bit ``i`` says that byte ``i`` of the word is non-zero,
followed by those non-zero bytes. Two tags are special: ``0x00`` is followed by a count
of further all-zero words (0..255) that it stands for too, and ``0xff`` is followed by
its 8 bytes, then a count of further words (0..255) copied raw, uncompressed.

``pack`` writes exactly what libcapnp writes (the tests compare the bytes): after an
all-zero word it counts the zero words that follow, and after an ``0xff`` word the words
that follow with at most one zero byte (where packing stops paying). It works in bulk,
with a constant number of C-level operations for the whole message plus a few per
special run, never a Python step per word:

1. *Tags.* ``translate`` maps every byte to 0 or 1, ``int.from_bytes`` makes the whole
   message one integer in which byte ``i`` of word ``w`` is bit ``64w + 8i``. OR-ing it
   with itself shifted right by 7, then 14, then 28 bits moves byte ``i``'s bit to bit
   ``64w + i``, and nothing else lands in a word's low byte: every eighth byte of the
   result is a word's tag.
2. *Ordinary words.* Every word is laid out as its tag followed by its 8 bytes (nine-byte
   slots filled by extended-slice assignment), and deleting every zero byte leaves each
   word's tag and non-zero bytes, in order: a word's packed form. An all-zero word leaves
   nothing and an ``0xff`` word leaves its nine bytes.
3. *Special runs* (a regular expression over the tags: runs of zero words, and an
   ``0xff`` word with its raw followers) are cut into that stream: ``0x00`` and a count,
   or ``0xff``, 8 bytes, a count and the raw words. Where each run starts in the stream
   of step 2 is the sum of the packed sizes of the words before it (``sum`` over a
   translated slice of the tags).

The compiled build (capsvc/_build.py) does both a word at a time instead, in C
(capsvc/codec/_native.c: the same loops, the same bytes), with ``_pack_words`` and
``_unpack_words`` on machine integers behind them (a stream C cannot decode is decoded
there again, to name the fault); that is several times faster there than the bulk
passes, which are faster in pure Python.

``unpack`` reads any valid packed stream (from libcapnp, from ``pack``, or another
writer's choices, such as tags that mark zero bytes as present). Decoding is sequential
(where a tag is depends on every tag before it), so one Python step per tag finds the
next one and notes two ``struct`` format pieces: how to read this word's encoding (skip
the tag, then its bytes; for a run, its count and raw words) and how to write its word
(its bytes where its bits are set, zero bytes elsewhere). Then one ``unpack`` reads every
stored byte of the whole stream and one ``pack`` writes every word. Hostile input gets
:class:`~capsvc.errors.DecodeError`: a truncated stream, or an output beyond
``max_words`` (a zero run makes 2 input bytes into up to 2 KiB; the limit is checked as
runs are met, so memory and work stay bounded by ``max_words`` and the input's size).
"""

from __future__ import annotations

import re
import struct
from typing import Any, Final

from librt.strings import BytesWriter, read_i64_le, write_i64_le

from capsvc._build import COMPILED
from capsvc._mypyc import i64, u8
from capsvc.errors import DecodeError

__all__ = ["DEFAULT_MAX_WORDS", "pack", "pack_message", "unpack", "unpack_message"]

#: The C loops (capsvc/codec/_native.c), in the compiled build only.
_native: Any = None
if COMPILED:
    from capsvc.codec import _native

#: The most words ``unpack`` produces unless told otherwise: libcapnp's default traversal
#: limit (8 Mi words, 64 MiB), the largest message a reader would accept anyway.
DEFAULT_MAX_WORDS: Final = 8 * 1024 * 1024

_POPCOUNT: Final = bytes(bin(byte).count("1") for byte in range(256))
#: Every non-zero byte to 1: one bit per byte, for the tag gathering of ``pack``.
_NONZERO: Final = bytes([0]) + bytes([1]) * 255
#: The size of each tag's word in the zero-deleted slot stream of ``pack``.
_SLOT_SIZE: Final = bytes([0]) + bytes(1 + count for count in _POPCOUNT[1:])
#: A special run: up to 256 zero words, or an all-ones word and up to 255 words that
#: have at most one zero byte (tags with 7 or 8 bits set), as libcapnp chooses.
_FEW_ZEROS: Final = bytes(tag for tag in range(256) if _POPCOUNT[tag] >= 7)
_SPECIAL: Final = re.compile(b"\\x00{1,256}|\\xff[" + re.escape(_FEW_ZEROS) + b"]{0,255}")


def _tags(data: bytes | bytearray) -> bytes:
    """Every word's tag, in order (module docstring, step 1)."""
    bits = int.from_bytes(data.translate(_NONZERO), "little")
    bits |= bits >> 7
    bits |= bits >> 14
    bits |= bits >> 28
    return bits.to_bytes(len(data), "little")[::8]


def _slots(tags: bytes, data: bytes | bytearray) -> bytearray:
    """Every word as its tag and non-zero bytes (module docstring, step 2)."""
    slots = bytearray(len(tags) * 9)
    slots[::9] = tags
    for index in range(8):
        slots[index + 1 :: 9] = data[index::8]
    return slots.replace(b"\x00", b"")


def pack(data: bytes | bytearray | memoryview) -> bytes:
    """The packed encoding of ``data``, a whole number of words (a framed message, or
    segments): the same bytes libcapnp writes."""
    if len(data) & 7:
        raise ValueError(f"packing needs whole words, got {len(data)} bytes")
    if not data:
        return b""
    if COMPILED:
        whole = data if isinstance(data, bytes) else bytes(data)
        if _native is not None:
            return _native.pack(whole)  # type: ignore[no-any-return]
        return _pack_words(whole)
    return _pack_bulk(data if isinstance(data, bytes | bytearray) else bytes(data))


def pack_message(segment: bytes | bytearray) -> bytes:
    """The packed encoding of a one-segment message in the stream framing (what
    ``to_bytes_packed`` sends): ``pack(encode_message([segment]))``, in C without the
    framed copy in between where the compiled build has it."""
    if _native is not None:
        return _native.pack_framed(segment)  # type: ignore[no-any-return]
    from capsvc.framing import encode_message

    return pack(encode_message([segment]))


def unpack_message(data: bytes | bytearray | memoryview) -> list[bytes] | None:
    """The one segment of a packed message in the stream framing, decoded in C without
    the unpacked copy in between (the compiled build); None where that does not apply (no
    C, several segments, a fault): the caller unpacks and unframes it the general way,
    which names any fault."""
    if _native is None or type(data) is not bytes:
        return None
    segment = _native.unpack_segment(data, DEFAULT_MAX_WORDS)
    return None if segment is None else [segment]


def _pack_bulk(data: bytes | bytearray) -> bytes:
    """``pack`` in bulk passes (the pure-Python build; module docstring)."""
    tags = _tags(data)
    stream = _slots(tags, data)
    sizes = tags.translate(_SLOT_SIZE)  # each word's bytes in ``stream``
    runs = _SPECIAL.finditer(tags)
    parts: list[bytes | bytearray] = []
    append = parts.append
    word = 0  # the next word not yet in ``parts``
    at = 0  # where that word starts in ``stream``
    for run in runs:
        start, end = run.span()
        if start > word:
            size = sum(sizes[word:start])
            append(stream[at : at + size])
            at += size
        if tags[start]:  # 0xff: its 9 bytes (from the stream), a count, the raw words
            append(stream[at : at + 9])
            append(_COUNTS[end - start - 1])
            append(data[(start + 1) << 3 : end << 3])
            at += 9 + sum(sizes[start + 1 : end])
        else:  # zero words: they left nothing in the stream
            append(_ZERO_RUNS[end - start - 1])
        word = end
    if word == 0:
        return bytes(stream)
    if word < len(tags):
        append(stream[at:])
    return b"".join(parts)


_COUNTS: Final = tuple(bytes([count]) for count in range(256))
_ZERO_RUNS: Final = tuple(bytes([0, count]) for count in range(256))


def _run_format(bits: str) -> str:
    """A ``struct`` format for a word's bytes: ``B`` per byte that is there, ``x`` per zero
    byte to write (or to skip, reading), runs counted ("B2x3B...")."""
    return "".join(
        f"{len(run)}{run[0]}" if len(run) > 1 else run for run in re.findall(r"B+|x+", bits)
    )


#: Per ordinary tag, reading its encoding (skip the tag, then one byte per bit set) and
#: writing its word (its bytes where its bits are set, zeros elsewhere). The special tags
#: 0x00 and 0xff have empty entries.
_READ: Final = (
    ("",)
    + tuple("x" + (f"{_POPCOUNT[tag]}B" if _POPCOUNT[tag] > 1 else "B") for tag in range(1, 255))
    + ("",)
)
_WRITE: Final = (
    ("",)
    + tuple(
        _run_format("".join("B" if tag >> bit & 1 else "x" for bit in range(8)))
        for tag in range(1, 255)
    )
    + ("",)
)
#: The length of each ordinary tag's encoding; 0 for the special tags.
_STEP: Final = bytes([0]) + bytes(1 + _POPCOUNT[tag] for tag in range(1, 255)) + bytes([0])


def unpack(data: bytes | bytearray | memoryview, *, max_words: int = DEFAULT_MAX_WORDS) -> bytes:
    """The words that the packed stream ``data`` encodes.

    One Python step per tag finds where the next tag is and notes how to read and write
    this one; then one ``struct`` unpack reads every stored byte of the stream (skipping
    the tags and counts) and one pack writes every word with its zeros.

    Raises:
        DecodeError: ``data`` ends inside a word's encoding, or encodes more than
            ``max_words`` words.
    """
    if COMPILED:
        whole = data if isinstance(data, bytes) else bytes(data)
        if _native is not None:
            words = _native.unpack(whole, max_words)
            if words is not None:
                return words  # type: ignore[no-any-return]
        return _unpack_words(whole, max_words)  # (or the fault named)
    return _unpack_bulk(data if isinstance(data, bytes | bytearray) else bytes(data), max_words)


def _unpack_bulk(data: bytes | bytearray, max_words: int) -> bytes:
    """``unpack`` with one ``struct`` call each way (the pure-Python build)."""
    reads: list[str] = []
    writes: list[str] = []
    read, write = reads.append, writes.append
    read_of, write_of, step_of = _READ, _WRITE, _STEP
    end = len(data)
    words = 0  # words of the runs (the ordinary tags are counted at the end)
    runs = 0
    pos = 0
    try:
        while pos < end:
            tag = data[pos]
            step = step_of[tag]
            if step:
                read(read_of[tag])
                write(write_of[tag])
                pos += step
            elif tag:  # 0xff: eight bytes, a count, that many raw words
                count = data[pos + 9]
                size = (count + 1) << 3
                read(f"x8sx{size - 8}s")
                write(f"8s{size - 8}s")
                words += count + 1
                runs += 1
                pos += 10 + (count << 3)
            else:  # 0x00: this word and ``count`` more are zero
                count = data[pos + 1]
                write(f"{(count + 1) << 3}x")
                read("2x")
                words += count + 1
                runs += 1
                if words > max_words:
                    raise DecodeError(f"packed message unpacks to more than {max_words} words")
                pos += 2
    except IndexError:
        raise DecodeError("packed message ends inside a word's encoding") from None
    if pos > end:
        raise DecodeError("packed message ends inside a word's encoding")
    if words + len(writes) - runs > max_words:  # and one word per ordinary tag
        raise DecodeError(f"packed message unpacks to more than {max_words} words")
    try:
        values = struct.Struct("<" + "".join(reads)).unpack(data)
        return struct.Struct("<" + "".join(writes)).pack(*values)
    except struct.error:  # the last word's bytes are not all there
        raise DecodeError("packed message ends inside a word's encoding") from None


# ---------------------------------------------------------------------- word at a time
_LOW_BITS: Final = 0x0101010101010101


def _tag(word: i64) -> i64:
    """The packed tag of ``word``: bit ``i`` set where byte ``i`` is not zero."""
    bits: i64 = word | (word >> 4)  # fold each byte onto its bit 0 (a sign fill only ever
    bits |= bits >> 2  # lands in a byte already non-zero: its top bit is set)
    bits |= bits >> 1
    bits &= _LOW_BITS
    bits |= bits >> 7  # gather bit 0 of every byte into the low byte
    bits |= bits >> 14
    bits |= bits >> 28
    return bits & 0xFF


def _pack_words(data: bytes) -> bytes:
    """``pack``, a word at a time (the compiled build). The counters are machine integers
    (``i64``): tagged-int arithmetic, with its overflow checks, was a third of the work."""
    out = BytesWriter()
    words: i64 = len(data) >> 3
    index: i64 = 0
    while index < words:
        word: i64 = read_i64_le(data, index << 3)
        index += 1
        if word == 0:  # this and up to 255 more zero words: 0x00, count
            run: i64 = 0
            while run < 255 and index < words and read_i64_le(data, index << 3) == 0:
                run += 1
                index += 1
            out.append(0)
            out.append(u8(run))
            continue
        tag: i64 = _tag(word)
        out.append(u8(tag))
        if tag != 0xFF:
            for byte in range(8):
                if tag >> byte & 1:
                    out.append(u8((word >> (byte << 3)) & 0xFF))
            continue
        # 0xff: the word, then a count of following words copied raw: those with at most
        # one zero byte (where packing stops paying), up to 255, as libcapnp chooses.
        write_i64_le(out, word)
        # The count goes before the raw words: a placeholder, set once the run is known,
        # so that each word is read once and copied as it is judged (word by word, not
        # a slice: a run is a dozen words of a Text or so, and a slice per run, an
        # allocation and a copy, costs more than the native reads).
        count_at: i64 = len(out)
        out.append(0)
        first: i64 = index
        while index < words and index - first < 255:
            # At most one zero byte: fold each byte onto its bit 0 (as ``_tag``), and
            # the zero bytes' bits, one per zero byte, are a power of two or none.
            raw: i64 = read_i64_le(data, index << 3)
            bits = raw | (raw >> 4)
            bits |= bits >> 2
            bits |= bits >> 1
            zeros: i64 = ~bits & _LOW_BITS
            if zeros & (zeros - 1):
                break
            write_i64_le(out, raw)
            index += 1
        out[count_at] = u8(index - first)
    return out.getvalue()


def _unpack_words(data: bytes, max_words: int) -> bytes:
    """``unpack``, a tag at a time (the compiled build; machine-integer counters, as
    ``_pack_words``)."""
    out = BytesWriter()
    end: i64 = len(data)
    pos: i64 = 0
    words: i64 = 0
    limit: i64 = min(max_words, 0x3FFF_FFFF_FFFF_FFFF)  # (a machine integer)
    while pos < end:
        tag: i64 = data[pos]
        pos += 1
        if tag == 0:  # zero words: this one and ``count`` more
            if pos >= end:
                raise DecodeError("packed message ends inside a word's encoding")
            count: i64 = data[pos] + 1
            pos += 1
            words += count
            if words > limit:
                raise DecodeError(f"packed message unpacks to more than {max_words} words")
            out.write(_zero_run(count))
            continue
        words += 1
        if tag == 0xFF:  # eight bytes, a count, that many raw words
            if pos + 9 > end:
                raise DecodeError("packed message ends inside a word's encoding")
            count = data[pos + 8]
            raw: i64 = (count + 1) << 3
            if pos + 9 + (count << 3) > end:
                raise DecodeError("packed message ends inside a word's encoding")
            words += count
            if words > limit:
                raise DecodeError(f"packed message unpacks to more than {max_words} words")
            # Word by word, not slices (see ``_pack_words``).
            write_i64_le(out, read_i64_le(data, pos))
            for at in range(pos + 9, pos + 1 + raw, 8):
                write_i64_le(out, read_i64_le(data, at))
            pos += 1 + raw
            continue
        if words > limit:
            raise DecodeError(f"packed message unpacks to more than {max_words} words")
        if pos + _POPCOUNT[tag] > end:
            raise DecodeError("packed message ends inside a word's encoding")
        # The word from its stored bytes, written whole. Byte 7 goes in as a signed
        # byte so that the i64 never overflows.
        word: i64 = 0
        for byte in range(7):
            if tag >> byte & 1:
                word |= i64(data[pos]) << (byte << 3)
                pos += 1
        if tag & 0x80:
            top: i64 = data[pos]
            word |= (top - 256 if top >= 128 else top) << 56
            pos += 1
        write_i64_le(out, word)
    return out.getvalue()


_ZERO_RUNS_BYTES: Final = tuple(bytes(count << 3) for count in range(257))


def _zero_run(count: int) -> bytes:
    return _ZERO_RUNS_BYTES[count]
