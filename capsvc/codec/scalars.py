"""Checking plain values against a field's type and writing them as bytes, for the value
encoder (capsvc.codec.values).

Theory of operation
-------------------
Values come from user code, so every one is checked here first: an ``int`` in range for
its width (a ``ValueError`` names the range), a finite float that fits a Float32, an
enum by code or by name, a bool for a Bool; anything else is a ``TypeError``. Each error
names the field (``Car.seats``) and its schema type, as the generated setters' errors do
(capsvc.codec.building).

The writes go to a ``librt.strings.BytesWriter``: appended in order (``append_int``,
librt's native little-endian writes), or stored at a byte offset (``store``, a byte at a
time, on machine integers in the compiled build: a shift, a mask and a store each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from librt.strings import (
    BytesWriter,
    write_f32_le,
    write_f64_le,
    write_i16_le,
    write_i32_le,
    write_i64_le,
)

from capsvc._mypyc import i64, u8
from capsvc.codec.building import bad_type

__all__ = [
    "append_int",
    "check_enum",
    "check_float",
    "check_integer",
    "patch",
    "store",
    "write_bools",
    "write_floats",
    "write_integers",
    "zero_bytes",
    "zero_words",
]

WORD: Final = 1 << 64
FLOAT32_MAX: Final = 3.4028234663852886e38
_ZERO_WORDS: Final = tuple(bytes(8 * n) for n in range(33))
_ZERO_BYTES: Final = tuple(bytes(n) for n in range(64))
#: The NUL and zero padding that end a Text of ``n`` bytes, by ``n & 7``; also the
#: padding of ``8 - k`` bytes after ``k`` bytes of a word (by ``k``).
TEXT_ENDS: Final = tuple(bytes(8 - n) for n in range(8))


def zero_words(words: int) -> bytes:
    return _ZERO_WORDS[words] if words <= 32 else bytes(words << 3)


def zero_bytes(count: int) -> bytes:
    return _ZERO_BYTES[count] if count < 64 else bytes(count)


# ---------------------------------------------------------------------- stores
#: The largest magnitude a compiled build keeps as a machine integer (mypyc's tagged
#: ints: 63 bits). Compared with anything larger, a comparison goes through Python's
#: rich comparison of objects, many times slower: so values are first checked against
#: this, and ``WORD`` comes into play only for the few beyond it.
SHORT: Final = 0x3FFF_FFFF_FFFF_FFFF


def store(w: BytesWriter, at: i64, value: int, width: i64) -> None:
    """``width`` bytes of ``value`` (-2**63 .. 2**64-1), little-endian, at byte ``at``."""
    if -SHORT <= value <= SHORT:
        store_bits(w, at, value, width)
        return
    bits: i64 = value - WORD if value >= WORD >> 1 else value  # two's complement
    store_bits(w, at, bits, width)


def store_bits(w: BytesWriter, at: i64, bits: i64, width: i64) -> None:
    w[at] = u8(bits & 0xFF)
    if width > 1:
        w[at + 1] = u8((bits >> 8) & 0xFF)
        if width > 2:
            w[at + 2] = u8((bits >> 16) & 0xFF)
            w[at + 3] = u8((bits >> 24) & 0xFF)
            if width > 4:
                w[at + 4] = u8((bits >> 32) & 0xFF)
                w[at + 5] = u8((bits >> 40) & 0xFF)
                w[at + 6] = u8((bits >> 48) & 0xFF)
                w[at + 7] = u8((bits >> 56) & 0xFF)


def patch(w: BytesWriter, at: i64, low: i64, high: i64) -> None:
    """A pointer word as its two 32-bit halves, at byte ``at`` (eight stores inline: every
    pointer the encoder writes comes through here)."""
    w[at] = u8(low & 0xFF)
    w[at + 1] = u8((low >> 8) & 0xFF)
    w[at + 2] = u8((low >> 16) & 0xFF)
    w[at + 3] = u8((low >> 24) & 0xFF)
    w[at + 4] = u8(high & 0xFF)
    w[at + 5] = u8((high >> 8) & 0xFF)
    w[at + 6] = u8((high >> 16) & 0xFF)
    w[at + 7] = u8((high >> 24) & 0xFF)


def append_int(out: BytesWriter, value: int, width: int) -> None:
    """Append ``value`` (in range for ``width`` bytes, signed or not), little-endian."""
    if width == 1:
        out.append(value & 0xFF)
    elif width == 2:
        write_i16_le(out, value - 0x10000 if value >= 0x8000 else value)
    elif width == 4:
        write_i32_le(out, value - 0x100000000 if value >= 0x80000000 else value)
    elif -SHORT <= value <= SHORT:
        write_i64_le(out, value)
    else:
        write_i64_le(out, value - WORD if value >= WORD >> 1 else value)


def store_float(
    w: BytesWriter, at: int, number: float, width: int, xor: int, scratch: BytesWriter
) -> None:
    """A Float32 (``width`` 4) or Float64 at byte ``at``, its bits XOR ``xor`` (the
    default's bits); ``scratch`` is a writer to spare."""
    scratch.truncate(0)
    if width == 4:
        write_f32_le(scratch, number)
    else:
        write_f64_le(scratch, number)
    for index in range(width):
        w[at + index] = scratch[index] ^ u8((xor >> (index << 3)) & 0xFF)


# ---------------------------------------------------------------------- checks
def check_integer(value: object, low: int, high: int, label: str, schema_type: str) -> int:
    """``value`` as an integer of ``schema_type`` (bools pass, as ``struct`` lets them)."""
    if not isinstance(value, int):
        raise TypeError(f"{label}: expected an int ({schema_type}), got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{label}: {value} is out of range for {schema_type} ({low}..{high})")
    return value


def _number_error(value: object, label: str, schema_type: str) -> Exception:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return ValueError(f"{label}: {value!r} does not fit a {schema_type}")
    return TypeError(f"{label}: expected a number ({schema_type}), got {type(value).__name__}")


def check_float(value: object, label: str, schema_type: str, width: int) -> float:
    """``value`` as a Float32 (``width`` 4) or Float64: a float, or an int that converts."""
    if isinstance(value, float):
        number = value
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            raise _number_error(value, label, schema_type) from None
    else:
        raise _number_error(value, label, schema_type)
    if width == 4 and (number > FLOAT32_MAX or number < -FLOAT32_MAX):
        if number - number == 0.0:  # finite, and too large: struct refuses it too
            raise _number_error(value, label, schema_type)
    return number


def check_enum(value: object, names: dict[str, int], label: str, schema_type: str) -> int:
    """An enum value: its code (an int, IntEnum members included), or its name."""
    if isinstance(value, int) and not isinstance(value, bool):
        # An IntEnum member as a plain int first: compiled comparisons and XORs of an int
        # subclass take the generic (rich comparison) path, several times slower.
        code = value if type(value) is int else int(value)
        if not 0 <= code <= 0xFFFF:
            raise ValueError(f"{label}: {value} is not an enum code (0..65535)")
        return code
    if isinstance(value, str):
        found = names.get(value)
        if found is None and value.endswith("_"):  # the Python name of a renamed member
            found = names.get(value[:-1])  # (``from_``: schema names have no underscores)
        if found is not None:
            return found
        known = ", ".join(names)
        raise ValueError(f"{label}: {schema_type} has no enumerant {value!r} ({known})")
    raise TypeError(
        f"{label}: expected a {schema_type} (an int or a name), got {type(value).__name__}"
    )


# ---------------------------------------------------------------------- lists of scalars
def write_bools(out: BytesWriter, items: Sequence[object], label: str) -> None:
    """The elements of a List(Bool), one bit each, padded to a word."""
    byte = 0
    for index, item in enumerate(items):
        if item is True:
            byte |= 1 << (index & 7)
        elif item is not False:
            raise bad_type(item, f"{label}[{index}]", "bool (Bool)")
        if index & 7 == 7:
            out.append(byte)
            byte = 0
    count = len(items)
    if count & 7:
        out.append(byte)
    used = (count + 7) >> 3
    if used & 7:
        out.write(TEXT_ENDS[used & 7])


def write_integers(
    out: BytesWriter,
    items: Sequence[object],
    width: int,
    low: int,
    high: int,
    names: dict[str, int] | None,
    label: str,
    schema_type: str,
) -> None:
    """The elements of a list of integers (of enums, with ``names``), padded to a word."""
    for index, item in enumerate(items):
        if names is not None:
            value = check_enum(item, names, f"{label}[{index}]", schema_type)
        elif isinstance(item, int) and low <= item <= high:
            value = item
        else:
            value = check_integer(item, low, high, f"{label}[{index}]", schema_type)
        append_int(out, value, width)
    used = len(items) * width
    if used & 7:
        out.write(TEXT_ENDS[used & 7])


def write_floats(
    out: BytesWriter, items: Sequence[object], width: int, label: str, schema_type: str
) -> None:
    """The elements of a list of Float32 (``width`` 4) or Float64, padded to a word."""
    for index, item in enumerate(items):
        if isinstance(item, float) and width == 8:
            write_f64_le(out, item)
            continue
        number = check_float(item, f"{label}[{index}]", schema_type, width)
        if width == 4:
            write_f32_le(out, number)
        else:
            write_f64_le(out, number)
    if width == 4 and len(items) & 1:
        out.write(TEXT_ENDS[4])
