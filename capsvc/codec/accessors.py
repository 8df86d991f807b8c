"""Field descriptors of generated readers: a data or Text field read in compiled code.

Theory of operation
-------------------
A generated reader used to read each field through a ``property``: every read was a
Python-level call (a frame, then the ``unpack_from``), about 0.25 µs even with the codec
runtime compiled. A descriptor whose ``__get__`` is compiled by mypyc is called by the
interpreter's attribute lookup directly (the type's ``tp_descr_get`` slot), so a read is
one C call: the generated class says ``seats = UInt8(2)`` and ``reader.seats`` runs
:meth:`UInt8.__get__` natively, attribute loads of the reader included.

Readers are immutable views, so only ``__get__`` exists (non-data descriptors: there is
no instance ``__dict__`` to shadow them, readers have ``__slots__``). mypyc gives a class
no ``__set__`` slot, so a builder field is a ``property`` whose getter and setter are
compiled callable objects (``*_property`` below): ``builder.seats = 4`` then runs
``property.__set__`` and the compiled setter, again with no Python frame. A setter checks
and reports exactly as the generated properties did (``building.bad_value`` /
``bad_type``: a ``TypeError`` or ``ValueError`` naming the field and its schema type), and
a setter of a union member also selects it (writes the discriminant).

``__get__`` returns ``object`` here because mypyc (1.15) emits a wrong C return type for
a ``__get__`` returning an unboxed ``int``/``float``/``bool``; the typed view generated
code and users see is :mod:`capsvc.codec.descriptors`. Offsets are byte offsets into the
data section (``_data``), which is always at least as long as the schema's (see
``StructReader``), so no read needs a bounds check; values are stored XOR their schema
default (rpc.capnp/encoding: "default values are XORed"), hence ``xor``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from librt.strings import read_f32_le, read_f64_le, read_i16_le, read_i32_le, read_i64_le

from capsvc.codec.building import StructBuilder, bad_type, bad_value, get_text
from capsvc.codec.building import group_view as building_group_view
from capsvc.codec.building import set_group as building_set_group
from capsvc.codec.reading import (
    MessageReader,
    StructReader,
    read_struct,
    read_struct_list,
    read_text,
)
from capsvc.codec.reading import group_view as reading_group_view

_Unpack = Callable[[Any, int], tuple[Any, ...]]
_Pack = Callable[[Any, int, Any], None]

_FORMATS: Final = {
    "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q",
    "u8": "<B", "u16": "<H", "u32": "<I", "u64": "<Q",
}  # fmt: skip
_F32: Final = struct.Struct("<f")
_F64: Final = struct.Struct("<d")
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_WORD: Final = 1 << 64


class UInt8:
    """A UInt8 field at byte ``offset`` of the data section."""

    __slots__ = ("offset", "xor")

    def __init__(self, offset: int, xor: int = 0) -> None:
        self.offset = offset
        self.xor = xor

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        value: int = obj._seg[obj._data + self.offset]
        return value ^ self.xor if self.xor else value


#: Integer widths, as ``Int`` dispatches on them.
_WIDTHS: Final = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")


class Int:
    """An integer field of ``width`` (``i8`` … ``u64``) at byte ``offset``.

    Read with librt.strings' native little-endian reads (a ``bytes`` segment, always:
    see ``MessageReader``): no Python call and no tuple per read, unlike
    ``struct.unpack_from``. Those reads are signed; an unsigned width masks the value.
    """

    __slots__ = ("code", "offset", "width", "xor")

    def __init__(self, width: str, offset: int, xor: int = 0) -> None:
        if width not in _WIDTHS:
            raise ValueError(f"no integer width {width!r}")
        self.width = width
        self.code = _WIDTHS.index(width)
        self.offset = offset
        self.xor = xor

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        seg = obj._seg
        at = obj._data + self.offset
        code = self.code
        value: int
        if code == 5:
            value = int(read_i16_le(seg, at)) & 0xFFFF
        elif code == 6:
            value = int(read_i32_le(seg, at)) & 0xFFFFFFFF
        elif code == 2:
            value = read_i32_le(seg, at)
        elif code == 1:
            value = read_i16_le(seg, at)
        elif code == 3:
            value = read_i64_le(seg, at)
        elif code == 7:
            word = read_i64_le(seg, at)
            value = int(word) if word >= 0 else int(word) + _WORD
        elif code == 4:
            value = seg[at]
        else:
            value = seg[at]
            value = value - 256 if value >= 128 else value
        return value ^ self.xor if self.xor else value


class Float:
    """A Float32 (``bits`` 32) or Float64 field at byte ``offset``; ``xor`` is the default's
    bit pattern."""

    __slots__ = ("bits", "offset", "xor")

    def __init__(self, bits: int, offset: int, xor: int = 0) -> None:
        if bits not in (32, 64):
            raise ValueError(f"no float of {bits} bits")
        self.bits = bits
        self.offset = offset
        self.xor = xor

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        at = obj._data + self.offset
        if self.bits == 32:
            if not self.xor:
                return read_f32_le(obj._seg, at)
            raw: int = _U32.unpack_from(obj._seg, at)[0]
            return _F32.unpack(_U32.pack(raw ^ self.xor))[0]
        if not self.xor:
            return read_f64_le(obj._seg, at)
        raw = _U64.unpack_from(obj._seg, at)[0]
        return _F64.unpack(_U64.pack(raw ^ self.xor))[0]


class Bool:
    """A Bool field: bit ``bit`` of byte ``byte``; ``default`` is the schema's."""

    __slots__ = ("bit", "byte", "default")

    def __init__(self, byte: int, bit: int, default: bool = False) -> None:
        self.byte = byte
        self.bit = bit
        self.default = default

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        value: int = obj._seg[obj._data + self.byte]
        return (value >> self.bit & 1 == 1) != self.default


