"""Building whole structs from plain values: ``new_message(**fields)`` and
``builder.assign(**fields)`` of generated code.

Theory of operation
-------------------
The generator describes every struct as a *plan* (capsvc.codec.plans): its section
sizes, its union's discriminant and, per field, what it is and where it lives. The
values are what pycapnp's ``new_message(**fields)`` takes and ``to_dict()`` gives back:
numbers, bools, ``str`` for Text, ``bytes`` for Data, enums by code or by name, a dict
for a struct or a group (the generated ``Init`` TypedDict types it), a sequence for a
list, a client or server object for a capability, a union member by its name alone. A
struct value (or a list element) may also be a generated reader or builder: it is
deep-copied, capabilities included; a list may be any iterable, a list reader too.

A struct's values travel as one list in the plan's field order (``StructPlan.order``),
``MISSING`` where a field is not given: generated ``assign`` and ``new_message`` pass
their keyword arguments so, a dict is turned into one (``_values_of``, which refuses a
key that names no field).

The encoder writes a whole subtree into one ``librt.strings.BytesWriter``, appending each
object where it is laid out, targets after their pointers as libcapnp lays them out. A
struct whose plan allows it (``in_order``: no union, group or float default) is appended
in one pass in offset order, each value straight from the list to the writer; any other
is appended zeroed and its fields are stored into it. Pointer words are patched once
their targets have been appended. Only then does the subtree join the message (one copy
onto its buffer), so a value that is refused (capsvc.codec.scalars names the field and
its schema type) leaves the message as it was. Readers given as values are copied after
that, through ``building.copy_pointer``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from librt.strings import BytesWriter, write_f32_le, write_f64_le

from capsvc._mypyc import i64
from capsvc.codec import rows
from capsvc.codec.building import (
    EMPTY_STRUCT_OFFSET,
    B,
    MessageBuilder,
    StructBuilder,
    Undo,
    _copy_pointer,
    bad_type,
    framed,
    release_hooks,
    sized_builder,
    write_struct_pointer,
)
from capsvc.codec.packing import pack_message
from capsvc.codec.plans import (
    BOOL,
    BOOL_BYTE,
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
    spliced,
)
from capsvc.codec.reading import AnyPointer, StructReader, written_sections
from capsvc.codec.rows import NATIVE as _NATIVE
from capsvc.codec.scalars import (
    TEXT_ENDS,
    append_int,
    check_enum,
    check_float,
    check_integer,
    patch,
    store,
    store_float,
    write_bools,
    write_floats,
    write_integers,
    zero_bytes,
    zero_words,
)

__all__ = [
    "MISSING",
    "assign_fields",
    "assign_values",
    "new_message",
    "new_message_from",
    "new_message_row",
]


class _Missing:
    """The value of a field not given (generated keywords default to it)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final[Any] = _Missing()


class _Encoder:
    """One subtree being written: ``w`` holds it, its byte 0 is word ``base`` of the
    message; capabilities and deferred copies wait for the subtree to join the message.
    (The lists start empty and shared: most subtrees need none of them.)"""

    def __init__(self, builder: MessageBuilder, base: int, root: StructPlan, op: str) -> None:
        self.builder = builder
        self.w = BytesWriter()
        self.base = base
        self.root = root
        self.op = op
        self.caps: list[Any] = _NONE
        #: (word of the pointer, reader or builder) to deep-copy once the subtree is in.
        self.copies: list[tuple[int, object]] = _NONE
        #: (first word of a composite list element, its data words and pointers, reader).
        self.element_copies: list[tuple[int, int, int, object]] = _NONE
        self.scratch: BytesWriter | None = None

    def where(self) -> str:
        """What was called, for error messages (``Car.assign()``)."""
        return f"{self.root.name}.{self.op}()"

    def end(self) -> int:
        """The message word the next appended object starts at."""
        return self.base + (len(self.w) >> 3)

    def spare(self) -> BytesWriter:
        scratch = self.scratch
        if scratch is None:
            scratch = BytesWriter()
            self.scratch = scratch
        return scratch

    def add_cap(self, hook: Any) -> int:
        """Put ``hook`` in the message's cap table (when the subtree joins); its index."""
        if self.caps is _NONE:
            self.caps = []
        self.caps.append(hook)
        return len(self.builder.caps) + len(self.caps) - 1

    # A builder to copy is read now (``as_reader``: its message as it is): copied later,
    # it could be one this change writes into first (``t.kids[0].kids = t.kids``).

    def copy_later(self, at: int, value: object) -> None:
        if self.copies is _NONE:
            self.copies = []
        if isinstance(value, StructBuilder):
            value = value.as_reader()
        self.copies.append((at, value))

    def copy_element_later(self, start: int, data_words: int, pointers: int, value: object) -> None:
        if self.element_copies is _NONE:
            self.element_copies = []
        if isinstance(value, StructBuilder):
            value = value.as_reader()
        self.element_copies.append((start, data_words, pointers, value))

    def finish(self) -> None:
        """Join the subtree to the message, then make the copies it is waiting for."""
        builder = self.builder
        if len(self.w):
            builder.buf += self.w.getvalue()
        if self.caps is not _NONE:
            builder.caps.extend(self.caps)
        for at, value in self.copies:
            copy_value(builder, at, value)
        for start, data_words, pointers, value in self.element_copies:
            _copy_element(builder, start, data_words, pointers, value)


