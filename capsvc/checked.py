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

#: (struct ID, field name) -> (wrapper class or None, the schema it wraps with).
_KINDS: dict[tuple[int, str], tuple[type | None, Any]] = {}


def _kind(schema: Any, name: str) -> tuple[type | None, Any]:
    key = (schema.node.id, name)
    kind = _KINDS.get(key)
    if kind is None:
        proto = schema.fields[name].proto
        kind = (None, None)
        if proto.which() == "group":
            kind = (Checked, schema.fields[name].schema)
        elif proto.slot.type.which() == "struct":
            kind = (Checked, schema.fields[name].schema)
        elif (
            proto.slot.type.which() == "list"
            and proto.slot.type.list.elementType.which() == "struct"
        ):
            kind = (CheckedList, schema.fields[name].schema.elementType)
        _KINDS[key] = kind
    return kind


def _checked(value: Any, schema: Any, name: str) -> Any:
    wrapper, inner = _kind(schema, name)
    if wrapper is None or not isinstance(value, _STRUCTS + _LISTS):
        return value
    return wrapper(value, inner)


def set_field(builder: Any, schema: Any, name: str, value: Any) -> None:
    """``setattr(builder, name, value)`` with pycapnp's errors translated (see
    capsvc.mistakes); a checked view given as the value is unwrapped first."""
    if name not in schema.fieldnames:
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

    __slots__ = ("_raw", "_schema")

    def __init__(self, raw: Any, schema: Any) -> None:
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_schema", schema)

    def __getattr__(self, name: str) -> Any:
        schema = self._schema
        try:
            value = getattr(self._raw, name)
        except AttributeError:
            if name in schema.fieldnames:
                raise  # e.g. a union member that is not set: pycapnp's words are plain
            raise AttributeError(unknown_field(schema, name).args[0]) from None
        except Exception as error:  # pycapnp's KjException, e.g. an unset union member
            raise AttributeError(f"{struct_name(schema)}.{name}: {_reason(error)}") from None
        if name in schema.fieldnames:
            return _checked(value, schema, name)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        set_field(self._raw, self._schema, name, value)

    def init(self, name: str, *args: Any) -> Any:
        schema = self._schema
        if name not in schema.fieldnames:
            raise unknown_field(schema, name)
        try:
            value = self._raw.init(name, *args)
        except Exception as error:
            raise TypeError(f"{struct_name(schema)}.{name}: {_reason(error)}") from None
        return _checked(value, schema, name)

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
