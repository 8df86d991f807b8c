"""Plans: what generated code tells the value encoder (capsvc.codec.values) about a struct.

Theory of operation
-------------------
A ``StructPlan`` is a struct (or a group) as the encoder needs it: its section sizes, the
byte offset of its union's discriminant and its fields by name. A ``FieldPlan`` says what
one field is (its kind, below) and where it lives; a ``ListPlan`` what a list's elements
are. Generated modules make them at import, with the maker functions at the end (one per
kind, arguments in the order the generator knows them), and tie plans that refer to each
other together once every plan exists (``StructPlan.add``). Plain data, no behaviour: the
encoder reads it.
"""

from __future__ import annotations

import itertools
from typing import ClassVar, Final, Protocol

__all__ = ["FieldPlan", "ListPlan", "StructPlan", "copied", "spliced"]

# Field and element kinds.
VOID: Final = 0
BOOL: Final = 1
INT: Final = 2
FLOAT: Final = 3
ENUM: Final = 4
TEXT: Final = 5
DATA: Final = 6
STRUCT: Final = 7
LIST: Final = 8
GROUP: Final = 9
CAPABILITY: Final = 10
ANY: Final = 11
#: A byte of Bool fields, in a struct's layout (``StructPlan.data_items``).
BOOL_BYTE: Final = 12


class ListPlan:
    """The elements of a List type: ``kind`` (the field kinds above) and what that kind
    needs. ``code`` is the element size code of its list pointer (0 void .. 7
    composite); ``width`` the bytes of a number (0 for Bool and pointers)."""

    __slots__ = (
        "code",
        "default",
        "element",
        "enum_names",
        "high",
        "kind",
        "low",
        "schema_type",
        "signed",
        "target",
        "width",
    )

    def __init__(
        self,
        kind: int,
        code: int,
        schema_type: str,
        width: int = 0,
        signed: bool = False,
        target: StructPlan | None = None,
        element: ListPlan | None = None,
        enum_names: tuple[str, ...] = (),
    ) -> None:
        self.kind = kind
        self.code = code
        self.schema_type = schema_type
        self.width = width
        self.signed = signed
        self.target = target
        self.element = element
        self.enum_names: dict[str, int] = {name: code for code, name in enumerate(enum_names)}
        #: The range of an integer element (``width`` bytes, ``signed`` or not).
        self.low, self.high = _range(width, signed)


def _range(width: int, signed: bool) -> tuple[int, int]:
    bits = width << 3
    if not bits:
        return 0, 0
    if signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


class FieldPlan:
    """One field: its names (``name`` as the schema spells it, ``key`` as a Python
    keyword, the same unless the schema name is a Python keyword), ``label`` for errors
    (``Car.seats``), ``kind``, and where it is: ``offset`` is a byte offset in the data
    section for numbers and enums, a bit offset for a Bool, a pointer index for pointers.
    ``xor`` is the schema default (the bits of a float's); ``disc`` the union
    discriminant value, or -1 outside a union."""

    __slots__ = (
        "default",
        "disc",
        "enum_members",
        "enum_names",
        "high",
        "index",
        "key",
        "kind",
        "label",
        "list",
        "low",
        "members",
        "name",
        "offset",
        "row_via_reader",
        "schema_type",
        "signed",
        "target",
        "width",
        "xor",
    )

    def __init__(
        self,
        name: str,
        kind: int,
        offset: int,
        schema_type: str,
        *,
        key: str = "",
        width: int = 0,
        signed: bool = False,
        xor: int = 0,
        disc: int = -1,
        target: StructPlan | None = None,
        list_plan: ListPlan | None = None,
        enum_names: tuple[str, ...] = (),
        enum_members: tuple[object, ...] = (),
        row_via_reader: bool = False,
    ) -> None:
        self.name = name
        self.key = key or name
        self.label = name
        #: The field's position in its struct's ``order`` (and in a value tuple).
        self.index = -1
        self.kind = kind
        self.offset = offset
        self.schema_type = schema_type
        self.width = width
        self.signed = signed
        self.xor = xor
        self.disc = disc
        self.target = target
        self.list = list_plan
        self.enum_names: dict[str, int] = {name: code for code, name in enumerate(enum_names)}
        #: The enum's members by code (an enum field's row value, capsvc.codec.rows).
        self.enum_members = enum_members
        #: Whether rows read this field through the generated reader's own field (a
        #: pointer field with a schema default: capsvc.codec.rows reads no defaults).
        self.row_via_reader = row_via_reader
        #: The Bool fields of a ``BOOL_BYTE`` item.
        self.members: list[FieldPlan] = []
        #: A struct field's default value (``struct``), or None.
        self.default: dict[str, object] | None = None
        #: The range of an integer field's values (``width`` bytes, ``signed`` or not).
        self.low, self.high = _range(width, signed)