#: The empty list every encoder starts with (``_Encoder``: never appended to).
_NONE: Final[list[Any]] = []


# ---------------------------------------------------------------------- entry points
def new_message(
    cls: type[B], plan: StructPlan, values: list[object], unknown: Mapping[str, object]
) -> B:
    """A message whose root is a ``cls`` struct of ``plan``, from ``values`` in the plan's
    order (a generated ``new_message``'s keywords) and ``unknown`` (its other keywords:
    fields by their schema names, or an error)."""
    message = _new_root(plan, "new_message", values, unknown)
    return sized_builder(cls, message, 1, plan.data_words, plan.pointers)


def new_message_row(cls: type[B], plan: StructPlan, row: object) -> B:
    """A message whose root is a ``cls`` struct of ``plan`` holding ``row``
    (capsvc.codec.rows: every field in schema order, None for a field left out)."""
    if not isinstance(row, tuple):
        raise bad_type(row, plan.name, f"a {plan.name} row (a tuple)")
    message = _new_root(plan, "from_row", row, None)
    return sized_builder(cls, message, 1, plan.data_words, plan.pointers)


def encode_message(plan: StructPlan, value: object, packed: bool) -> bytes:
    """The bytes of a message whose root is a struct of ``plan`` holding ``value`` (its
    row, or a mapping of its fields) in the stream framing, or its packed encoding:
    ``from_row`` or ``new_message`` and then ``to_bytes``, with no builder made
    (generated ``T.encode``, what msgpack's ``packb`` is to msgpack)."""
    if type(value) is not tuple and type(value) is not dict:
        if not isinstance(value, Mapping):  # (a list is new_message's own form: not taken)
            expected = f"a {plan.name} row (a tuple) or a dict of its fields"
            raise bad_type(value, f"{plan.name}.encode()", expected)
        value = dict(value)
    if packed:
        buf = _native_root(plan, value)
    else:
        data = _native_framed(plan, value)
        if data is not None:
            return data  # (the common case: framed as the C encoder writes it, no copy)
        buf = None  # (C left it to Python: running C again as _native_root would not help)
    if buf is None:
        message = _python_root(plan, "encode", value, None)
        if message.caps:
            # The capabilities would be indexes into a cap table the bytes do not carry.
            release_hooks(message.caps)
            raise ValueError(
                f"{plan.name}.encode(): the value holds capabilities, which a message's"
                " bytes cannot carry (send it as an RPC call's params or results)"
            )
        buf = message.buf
    return pack_message(buf) if packed else framed(buf)


def new_message_from(plan: StructPlan, fields: Mapping[str, object]) -> MessageBuilder:
    """A message whose root struct is ``plan``'s, from a mapping of its fields."""
    return _new_root(plan, "new_message", fields, None)


def _native_root(plan: StructPlan, given: object) -> bytearray | None:
    """The message ``_new_root`` makes from ``given`` (no unknown keywords), by the
    compiled build's C encoder (capsvc/codec/_native.c): the common case, laid out as
    ``_new_root`` lays it out, byte for byte. None for anything it leaves to Python."""
    encode_root = _NATIVE.encode_root
    kind = type(given)  # (``is`` tests: ``in`` a tuple of types compares them with ``==``)
    if encode_root is None or not (kind is list or kind is tuple or kind is dict):
        return None
    buf: bytearray | None = encode_root(_program(plan), given, MISSING)
    return buf


def _program(plan: StructPlan) -> Any:
    """``plan``'s C program (made on first use)."""
    program = plan.native
    return rows.native_program(plan) if program is None else program


