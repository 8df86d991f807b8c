"""Checked views of pycapnp structs: the dynamic path's readers and builders, with user
mistakes raised as Python errors in schema terms (capsvc.mistakes), not C++ text.

Theory of operation: on the ``load_schema`` path, params and results of structs without
capabilities used to be pycapnp's own objects, whose errors carry C++ file names and stack
addresses. These wrappers forward everything to the pycapnp object and check only where a
mistake can happen: an unknown field name (read, set or ``init``), a value of the wrong
type, a list index out of range. Nested structs and lists of structs come back checked
too; scalars, Text, Data and lists of primitives come back as pycapnp gives them. A
checked object given to pycapnp (``builder.inner = checked_reader``) is unwrapped first.
Structs that can hold capabilities use capsvc.structs' wrappers, which check the same way.
"""

from __future__ import annotations

from typing import Any

import capnp

from capsvc.mistakes import field_type, from_pycapnp, struct_name, unknown_field

_STRUCTS = (capnp.lib.capnp._DynamicStructBuilder, capnp.lib.capnp._DynamicStructReader)
_LISTS = (capnp.lib.capnp._DynamicListBuilder, capnp.lib.capnp._DynamicListReader)
_WRAPPABLE = _STRUCTS + _LISTS


class _Shape:
    """What the checks need of one struct schema, computed once: its field names, and
    for each struct, group or list-of-structs field the view to wrap it in."""

    __slots__ = ("kinds", "names", "schema")

    def __init__(self, schema: Any) -> None:
        self.schema = schema  # held: the cache below is keyed by its id()
        self.names = frozenset(schema.fieldnames)
        self.kinds: dict[str, tuple[type, Any]] = {}
        for name in schema.fieldnames:
            field = schema.fields[name]
            proto = field.proto
            if proto.which() == "group" or proto.slot.type.which() == "struct":
                self.kinds[name] = (Checked, field.schema)
            elif (
                proto.slot.type.which() == "list"
                and proto.slot.type.list.elementType.which() == "struct"
            ):
                self.kinds[name] = (CheckedList, field.schema.elementType)


_SHAPES: dict[int, _Shape] = {}


def _shape_of(schema: Any) -> _Shape:
    shape = _SHAPES.get(id(schema))
    if shape is None or shape.schema is not schema:
        shape = _SHAPES[id(schema)] = _Shape(schema)
    return shape


def _checked(value: Any, shape: _Shape, name: str) -> Any:
    kind = shape.kinds.get(name)
    if kind is None or not isinstance(value, _WRAPPABLE):
        return value
    return kind[0](value, kind[1])


def set_field(builder: Any, schema: Any, name: str, value: Any) -> None:
    """``setattr(builder, name, value)`` with pycapnp's errors translated (see
    capsvc.mistakes); a checked view given as the value is unwrapped first."""
    _set(builder, schema, _shape_of(schema).names, name, value)


def _set(builder: Any, schema: Any, names: frozenset[str], name: str, value: Any) -> None:
    if name not in names:
        raise unknown_field(schema, name)
    if isinstance(value, Checked | CheckedList):
        value = value._raw
    try:
        setattr(builder, name, value)
    except Exception as error:
        if not from_pycapnp(error):
            raise
        raise TypeError(
            f"{struct_name(schema)}.{name}: expected {field_type(schema, name)},"
            f" got {type(value).__name__}"
        ) from None


def unwrap(value: Any) -> Any:
    """The pycapnp object behind a checked view (anything else as it is)."""
    return value._raw if isinstance(value, Checked | CheckedList) else value


class Checked:
    """A pycapnp struct reader or builder whose mistakes are Python errors."""

    __slots__ = ("_raw", "_schema", "_shape")

    def __init__(self, raw: Any, schema: Any) -> None:
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_schema", schema)
        object.__setattr__(self, "_shape", _shape_of(schema))

    def __getattr__(self, name: str) -> Any:
        try:
            value = getattr(self._raw, name)
        except AttributeError:
            if name in self._shape.names:
                raise  # e.g. a union member that is not set: pycapnp's words are plain
            raise AttributeError(unknown_field(self._schema, name).args[0]) from None
        except Exception as error:  # pycapnp's KjException, e.g. an unset union member
            where = f"{struct_name(self._schema)}.{name}"
            raise AttributeError(f"{where}: {_reason(error)}") from None
        return _checked(value, self._shape, name)

    def __setattr__(self, name: str, value: Any) -> None:
        _set(self._raw, self._schema, self._shape.names, name, value)

    def init(self, name: str, *args: Any) -> Any:
        shape = self._shape
        if name not in shape.names:
            raise unknown_field(self._schema, name)
        try:
            value = self._raw.init(name, *args)
        except Exception as error:
            raise TypeError(f"{struct_name(self._schema)}.{name}: {_reason(error)}") from None
        return _checked(value, shape, name)

    def __dir__(self) -> list[str]:
        return list(self._schema.fieldnames)

    def __repr__(self) -> str:
        return repr(self._raw)

    def __str__(self) -> str:
        return str(self._raw)


class CheckedList:
    """A pycapnp list of structs whose elements are checked views."""

    __slots__ = ("_raw", "_schema")

    def __init__(self, raw: Any, schema: Any) -> None:
        self._raw = raw
        self._schema = schema

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, index: int) -> Checked:
        count = len(self._raw)
        if not -count <= index < count:
            raise IndexError(f"list index {index} out of range ({count} elements)")
        return Checked(self._raw[index], self._schema)

    def __iter__(self) -> Any:
        schema = self._schema
        return (Checked(element, schema) for element in self._raw)

    def __repr__(self) -> str:
        return repr(self._raw)


def _reason(error: Exception) -> str:
    """pycapnp's reason without its C++ file name and stack addresses."""
    text = str(error).split("\nstack:")[0]
    if "failed:" in text:
        text = text.split("failed:", 1)[1]
    return text.strip().removeprefix("expected ").strip() or type(error).__name__