class StructPlan:
    """A struct (or a group: the sections of the struct it belongs to): ``name`` as the
    schema scopes it (``Car``, ``Expression.left``), its sections, the byte offset of its
    union's discriminant (-1: no union), and its fields by both their names."""

    __slots__ = (
        "data_items",
        "data_words",
        "disc_at",
        "fields",
        "in_order",
        "is_group",
        "keys",
        "name",
        "native",
        "order",
        "origin",
        "pointer_fields",
        "pointers",
        "reader",
        "row_at",
        "row_size",
        "row_spliced",
        "scratch",
        "scratch_busy",
        "scratch_level",
    )

    def __init__(
        self, name: str, data_words: int, pointers: int, disc_at: int = -1, is_group: bool = False
    ) -> None:
        #: The generated reader class of this struct or group (rows read the fields they
        #: do not read natively through it: capsvc.codec.rows); set by generated modules.
        self.reader: type | None = None
        #: This plan flattened for the C row reader (capsvc.codec.rows makes it on first
        #: use, in the compiled build); None until then.
        self.native: object = None
        #: Lists that rows of this struct are gathered in before they become tuples (so a
        #: row costs no list of its own: capsvc.codec.rows), a stack: rows being read at
        #: once (a struct that holds itself, or another thread) each take their own, the
        #: one at ``scratch_level``; ``scratch_busy`` says which are taken (every one at
        #: or above the level is free).
        self.scratch: list[list[object]] = []
        self.scratch_busy: list[bool] = []
        self.scratch_level = 0
        #: Where each field (in ``order``) starts in a row, and a row's length: filled in
        #: by ``row_width`` on first use (a group's plan may get its fields after this one).
        self.row_at: list[int] = []
        self.row_size = -1
        self.row_spliced = False  # (whether a group's fields are spliced in)
        self.name = name
        #: The schema's plan of this struct: itself, except for a selection of some of its
        #: fields (capsvc.codec.rows.select), which reads rows at the same offsets.
        self.origin: StructPlan = self
        self.data_words = data_words
        self.pointers = pointers
        self.disc_at = disc_at
        self.is_group = is_group
        self.fields: dict[str, FieldPlan] = {}
        #: The fields in schema order (a value tuple's order), and their keyword names.
        self.order: list[FieldPlan] = []
        self.keys: list[str] = []
        #: Whether the encoder may write the sections in one pass, in offset order (no
        #: union, no group, no float default): ``data_items`` then ``pointer_fields``.
        self.in_order = False
        #: Data fields by byte offset, Bools as one ``BOOL_BYTE`` item per byte.
        self.data_items: list[FieldPlan] = []
        self.pointer_fields: list[FieldPlan] = []

    def add(self, *fields: FieldPlan) -> None:
        """Add fields (the generated module's tail: every plan exists by then)."""
        for field in fields:
            field.label = f"{self.name}.{field.name}"
            field.index = len(self.order)
            self.fields[field.key] = field
            self.fields[field.name] = field
            self.order.append(field)
            self.keys.append(field.key)
        self.row_size = -1  # (measured again on first use)
        self._lay_out()

    def _lay_out(self) -> None:
        in_order = self.disc_at < 0 and not self.is_group
        items: list[FieldPlan] = []
        bool_bytes: dict[int, FieldPlan] = {}
        pointers: list[FieldPlan] = []
        for field in self.order:
            kind = field.kind
            if kind == GROUP or field.disc >= 0 or (kind == FLOAT and field.xor):
                in_order = False
            elif kind == BOOL:
                byte = bool_bytes.get(field.offset >> 3)
                if byte is None:
                    byte = FieldPlan("", BOOL_BYTE, field.offset >> 3, "Bool", width=1)
                    bool_bytes[field.offset >> 3] = byte
                    items.append(byte)
                byte.members.append(field)
            elif kind in (INT, ENUM, FLOAT):
                items.append(field)
            elif kind != VOID:
                pointers.append(field)
        items.sort(key=_offset)
        for first, second in itertools.pairwise(items):
            if first.offset + first.width > second.offset:
                in_order = False  # fields that share bytes: only a union's do
        self.in_order = in_order
        self.data_items = items
        self.pointer_fields = sorted(pointers, key=_offset)

    def row_width(self) -> int:
        """How many values a row of this struct holds (capsvc.codec.rows): one per field,
        except a group that is not a union member, whose fields take its place in the
        row (its own row's values, spliced in: a group is part of its struct's layout,
        as an unnamed union's members are)."""
        if self.row_size < 0:
            at: list[int] = []
            size = 0
            for field in self.order:
                at.append(size)
                target = field.target
                size += target.row_width() if spliced(field) and target is not None else 1
            self.row_at = at
            self.row_spliced = any(spliced(field) for field in self.order)
            self.row_size = size
        return self.row_size

    def row_labels(self) -> list[str]:
        """What each value of a row is: a field's keyword, ``group.field`` inside a
        spliced group."""
        labels: list[str] = []
        for field in self.order:
            if spliced(field):
                assert field.target is not None
                labels.extend(f"{field.key}.{label}" for label in field.target.row_labels())
            else:
                labels.append(field.key)
        return labels

    def unknown(self, key: object, where: str) -> TypeError:
        known = ", ".join(self.keys) or "none"
        return TypeError(f"{where}: {self.name} has no field {key!r} (its fields: {known})")


