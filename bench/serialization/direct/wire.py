"""Cap'n Proto wire pieces for the direct accessors: pointers, layouts, framing, packing.

Theory of operation
-------------------
The "direct" capnp implementation of the suite reads and writes message segments itself
with ``struct`` formats at precomputed offsets, the way generated code such as capnpy
does, instead of going through pycapnp's dynamic, by-name field access (the issue's
suggested route; specs/benchmarks.md "Where the Python time went": field access, not
serialization, dominates pycapnp's figures). pycapnp still supplies the schemas, which
:func:`check_layout` compares against every hand-written format at start-up, and the C++
packer/unpacker for the ``packed`` compression.

Encoding (the Cap'n Proto encoding spec; all little-endian):

- A pointer is one word, read here as two 32-bit halves ``lo`` (signed) and ``hi``
  (unsigned) so that ``lo >> 2`` is the signed word offset directly.
  ``lo & 3`` is the kind: 0 struct, 1 list, 2 far, 3 other (capabilities). The target of a
  struct or list pointer at word ``p`` is word ``p + 1 + (lo >> 2)``.
- Struct pointer: ``hi`` = data words | pointer count << 16.
- List pointer: ``hi`` = element size (3 bits) | count << 3; size 2 is bytes (Text: the
  count includes the NUL), 7 is composite: ``count`` is then the words after a tag word
  whose ``lo`` holds the element count << 2 and whose ``hi`` the element struct sizes.
- Far pointer: ``hi`` is the segment id, ``lo >> 3`` the landing pad's word; bit 2 of
  ``lo`` marks a double-far pad (a far pointer to the content plus a tag word that
  carries the content pointer's ``hi``).

Messages are ``list[bytes]`` (one ``bytes`` per segment, root pointer at word 0 of segment
0). Writers produce one segment. Readers follow far pointers, so multi-segment messages
written by pycapnp read correctly; a struct whose sizes differ from this schema's (an
older or newer writer) raises :class:`LayoutError` rather than being misread: this is a
benchmark codec, not a general library. Reads are bounds-checked by ``struct`` (an
out-of-range pointer raises ``struct.error``), but there is no traversal limit.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, cast

from capsvc.framing import FrameDecoder, encode_message

__all__ = [
    "POINTER",
    "LayoutError",
    "Message",
    "StreamSegments",
    "check_layout",
    "composite_elements",
    "deref",
    "flat_segments",
    "frame_flat",
    "frame_message",
    "list_target",
    "pack_segments",
    "root_struct",
    "struct_target",
    "text_at",
    "unpack_segments",
]

POINTER = struct.Struct("<iI")  # one pointer word as (lo signed, hi unsigned)
_ONE_SEGMENT = struct.Struct("<II")  # segment count - 1, then the first segment's words


class LayoutError(ValueError):
    """A pointer of an unexpected kind, or a struct of sizes this schema does not have."""


class Message(list):  # type: ignore[type-arg]
    """The segments of a message built here, with its root type (libcapnp packs by schema)."""

    __slots__ = ("root_type",)

    def __init__(self, segments: Sequence[bytes], root_type: Any) -> None:
        super().__init__(segments)
        self.root_type = root_type


def deref(
    segments: Sequence[bytes], seg: int, ptr_word: int, lo: int, hi: int
) -> tuple[int, int, int]:
    """The target of the pointer ``(lo, hi)`` found at word ``ptr_word`` of segment ``seg``.

    Returns ``(segment, word, hi)`` where ``hi`` is the content pointer's upper half (it
    differs from the argument only after a double-far hop). Far pointers are followed;
    the caller checks the kind it expects. A null pointer returns word -1.
    """
    kind = lo & 3
    if kind == 2:
        landing_seg = hi
        pad = lo >> 3 if lo >= 0 else (lo & 0xFFFFFFFF) >> 3
        buf = segments[landing_seg]
        if not (lo >> 2) & 1:
            # single far: the pad is an ordinary pointer whose offset counts from the pad
            pad_lo, pad_hi = POINTER.unpack_from(buf, pad * 8)
            return landing_seg, pad + 1 + (pad_lo >> 2), pad_hi
        # double far: the pad is a far pointer to the content plus a tag word with the hi
        far_lo, far_seg = POINTER.unpack_from(buf, pad * 8)
        _tag_lo, tag_hi = POINTER.unpack_from(buf, pad * 8 + 8)
        content = far_lo >> 3 if far_lo >= 0 else (far_lo & 0xFFFFFFFF) >> 3
        return far_seg, content, tag_hi
    if lo == 0 and hi == 0:
        return seg, -1, 0
    return seg, ptr_word + 1 + (lo >> 2), hi


def struct_target(
    segments: Sequence[bytes], seg: int, ptr_word: int, lo: int, hi: int, expected_hi: int
) -> tuple[int, int]:
    """``(segment, word)`` of a struct pointer's target, ``word`` -1 for null (the slow path).

    Raises :class:`LayoutError` for another kind of pointer or other struct sizes.
    """
    if lo & 3 not in (0, 2):
        raise LayoutError(f"expected a struct pointer, got kind {lo & 3}")
    seg, word, hi = deref(segments, seg, ptr_word, lo, hi)
    if word >= 0 and hi != expected_hi:
        raise LayoutError(
            f"struct of {hi & 0xFFFF} data words and {hi >> 16} pointers; "
            f"the schema has {expected_hi & 0xFFFF} and {expected_hi >> 16}"
        )
    return seg, word


def list_target(
    segments: Sequence[bytes], seg: int, ptr_word: int, lo: int, hi: int
) -> tuple[int, int, int]:
    """``(segment, word, hi)`` of a list pointer's target; word -1 for null (slow path)."""
    if lo & 3 not in (1, 2) and not (lo == 0 and hi == 0):
        raise LayoutError(f"expected a list pointer, got kind {lo & 3}")
    return deref(segments, seg, ptr_word, lo, hi)