def _native_framed(plan: StructPlan, value: object) -> bytes | None:
    """``framed(_native_root(plan, value))`` in one C call (``encode_framed``), the bytes
    written behind the segment table's word; None for anything the C encoder leaves to
    Python (``value`` is a row or a dict here)."""
    encode_framed = _NATIVE.encode_framed
    if encode_framed is None:
        return None
    data: bytes | None = encode_framed(_program(plan), value, MISSING)
    return data


def _new_root(
    plan: StructPlan, op: str, given: object, unknown: Mapping[str, object] | None
) -> MessageBuilder:
    """A message whose root struct is ``plan``'s, from ``given``: values in the plan's order
    (a list, with ``unknown`` keywords to place), or a mapping of fields, or a row."""
    if not unknown:
        buf = _native_root(plan, given)
        if buf is not None:
            return MessageBuilder(buf)
    return _python_root(plan, op, given, unknown)


def _python_root(
    plan: StructPlan, op: str, given: object, unknown: Mapping[str, object] | None
) -> MessageBuilder:
    """``_new_root``'s work in Python: what the C encoder leaves (or has no build for)."""
    builder = MessageBuilder()
    enc = _Encoder(builder, 1, plan, op)
    if type(given) is list:
        values: list[object] = _with_unknown(enc, plan, given, unknown) if unknown else given
    else:
        values = _values_of(enc, plan, given)
    _append_struct(enc, plan, values)
    enc.finish()
    write_struct_pointer(builder.buf, 0, 1, plan.data_words, plan.pointers)
    return builder


def assign_values(
    target: StructBuilder, plan: StructPlan, values: list[object], unknown: Mapping[str, object]
) -> None:
    """Set ``target`` (a struct being built, or a group of one) as a constructor would: the
    given ``values`` (in the plan's order; ``unknown`` as for ``new_message``), every other
    field to its default (pointers null). Nothing changes if a value is refused."""
    enc = _Encoder(target._b, len(target._b.buf) >> 3, plan, "assign")
    _assign(enc, target, plan, _with_unknown(enc, plan, values, unknown) if unknown else values)


def assign_fields(
    target: StructBuilder, plan: StructPlan, fields: Mapping[str, object] | tuple[object, ...]
) -> None:
    """``assign_values`` from a mapping of the fields, or a row."""
    enc = _Encoder(target._b, len(target._b.buf) >> 3, plan, "assign")
    _assign(enc, target, plan, _values_of(enc, plan, fields))


def _assign(enc: _Encoder, target: StructBuilder, plan: StructPlan, values: list[object]) -> None:
    buf = target._b.buf
    data = target._data
    start = data >> 3
    ptr = target._ptr
    end = (ptr + plan.pointers) << 3
    # The struct's sections as they are, with this schema's fields zeroed (each reads as
    # its default), then set from ``values``. What this schema does not know stays as it
    # is: a newer writer's fields in bits its data section leaves unused, its data words
    # past this schema's (before ``ptr``) and its pointers past ``end``. (A group shares
    # its struct's sections: only its own fields are reset, the same way.)
    sections = BytesWriter()
    sections.write(bytes(buf[data:end]))
    _clear(sections, plan, start, ptr)
    _fill(enc, plan, values, sections, start, start, ptr)
    # The copies the encoder makes last (readers deep-copied in) can still fail on a
    # fault or a limit of their source: then nothing has changed.
    undo = Undo(target._b, start, (end >> 3) - start)
    try:
        buf[data:end] = sections.getvalue()
        enc.finish()
    except BaseException:
        undo.restore()
        raise


def set_pointer_value(target: StructBuilder, plan: StructPlan, name: str, value: object) -> None:
    """Set pointer field ``name`` of ``target`` (a struct being built, or a group of one)
    from a plain value as ``assign`` takes it (a list field: a sequence of its elements,
    or a list reader; None: null), every other field left as it is: pycapnp's
    ``builder.field = value``. Nothing changes if the value is refused; the list it
    replaces stays in the message, unreachable, as a C++ orphan would not."""
    field = plan.fields[name]
    builder = target._b
    at = target._ptr + field.offset
    word = BytesWriter()
    word.write(zero_words(1))
    enc = _Encoder(builder, len(builder.buf) >> 3, plan, "set")
    if value is not None:
        _pointer(enc, word, 0, at, field, value)
    undo = Undo(builder, at, 1)
    try:
        builder.buf[at << 3 : (at + 1) << 3] = word.getvalue()
        enc.finish()
    except BaseException:
        undo.restore()
        raise


