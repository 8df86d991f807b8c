"""The pure-Python build's field accessors: ``property`` objects over closures.

Same names and arguments as :mod:`capsvc.codec.accessors` (which see for what each field
kind stores and how a setter reports a bad value); :mod:`capsvc.codec.descriptors` picks
one module or the other. Interpreted, a descriptor class's ``__get__`` costs a Python
frame more than a property's getter, so here each field gets a getter and a setter made
for it, with its offset, width and default bound in the closure: what a generated
property used to spell out in the generated module. (The reader factories keep the
accessors' class names, capitalised, so that generated code reads the same in both builds.)
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from capsvc.codec.building import StructBuilder, bad_type, bad_value, get_text, set_group
from capsvc.codec.building import group_view as building_group_view
from capsvc.codec.reading import StructReader, read_struct, read_struct_list
from capsvc.codec.reading import group_view as reading_group_view

_FORMATS = {
    "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q",
    "u8": "<B", "u16": "<H", "u32": "<I", "u64": "<Q",
}  # fmt: skip
_F32, _F64 = struct.Struct("<f"), struct.Struct("<d")
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")


def _width(width: str) -> str:
    fmt = _FORMATS.get(width)
    if fmt is None:
        raise ValueError(f"no integer width {width!r}")
    return fmt


def _check_bits(bits: int) -> None:
    if bits not in (32, 64):
        raise ValueError(f"no float of {bits} bits")


def _float_codec(bits: int) -> tuple[struct.Struct, struct.Struct]:
    return (_F32, _U32) if bits == 32 else (_F64, _U64)


# ------------------------------------------------------------------------------ readers
def UInt8(offset: int, xor: int = 0) -> property:
    if xor:
        return property(lambda self: self._seg[self._data + offset] ^ xor)
    return property(lambda self: self._seg[self._data + offset])


def Int(width: str, offset: int, xor: int = 0) -> property:
    unpack = struct.Struct(_width(width)).unpack_from
    if xor:
        return property(lambda self: unpack(self._seg, self._data + offset)[0] ^ xor)
    return property(lambda self: unpack(self._seg, self._data + offset)[0])


def Float(bits: int, offset: int, xor: int = 0) -> property:
    return property(_float_getter(bits, offset, xor, "_seg"))


def Bool(byte: int, bit: int, default: bool = False) -> property:
    if default:
        return property(lambda self: not self._seg[self._data + byte] >> bit & 1)
    return property(lambda self: self._seg[self._data + byte] >> bit & 1 == 1)


def Text(slot: int, default: str = "") -> property:
    return property(lambda self: self._text(slot, default))


class _Late(property):
    """A property whose getter reads a type the module binds after the class (see
    accessors.Struct): ``bind`` fills the list the getter's closure holds."""

    def __init__(self, fget: Callable[[Any], Any], bound: list[Any]) -> None:
        super().__init__(fget)
        self._bound = bound

    def bind(self, *values: Any) -> None:
        self._bound[: len(values)] = values


def Struct(slot: int) -> _Late:
    bound: list[Any] = [StructReader, None]  # the reader class, the encoded default

    def get(self: Any) -> Any:
        w = self._ptr + slot
        at = w if w < self._pend else -1
        return read_struct(self._msg, self._si, at, bound[0], self._depth, bound[1])

    return _Late(get, bound)


def StructList(slot: int) -> _Late:
    bound: list[Any] = [StructReader]

    def get(self: Any) -> Any:
        w = self._ptr + slot
        return read_struct_list(
            self._msg, self._si, w if w < self._pend else -1, self._depth, bound[0]
        )

    return _Late(get, bound)


def List(slot: int) -> _Late:
    bound: list[Any] = [None]  # the list maker

    def get(self: Any) -> Any:
        w = self._ptr + slot
        return bound[0](self._msg, self._si, w if w < self._pend else -1, self._depth)

    return _Late(get, bound)


def Group() -> _Late:
    bound: list[Any] = [StructReader]

    def get(self: Any) -> Any:
        return reading_group_view(bound[0], self)

    return _Late(get, bound)


class _LateGroup(_Late):
    """A builder's group (accessors.BuilderGroup, which see): ``init`` clears it, and
    setting it sets the group (building.set_group)."""

    def __init__(self, fget: Callable[[Any], Any], bound: list[Any], disc_at: int, disc: int):
        super().__init__(fget, bound)
        self._disc_at = disc_at
        self._disc = disc

    def __set__(self, obj: Any, value: Any) -> None:
        set_group(obj, self._bound[0], self._disc_at, self._disc, value)

    def init(self, obj: Any) -> Any:
        view = building_group_view(self._bound[0], obj)
        view.assign()
        if self._disc_at >= 0:
            _U16.pack_into(obj._b.buf, obj._data + self._disc_at, self._disc)
        return view


def BuilderGroup(disc_at: int = -1, disc: int = 0) -> _Late:
    bound: list[Any] = [StructBuilder]

    def get(self: Any) -> Any:
        view = building_group_view(bound[0], self)
        if disc_at >= 0 and _U16.unpack_from(self._b.buf, self._data + disc_at)[0] != disc:
            view.assign()  # another member's bits and pointers are not this group's
            _U16.pack_into(self._b.buf, self._data + disc_at, disc)
        return view

    return _LateGroup(get, bound, disc_at, disc)