def composite_elements(
    segments: Sequence[bytes], seg: int, word: int, hi: int, expected_hi: int
) -> tuple[int, int]:
    """``(first element word, count)`` of a composite list at ``word``; (0, 0) for null."""
    if word < 0:
        return 0, 0
    if hi & 7 != 7:
        raise LayoutError(f"expected a list of structs, got element size {hi & 7}")
    tag_lo, tag_hi = POINTER.unpack_from(segments[seg], word * 8)
    if tag_hi != expected_hi:
        raise LayoutError(
            f"list of structs of {tag_hi & 0xFFFF} data words and {tag_hi >> 16} pointers; "
            f"the schema has {expected_hi & 0xFFFF} and {expected_hi >> 16}"
        )
    return word + 1, tag_lo >> 2


def root_struct(segments: Sequence[bytes], expected_hi: int) -> tuple[int, int]:
    """``(segment, word)`` of the root struct (word -1 if the root pointer is null)."""
    lo, hi = POINTER.unpack_from(segments[0], 0)
    if lo & 3 == 0 and hi == expected_hi:
        return 0, 1 + (lo >> 2)
    return struct_target(segments, 0, 0, lo, hi, expected_hi)


def text_at(segments: Sequence[bytes], seg: int, ptr_word: int, lo: int, hi: int) -> bytes:
    """The bytes of the Text pointed to (without its NUL); ``b""`` for a null pointer."""
    if lo & 3 != 1:
        seg, word, hi = deref(segments, seg, ptr_word, lo, hi)
        if word < 0:
            return b""
        # after a far hop the content pointer's kind is in its own lo, already resolved
    else:
        word = ptr_word + 1 + (lo >> 2)
    if hi & 7 != 2:
        raise LayoutError(f"expected a Text (byte list), got element size {hi & 7}")
    start = word * 8
    return segments[seg][start : start + (hi >> 3) - 1]


def check_layout(struct_type: Any, fmt: str, names: Sequence[str]) -> int:
    """Check a hand-written struct format against the schema; return the expected ``hi``.

    ``fmt`` covers the struct's data section then its pointer section (each pointer as
    ``iI``, or as one ``q`` word); ``names`` names every item the format produces, in
    order: a field name (``group.field`` inside a group, ``group.$which`` for a group's
    union tag), a pointer field name (twice for ``iI``, once for ``q``),
    ``"bits:<f1>,<f2>,..."`` for a byte of Bool fields (bit 0 first; ``-`` for an unused
    bit), or ``"-"`` for an item to ignore.
    Raises :class:`LayoutError` on any mismatch, so that a schema change cannot silently
    desynchronise the offsets.
    """
    node = struct_type.schema.node.struct
    layout = struct.Struct(fmt)
    expected_size = (node.dataWordCount + node.pointerCount) * 8
    if layout.size != expected_size:
        raise LayoutError(f"{fmt!r}: {layout.size} bytes, schema says {expected_size}")
    fields = _field_protos(struct_type.schema)
    offset = 0
    index = 0
    codes = _format_items(fmt)
    for code, size in codes:
        if code == "x":
            offset += size
            continue
        name = names[index]
        index += 1
        if name.startswith("bits:"):
            for bit, field_name in enumerate(name[5:].split(",")):
                if field_name != "-":
                    _expect(fields, field_name, "bool", offset * 8 + bit, 1)
        elif name != "-" and offset >= node.dataWordCount * 8:
            pointer = (offset - node.dataWordCount * 8) // 8
            if code in "iqQ":  # a pointer as (lo ``i``, hi ``I``) or as one 64-bit word
                _expect_pointer(fields, name, pointer)
        elif name != "-":
            _expect(fields, name, None, offset * 8, size * 8)
        offset += size
    if index != len(names):
        raise LayoutError(f"{fmt!r}: {len(names)} names for {index} items")
    return node.dataWordCount | node.pointerCount << 16