def _clear(w: BytesWriter, plan: StructPlan, base: int, ptr: int) -> None:
    """Zero the bits and pointers of a struct's or a group's fields in ``w`` (the struct's
    sections from word ``base``), so that each reads as its default."""
    if plan.disc_at >= 0:
        store(w, plan.disc_at, 0, 2)
    for field in plan.order:
        kind = field.kind
        if kind == GROUP:
            assert field.target is not None
            _clear(w, field.target, base, ptr)
        elif kind == BOOL:
            at = field.offset >> 3
            w[at] = w[at] & (0xFF ^ (1 << (field.offset & 7)))
        elif kind in (INT, FLOAT, ENUM):
            store(w, field.offset, 0, field.width)
        elif kind != VOID:
            store(w, ((ptr - base) << 3) + (field.offset << 3), 0, 8)


# ---------------------------------------------------------------------- values
def _with_unknown(
    enc: _Encoder, plan: StructPlan, values: list[object], unknown: Mapping[str, object]
) -> list[object]:
    """``values`` with the keywords a generated signature did not name: fields given by
    their schema names (a Python keyword, passed as ``**{"from": 1}``), or an error."""
    return _place(enc, plan, list(values), unknown)


def _place(
    enc: _Encoder, plan: StructPlan, values: list[object], fields: Mapping[str, object]
) -> list[object]:
    """Each of ``fields`` (by either name) at its place in ``values``."""
    by_name = plan.fields
    for key, value in fields.items():
        field = by_name.get(key)
        if field is None:
            raise plan.unknown(key, enc.where())
        if values[field.index] is not MISSING:
            raise TypeError(f"{enc.where()}: {field.label} given twice (by both of its names)")
        values[field.index] = value
    return values


def _values_of(enc: _Encoder, plan: StructPlan, fields: object) -> list[object]:
    """A mapping of fields (by either of their names), or a row (a tuple of every field
    in the plan's order), as a list in the plan's order."""
    if type(fields) is tuple:
        return _row_values(enc, plan, fields)
    if type(fields) is not dict:
        if not isinstance(fields, Mapping):
            raise bad_type(fields, plan.name, f"a dict of {plan.name}'s fields")
        fields = dict(fields)
    assert isinstance(fields, dict)
    order = plan.order
    count = len(fields)
    if count << 2 >= len(order):  # many given: look each field up
        values: list[object] = [MISSING] * len(order)
        used = 0
        for index, field in enumerate(order):
            value = fields.get(field.key, MISSING)
            if value is MISSING and field.name != field.key:
                value = fields.get(field.name, MISSING)
            if value is not MISSING:
                used += 1
                values[index] = value
        if used == count:
            return values
    return _place(enc, plan, [MISSING] * len(order), fields)  # a few (or a key to blame)


def _row_values(enc: _Encoder, plan: StructPlan, row: tuple[object, ...]) -> list[object]:
    """A row (capsvc.codec.rows: every field in schema order, a group's fields in its
    place, None where a field is left at its default or a union member is not set) as
    values in the plan's order (a spliced group's as its own row)."""
    width = plan.row_width()
    if len(row) != width:
        raise TypeError(
            f"{enc.where()}: a {plan.name} row holds {width} values"
            f" ({', '.join(plan.row_labels())}), not {len(row)}"
        )
    if not plan.row_spliced:  # a value per field
        return [MISSING if value is None else value for value in row]
    values: list[object] = []
    row_at = plan.row_at
    for index, field in enumerate(plan.order):
        at = row_at[index]
        if spliced(field):
            assert field.target is not None
            values.append(row[at : at + field.target.row_width()])
        else:
            value = row[at]
            values.append(MISSING if value is None else value)
    return values


# ---------------------------------------------------------------------- structs
def _append_struct(enc: _Encoder, plan: StructPlan, values: list[object]) -> None:
    """Append a struct of ``plan`` holding ``values``, and then what its pointers lead to."""
    out = enc.w
    start = enc.end()
    if plan.in_order:
        _sections_in_order(plan, values, out)
        _pointers_in_order(enc, plan, values, out, enc.base, start + plan.data_words)
    else:
        out.write(zero_words(plan.data_words + plan.pointers))
        _fill(enc, plan, values, out, enc.base, start, start + plan.data_words)


