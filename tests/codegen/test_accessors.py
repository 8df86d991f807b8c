"""The field descriptors of generated readers (capsvc.codec.accessors), one by one, on a
hand-made data section: each kind at its offset, with and without an XOR default."""

from __future__ import annotations

import struct
from typing import ClassVar

import pytest

from capsvc.codec import accessors
from capsvc.codec.reading import MessageReader, StructReader


class Fields(StructReader):
    __slots__ = ()
    _DATA_WORDS: ClassVar[int] = 3
    _POINTERS: ClassVar[int] = 1

    small = accessors.UInt8(0)
    small_xor = accessors.UInt8(0, 0x0F)
    signed = accessors.Int("i16", 2)
    signed_xor = accessors.Int("i16", 2, -42)
    wide = accessors.Int("u32", 4)
    flag = accessors.Bool(1, 3)
    flag_default_true = accessors.Bool(1, 3, True)
    half = accessors.Float(32, 8)
    half_xor = accessors.Float(32, 8, struct.unpack("<I", struct.pack("<f", 2.5))[0])
    double = accessors.Float(64, 16)
    text = accessors.Text(0, "fallback")


def reader(data: bytes) -> Fields:
    # One segment: the struct's 3 data words, then a null pointer (Text reads its default).
    segment = data + bytes(8)
    return Fields._at(MessageReader([segment]), 0, 0, 3, 1, 0)


def test_each_kind_reads_its_bytes() -> None:
    data = bytearray(24)
    data[0] = 200
    data[1] = 1 << 3
    struct.pack_into("<h", data, 2, -7)
    struct.pack_into("<I", data, 4, 4_000_000_000)
    struct.pack_into("<f", data, 8, 1.5)
    struct.pack_into("<d", data, 16, -0.25)
    r = reader(bytes(data))
    assert (r.small, r.small_xor) == (200, 200 ^ 0x0F)
    assert (r.signed, r.signed_xor) == (-7, -7 ^ -42)
    assert r.wide == 4_000_000_000
    assert (r.flag, r.flag_default_true) == (True, False)
    assert r.half == 1.5
    assert r.double == -0.25
    assert r.text == "fallback"


def test_zero_bytes_read_as_the_defaults() -> None:
    r = reader(bytes(24))
    assert (r.small, r.small_xor, r.signed_xor, r.flag_default_true) == (0, 0x0F, -42, True)
    assert r.half_xor == 2.5  # stored XOR the default's bit pattern
    assert r.half == 0.0


def test_the_class_attribute_is_the_descriptor() -> None:
    assert isinstance(Fields.small, accessors.UInt8)
    assert isinstance(Fields.__dict__["text"], accessors.Text)


def test_a_reader_field_cannot_be_assigned() -> None:
    r = reader(bytes(24))
    with pytest.raises(AttributeError):
        setattr(r, "small", 1)  # noqa: B010 (a plain assignment, spelt so for mypy)


def test_bad_widths_are_refused() -> None:
    with pytest.raises(ValueError, match="width"):
        accessors.Int("u128", 0)
    with pytest.raises(ValueError, match="bits"):
        accessors.Float(16, 0)