class Text:
    """A Text field in pointer ``slot``; ``default`` when the pointer is null."""

    __slots__ = ("default", "slot")

    def __init__(self, slot: int, default: str = "") -> None:
        self.slot = slot
        self.default = default

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        # read_text itself, not the reader's ``_text``: a method of a class that allows
        # interpreted subclasses is called through the Python method protocol.
        w = obj._ptr + self.slot
        return read_text(obj._msg, obj._si, w if w < obj._pend else -1, self.default)


# Fields whose type the generated module defines after the class that has the field (a
# struct, list or enum type; possibly the class itself): the class body makes the
# descriptor with what it knows, and the module's tail calls ``bind`` with the type once
# every class is defined. Before that, a read gives a plain reader or the raw code (a
# List field raises TypeError).
class Struct:
    """A struct field in pointer ``slot``, read as ``cls``; ``default`` (an encoded struct)
    when the pointer is null, or every field at its default if there is none."""

    __slots__ = ("cls", "default", "slot")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.cls: type[StructReader] = StructReader
        self.default: Sequence[bytes] | None = None

    def bind(self, cls: type[StructReader], default: Sequence[bytes] | None = None) -> None:
        self.cls = cls
        self.default = default

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        w = obj._ptr + self.slot
        at = w if w < obj._pend else -1
        return read_struct(obj._msg, obj._si, at, self.cls, obj._depth, self.default)


class StructList:
    """A List of structs in pointer ``slot``, of element type ``cls``."""

    __slots__ = ("cls", "slot")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.cls: type[StructReader] = StructReader

    def bind(self, cls: type[StructReader]) -> None:
        self.cls = cls

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        w = obj._ptr + self.slot
        return read_struct_list(obj._msg, obj._si, w if w < obj._pend else -1, obj._depth, self.cls)


class List:
    """A List field (of any element type but structs) in pointer ``slot``, read by ``make``
    (a list maker of capsvc.codec.reading)."""

    __slots__ = ("make", "slot")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.make: Callable[[MessageReader, int, int, int], object] = _unbound_list

    def bind(self, make: Callable[[MessageReader, int, int, int], object]) -> None:
        self.make = make

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        w = obj._ptr + self.slot
        return self.make(obj._msg, obj._si, w if w < obj._pend else -1, obj._depth)


def _unbound_list(msg: MessageReader, si: int, w: int, depth: int) -> object:
    raise TypeError("a List field read before its module bound its element type")


class Group:
    """A group of a reader: a ``cls`` reader of the same sections."""

    __slots__ = ("cls",)

    def __init__(self) -> None:
        self.cls: type[StructReader] = StructReader

    def bind(self, cls: type[StructReader]) -> None:
        self.cls = cls

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        return reading_group_view(self.cls, obj)