def _sections_in_order(plan: StructPlan, values: list[object], out: BytesWriter) -> None:
    """Append ``plan``'s data section from ``values``, in offset order, and its pointer
    section zeroed."""
    at = 0
    for item in plan.data_items:
        offset = item.offset
        if offset > at:
            out.write(zero_bytes(offset - at))
        kind = item.kind
        if kind == BOOL_BYTE:
            byte = 0
            for field in item.members:
                value = values[field.index]
                if value is True:
                    if not field.xor:
                        byte |= 1 << (field.offset & 7)
                elif value is False:
                    if field.xor:
                        byte |= 1 << (field.offset & 7)
                elif value is not MISSING:
                    raise bad_type(value, field.label, "bool (Bool)")
            out.append(byte)
        else:
            value = values[item.index]
            if value is MISSING:
                out.write(zero_bytes(item.width))
            elif kind == INT:
                if not (isinstance(value, int) and item.low <= value <= item.high):
                    check_integer(value, item.low, item.high, item.label, item.schema_type)
                assert isinstance(value, int)
                append_int(out, value ^ item.xor, item.width)
            elif kind == ENUM:
                code = check_enum(value, item.enum_names, item.label, item.schema_type)
                append_int(out, code ^ item.xor, 2)
            elif item.width == 4:
                write_f32_le(out, check_float(value, item.label, item.schema_type, 4))
            elif isinstance(value, float):
                write_f64_le(out, value)
            else:
                write_f64_le(out, check_float(value, item.label, item.schema_type, 8))
        at = offset + item.width
    end = (plan.data_words + plan.pointers) << 3
    if end > at:
        out.write(zero_bytes(end - at))


def _pointers_in_order(
    enc: _Encoder, plan: StructPlan, values: list[object], w: BytesWriter, wbase: int, ptr: int
) -> None:
    """The pointer fields of a struct whose pointers start at word ``ptr`` (in ``w``, whose
    byte 0 is word ``wbase``)."""
    for field in plan.pointer_fields:
        value = values[field.index]
        if value is not MISSING and value is not None:
            at = ptr + field.offset
            _pointer(enc, w, (at - wbase) << 3, at, field, value)


def _fill(
    enc: _Encoder,
    plan: StructPlan,
    values: list[object],
    w: BytesWriter,
    wbase: int,
    start: int,
    ptr: int,
) -> None:
    """Store ``values`` into the zeroed struct whose data section starts at word ``start``
    and whose pointers at word ``ptr``; both are in ``w``, whose byte 0 is word ``wbase``
    (any plan: unions, groups, float defaults)."""
    data = (start - wbase) << 3
    member = ""
    for field in plan.order:
        value = values[field.index]
        if value is MISSING:
            continue
        if field.disc >= 0:
            if member:
                raise TypeError(
                    f"{plan.name}: one union member at a time, not both {member} and {field.name}"
                )
            member = field.name
            store(w, data + plan.disc_at, field.disc, 2)
        kind = field.kind
        if kind == INT:
            number = check_integer(value, field.low, field.high, field.label, field.schema_type)
            store(w, data + field.offset, number ^ field.xor, field.width)
        elif kind == BOOL:
            if value is not True and value is not False:
                raise bad_type(value, field.label, "bool (Bool)")
            at = data + (field.offset >> 3)
            if (value is True) != (field.xor != 0):
                w[at] = w[at] | (1 << (field.offset & 7))
            else:
                w[at] = w[at] & (0xFF ^ (1 << (field.offset & 7)))
        elif kind == FLOAT:
            number_f = check_float(value, field.label, field.schema_type, field.width)
            store_float(w, data + field.offset, number_f, field.width, field.xor, enc.spare())
        elif kind == ENUM:
            code = check_enum(value, field.enum_names, field.label, field.schema_type)
            store(w, data + field.offset, code ^ field.xor, 2)
        elif kind == GROUP:
            assert field.target is not None
            group = _values_of(enc, field.target, value)
            _fill(enc, field.target, group, w, wbase, start, ptr)
        elif kind == VOID:
            # None selects a Void union member in a dict; True does in a row, where None
            # stands for a member not set.
            if value is not None and value is not True:
                raise bad_type(value, field.label, "None (Void)")
        elif value is not None:
            at = ptr + field.offset
            _pointer(enc, w, (at - wbase) << 3, at, field, value)


def _pointer(
    enc: _Encoder, w: BytesWriter, rel: int, at: int, field: FieldPlan, value: object
) -> None:
    """The pointer field ``field`` whose word ``at`` is at byte ``rel`` of ``w``."""
    kind = field.kind
    if kind == TEXT:
        _text(enc, w, rel, at, value, field.label)
    elif kind == DATA:
        _data(enc, w, rel, at, value, field.label)
    elif kind == STRUCT:
        assert field.target is not None
        _struct(enc, w, rel, at, field.target, value, field.label, field.default)
    elif kind == LIST:
        assert field.list is not None
        _list(enc, w, rel, at, field.list, value, field.label)
    elif kind == CAPABILITY:
        _capability(enc, w, rel, value, field.label)
    else:
        _any(enc, w, rel, at, value, field.label)


