"""Find, read and write capability pointers in the raw segments of a Cap'n Proto message.

Theory of operation
-------------------
pycapnp refuses to touch capability pointers outside its own RPC system (see DESIGN.md,
"Capabilities inside messages"), so capsvc lets pycapnp build and read everything else and
handles the capability words itself, directly in the segment buffers:

* A *location* is ``(segment index, word index)`` of one pointer word. ``ROOT`` is the root
  pointer. ``follow`` walks from a location along a *path* of small integers computed from
  the schema (``field_path``) and returns the location of the pointer word reached, or
  ``None`` when an enclosing struct is null or too old to have the slot (an absent pointer
  reads as null, as in libcapnp).
* Path steps. ``s >= 0``: the current pointer is a struct pointer, go to pointer slot ``s``.
  ``~i`` (that is ``-1 - i``): the current pointer is a list pointer, go to element ``i``.
  What an element is comes from the path, never from the data: if the next step is a slot
  step (``>= 0``) element ``i`` is a struct and that step picks its slot, otherwise
  (last step, or another ``~j``) element ``i`` is a pointer. The data is then read the way
  libcapnp reads it, including the legal schema-evolution encodings: a struct list may be
  a composite list (the usual case), a pointer list (structs of one pointer) or a data list
  (structs with no pointers, so every slot is absent); a pointer list may be a composite
  list whose elements have at least one pointer (the first pointer is the element). So
  capsvc and pycapnp always agree on which word a field is.
* Far pointers are followed wherever a pointer is dereferenced, including at the start:
  a single far pointer lands on a normal pointer whose offset is relative to the landing
  pad; a double far pointer lands on two words, a far pointer to the content and a tag
  that describes it. A landing pad may not itself be far (libcapnp rejects that too), so
  one dereference is at most one hop (two words for a double far) and loops are
  impossible: the work of ``follow`` is bounded by the length of the path.
* Hostile input: every segment index, landing pad and object (whole struct or list, as
  libcapnp checks it) is bounds-checked before any word in it is read; anything malformed
  or of the wrong kind raises ``PointerError`` (a ``RemoteProtocolError``), never an
  ``IndexError`` or ``struct.error``. Segments may be ``bytes``, ``bytearray`` or byte
  memoryviews; a trailing partial word (a truncated segment) is treated as absent.
* Writing: ``write_cap_index`` only replaces a null word with a capability pointer (low
  32 bits = 3, high 32 bits = cap-table index); misuse raises ``LocalProtocolError``.
  pycapnp cannot select a union member that is an interface either, so
  ``write_struct_u16`` writes the discriminant into the data section of the struct a path
  leads to (``read_struct_u16`` reads one back).
* Without a schema, ``scan_caps`` lists every capability pointer under a location with its
  path (used to copy content that holds capabilities). It visits every pointer, so it
  bounds its work by a traversal limit (default: the message's size in words) and a
  nesting limit (64), as libcapnp does: cycles and amplified pointers raise PointerError.

Cost: ``follow`` does O(1) work per step (one ``unpack_from`` per pointer, two for a far
pointer): a 3-step path of near pointers takes about 1 us on CPython 3.11, plus about
0.5 us per far pointer crossed. Compute paths once per schema with ``field_path`` and keep
them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final

from capsvc.errors import LocalProtocolError, RemoteProtocolError

__all__ = [
    "ROOT",
    "Location",
    "PointerError",
    "Segments",
    "field_path",
    "follow",
    "list_length",
    "read_cap_index",
    "read_struct_u16",
    "scan_caps",
    "write_cap_index",
    "write_struct_u16",
]

Segments = Sequence[bytes | bytearray | memoryview]
Location = tuple[int, int]

ROOT: Final[Location] = (0, 0)

_read = struct.Struct("<Q").unpack_from
_read2 = struct.Struct("<QQ").unpack_from
# A pointer word as (signed low 32 bits, bits 32-47, bits 48-63): a struct pointer's
# (offset << 2 | kind, data words, pointer count) without any masking.
_read_struct = struct.Struct("<iHH").unpack_from
# ... and as (signed low 32 bits, high 32 bits): a list pointer's
# (offset << 2 | kind, count << 3 | element size code).
_read_list = struct.Struct("<iI").unpack_from
_write = struct.Struct("<Q").pack_into
_read_u16 = struct.Struct("<H").unpack_from
_write_u16 = struct.Struct("<H").pack_into

_CAP_LOW: Final = 3  # low 32 bits of a capability pointer: kind 3 ("other"), B = 0
_MAX_INDEX: Final = 0xFFFFFFFF
# Bits per element for list element size codes 0..6 (7, composite, is handled apart).
_BITS: Final = (0, 1, 8, 16, 32, 64, 64)
NESTING_LIMIT: Final = 64  # as libcapnp's default: struct/list levels scan_caps descends
_POINTER_TYPES: Final = frozenset({"text", "data", "list", "struct", "interface", "anyPointer"})


# (segment, first element, count, stride, data words, pointers, composite?), see _open_list
_ListInfo = tuple[int, int, int, int, int, int, bool]


class PointerError(RemoteProtocolError):
    """A pointer in the segments is malformed, out of bounds, or not what the path expects."""


def _offset(word: int) -> int:
    """Signed 30-bit word offset of a struct/list pointer (bits 2-31)."""
    return (((word & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000) >> 2


def _describe(word: int) -> str:
    if word == 0:
        return "a null pointer"
    kind = word & 3
    if kind == 0:
        return f"a struct pointer ({(word >> 32) & 0xFFFF} data words, {word >> 48} pointers)"
    if kind == 1:
        return f"a list pointer (element size code {(word >> 32) & 7})"
    if kind == 2:
        return "a far pointer"
    if word & 0xFFFFFFFF == _CAP_LOW:
        return f"a capability pointer (index {word >> 32})"
    return f"an unknown 'other' pointer {word:#018x}"


def _check_loc(segments: Segments, loc: Location) -> None:
    si, wi = loc
    if not (0 <= si < len(segments) and 0 <= wi < len(segments[si]) >> 3):
        raise PointerError(f"location {loc} is outside the message")


def _target(segments: Segments, si: int, wi: int) -> tuple[int, int, int]:
    """Dereference the in-bounds pointer word at (si, wi).

    Returns (word describing the object, content segment, content word index); the word is 0
    for a null pointer. Far pointers are resolved; the content position is NOT bounds-checked
    (the caller knows the object's size)."""
    word: int = _read(segments[si], wi << 3)[0]
    if word & 3 != 2:
        return word, si, wi + 1 + _offset(word)
    tsi = word >> 32
    if tsi >= len(segments):
        raise PointerError(
            f"far pointer at {(si, wi)} names segment {tsi}; the message has {len(segments)}"
        )
    seg = segments[tsi]
    pad = (word >> 3) & 0x1FFFFFFF
    if not word & 4:
        if pad >= len(seg) >> 3:
            raise PointerError(
                f"far pointer at {(si, wi)}: landing pad {(tsi, pad)} is outside the segment"
            )
        land: int = _read(seg, pad << 3)[0]
        if land & 3 == 2:
            raise PointerError(
                f"far pointer at {(si, wi)} lands on another far pointer at {(tsi, pad)}"
            )
        return land, tsi, pad + 1 + _offset(land)
    if pad + 2 > len(seg) >> 3:
        raise PointerError(
            f"double-far pointer at {(si, wi)}: landing pad {(tsi, pad)} is outside the segment"
        )
    land, tag = _read2(seg, pad << 3)
    if land & 3 != 2:  # libcapnp ignores this pad's double-far bit; so do we
        raise PointerError(
            f"double-far pointer at {(si, wi)}: its landing pad starts with {_describe(land)},"
            " not a far pointer"
        )
    csi = land >> 32
    if csi >= len(segments):
        raise PointerError(
            f"double-far landing pad at {(tsi, pad)} names segment {csi};"
            f" the message has {len(segments)}"
        )
    if tag & 3 >= 2:
        raise PointerError(
            f"double-far landing pad at {(tsi, pad)}: the tag is {_describe(tag)},"
            " not a struct or list"
        )
    return tag, csi, (land >> 3) & 0x1FFFFFFF


def _open_list(segments: Segments, si: int, wi: int) -> _ListInfo:
    """The list at the in-bounds pointer (si, wi) -> (segment, first element, count, stride,
    data words, pointers, composite?): stride in words, (data words, pointers) as a struct
    reader sees each element. Size code 1 (bits) gives pointers -1 (not a struct or pointer
    list). A null list is empty. The whole list is bounds-checked."""
    lo, hi = _read_list(segments[si], wi << 3)
    if lo & 3 == 2:
        word, cs, cp = _target(segments, si, wi)
        lo, hi = word & 0xFFFFFFFF, word >> 32
    elif not (lo or hi):
        return si, 0, 0, 0, 0, 0, False
    else:
        cs, cp = si, wi + 1 + (lo >> 2)
    if lo & 3 != 1:
        found = _describe((hi << 32) | (lo & 0xFFFFFFFF))
        raise PointerError(f"expected a list pointer at {(si, wi)}, found {found}")
    where = (si, wi)
    size = hi & 7
    count = hi >> 3
    nwords = len(segments[cs]) >> 3
    if size == 7:
        if cp < 0 or cp + 1 + count > nwords:
            raise PointerError(f"composite list at {where} ({count} words) is out of bounds")
        tag: int = _read(segments[cs], cp << 3)[0]
        if tag & 3:
            raise PointerError(f"composite list at {where}: its tag is {_describe(tag)}")
        n = (tag >> 2) & 0x3FFFFFFF
        dw = (tag >> 32) & 0xFFFF
        pc = tag >> 48
        if n * (dw + pc) > count:
            raise PointerError(f"composite list at {where}: {n} elements overrun {count} words")
        return cs, cp + 1, n, dw + pc, dw, pc, True
    if cp < 0 or cp + ((count * _BITS[size] + 63) >> 6) > nwords:
        raise PointerError(f"list at {where} ({count} elements) is out of bounds")
    if size == 6:
        return cs, cp, count, 1, 0, 1, False
    # Data lists read as structs without pointers; bit lists cannot be read as structs.
    return cs, cp, count, 0, 0, -1 if size == 1 else 0, False


def follow(segments: Segments, start: Location, path: Sequence[int]) -> Location | None:
    """Walk from the pointer at `start` along `path`; return the location of the pointer word
    reached, or None if an enclosing struct is null or lacks the slot (see the module doc for
    the path language). Raises PointerError for anything malformed, out of bounds, out of
    range or of the wrong kind."""
    si, wi = start
    if not (0 <= si < len(segments) and 0 <= wi < len(segments[si]) >> 3):
        raise PointerError(f"location {start} is outside the message")
    n = len(path)
    k = 0
    null = False
    while k < n:
        step = path[k]
        if step >= 0:  # struct pointer -> pointer slot `step`
            k += 1
            if null:
                continue
            lo, dw, pc = _read_struct(segments[si], wi << 3)
            if lo & 3 == 0:  # near struct pointer (the common case, inlined) or null
                if not (lo or dw or pc):
                    null = True
                    continue
                cs, cp = si, wi + 1 + (lo >> 2)
            else:
                word, cs, cp = _target(segments, si, wi)
                if word & 3:
                    raise PointerError(
                        f"path step {k - 1} ({step}): expected a struct pointer at {(si, wi)},"
                        f" found {_describe(word)}"
                    )
                dw = (word >> 32) & 0xFFFF
                pc = word >> 48
            if cp < 0 or cp + dw + pc > len(segments[cs]) >> 3:
                raise PointerError(
                    f"path step {k - 1}: struct of {dw} + {pc} words at {(cs, cp)}"
                    f" (pointer {(si, wi)}) is out of bounds"
                )
            if step >= pc:
                null = True
                continue
            si, wi = cs, cp + dw + step
            continue
        # list pointer -> element i
        i = ~step
        if null:
            raise PointerError(f"path step {k} (~{i}): element {i} of a null list")
        cs, first, count, stride, dw, pc, _ = _open_list(segments, si, wi)
        if i >= count:
            raise PointerError(
                f"path step {k} (~{i}): index {i} out of range for the list at {(si, wi)}"
                f" ({count} elements)"
            )
        if pc < 0:
            raise PointerError(
                f"path step {k} (~{i}): the list at {(si, wi)} is a bit list, not a list of"
                " structs or pointers"
            )
        if k + 1 < n and path[k + 1] >= 0:  # element i is a struct; the next step is its slot
            slot = path[k + 1]
            k += 2
            if slot >= pc:
                null = True
                continue
            si, wi = cs, first + i * stride + dw + slot
            continue
        k += 1  # element i is a pointer: the element's first pointer
        if pc == 0:
            raise PointerError(
                f"path step {k - 1} (~{i}): expected a list of pointers at {(si, wi)},"
                " found a list without pointers"
            )
        si, wi = cs, first + i * stride + dw
    return None if null else (si, wi)


def list_length(segments: Segments, loc: Location) -> int:
    """Element count of the list pointer at `loc` (following far pointers); 0 if null.
    Raises PointerError if the pointer is not a well-formed, in-bounds list."""
    _check_loc(segments, loc)
    return _open_list(segments, *loc)[2]


def read_cap_index(segments: Segments, loc: Location) -> int | None:
    """The pointer word at `loc`: None if null, the cap-table index if it is a capability
    pointer; PointerError for anything else (or if `loc` is outside the message)."""
    si, wi = loc
    if not (0 <= si < len(segments) and 0 <= wi < len(segments[si]) >> 3):
        raise PointerError(f"location {loc} is outside the message")
    word: int = _read(segments[si], wi << 3)[0]
    if word & 0xFFFFFFFF == _CAP_LOW:
        return word >> 32
    if word == 0:
        return None
    raise PointerError(f"expected a capability pointer at {loc}, found {_describe(word)}")


def write_cap_index(segments: Segments, loc: Location, index: int) -> None:
    """Overwrite the null word at `loc` with a capability pointer to cap-table entry `index`.
    LocalProtocolError if the word is not null, `loc` is outside the message, the segment is
    read-only (pass bytearrays) or `index` does not fit in 32 bits."""
    if not 0 <= index <= _MAX_INDEX:
        raise LocalProtocolError(f"capability index {index} does not fit in 32 bits")
    si, wi = loc
    if not (0 <= si < len(segments) and 0 <= wi < len(segments[si]) >> 3):
        raise LocalProtocolError(f"location {loc} is outside the message")
    seg = segments[si]
    old: int = _read(seg, wi << 3)[0]
    if old:
        raise LocalProtocolError(
            f"cannot write capability {index} at {loc}: the word holds {_describe(old)}"
        )
    try:
        _write(seg, wi << 3, (index << 32) | _CAP_LOW)
    except TypeError:
        raise LocalProtocolError(f"segment {si} is read-only") from None


def _struct_at(
    segments: Segments, start: Location, path: Sequence[int]
) -> tuple[int, int, int] | None:
    """(segment, data section word index, data words) of the struct that `path` leads to from
    `start`, or None if it is null. A path ending in a slot step (or empty) names a struct
    pointer; a path ending in ``~i`` names element i of a struct list (an inline struct)."""
    if path and path[-1] < 0:
        loc = follow(segments, start, path[:-1])
        if loc is None:
            return None
        cs, first, count, stride, dw, pc, _ = _open_list(segments, *loc)
        i = ~path[-1]
        if i >= count or pc < 0:
            raise PointerError(f"no struct element {i} in the list at {loc} (path {path})")
        return cs, first + i * stride, dw
    loc = follow(segments, start, path)
    if loc is None:
        return None
    word, cs, cp = _target(segments, *loc)
    if word == 0:
        return None
    if word & 3:
        raise PointerError(f"expected a struct pointer at {loc}, found {_describe(word)}")
    dw = (word >> 32) & 0xFFFF
    if cp < 0 or cp + dw + (word >> 48) > len(segments[cs]) >> 3:
        raise PointerError(f"struct at {(cs, cp)} (pointer {loc}) is out of bounds")
    return cs, cp, dw


def read_struct_u16(
    segments: Segments, start: Location, struct_path: Sequence[int], offset: int
) -> int:
    """The 16-bit data field number `offset` (in 16-bit units, like a union's
    discriminantOffset) of the struct at `struct_path` from `start` (see ``_struct_at``).
    A null struct or a field beyond its data section reads as 0, as in libcapnp."""
    found = _struct_at(segments, start, struct_path)
    if found is None or offset < 0 or (offset + 1) * 2 > found[2] * 8:
        return 0
    value: int = _read_u16(segments[found[0]], found[1] * 8 + offset * 2)[0]
    return value


def write_struct_u16(
    segments: Segments, start: Location, struct_path: Sequence[int], offset: int, value: int
) -> None:
    """Write `value` into the 16-bit data field number `offset` of the struct at `struct_path`
    from `start`: how capsvc selects a union member pycapnp cannot set (an interface field),
    with offset = the union's discriminantOffset, value = the member's discriminantValue.
    LocalProtocolError if there is no such struct or field, or the segment is read-only."""
    if not 0 <= value <= 0xFFFF:
        raise LocalProtocolError(f"{value} does not fit in 16 bits")
    found = _struct_at(segments, start, struct_path)
    if found is None:
        raise LocalProtocolError(f"no struct at path {tuple(struct_path)} from {start}")
    si, data, dw = found
    if offset < 0 or (offset + 1) * 2 > dw * 8:
        raise LocalProtocolError(
            f"16-bit field {offset} is outside the {dw}-word data section at {(si, data)}"
        )
    try:
        _write_u16(segments[si], data * 8 + offset * 2, value)
    except TypeError:
        raise LocalProtocolError(f"segment {si} is read-only") from None


Found = list[tuple[tuple[int, ...], Location, int]]


def scan_caps(
    segments: Segments,
    start: Location,
    *,
    traversal_limit: int | None = None,
    nesting_limit: int = NESTING_LIMIT,
) -> Found:
    """Every capability pointer in the object at `start`, without a schema: a list of
    (path from `start`, location, cap-table index), depth first, slots and elements in
    increasing order. Paths use the language of ``follow`` (``~i`` then a slot for composite
    list elements, ``~i`` alone for pointer list elements), so
    ``follow(segments, start, path) == location`` (``start`` for the path ``()``).

    Hostile input: besides the checks of ``follow``, an unknown 'other' pointer raises, as do
    more than `nesting_limit` levels of structs/lists and visiting more than
    `traversal_limit` words in all (default: the message's size, which a message without
    overlapping objects never exceeds), so cycles and amplification stay bounded."""
    _check_loc(segments, start)
    budget = sum(len(s) >> 3 for s in segments) if traversal_limit is None else traversal_limit
    scan = _CapScan(segments, budget, nesting_limit)
    scan.visit(start[0], start[1], (), 0)
    return scan.found


class _CapScan:
    """One ``scan_caps`` walk. A class rather than nested functions: compiled by mypyc, a
    recursive closure is kept in its own environment, a cycle that leaves the walk (and
    the segments it holds) for the garbage collector after every scan."""

    __slots__ = ("budget", "found", "nesting_limit", "segments")

    def __init__(self, segments: Segments, budget: int, nesting_limit: int) -> None:
        self.segments = segments
        self.budget = budget
        self.nesting_limit = nesting_limit
        self.found: Found = []

    def spend(self, words: int) -> None:
        self.budget -= words
        if self.budget < 0:
            raise PointerError("traversal limit exceeded while scanning for capabilities")

    def visit(self, si: int, wi: int, path: tuple[int, ...], depth: int) -> None:
        segments = self.segments
        nesting_limit = self.nesting_limit
        found = self.found
        lo, hi = _read_list(segments[si], wi << 3)
        if not (lo or hi):
            return
        kind = lo & 3
        if kind == 3:
            if lo == _CAP_LOW:
                found.append((path, (si, wi), hi))
                return
            raise PointerError(f"unknown 'other' pointer at {(si, wi)} (path {path})")
        if depth >= nesting_limit:
            raise PointerError(f"nesting limit {nesting_limit} exceeded at path {path}")
        word, cs, cp = _target(segments, si, wi)
        if word & 3 >= 2:
            raise PointerError(f"far pointer at {(si, wi)} lands on {_describe(word)}")
        if word & 3 == 0:
            dw = (word >> 32) & 0xFFFF
            pc = word >> 48
            if cp < 0 or cp + dw + pc > len(segments[cs]) >> 3:
                raise PointerError(f"struct at {(cs, cp)} (pointer {(si, wi)}) is out of bounds")
            self.spend(dw + pc)
            for slot in range(pc):
                self.visit(cs, cp + dw + slot, (*path, slot), depth + 1)
            return
        cs, first, count, stride, dw, pc, composite = _open_list(segments, si, wi)
        if pc <= 0:
            return  # no pointers in the elements
        self.spend(count * stride + composite)
        for i in range(count):
            at = first + i * stride + dw
            if composite:
                for slot in range(pc):
                    self.visit(cs, at + slot, (*path, ~i, slot), depth + 1)
            else:
                self.visit(cs, at, (*path, ~i), depth + 1)


def field_path(struct_schema: Any, names: Sequence[str | int] | str) -> tuple[int, ...]:
    """Pointer-slot path (for `follow`) of a chain of field names from `struct_schema`
    (a pycapnp ``_StructSchema``, or anything with a ``.schema`` such as a StructModule).

    Group fields add no step (their fields live in the parent's sections); pointer fields add
    their slot; an int after a list field selects that element (``~i``). A string is split at
    dots: ``"inner.cap"``. KeyError for an unknown name; ValueError if the chain goes through
    a non-pointer field or ends on something that is not a pointer (a group, a struct list
    element). Unions are not checked: the path of a union member is its slot, whichever
    member is set (the caller reads the discriminant). Compute paths once and keep them."""
    chain = names.split(".") if isinstance(names, str) else list(names)
    schema: Any = struct_schema if hasattr(struct_schema, "node") else struct_schema.schema
    where: Any = None  # capnp Type of the pointer reached; None while inside a struct
    list_field: Any = None  # the field holding the outermost list being indexed
    list_depth = 0  # how many list levels below list_field we are
    at_pointer = True
    path: list[int] = []
    for name in chain:
        if isinstance(name, int):
            if name < 0 or where is None or where.which() != "list":
                raise ValueError(f"index {name} is negative or does not follow a list: {chain}")
            elem = where.list.elementType
            kind = elem.which()
            if kind not in _POINTER_TYPES:
                raise ValueError(f"List({kind}) has no pointer elements: {chain}")
            path.append(~name)
            if kind == "struct":
                schema = list_field.schema
                for _ in range(list_depth + 1):
                    schema = schema.elementType
                where, at_pointer = None, False
            else:
                list_depth += 1
                where, at_pointer = elem, True
            continue
        if where is not None:
            raise ValueError(f"{name!r} follows a {where.which()} field: {chain}")
        field = schema.fields.get(name)
        if field is None:
            raise KeyError(name)
        proto = field.proto
        if proto.which() == "group":
            schema, at_pointer = field.schema, False
            continue
        kind = proto.slot.type.which()
        if kind not in _POINTER_TYPES:
            raise ValueError(f"field {name!r} is a {kind}, not a pointer: {chain}")
        path.append(proto.slot.offset)
        at_pointer = True
        if kind == "struct":
            schema = field.schema
        else:
            where = proto.slot.type
            list_field, list_depth = field, 0
    if not at_pointer:
        raise ValueError(f"{chain} ends on a group or a struct list element, not a pointer")
    return tuple(path)