class BuilderGroup:
    """A group of a builder; a group that is a union member is selected by the access, as
    generated setters select theirs (``disc_at`` < 0: not a union member).

    Union members share their struct's space, so a group selected while another member is
    set would read that member's bits and pointers as its own fields: the switch clears
    the group's fields first, as C++'s ``init<Group>()`` does. Once selected, access
    changes nothing. ``init`` (generated ``init_<group>()``) always clears."""

    __slots__ = ("cls", "disc", "disc_at")

    def __init__(self, disc_at: int = -1, disc: int = 0) -> None:
        self.disc_at = disc_at
        self.disc = disc
        self.cls: type[StructBuilder] = StructBuilder

    def bind(self, cls: type[StructBuilder]) -> None:
        self.cls = cls

    def __get__(self, obj: StructBuilder | None, owner: object = None) -> object:
        if obj is None:
            return self
        view = building_group_view(self.cls, obj)
        disc_at = self.disc_at
        if disc_at >= 0 and _U16.unpack_from(obj._b.buf, obj._data + disc_at)[0] != self.disc:
            view.assign()  # every field of the group to its default (capsvc.codec.values)
            _select(obj, disc_at, self.disc)
        return view

    def set(self, obj: StructBuilder, value: object) -> None:
        """``builder.group = {...}`` (or its row), as pycapnp's: building.set_group. (A
        compiled class has no ``__set__`` slot: descriptors.BuilderGroup makes this the
        setter of a ``property`` whose getter is ``get``.)"""
        building_set_group(obj, self.cls, self.disc_at, self.disc, value)

    def get(self, obj: StructBuilder) -> object:
        return self.__get__(obj)

    def init(self, obj: StructBuilder) -> Any:
        """The group of ``obj`` with every field at its default, selected if it is a union
        member: what generated ``init_<group>()`` returns."""
        view = building_group_view(self.cls, obj)
        view.assign()
        _select(obj, self.disc_at, self.disc)
        return view


class Enum:
    """An enum field at byte ``offset`` (stored XOR ``xor``, the default's code): the
    member of ``cls`` whose code it holds, from the ``members`` tuple for the codes the
    schema knows (an IntEnum call costs several times the read), else ``cls(code)``."""

    __slots__ = ("cls", "members", "offset", "xor")

    def __init__(self, offset: int, xor: int = 0) -> None:
        self.offset = offset
        self.xor = xor
        self.cls: Callable[[int], object] = int
        self.members: tuple[object, ...] = ()

    def bind(self, cls: Callable[[int], object], members: tuple[object, ...]) -> None:
        self.cls = cls
        self.members = members

    def __get__(self, obj: StructReader | None, owner: object = None) -> object:
        if obj is None:
            return self
        code = (int(read_i16_le(obj._seg, obj._data + self.offset)) & 0xFFFF) ^ self.xor
        members = self.members
        return members[code] if code < len(members) else self.cls(code)


# ----------------------------------------------------------------------------- builders
def _select(obj: StructBuilder, disc_at: int, disc: int) -> None:
    """Make this field the union's member: write ``disc`` at byte ``disc_at`` (if any)."""
    if disc_at >= 0:
        _U16.pack_into(obj._b.buf, obj._data + disc_at, disc)


class _IntGet:
    __slots__ = ("offset", "unpack", "xor")

    def __init__(self, unpack: _Unpack, offset: int, xor: int) -> None:
        self.unpack = unpack
        self.offset = offset
        self.xor = xor

    def __call__(self, obj: StructBuilder) -> object:
        value: int = self.unpack(obj._b.buf, obj._data + self.offset)[0]
        return value ^ self.xor if self.xor else value


class _IntSet:
    __slots__ = ("disc", "disc_at", "fmt", "label", "offset", "pack", "schema_type", "xor")

    def __init__(
        self, fmt: str, offset: int, xor: int, label: str, schema_type: str, disc_at: int, disc: int
    ) -> None:
        self.pack: _Pack = struct.Struct("<" + fmt).pack_into
        self.fmt = fmt
        self.offset = offset
        self.xor = xor
        self.label = label
        self.schema_type = schema_type
        self.disc_at = disc_at
        self.disc = disc

    def __call__(self, obj: StructBuilder, value: object) -> None:
        try:
            stored: Any = value
            self.pack(
                obj._b.buf, obj._data + self.offset, stored ^ self.xor if self.xor else stored
            )
        except (struct.error, TypeError):
            raise bad_value(value, self.label, self.schema_type, self.fmt) from None
        _select(obj, self.disc_at, self.disc)


def int_property(
    width: str,
    offset: int,
    xor: int,
    label: str,
    schema_type: str,
    disc_at: int = -1,
    disc: int = 0,
) -> property:
    """The builder property of an integer field (``label``: ``Struct.field``)."""
    fmt = _FORMATS.get(width)
    if fmt is None:
        raise ValueError(f"no integer width {width!r}")
    getter = _IntGet(struct.Struct(fmt).unpack_from, offset, xor)
    return property(getter, _IntSet(fmt[1:], offset, xor, label, schema_type, disc_at, disc))