def copied(
    field: FieldPlan, target: StructPlan | None = None, list_plan: ListPlan | None = None
) -> FieldPlan:
    """A copy of ``field`` for another plan of the same struct (a selection's: ``add``
    numbers and labels the fields it is given), holding ``target`` or ``list_plan`` where
    given: a selection of the struct, group or list elements the field holds."""
    copy = FieldPlan(
        field.name,
        field.kind,
        field.offset,
        field.schema_type,
        key=field.key,
        width=field.width,
        signed=field.signed,
        xor=field.xor,
        disc=field.disc,
        target=target if target is not None else field.target,
        list_plan=list_plan if list_plan is not None else field.list,
        enum_names=tuple(field.enum_names),  # (a dict in code order)
        enum_members=field.enum_members,
        row_via_reader=field.row_via_reader,
    )
    copy.default = field.default
    return copy


def spliced(field: FieldPlan) -> bool:
    """Whether ``field`` is a group whose fields are spliced into its struct's row (every
    group but a union member, which is one value: its row, or None when not set)."""
    return field.kind == GROUP and field.disc < 0


def _offset(field: FieldPlan) -> int:
    return field.offset


# ---------------------------------------------------------------------- plan makers
# What generated modules call: one function per kind, arguments in the order the
# generator knows them. ``key`` is the Python keyword of a field whose schema name is
# not one; ``disc`` the union discriminant value (-1: not a union member).
def void(name: str, disc: int = -1, key: str = "") -> FieldPlan:
    return FieldPlan(name, VOID, 0, "Void", key=key, disc=disc)


def boolean(name: str, bit: int, default: bool, disc: int = -1, key: str = "") -> FieldPlan:
    return FieldPlan(name, BOOL, bit, "Bool", key=key, xor=int(default), disc=disc)


def integer(
    name: str,
    schema_type: str,
    offset: int,
    width: int,
    signed: bool,
    xor: int = 0,
    disc: int = -1,
    key: str = "",
) -> FieldPlan:
    return FieldPlan(
        name, INT, offset, schema_type, key=key, width=width, signed=signed, xor=xor, disc=disc
    )


def floating(
    name: str,
    schema_type: str,
    offset: int,
    width: int,
    xor: int = 0,
    disc: int = -1,
    key: str = "",
) -> FieldPlan:
    return FieldPlan(name, FLOAT, offset, schema_type, key=key, width=width, xor=xor, disc=disc)


