"""Whole structs as tuples: the ``row`` and ``rows`` of generated code.

Theory of operation
-------------------
A *row* is a struct read all at once into a tuple of its fields' values, in schema order
(a struct's ``StructPlan.order``, what ``new_message`` and ``assign`` take too): numbers,
bools, enum members, ``str`` for Text, ``bytes`` for Data, a row for a struct field
(None for a null struct pointer: rows are read eagerly, and a struct that holds itself
would otherwise never end), a Python ``list`` for a List field (of rows, for a list of
structs). A group's fields take its place (``StructPlan.row_width``: a group is part of
its struct's layout, as an unnamed union's members are, and one tuple per struct is
what makes a tree of them as cheap as msgpack's), except a group that is a union member,
which is one value: its own row, or None. A union member that is not set reads as None,
and a Void member that is set as True. Generated
``T.row(reader)`` and ``T.rows(list_reader)`` call it, and the generated encoder takes a
row wherever it takes a dict of a struct's fields, so a row read is a row written.

Why: reading a struct a field at a time costs a Python attribute access per field (about
20 ns each, and a reader object per nested struct); a row is one compiled call per
message that walks the plan the generator made (capsvc.codec.plans) and reads every
field at its offset, much as msgpack's ``unpackb`` makes a tuple in one call.

The rules of the readers hold (capsvc.codec.reading): every pointer is resolved and
bounds-checked there (``read_text``, ``_resolve``, ``_open_list``), each object is charged
to the message's traversal budget before it is read, the nesting limit is counted the
same way, and a struct from an older writer (a shorter data section) reads its missing
fields as their defaults from a zero-padded copy. What this module does not read
natively (pointer fields with schema defaults, lists of anything but structs,
capabilities, AnyPointers, float defaults, enum codes the schema does not know) it reads
through the generated reader's own field, so a row always equals the reader's values.

In the compiled build the rows of a message's common case are read in C
(capsvc/codec/_native.c): each plan is flattened once into a ``Program`` (``native_program``),
and C reads near pointers within one segment, charging the budget and counting nesting
as this module does. On anything else (far pointers, upgraded lists, and every fault) C
gives up with the budget untouched and this module reads the struct from the start, so
faults get the same DecodeError and C never has to name one. The pure build never loads
C.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Final

from librt.strings import read_f32_le, read_f64_le, read_i16_le, read_i32_le, read_i64_le

from capsvc import _build
from capsvc._mypyc import i64
from capsvc.codec.building import StructListBuilder
from capsvc.codec.plans import (
    ANY,
    BOOL,
    CAPABILITY,
    DATA,
    ENUM,
    FLOAT,
    GROUP,
    INT,
    LIST,
    STRUCT,
    TEXT,
    VOID,
    FieldPlan,
    ListPlan,
    StructPlan,
    copied,
    of_struct,
    spliced,
)
from capsvc.codec.reading import (
    DEFAULT_NESTING_LIMIT,
    ListReader,
    MessageReader,
    R,
    StructList,
    StructReader,
    _open_list,
    locate_struct,
    near_composite,
    padded_data,
    read_data,
    read_segments,
    read_text,
)
from capsvc.errors import DecodeError

__all__ = [
    "NATIVE",
    "NativeEntries",
    "Selection",
    "list_rows",
    "root_row",
    "select",
    "struct_row",
    "use_native",
]

_WORD: Final = 1 << 64
_MASK64: Final = (1 << 64) - 1
#: The kind of a field C reads through ``_via_reader`` (capsvc/codec/_native.c).
_VIA: Final = 100
#: Kinds of fields that hold no pointer (and are no group holding one).
_NO_POINTER: Final = (VOID, BOOL, INT, FLOAT, ENUM)


class NativeEntries:
    """The C reader's and encoder's entry points (capsvc/codec/_native.c) that rows and
    capsvc.codec.values call, or None each: bound once, and read as a native attribute of
    a ``Final`` object in the compiled build (a module attribute there costs a dict
    lookup, and a function of it a getattr, per message)."""

    __slots__ = (
        "element_rows",
        "encode_framed",
        "encode_root",
        "module",
        "root_row",
        "struct_row",
    )

    def __init__(self) -> None:
        self.module: Any = None
        self.struct_row: Any = None
        self.element_rows: Any = None
        self.encode_root: Any = None
        self.encode_framed: Any = None
        self.root_row: Any = None


#: The C half in use: the compiled build's, else none (``use_native``).
NATIVE: Final = NativeEntries()


def use_native(module: Any) -> None:
    """Read and encode rows through ``module`` (capsvc.codec._native), or in Python only
    (None): the compiled build starts with C, the pure one without; tests run both."""
    global _native
    _native = module
    NATIVE.module = module
    NATIVE.struct_row = None if module is None else module.struct_row
    NATIVE.element_rows = None if module is None else module.element_rows
    NATIVE.encode_root = None if module is None else module.encode_root
    NATIVE.encode_framed = None if module is None else module.encode_framed
    NATIVE.root_row = None if module is None else module.root_row


#: The C module itself (its ``Program`` type), while in use.
_native: Any = None
if _build.COMPILED:
    from capsvc.codec import _native as _compiled_half

    use_native(_compiled_half)


# ---------------------------------------------------------------------- entry points
def root_row(
    cls: type[R], plan: StructPlan, segments: list[bytes | memoryview], traversal: int, nesting: int
) -> tuple[Any, ...]:
    """The row of the root ``cls`` struct (``plan``'s) of a message's ``segments`` (a list
    made for this message alone, a decoder's), read with ``traversal`` words of budget and
    ``nesting`` levels: ``struct_row(read_segments(...))``, the same row and the same
    errors, but a one-segment message is read in one C call with no message or reader
    object made (what a row decoder gives per message)."""
    root_row_in_c = NATIVE.root_row
    if root_row_in_c is not None and len(segments) == 1:
        only = segments[0]
        if type(only) is bytes:
            program = native_program(plan)
            row = root_row_in_c(program, only, traversal, nesting, _VIA_READER, _ROOT_MESSAGE)
            if row is not None:
                return row  # type: ignore[no-any-return]
    return struct_row(read_segments(cls, segments, traversal, nesting, True), plan)


def struct_row(reader: object, plan: StructPlan) -> tuple[Any, ...]:
    """The row of ``reader`` (a generated reader of ``plan``'s struct, or a builder)."""
    if not isinstance(reader, StructReader):
        as_reader = getattr(reader, "as_reader", None)
        if as_reader is None:
            raise TypeError(f"{plan.name}.row() takes a {plan.name} reader or builder")
        reader = as_reader()
        if not isinstance(reader, StructReader):
            raise TypeError(f"{plan.name}.row() takes a {plan.name} reader or builder")
    if plan.reader is not None and not isinstance(reader, plan.reader):
        # Another struct's fields are elsewhere: refused, not read at this one's offsets.
        raise TypeError(
            f"{plan.name}.row() takes a {plan.name} reader or builder,"
            f" not {type(reader).__qualname__}"
        )
    struct_row_in_c = NATIVE.struct_row
    if struct_row_in_c is not None:
        msg = reader._msg
        si = reader._si
        row = struct_row_in_c(
            native_program(plan),
            msg,
            msg.segments[si],
            msg.budget,
            si,
            reader._seg,
            reader._data,
            reader._ptr,
            reader._pend,
            reader._depth,
            _VIA_READER,
        )
        if row is not None:
            return row  # type: ignore[no-any-return]
    return _row(
        reader._msg,
        reader._si,
        reader._seg,
        reader._data,
        reader._ptr,
        reader._pend,
        plan,
        reader._depth,
    )


def list_rows(elements: object, plan: StructPlan) -> list[tuple[Any, ...]]:
    """The rows of a list of ``plan``'s structs (a generated list reader, or the list of
    a struct being built: read from one snapshot of its message, not one per element)."""
    if isinstance(elements, StructListBuilder):
        if getattr(elements._cls, "_PLAN", None) is not plan.origin:
            raise TypeError(
                f"{plan.name}.rows() takes a list of {plan.name},"
                f" not of {elements._cls.__qualname__}"
            )
        snapshot = MessageReader([bytes(elements._b.buf)])
        return _list_of_rows(
            snapshot,
            0,
            elements._start,
            elements._count,
            plan.data_words + plan.pointers,
            plan.data_words,
            plan.pointers,
            plan,
            DEFAULT_NESTING_LIMIT,
        )
    if not isinstance(elements, StructList):
        if isinstance(elements, ListReader) or not hasattr(elements, "__iter__"):
            raise TypeError(f"{plan.name}.rows() takes a list of {plan.name} readers")
        return [struct_row(item, plan) for item in elements]  # type: ignore[attr-defined,unused-ignore]
    if plan.reader is not None and not issubclass(elements._cls, plan.reader):
        raise TypeError(
            f"{plan.name}.rows() takes a list of {plan.name} readers,"
            f" not of {elements._cls.__qualname__}"
        )
    words = elements._words
    if not words or not elements._count:
        return [struct_row(item, plan) for item in elements]
    return _list_of_rows(
        elements._msg,
        elements._si,
        elements._start,
        elements._count,
        words,
        elements._dw,
        elements._pc,
        plan,
        elements._depth,
    )


# ---------------------------------------------------------------------- selections
class Selection:
    """Some of a struct's fields, read as rows: generated ``T.select(...)``. A selection's
    row holds the fields chosen, in schema order, as ``T.row`` holds them; a struct, list
    or group field given a selection of its own holds rows of that. Made once and kept
    (a module constant): reading is as fast as a whole row, and skips what it leaves out,
    so a row of a few fields of a wide struct costs a few fields' reads, as Cap'n Proto's
    readers cost only what they read."""

    __slots__ = ("plan",)

    def __init__(self, plan: StructPlan) -> None:
        #: A plan of the struct holding only the fields selected (``origin``: the whole).
        self.plan = plan

    def row(self, reader: object) -> tuple[Any, ...]:
        """The selected fields of ``reader`` (a reader or builder of the struct)."""
        return struct_row(reader, self.plan)

    def rows(self, readers: object) -> list[tuple[Any, ...]]:
        """The selected fields of every element of a list of the struct."""
        return list_rows(readers, self.plan)

    @property
    def labels(self) -> list[str]:
        """What each value of a row is, as ``StructPlan.row_labels`` says."""
        return self.plan.row_labels()

    def __repr__(self) -> str:
        return f"<{self.plan.name} selection: {_describe(self.plan)}>"


def select(plan: StructPlan, names: tuple[object, ...], nested: Mapping[str, object]) -> Selection:
    """Generated ``T.select(*names, **nested)``: the fields ``names`` of ``plan``'s struct
    whole, and of each field named in ``nested`` (a struct, a list of structs or a group)
    the fields of its selection (a ``Selection`` of that type, a name, or a sequence of
    names)."""
    where = f"{plan.name}.select()"
    chosen: dict[int, FieldPlan] = {}
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{where} takes field names, not {type(name).__name__}")
        field = _field(plan, name, where)
        chosen.setdefault(field.index, copied(field))
    for key, spec in nested.items():
        field = _field(plan, key, where)
        if field.index in chosen:
            raise TypeError(f"{where}: {field.label} is selected twice")
        chosen[field.index] = _narrowed(field, spec, where)
    if not chosen:
        raise TypeError(f"{where} selects nothing: name at least one of {', '.join(plan.keys)}")
    selection = StructPlan(plan.name, plan.data_words, plan.pointers, plan.disc_at, plan.is_group)
    selection.origin = plan.origin
    selection.reader = plan.reader
    selection.add(*(chosen[index] for index in sorted(chosen)))
    return Selection(selection)


def _field(plan: StructPlan, name: str, where: str) -> FieldPlan:
    field = plan.fields.get(name)
    if field is None:
        raise plan.unknown(name, where)
    return field


def _narrowed(field: FieldPlan, spec: object, where: str) -> FieldPlan:
    """``field`` holding a selection (``spec``) of the struct it holds."""
    element = field.list
    if field.kind in (STRUCT, GROUP):
        target = field.target
    elif field.kind == LIST and element is not None and element.kind == STRUCT:
        target = element.target
    else:
        raise TypeError(
            f"{where}: {field.label} is {field.schema_type}: only a struct, a list of"
            " structs or a group has fields to select (name it to select it whole)"
        )
    assert target is not None
    if isinstance(spec, Selection):
        if spec.plan.origin is not target.origin:
            raise TypeError(
                f"{where}: {field.label} holds {target.name}, not {spec.plan.name}"
                f" (select from {target.name})"
            )
        narrowed = spec.plan
    elif isinstance(spec, str):  # one name (a str is a Sequence[str] to the type checker)
        narrowed = select(target, (spec,), {}).plan
    elif isinstance(spec, (tuple, list)):
        narrowed = select(target, tuple(spec), {}).plan
    else:
        raise TypeError(
            f"{where}: {field.label} takes a {target.name} selection, or one or a sequence"
            f" of its field names, not {type(spec).__name__}"
        )
    if field.kind == LIST:
        return copied(field, list_plan=of_struct(narrowed))
    return copied(field, target=narrowed)


def _describe(plan: StructPlan) -> str:
    """A selection's fields, a narrowed one's own in brackets: ``a, b(c, d)``."""
    parts: list[str] = []
    for field in plan.order:
        element = field.list
        target = element.target if element is not None else field.target
        if target is not None and target is not target.origin:
            parts.append(f"{field.key}({_describe(target)})")
        else:
            parts.append(field.key)
    return ", ".join(parts)


def _list_of_rows(
    msg: MessageReader,
    si: int,
    start: int,
    count: int,
    words: int,
    data_words: int,
    pointers: int,
    plan: StructPlan,
    depth: int,
) -> list[tuple[Any, ...]]:
    """``_element_rows`` (the same arguments), in C where the compiled build can."""
    element_rows_in_c = NATIVE.element_rows
    if element_rows_in_c is not None:
        rows = element_rows_in_c(
            native_program(plan),
            msg,
            msg.segments[si],
            msg.budget,
            si,
            start,
            count,
            words,
            data_words,
            pointers,
            depth,
            _VIA_READER,
        )
        if rows is not None:
            return rows  # type: ignore[no-any-return]
    return _element_rows(msg, si, start, count, words, data_words, pointers, plan, depth)


# ---------------------------------------------------------------------- the C reader
def native_program(plan: StructPlan) -> object:
    """``plan`` flattened for the C reader and encoder (made on first use, then kept on
    the plan)."""
    program = plan.native
    if program is None:
        program = _make_program(plan)
    return program


def _make_program(plan: StructPlan) -> object:
    program = plan.native
    if program is not None:
        return program
    program = _native.Program(plan)
    plan.native = program  # before the fields: a struct may hold itself
    fields: list[tuple[object, ...]] = []
    width = plan.row_width()
    for field, row_at in zip(plan.order, plan.row_at, strict=True):
        kind = field.kind
        sub: object = None
        if field.row_via_reader or kind in (CAPABILITY, ANY) or (kind == FLOAT and field.xor):
            kind = _VIA
        elif kind in (STRUCT, GROUP):
            assert field.target is not None
            sub = _make_program(field.target)
        elif kind == LIST:
            element = field.list
            if element is not None and element.kind == STRUCT and element.target is not None:
                sub = _make_program(element.target)
            else:
                kind = _VIA
        fields.append(
            (
                kind,
                field.kind,
                field.offset,
                field.width,
                field.signed,
                field.xor & _MASK64,
                field.disc,
                sub,
                field.enum_members,
                field,
                field.key,
                field.name,
                row_at,
                spliced(field),
            )
        )
    # The order the Python encoder appends pointer targets in (capsvc.codec.values): by
    # offset for a plan written in one pass, else schema order (groups among them; the
    # fields that hold no pointer left out, as they append nothing).
    appended = plan.pointer_fields if plan.in_order else plan.order
    order = tuple(field.index for field in appended if field.kind not in _NO_POINTER)
    program.set(plan.data_words, plan.pointers, plan.disc_at, width, tuple(fields), order)
    return program


# ---------------------------------------------------------------------- structs
def _row(
    msg: MessageReader,
    si: int,
    seg: bytes,
    data: int,
    ptr: int,
    pend: int,
    plan: StructPlan,
    depth: int,
) -> tuple[Any, ...]:
    """The row of the struct whose data section is at byte ``data`` of ``seg`` (at least
    the schema's size: a padded copy if the writer's was shorter) and whose pointers are
    words ``ptr`` to ``pend`` of segment ``si``; ``depth`` is the nesting left below it."""
    # A stack of lists, not a free list that is popped and appended to: a list shrunk to
    # nothing and grown again is reallocated every time.
    scratch, busy = plan.scratch, plan.scratch_busy
    level = plan.scratch_level
    if level == len(scratch):
        scratch.append([None] * plan.row_width())
        busy.append(False)
    values = scratch[level]
    busy[level] = True
    plan.scratch_level = level + 1
    try:
        _gather(msg, si, seg, data, ptr, pend, plan, depth, values, 0)
        return tuple(values)
    finally:
        for index in range(len(values)):
            values[index] = None  # what the row holds is the caller's, not the plan's
        busy[level] = False
        # Down past every free list on top: a row that ends while one taken after it still
        # runs (another thread's) leaves the level to that one.
        top = plan.scratch_level
        while top > 0 and not busy[top - 1]:
            top -= 1
        plan.scratch_level = top


def _gather(
    msg: MessageReader,
    si: int,
    seg: bytes,
    data: int,
    ptr: int,
    pend: int,
    plan: StructPlan,
    depth: int,
    values: list[object],
    base: int,
) -> None:
    """``_row`` into ``values`` from ``base`` on (a spliced group's fields land in its
    struct's row: ``StructPlan.row_width``)."""
    disc = -1
    if plan.disc_at >= 0:
        disc = int(read_i16_le(seg, data + plan.disc_at)) & 0xFFFF
    plan.row_width()  # (``row_at``, on first use)
    row_at = plan.row_at
    position: i64 = 0
    field_index: i64 = -1
    for field in plan.order:
        field_index += 1
        position = base + row_at[field_index]
        if field.disc >= 0 and field.disc != disc:
            continue  # a union member not set: None
        kind = field.kind
        if kind == INT:
            values[position] = _integer(seg, data + field.offset, field)
        elif kind == BOOL:
            bit = field.offset
            values[position] = (seg[data + (bit >> 3)] >> (bit & 7) & 1) != field.xor
        elif kind == FLOAT and not field.xor:
            if field.width == 4:
                values[position] = read_f32_le(seg, data + field.offset)
            else:
                values[position] = read_f64_le(seg, data + field.offset)
        elif kind == ENUM:
            code = (int(read_i16_le(seg, data + field.offset)) & 0xFFFF) ^ field.xor
            members = field.enum_members
            if code < len(members):
                values[position] = members[code]
            else:
                values[position] = _via_reader(msg, si, seg, data, ptr, pend, plan, depth, field)
        elif field.row_via_reader:
            values[position] = _via_reader(msg, si, seg, data, ptr, pend, plan, depth, field)
        elif kind == TEXT:
            w = ptr + field.offset
            values[position] = read_text(msg, si, w if w < pend else -1, "")
        elif kind == STRUCT:
            w = ptr + field.offset
            target = field.target
            assert target is not None
            values[position] = _struct_field(msg, si, w if w < pend else -1, target, depth)
        elif kind == LIST:
            w = ptr + field.offset
            values[position] = (
                _list_field(msg, si, w if w < pend else -1, field, depth)
                if _is_struct_list(field)
                else _via_reader(msg, si, seg, data, ptr, pend, plan, depth, field)
            )
        elif kind == GROUP:
            target = field.target
            assert target is not None
            if field.disc < 0:  # spliced: its fields take its place
                _gather(msg, si, seg, data, ptr, pend, target, depth, values, position)
            else:  # a union member: its own row
                values[position] = _row(msg, si, seg, data, ptr, pend, target, depth)
        elif kind == DATA:
            w = ptr + field.offset
            values[position] = read_data(msg, si, w if w < pend else -1, b"")
        elif kind == VOID:
            values[position] = True if field.disc >= 0 else None
        else:  # capabilities, AnyPointers, float defaults
            values[position] = _via_reader(msg, si, seg, data, ptr, pend, plan, depth, field)


def _integer(seg: bytes, at: int, field: FieldPlan) -> int:
    width = field.width
    value: int
    if width == 1:
        value = seg[at]
        if field.signed and value >= 128:
            value -= 256
    elif width == 2:
        value = read_i16_le(seg, at)
        if not field.signed:
            value &= 0xFFFF
    elif width == 4:
        value = read_i32_le(seg, at)
        if not field.signed:
            value &= 0xFFFFFFFF
    else:
        word = read_i64_le(seg, at)
        value = int(word) if field.signed or word >= 0 else int(word) + _WORD
    return value ^ field.xor if field.xor else value


def _sections(
    msg: MessageReader, si: int, start: int, data_words: int, plan: StructPlan
) -> tuple[bytes, int]:
    """The bytes holding a struct's data section, and where in them it starts: the
    segment itself, or a zero-padded copy when the writer's section is shorter."""
    seg = msg.segments[si]
    if data_words >= plan.data_words:
        return seg, start << 3
    return padded_data(seg, start, data_words, plan.data_words), 0


def _struct_field(
    msg: MessageReader, si: int, w: int, plan: StructPlan, depth: int
) -> tuple[Any, ...] | None:
    """The row of the struct the pointer at (``si``, ``w``) leads to; None for a null
    pointer (or ``w`` < 0, an absent slot). Not a row of defaults, as a reader's field
    gives: rows are read eagerly, and a struct that holds itself would never end."""
    si, start, data_words, pointers = locate_struct(msg, si, w, depth)
    if si < 0:
        return None
    seg, data = _sections(msg, si, start, data_words, plan)
    ptr = start + data_words
    return _row(msg, si, seg, data, ptr, ptr + pointers, plan, depth - 1)


# ---------------------------------------------------------------------- lists
def _is_struct_list(field: FieldPlan) -> bool:
    element = field.list
    return element is not None and element.kind == STRUCT


def _list_field(
    msg: MessageReader, si: int, w: int, field: FieldPlan, depth: int
) -> list[tuple[Any, ...]]:
    """The rows of the list of structs the pointer at (``si``, ``w``) leads to."""
    element = field.list
    assert element is not None
    plan = element.target
    assert plan is not None
    if w < 0:
        return []
    start, count, data_words, pointers = near_composite(msg, si, w, depth)
    if count >= 0:  # the common case (no list shape made)
        size = data_words + pointers
        return _element_rows(msg, si, start, count, size, data_words, pointers, plan, depth - 1)
    shape = _open_list(msg, si, w, depth)  # bounds, budget and nesting checked there
    if shape is None or shape.count == 0:
        return []
    if shape.code == 1:
        raise DecodeError(f"expected a list of {plan.name}, found a list of Bool")
    words = shape.step_bits >> 6
    if words == 0:  # sub-word elements (an upgraded primitive list): one padded copy each
        seg = msg.segments[shape.si]
        step = shape.step_bits >> 3
        rows: list[tuple[Any, ...]] = []
        for index in range(shape.count):
            first = (shape.start << 3) + index * step
            padded = bytes(seg[first : first + step]) + bytes(plan.data_words << 3)
            rows.append(_row(msg, shape.si, padded, 0, 0, 0, plan, depth - 1))
        return rows
    return _element_rows(
        msg,
        shape.si,
        shape.start,
        shape.count,
        words,
        shape.data_words,
        shape.pointers,
        plan,
        depth - 1,
    )


def _element_rows(
    msg: MessageReader,
    si: int,
    start: int,
    count: int,
    words: int,
    data_words: int,
    pointers: int,
    plan: StructPlan,
    depth: int,
) -> list[tuple[Any, ...]]:
    """The rows of ``count`` elements of ``words`` words each from word ``start`` of
    segment ``si`` (already bounds-checked and charged as one list)."""
    rows: list[tuple[Any, ...]] = []
    if data_words >= plan.data_words:
        seg = msg.segments[si]
        for at in range(start, start + count * words, words):
            ptr = at + data_words
            rows.append(_row(msg, si, seg, at << 3, ptr, ptr + pointers, plan, depth))
        return rows
    for at in range(start, start + count * words, words):
        seg, data = _sections(msg, si, at, data_words, plan)
        ptr = at + data_words
        rows.append(_row(msg, si, seg, data, ptr, ptr + pointers, plan, depth))
    return rows


# ---------------------------------------------------------------------- the reader's way
def _via_reader(
    msg: MessageReader,
    si: int,
    seg: bytes,
    data: int,
    ptr: int,
    pend: int,
    plan: StructPlan,
    depth: int,
    field: FieldPlan,
) -> Any:
    """``field`` read through the generated reader of its struct, as a row value."""
    cls = plan.reader
    if cls is None:
        raise TypeError(f"{plan.name} has no reader class (regenerate its module)")
    reader = cls()
    assert isinstance(reader, StructReader)
    reader._msg = msg
    reader._si = si
    reader._seg = seg
    reader._data = data
    reader._ptr = ptr
    reader._pend = pend
    reader._depth = depth
    value = getattr(reader, field.key)
    source = getattr(value, "_msg", None)
    if source is None or source is msg or not isinstance(source, MessageReader):
        return _row_value(value, field.kind, field.target, field.list)
    # The field's schema default, read from its own message. Rows are eager, and a
    # default may hold a null pointer whose default is that default again (test.capnp's
    # TestUseGenerics.defaultUser): met again inside its own expansion, a default reads
    # as a null pointer without one does (None, or an empty list), so a row ends.
    key = id(source.segments[0]) if source.segments else 0
    active = _expanding_defaults()
    if key in active:
        return None if field.kind == STRUCT else []
    active.add(key)
    try:
        return _row_value(value, field.kind, field.target, field.list)
    finally:
        active.discard(key)


_THREAD = threading.local()


def _expanding_defaults() -> set[int]:
    """The defaults (their first segment's id) this thread's rows are expanding now."""
    active: set[int] | None = getattr(_THREAD, "defaults", None)
    if active is None:
        active = set()
        _THREAD.defaults = active
    return active


def _row_value(
    value: object, kind: int, target: StructPlan | None, element: ListPlan | None
) -> Any:
    """A reader's value of a field (or list element) as a row holds it."""
    if kind == STRUCT and target is not None:
        return struct_row(value, target)
    if kind == LIST and element is not None:
        assert isinstance(value, ListReader)
        return [_row_value(item, element.kind, element.target, element.element) for item in value]
    return value


#: ``_via_reader`` for the C reader's calls: a Final is a C static in the compiled build
#: (a function named as a value is a dict lookup per call).
_VIA_READER: Final = _via_reader


def _root_message(segment: bytes, traversal: int, nesting: int) -> MessageReader:
    """The message object of ``root_row``'s one segment, made when a field needs one."""
    return MessageReader([segment], traversal_limit_words=traversal, nesting_limit=nesting)


_ROOT_MESSAGE: Final = _root_message