def _struct(
    enc: _Encoder,
    w: BytesWriter,
    rel: int,
    at: int,
    plan: StructPlan,
    value: object,
    label: str,
    default: dict[str, object] | None = None,
) -> None:
    if type(value) is not dict and type(value) is not tuple:  # (before Mapping's isinstance,
        # which runs Python code)
        if isinstance(value, StructReader) or isinstance(value, StructBuilder):
            check_struct_type(value, plan, label)
            enc.copy_later(at, value)
            return
        if not isinstance(value, Mapping):
            expected = f"a dict of {plan.name}'s fields, a {plan.name} row or reader"
            raise bad_type(value, label, expected)
    start = enc.end()
    offset = start - at - 1 if plan.data_words or plan.pointers else EMPTY_STRUCT_OFFSET
    patch(w, rel, (offset << 2) & 0xFFFFFFFF, plan.data_words | plan.pointers << 16)
    values = _values_of(enc, plan, value)
    if default is not None and type(value) is not tuple:
        # A dict sets some fields over the field's schema default, as pycapnp's does. A row
        # is the whole struct (what ``row`` read of one: None where a pointer was null), so
        # it is written as it is: a row read is a row written.
        values = _over(enc, plan, _values_of(enc, plan, default), values)
    _append_struct(enc, plan, values)


def _over(
    enc: _Encoder, plan: StructPlan, base: list[object], values: list[object]
) -> list[object]:
    """``values`` over ``base`` (a field's default): what is given wins; a union member
    given replaces the default's if it is another one; a group or a struct given as a
    dict merges into the default's, field by field, the union member the default selects
    too (pycapnp's ``new_message(**fields)`` sets the keys of a dict into the struct the
    default already put there: test.capnp's TestDefaults)."""
    member_given = any(values[f.index] is not MISSING for f in plan.order if f.disc >= 0)
    merged = list(values)
    for field in plan.order:
        below = base[field.index]
        if below is MISSING:
            continue
        given = merged[field.index]
        if given is MISSING:
            if not (member_given and field.disc >= 0):  # (another member was given)
                merged[field.index] = below
        elif (field.kind == GROUP or field.kind == STRUCT) and (
            type(below) is dict and type(given) is dict
        ):
            assert field.target is not None
            group = field.target
            inner = _over(enc, group, _values_of(enc, group, below), _values_of(enc, group, given))
            pairs = zip(group.keys, inner, strict=True)
            merged[field.index] = {key: v for key, v in pairs if v is not MISSING}
    return merged


def _any(enc: _Encoder, w: BytesWriter, rel: int, at: int, value: object, label: str) -> None:
    """An AnyPointer: Text, Data, a copy of a struct reader (or builder) or of an
    AnyPointer read elsewhere (what a row of it holds), or a capability."""
    if isinstance(value, str):
        _text(enc, w, rel, at, value, label)
    elif isinstance(value, bytes | bytearray | memoryview):
        _data(enc, w, rel, at, value, label)
    elif (
        isinstance(value, StructReader)
        or isinstance(value, StructBuilder)
        or isinstance(value, AnyPointer)
    ):
        enc.copy_later(at, value)
    elif hasattr(value, "_capsvc_hook"):
        _capability(enc, w, rel, value, label)
    else:
        expected = "str, bytes, a struct reader or builder, an AnyPointer, or a capability"
        raise bad_type(value, label, f"{expected} (AnyPointer)")


# ---------------------------------------------------------------------- pointers
def _text(enc: _Encoder, w: BytesWriter, rel: int, at: int, value: object, label: str) -> None:
    if not isinstance(value, str):
        raise bad_type(value, label, "str (Text)")
    encoded = value.encode("utf-8")
    size: i64 = len(encoded) + 1  # the NUL
    offset: i64 = enc.end() - at - 1  # (machine integers: no tagged arithmetic per Text)
    out = enc.w
    out.write(encoded)
    out.write(TEXT_ENDS[(size - 1) & 7])
    patch(w, rel, ((offset << 2) & 0xFFFFFFFF) | 1, (size << 3) | 2)


def _data(enc: _Encoder, w: BytesWriter, rel: int, at: int, value: object, label: str) -> None:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise bad_type(value, label, "bytes (Data)")
    raw = bytes(value)
    size = len(raw)
    start = enc.end()
    out = enc.w
    out.write(raw)
    if size & 7:
        out.write(TEXT_ENDS[size & 7])
    patch(w, rel, (((start - at - 1) << 2) & 0xFFFFFFFF) | 1, size << 3 | 2)


