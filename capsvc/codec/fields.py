"""Precompiled ``struct`` readers and writers of each field width, for generated code.

Generated accessors call these directly (module globals: no attribute lookups), one
``unpack_from`` or ``pack_into`` per field, at byte offsets computed at generation time
(specs/codegen.md §4: about 0.09 us per call).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, cast

_GetInt = Callable[[Any, int], tuple[int]]
_GetFloat = Callable[[Any, int], tuple[float]]
_Set = Callable[[Any, int, Any], None]


def _int(fmt: str) -> tuple[_GetInt, _Set]:
    packer = struct.Struct("<" + fmt)
    return cast(_GetInt, packer.unpack_from), cast(_Set, packer.pack_into)


def _float(fmt: str) -> tuple[_GetFloat, _Set]:
    packer = struct.Struct("<" + fmt)
    return cast(_GetFloat, packer.unpack_from), cast(_Set, packer.pack_into)


get_i8, set_i8 = _int("b")
get_i16, set_i16 = _int("h")
get_i32, set_i32 = _int("i")
get_i64, set_i64 = _int("q")
get_u8, set_u8 = _int("B")
get_u16, set_u16 = _int("H")
get_u32, set_u32 = _int("I")
get_u64, set_u64 = _int("Q")
get_f32, set_f32 = _float("f")
get_f64, set_f64 = _float("d")

_f32_bits = struct.Struct("<f")
_u32_bits = struct.Struct("<I")
_f64_bits = struct.Struct("<d")
_u64_bits = struct.Struct("<Q")


def f32_from_bits(bits: int) -> float:
    """The Float32 whose bit pattern is ``bits`` (floats with defaults are stored XOR the
    default's bits)."""
    return float(_f32_bits.unpack(_u32_bits.pack(bits))[0])


def f32_bits(value: float) -> int:
    return int(_u32_bits.unpack(_f32_bits.pack(value))[0])


def f64_from_bits(bits: int) -> float:
    return float(_f64_bits.unpack(_u64_bits.pack(bits))[0])


def f64_bits(value: float) -> int:
    return int(_u64_bits.unpack(_f64_bits.pack(value))[0])