def _field_protos(schema: Any, prefix: str = "") -> dict[str, Any]:
    """Slot fields by name; a group's fields as ``group.field`` and its tag as ``group.$which``."""
    protos: dict[str, Any] = {}
    for field in schema.fields_list:
        proto = field.proto
        if proto.which() == "slot":
            protos[prefix + proto.name] = proto
        else:  # a group: its members, and its union discriminant as a 16-bit pseudo-field
            group = field.schema
            protos.update(_field_protos(group, f"{prefix}{proto.name}."))
            node = group.node.struct
            if node.discriminantCount:
                protos[f"{prefix}{proto.name}.$which"] = node.discriminantOffset
    return protos


_BITS = {"bool": 1, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "enum": 16}
_BITS.update({"int32": 32, "uint32": 32, "float32": 32, "int64": 64, "uint64": 64})
_BITS.update({"float64": 64})


def _expect(fields: dict[str, Any], name: str, kind: str | None, bit: int, width: int) -> None:
    proto = fields.get(name)
    if name.endswith(".$which"):  # a union discriminant: uint16 at a 16-bit offset
        if proto is None or width != 16 or proto * 16 != bit:
            raise LayoutError(f"discriminant {name!r} is not the 16 bits at bit {bit}")
        return
    if proto is None or proto.which() != "slot":
        raise LayoutError(f"no data field {name!r}")
    type_name = proto.slot.type.which()
    bits = _BITS.get(type_name)
    if bits is None or (kind is not None and type_name != kind) or bits != width:
        raise LayoutError(f"field {name!r} is {type_name}, the format reads {width} bits")
    if proto.slot.offset * bits != bit:
        raise LayoutError(f"field {name!r} is at bit {proto.slot.offset * bits}, not {bit}")


def _expect_pointer(fields: dict[str, Any], name: str, index: int) -> None:
    proto = fields.get(name)
    if proto is None or proto.which() != "slot" or proto.slot.offset != index:
        raise LayoutError(f"field {name!r} is not pointer {index}")


def _format_items(fmt: str) -> list[tuple[str, int]]:
    """``struct`` format codes with their sizes, repeat counts expanded (no ``s``)."""
    items = []
    count = ""
    for char in fmt.lstrip("<"):
        if char.isdigit():
            count += char
            continue
        repeat = int(count or "1")
        count = ""
        size = struct.calcsize("<" + char)
        if char == "x":
            items.append(("x", repeat))
        else:
            items.extend((char, size) for _ in range(repeat))
    return items


# --------------------------------------------------------------------------- framing


def frame_flat(segment: bytes) -> bytes:
    """One single-segment message in stream framing (§6): u32 0, u32 words, segment."""
    return _ONE_SEGMENT.pack(0, len(segment) >> 3) + segment


def frame_message(segments: Sequence[bytes]) -> bytes:
    """A message in stream framing; the writers' single segment without a general join.

    capsvc's ``encode_message`` handles any segment count (~0.8 µs); one segment needs only
    its 8-byte table (~0.15 µs), which matters for eval's ~130-byte messages.
    """
    if len(segments) == 1 and not len(segments[0]) & 7:
        return _ONE_SEGMENT.pack(0, len(segments[0]) >> 3) + segments[0]
    return encode_message(segments)


def flat_segments(data: bytes) -> list[bytes]:
    """The segments of one framed message held in ``data`` (bytes mode)."""
    count_minus_one, words = _ONE_SEGMENT.unpack_from(data, 0)
    if count_minus_one == 0:  # one segment: the common case, without the general loop
        if 8 + words * 8 > len(data):
            raise LayoutError("message ends prematurely")
        return [data[8 : 8 + words * 8]]
    count = count_minus_one + 1
    sizes = struct.unpack_from(f"<{count}I", data, 4)
    offset = 8 * (count // 2 + 1)
    segments = []
    for words in sizes:
        end = offset + words * 8
        segments.append(data[offset:end])
        offset = end
    if offset > len(data):
        raise LayoutError("message ends prematurely")
    return segments


class StreamSegments:
    """Unpacked stream decoder yielding ``list[bytes]`` messages (capsvc's FrameDecoder)."""

    __slots__ = ("_frames",)

    def __init__(self) -> None:
        self._frames = FrameDecoder()

    def feed(self, data: bytes) -> None:
        self._frames.feed(data)

    def next(self) -> list[bytes] | None:
        segments = self._frames.next_message()
        if segments is None:
            return None
        if len(segments) == 1:
            return [cast(bytes, segments[0])]  # a one-segment message's body is a fresh bytes
        return [bytes(segment) for segment in segments]


# --------------------------------------------------------------------------- packing


def pack_segments(message_type: Any, segments: Sequence[bytes]) -> bytes:
    """Cap'n Proto packing of a message, done by libcapnp (via a pycapnp copy)."""
    words = sum(len(segment) for segment in segments) // 8
    reader = message_type.from_segments(list(segments))
    packed: bytes = reader.as_builder(num_first_segment_words=words + 1).to_bytes_packed()
    return packed


def unpack_segments(message_type: Any, data: bytes) -> list[bytes]:
    """The segments of a packed message, unpacked by libcapnp (via a pycapnp copy)."""
    reader = message_type.from_bytes_packed(data)
    words = reader.total_size.word_count + 1
    segments: list[bytes] = reader.as_builder(num_first_segment_words=words).to_segments()
    return segments