def _capability(enc: _Encoder, w: BytesWriter, rel: int, value: object, label: str) -> None:
    make_hook = getattr(value, "_capsvc_hook", None)
    if make_hook is None:
        raise bad_type(value, label, "a capability (a client or a server object)")
    hook = make_hook()
    if hook.is_null:  # a null capability is a null pointer (C++ setCapabilityPointer)
        hook.release()
        return  # (the pointer word is still zero)
    patch(w, rel, 3, enc.add_cap(hook))


def _items(value: object, label: str) -> Sequence[object]:
    if type(value) is tuple:
        return value
    if isinstance(value, list):
        # The elements as given: a list could change while it is encoded (a dict key's
        # ``__eq__`` runs Python code), and the list's pointer already holds its length.
        return tuple(value)
    if isinstance(value, tuple):
        return value
    if isinstance(value, str | bytes | bytearray | dict) or not hasattr(value, "__iter__"):
        raise bad_type(value, label, "a sequence (a List)")
    return list(value)  # type: ignore[call-overload,unused-ignore]


def _list(
    enc: _Encoder, w: BytesWriter, rel: int, at: int, plan: ListPlan, value: object, label: str
) -> None:
    items = _items(value, label)
    count = len(items)
    if count >= 1 << 29:
        raise ValueError(f"{label}: a list of {count} elements cannot be encoded (0..2**29-1)")
    out = enc.w
    start = enc.end()
    kind = plan.kind
    if kind == STRUCT:
        target = plan.target
        assert target is not None
        data_words, pointers = _element_sizes(target, items)
        size = data_words + pointers
        patch(w, rel, (((start - at - 1) << 2) & 0xFFFFFFFF) | 1, (count * size) << 3 | 7)
        _composite(enc, target, items, label, data_words, pointers)
        return
    patch(w, rel, (((start - at - 1) << 2) & 0xFFFFFFFF) | 1, count << 3 | plan.code)
    if kind == VOID:
        for index, item in enumerate(items):
            if item is not None:
                raise bad_type(item, f"{label}[{index}]", "None (Void)")
    elif kind == BOOL:
        write_bools(out, items, label)
    elif kind == INT:
        write_integers(out, items, plan.width, plan.low, plan.high, None, label, plan.schema_type)
    elif kind == ENUM:
        write_integers(out, items, 2, 0, 0, plan.enum_names, label, plan.schema_type)
    elif kind == FLOAT:
        write_floats(out, items, plan.width, label, plan.schema_type)
    else:
        _pointer_list(enc, plan, items, label, start)


def _element_sizes(plan: StructPlan, items: Sequence[object]) -> tuple[int, int]:
    """The sections of a composite list of ``items``: ``plan``'s, or larger where a struct
    reader or builder among them is larger (a newer writer's, its unknown fields kept in
    the copy, as libcapnp's copy of such a list keeps them)."""
    data_words = plan.data_words
    pointers = plan.pointers
    for item in items:
        if isinstance(item, StructBuilder):
            data_words = max(data_words, item._ptr - (item._data >> 3))
            pointers = max(pointers, item._pend - item._ptr)
        elif isinstance(item, StructReader):
            item_data, item_pointers = written_sections(item)
            data_words = max(data_words, item_data)
            pointers = max(pointers, item_pointers)
    return data_words, pointers


def _composite(
    enc: _Encoder,
    plan: StructPlan,
    items: Sequence[object],
    label: str,
    data_words: int,
    pointers: int,
) -> None:
    """A composite list: its tag word, every element's sections (``data_words`` and
    ``pointers``: ``_element_sizes``), then the elements' pointer targets (after all the
    elements)."""
    out = enc.w
    size = data_words + pointers
    in_order = plan.in_order and size == plan.data_words + plan.pointers
    first = enc.end() + 1
    tag = len(out)
    out.write(zero_words(1))
    patch(out, tag, (len(items) << 2) & 0xFFFFFFFF, data_words | pointers << 16)
    element_values: list[list[object] | None] = []
    for index, item in enumerate(items):
        if type(item) is not dict and type(item) is not tuple:
            if isinstance(item, StructReader) or isinstance(item, StructBuilder):
                check_struct_type(item, plan, f"{label}[{index}]")
                out.write(zero_words(size))
                enc.copy_element_later(first + index * size, data_words, pointers, item)
                element_values.append(None)
                continue
            if not isinstance(item, Mapping):
                expected = f"a dict of {plan.name}'s fields, a {plan.name} row or reader"
                raise bad_type(item, f"{label}[{index}]", expected)
        values = _values_of(enc, plan, item)
        element_values.append(values)
        if in_order:
            _sections_in_order(plan, values, out)
        else:
            out.write(zero_words(size))
    base = enc.base
    for index, element in enumerate(element_values):
        if element is None:
            continue
        start = first + index * size
        if in_order:
            if plan.pointer_fields:
                _pointers_in_order(enc, plan, element, out, base, start + data_words)
        else:
            _fill(enc, plan, element, out, base, start, start + data_words)


