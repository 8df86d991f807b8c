"""The field accessors of generated readers, one by one, on a hand-made data section: each
kind at its offset, with and without an XOR default. Both implementations: the compiled
build's descriptors (capsvc.codec.accessors) and the pure build's closures
(capsvc.codec._pure_descriptors), which generated code gets through
capsvc.codec.descriptors in the build it runs."""

from __future__ import annotations

import struct
from typing import Any, ClassVar

import pytest

import capsvc
from capsvc.codec import _pure_descriptors, accessors, descriptors
from capsvc.codec.building import StructBuilder
from capsvc.codec.reading import MessageReader, StructReader

IMPLEMENTATIONS = {"compiled-build": accessors, "pure-build": _pure_descriptors}


def fields_class(impl: Any) -> type[StructReader]:
    class Fields(StructReader):
        __slots__ = ()
        _DATA_WORDS: ClassVar[int] = 3
        _POINTERS: ClassVar[int] = 1

        small = impl.UInt8(0)
        small_xor = impl.UInt8(0, 0x0F)
        signed = impl.Int("i16", 2)
        signed_xor = impl.Int("i16", 2, -42)
        wide = impl.Int("u32", 4)
        flag = impl.Bool(1, 3)
        flag_default_true = impl.Bool(1, 3, True)
        half = impl.Float(32, 8)
        half_xor = impl.Float(32, 8, struct.unpack("<I", struct.pack("<f", 2.5))[0])
        double = impl.Float(64, 16)
        text = impl.Text(0, "fallback")

    return Fields


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def impl(request: pytest.FixtureRequest) -> Any:
    return IMPLEMENTATIONS[request.param]


def reader(impl: Any, data: bytes) -> Any:
    # One segment: the struct's 3 data words, then a null pointer (Text reads its default).
    segment = data + bytes(8)
    return fields_class(impl)._at(MessageReader([segment]), 0, 0, 3, 1, 0)


def test_each_kind_reads_its_bytes(impl: Any) -> None:
    data = bytearray(24)
    data[0] = 200
    data[1] = 1 << 3
    struct.pack_into("<h", data, 2, -7)
    struct.pack_into("<I", data, 4, 4_000_000_000)
    struct.pack_into("<f", data, 8, 1.5)
    struct.pack_into("<d", data, 16, -0.25)
    r = reader(impl, bytes(data))
    assert (r.small, r.small_xor) == (200, 200 ^ 0x0F)
    assert (r.signed, r.signed_xor) == (-7, -7 ^ -42)
    assert r.wide == 4_000_000_000
    assert (r.flag, r.flag_default_true) == (True, False)
    assert r.half == 1.5
    assert r.double == -0.25
    assert r.text == "fallback"


def test_zero_bytes_read_as_the_defaults(impl: Any) -> None:
    r = reader(impl, bytes(24))
    assert (r.small, r.small_xor, r.signed_xor, r.flag_default_true) == (0, 0x0F, -42, True)
    assert r.half_xor == 2.5  # stored XOR the default's bit pattern
    assert r.half == 0.0


def test_the_class_attribute_is_the_descriptor() -> None:
    fields = fields_class(accessors)
    assert isinstance(fields.small, accessors.UInt8)
    assert isinstance(fields.__dict__["text"], accessors.Text)


def test_generated_code_gets_the_implementation_of_its_build() -> None:
    expected = accessors if capsvc.COMPILED else _pure_descriptors
    assert descriptors.UInt8 is expected.UInt8
    assert descriptors.int_property is expected.int_property


def test_a_reader_field_cannot_be_assigned(impl: Any) -> None:
    r = reader(impl, bytes(24))
    with pytest.raises(AttributeError):
        setattr(r, "small", 1)  # noqa: B010 (a plain assignment, spelt so for mypy)


def test_bad_widths_are_refused(impl: Any) -> None:
    with pytest.raises(ValueError, match="width"):
        impl.Int("u128", 0)
    with pytest.raises(ValueError, match="bits"):
        impl.Float(16, 0)
    with pytest.raises(ValueError, match="width"):
        impl.int_property("u128", 0, 0, "S.f", "UInt128")


def builder_class(impl: Any) -> type[StructBuilder]:
    class Fields(StructBuilder):
        __slots__ = ()
        _DATA_WORDS: ClassVar[int] = 3
        _POINTERS: ClassVar[int] = 1

        small = impl.int_property("u8", 0, 0, "Fields.small", "UInt8")
        signed_xor = impl.int_property("i16", 2, -42, "Fields.signedXor", "Int16", 6, 3)
        flag = impl.bool_property(1, 3, True, "Fields.flag")
        half_xor = impl.float_property(32, 8, struct.unpack("<I", struct.pack("<f", 2.5))[0],
                                       "Fields.halfXor", "Float32")  # fmt: skip
        double = impl.float_property(64, 16, 0, "Fields.double", "Float64")
        text = impl.text_property(0, "fallback", "Fields.text")

    return Fields


def test_builders_write_what_readers_read(impl: Any) -> None:
    b = builder_class(impl).new_message()
    assert (b.small, b.signed_xor, b.flag, b.half_xor, b.text) == (0, -42, True, 2.5, "fallback")
    b.small, b.signed_xor, b.flag, b.half_xor, b.double, b.text = 7, -7, False, 1.5, 0.5, "hi"
    assert (b.small, b.signed_xor, b.flag, b.half_xor, b.double, b.text) == (
        7, -7, False, 1.5, 0.5, "hi",
    )  # fmt: skip
    data = b._b.buf[b._data : b._data + 24]  # the struct's data section
    assert data[0] == 7
    assert struct.unpack_from("<h", data, 2)[0] == -7 ^ -42  # stored XOR the default
    assert data[6] == 3  # setting a union member wrote its discriminant
    assert data[1] >> 3 & 1 == 1  # False stored XOR the default True


def test_bad_values_name_the_field_and_its_type(impl: Any) -> None:
    b = builder_class(impl).new_message()
    with pytest.raises(ValueError, match=r"Fields.small: 256 is out of range for UInt8"):
        b.small = 256
    with pytest.raises(TypeError, match=r"Fields.small: expected an int \(UInt8\), got str"):
        b.small = "1"
    with pytest.raises(TypeError, match=r"Fields.flag: expected bool \(Bool\), got int"):
        b.flag = 1
    with pytest.raises(TypeError, match=r"Fields.double: expected a number \(Float64\)"):
        b.double = "x"
    with pytest.raises(TypeError, match=r"Fields.halfXor: expected a number \(Float32\)"):
        b.half_xor = None