def Enum(offset: int, xor: int = 0) -> _Late:
    bound: list[Any] = [int, ()]  # the enum class, its members by code
    unpack = _U16.unpack_from

    def get(self: Any) -> Any:
        code = unpack(self._seg, self._data + offset)[0] ^ xor
        members = bound[1]
        return members[code] if code < len(members) else bound[0](code)

    return _Late(get, bound)


def _float_getter(bits: int, offset: int, xor: int, buffer: str) -> Callable[[Any], float]:
    """A float field's getter, reading a reader's ``_seg`` or a builder's ``_b.buf``."""
    _check_bits(bits)
    value, raw = _float_codec(bits)
    builder = buffer == "_b"
    if xor:
        unpack_raw, pack_raw, unpack_value = raw.unpack_from, raw.pack, value.unpack

        def read_xor(self: Any) -> float:
            buf = self._b.buf if builder else self._seg
            stored: int = unpack_raw(buf, self._data + offset)[0]
            return float(unpack_value(pack_raw(stored ^ xor))[0])

        return read_xor
    unpack = value.unpack_from
    if builder:
        return lambda self: unpack(self._b.buf, self._data + offset)[0]
    return lambda self: unpack(self._seg, self._data + offset)[0]


# ----------------------------------------------------------------------------- builders
def _selector(disc_at: int, disc: int) -> Callable[[Any], None] | None:
    if disc_at < 0:
        return None
    pack = _U16.pack_into

    def select(self: Any) -> None:
        pack(self._b.buf, self._data + disc_at, disc)

    return select


def int_property(
    width: str,
    offset: int,
    xor: int,
    label: str,
    schema_type: str,
    disc_at: int = -1,
    disc: int = 0,
) -> property:
    fmt = _width(width)
    unpack = struct.Struct(fmt).unpack_from
    pack = struct.Struct(fmt).pack_into
    select = _selector(disc_at, disc)

    def get(self: Any) -> int:
        value: int = unpack(self._b.buf, self._data + offset)[0]
        return value ^ xor

    if not xor and select is None:  # the common case, with no test a field never needs

        def set_plain(self: Any, value: int) -> None:
            try:
                pack(self._b.buf, self._data + offset, value)
            except (struct.error, TypeError):
                raise bad_value(value, label, schema_type, fmt[1:]) from None

        return property(get, set_plain)

    def set_(self: Any, value: int) -> None:
        try:
            pack(self._b.buf, self._data + offset, value ^ xor if xor else value)
        except (struct.error, TypeError):
            raise bad_value(value, label, schema_type, fmt[1:]) from None
        if select is not None:
            select(self)

    return property(get, set_)


def float_property(
    bits: int,
    offset: int,
    xor: int,
    label: str,
    schema_type: str,
    disc_at: int = -1,
    disc: int = 0,
) -> property:
    _check_bits(bits)
    value_codec, raw = _float_codec(bits)
    fmt = "f" if bits == 32 else "d"
    select = _selector(disc_at, disc)
    pack_value, pack_raw = value_codec.pack_into, raw.pack_into
    value_bits = value_codec.pack

    if not xor and select is None:

        def set_plain(self: Any, value: float) -> None:
            try:
                pack_value(self._b.buf, self._data + offset, value)
            except (struct.error, TypeError):
                raise bad_value(value, label, schema_type, fmt) from None

        return property(_float_getter(bits, offset, xor, "_b"), set_plain)

    def set_(self: Any, value: float) -> None:
        try:
            if xor:
                pack_raw(self._b.buf, self._data + offset, raw.unpack(value_bits(value))[0] ^ xor)
            else:
                pack_value(self._b.buf, self._data + offset, value)
        except (struct.error, TypeError):
            raise bad_value(value, label, schema_type, fmt) from None
        if select is not None:
            select(self)

    return property(_float_getter(bits, offset, xor, "_b"), set_)


def bool_property(
    byte: int, bit: int, default: bool, label: str, disc_at: int = -1, disc: int = 0
) -> property:
    select = _selector(disc_at, disc)
    mask = 1 << bit

    def get(self: Any) -> bool:
        stored: int = self._b.buf[self._data + byte]
        return (stored >> bit & 1 == 1) != default

    clear = 0xFF ^ mask

    def set_(self: Any, value: bool) -> None:
        if value is not True and value is not False:
            raise bad_type(value, label, "bool (Bool)")
        buf = self._b.buf
        at = self._data + byte
        buf[at] = buf[at] | mask if value is not default else buf[at] & clear
        if select is not None:
            select(self)

    return property(get, set_)


def text_property(
    slot: int, default: str, label: str, disc_at: int = -1, disc: int = 0
) -> property:
    select = _selector(disc_at, disc)

    def get(self: Any) -> str:
        return get_text(self._b, self._ptr + slot, default)

    if select is None:

        def set_plain(self: Any, value: str) -> None:
            self._set_text(slot, value, label)

        return property(get, set_plain)

    def set_(self: Any, value: str) -> None:
        select(self)
        self._set_text(slot, value, label)

    return property(get, set_)