def _pointer_list(
    enc: _Encoder, plan: ListPlan, items: Sequence[object], label: str, start: int
) -> None:
    """A list of pointers (Text, Data, lists, capabilities, AnyPointers): the pointer
    words, then what each points at."""
    out = enc.w
    out.write(zero_words(len(items)))
    base = enc.base
    kind = plan.kind
    for index, item in enumerate(items):
        if item is None:
            continue
        at = start + index
        rel = (at - base) << 3
        if kind == TEXT and isinstance(item, str):
            _text(enc, out, rel, at, item, label)
        elif kind == DATA and isinstance(item, bytes | bytearray | memoryview):
            _data(enc, out, rel, at, item, label)
        elif kind == TEXT:
            raise bad_type(item, f"{label}[{index}]", "str (Text)")
        elif kind == DATA:
            raise bad_type(item, f"{label}[{index}]", "bytes (Data)")
        elif kind == LIST:
            assert plan.element is not None
            _list(enc, out, rel, at, plan.element, item, f"{label}[{index}]")
        elif kind == CAPABILITY:
            _capability(enc, out, rel, item, f"{label}[{index}]")
        else:
            _any(enc, out, rel, at, item, f"{label}[{index}]")


# ---------------------------------------------------------------------- copies
def check_struct_type(value: StructReader | StructBuilder, plan: StructPlan, label: str) -> None:
    """Refuse a reader or builder of another struct type than ``plan``'s where one of
    ``plan``'s is copied in (as libcapnp refuses it: "Value type mismatch"). Types are
    compared by schema ID, so another generated module of the same struct (another
    version of the schema) is taken; a class that does not know its ID is taken too."""
    expected: int = getattr(plan.reader, "_STRUCT_ID", 0)
    got = type(value)._STRUCT_ID
    if expected and got and expected != got:
        raise TypeError(
            f"{label}: expected a reader or builder of {plan.name},"
            f" got a {type(value).__qualname__}"
        )


def copy_value(builder: MessageBuilder, at: int, value: object) -> None:
    """Point word ``at`` of ``builder`` at a deep copy of a struct reader (or builder), or
    of what an AnyPointer read elsewhere holds (capabilities too). All or nothing: a copy
    that fails (a fault or a limit in the source) leaves ``builder`` as it was."""
    undo = Undo(builder, at, 1)
    try:
        _copy_value(builder, at, value)
    except BaseException:
        undo.restore()
        raise


def _copy_value(builder: MessageBuilder, at: int, value: object) -> None:
    if isinstance(value, AnyPointer):
        if value._w >= 0:  # (an absent slot, of an older writer's struct: null)
            _copy_pointer(value._msg, value._si, value._w, builder, at, value._depth)
        return
    if isinstance(value, StructBuilder):
        value = value.as_reader()
    if not isinstance(value, StructReader):
        raise bad_type(value, "copy", "a struct reader")
    source = value
    data_words, pointers = written_sections(source)
    target = builder.alloc(data_words + pointers)
    buf = builder.buf
    buf[target << 3 : (target + data_words) << 3] = source._seg[
        source._data : source._data + (data_words << 3)
    ]
    write_struct_pointer(buf, at, target, data_words, pointers)
    for index in range(pointers):
        _copy_pointer(
            source._msg, source._si, source._ptr + index, builder, target + data_words + index,
            source._depth,
        )  # fmt: skip


def _copy_element(
    builder: MessageBuilder, start: int, data_words: int, pointers: int, value: object
) -> None:
    """Copy a reader into element ``start`` of a composite list (sections as the list's)."""
    if isinstance(value, StructBuilder):
        value = value.as_reader()
    assert isinstance(value, StructReader)
    source = value
    source_words, source_pointers = written_sections(source)
    words = min(data_words, source_words)
    buf = builder.buf
    buf[start << 3 : (start + words) << 3] = source._seg[source._data : source._data + (words << 3)]
    for index in range(min(pointers, source_pointers)):
        _copy_pointer(
            source._msg, source._si, source._ptr + index, builder, start + data_words + index,
            source._depth,
        )  # fmt: skip