class _FloatGet:
    __slots__ = ("bits", "offset", "xor")

    def __init__(self, bits: int, offset: int, xor: int) -> None:
        self.bits = bits
        self.offset = offset
        self.xor = xor

    def __call__(self, obj: StructBuilder) -> object:
        buf = obj._b.buf
        at = obj._data + self.offset
        if self.bits == 32:
            if not self.xor:
                return _F32.unpack_from(buf, at)[0]
            raw: int = _U32.unpack_from(buf, at)[0]
            return _F32.unpack(_U32.pack(raw ^ self.xor))[0]
        if not self.xor:
            return _F64.unpack_from(buf, at)[0]
        raw = _U64.unpack_from(buf, at)[0]
        return _F64.unpack(_U64.pack(raw ^ self.xor))[0]


class _FloatSet:
    __slots__ = ("bits", "disc", "disc_at", "label", "offset", "schema_type", "xor")

    def __init__(
        self,
        bits: int,
        offset: int,
        xor: int,
        label: str,
        schema_type: str,
        disc_at: int,
        disc: int,
    ) -> None:
        self.bits = bits
        self.offset = offset
        self.xor = xor
        self.label = label
        self.schema_type = schema_type
        self.disc_at = disc_at
        self.disc = disc

    def __call__(self, obj: StructBuilder, value: object) -> None:
        buf = obj._b.buf
        at = obj._data + self.offset
        try:
            if self.bits == 32:
                if self.xor:
                    bits: int = _U32.unpack(_F32.pack(value))[0]
                    _U32.pack_into(buf, at, bits ^ self.xor)
                else:
                    _F32.pack_into(buf, at, value)
            elif self.xor:
                bits = _U64.unpack(_F64.pack(value))[0]
                _U64.pack_into(buf, at, bits ^ self.xor)
            else:
                _F64.pack_into(buf, at, value)
        except (struct.error, TypeError):
            raise bad_value(
                value, self.label, self.schema_type, "f" if self.bits == 32 else "d"
            ) from None
        _select(obj, self.disc_at, self.disc)


def float_property(
    bits: int,
    offset: int,
    xor: int,
    label: str,
    schema_type: str,
    disc_at: int = -1,
    disc: int = 0,
) -> property:
    """The builder property of a Float32/Float64 field (``xor``: the default's bits)."""
    if bits not in (32, 64):
        raise ValueError(f"no float of {bits} bits")
    return property(
        _FloatGet(bits, offset, xor),
        _FloatSet(bits, offset, xor, label, schema_type, disc_at, disc),
    )


class _BoolGet:
    __slots__ = ("bit", "byte", "default")

    def __init__(self, byte: int, bit: int, default: bool) -> None:
        self.byte = byte
        self.bit = bit
        self.default = default

    def __call__(self, obj: StructBuilder) -> object:
        value: int = obj._b.buf[obj._data + self.byte]
        return (value >> self.bit & 1 == 1) != self.default


class _BoolSet:
    __slots__ = ("bit", "byte", "default", "disc", "disc_at", "label")

    def __init__(
        self, byte: int, bit: int, default: bool, label: str, disc_at: int, disc: int
    ) -> None:
        self.byte = byte
        self.bit = bit
        self.default = default
        self.label = label
        self.disc_at = disc_at
        self.disc = disc

    def __call__(self, obj: StructBuilder, value: object) -> None:
        if value is not True and value is not False:
            raise bad_type(value, self.label, "bool (Bool)")
        buf = obj._b.buf
        at = obj._data + self.byte
        if (value is True) != self.default:
            buf[at] = buf[at] | 1 << self.bit
        else:
            buf[at] = buf[at] & (0xFF ^ 1 << self.bit)
        _select(obj, self.disc_at, self.disc)


def bool_property(
    byte: int, bit: int, default: bool, label: str, disc_at: int = -1, disc: int = 0
) -> property:
    """The builder property of a Bool field: bit ``bit`` of byte ``byte``."""
    return property(
        _BoolGet(byte, bit, default), _BoolSet(byte, bit, default, label, disc_at, disc)
    )


class _TextGet:
    __slots__ = ("default", "slot")

    def __init__(self, slot: int, default: str) -> None:
        self.slot = slot
        self.default = default

    def __call__(self, obj: StructBuilder) -> object:
        return get_text(obj._b, obj._ptr + self.slot, self.default)


class _TextSet:
    __slots__ = ("disc", "disc_at", "label", "slot")

    def __init__(self, slot: int, label: str, disc_at: int, disc: int) -> None:
        self.slot = slot
        self.label = label
        self.disc_at = disc_at
        self.disc = disc

    def __call__(self, obj: StructBuilder, value: object) -> None:
        _select(obj, self.disc_at, self.disc)
        obj._set_text(self.slot, value, self.label)


def text_property(
    slot: int, default: str, label: str, disc_at: int = -1, disc: int = 0
) -> property:
    """The builder property of a Text field in pointer ``slot``."""
    return property(_TextGet(slot, default), _TextSet(slot, label, disc_at, disc))