def enumeration(
    name: str,
    schema_type: str,
    offset: int,
    names: tuple[str, ...],
    xor: int = 0,
    disc: int = -1,
    key: str = "",
    members: tuple[object, ...] = (),
) -> FieldPlan:
    return FieldPlan(
        name,
        ENUM,
        offset,
        schema_type,
        key=key,
        width=2,
        xor=xor,
        disc=disc,
        enum_names=names,
        enum_members=members,
    )


def text(name: str, slot: int, disc: int = -1, key: str = "", defaulted: bool = False) -> FieldPlan:
    """A Text field; ``defaulted``: the schema gives it a default (read when null)."""
    return FieldPlan(name, TEXT, slot, "Text", key=key, disc=disc, row_via_reader=defaulted)


def data(name: str, slot: int, disc: int = -1, key: str = "", defaulted: bool = False) -> FieldPlan:
    return FieldPlan(name, DATA, slot, "Data", key=key, disc=disc, row_via_reader=defaulted)


def struct(
    name: str,
    slot: int,
    target: StructPlan,
    disc: int = -1,
    key: str = "",
    default: dict[str, object] | None = None,
) -> FieldPlan:
    """A struct field; ``default``: the schema's default value, as ``to_dict()`` gives it (a
    dict given for the field starts from it, as libcapnp's builders start from it)."""
    field = FieldPlan(
        name,
        STRUCT,
        slot,
        target.name,
        key=key,
        disc=disc,
        target=target,
        row_via_reader=default is not None,
    )
    field.default = default
    return field


def group(name: str, target: StructPlan, disc: int = -1, key: str = "") -> FieldPlan:
    return FieldPlan(name, GROUP, 0, target.name, key=key, disc=disc, target=target)


def list_(
    name: str, slot: int, plan: ListPlan, disc: int = -1, key: str = "", defaulted: bool = False
) -> FieldPlan:
    return FieldPlan(
        name, LIST, slot, "List", key=key, disc=disc, list_plan=plan, row_via_reader=defaulted
    )


def capability(name: str, slot: int, disc: int = -1, key: str = "") -> FieldPlan:
    return FieldPlan(name, CAPABILITY, slot, "Capability", key=key, disc=disc)


def any_pointer(name: str, slot: int, disc: int = -1, key: str = "") -> FieldPlan:
    return FieldPlan(name, ANY, slot, "AnyPointer", key=key, disc=disc)


# List element plans (the element size code follows from the kind).
def of_void() -> ListPlan:
    return ListPlan(VOID, 0, "Void")


def of_bool() -> ListPlan:
    return ListPlan(BOOL, 1, "Bool")


_WIDTH_CODES: Final = {1: 2, 2: 3, 4: 4, 8: 5}


def of_integer(schema_type: str, width: int, signed: bool) -> ListPlan:
    return ListPlan(INT, _WIDTH_CODES[width], schema_type, width=width, signed=signed)


def of_float(schema_type: str, width: int) -> ListPlan:
    return ListPlan(FLOAT, _WIDTH_CODES[width], schema_type, width=width)


def of_enum(schema_type: str, names: tuple[str, ...]) -> ListPlan:
    return ListPlan(ENUM, 3, schema_type, width=2, enum_names=names)


def of_text() -> ListPlan:
    return ListPlan(TEXT, 6, "Text")


def of_data() -> ListPlan:
    return ListPlan(DATA, 6, "Data")


def of_struct(target: StructPlan) -> ListPlan:
    return ListPlan(STRUCT, 7, target.name, target=target)


def of_list(element: ListPlan) -> ListPlan:
    return ListPlan(LIST, 6, "List", element=element)


def of_capability() -> ListPlan:
    return ListPlan(CAPABILITY, 6, "Capability")


def of_any() -> ListPlan:
    return ListPlan(ANY, 6, "AnyPointer")


class _HasPlan(Protocol):
    _PLAN: ClassVar[StructPlan | None]


def plan_of(builder: type[_HasPlan]) -> StructPlan:
    """The plan of another module's generated builder class (made when it was imported)."""
    plan = builder._PLAN
    if plan is None:
        raise TypeError(f"{builder.__qualname__} has no plan (not a generated builder)")
    return plan
