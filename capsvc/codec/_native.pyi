"""Types of capsvc/codec/_native.c, the C row reader and encoder (capsvc.codec.rows and
capsvc.codec.values use it in the compiled build)."""

from collections.abc import Callable
from typing import Any

class Program:
    def __init__(self, plan: object) -> None: ...
    def set(
        self,
        data_words: int,
        pointers: int,
        disc_at: int,
        width: int,
        fields: tuple[tuple[object, ...], ...],
        pointer_order: tuple[int, ...],
    ) -> None: ...

def struct_row(
    program: object,
    msg: object,
    segment: bytes,
    budget: int,
    si: int,
    seg: bytes,
    data: int,
    ptr: int,
    pend: int,
    depth: int,
    via: Callable[..., Any],
) -> tuple[Any, ...] | None: ...
def element_rows(
    program: object,
    msg: object,
    segment: bytes,
    budget: int,
    si: int,
    start: int,
    count: int,
    words: int,
    data_words: int,
    pointers: int,
    depth: int,
    via: Callable[..., Any],
) -> list[tuple[Any, ...]] | None: ...
def root_row(
    program: object,
    segment: bytes,
    traversal_limit: int,
    nesting_limit: int,
    via: Callable[..., Any],
    make_msg: Callable[[bytes, int, int], Any],
) -> tuple[Any, ...] | None: ...
def encode_root(program: object, values: object, missing: object) -> bytearray | None: ...
def encode_framed(program: object, values: object, missing: object) -> bytes | None: ...
def pack(data: bytes) -> bytes: ...
def unpack(data: bytes, max_words: int) -> bytes | None: ...
def pack_framed(segment: bytes | bytearray) -> bytes: ...
def unpack_segment(data: bytes, max_words: int) -> bytes | None: ...
def use_shuffle(on: bool) -> bool: ...
def one_segment(buf: bytearray | bytes, pos: int, max_words: int) -> bytes | None: ...
def frame_one(segment: bytearray) -> bytes: ...
