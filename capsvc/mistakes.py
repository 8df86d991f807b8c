"""User mistakes on the dynamic (``load_schema``) path, as Python errors in schema terms.

Theory of operation: pycapnp reports a misspelt field as ``AttributeError:
capnp/schema.c++:511: failed: struct has no such member; name = kee`` and a wrong value
type as a ``KjException`` from ``dynamic.c++``, both followed by a line of C++ stack
addresses. Wherever a user sets a field on the dynamic path (keyword arguments of a call,
a ``Request``'s attributes, the checked views of capsvc.checked and the capability-aware
wrappers of capsvc.structs) it goes through ``capsvc.checked.set_field``, which turns
those into a ``TypeError`` naming the struct, the field and the schema type
(``Echo.ping$Params.msg: expected Text, got int``). The generated path (``capsvc gen``)
checks the same things itself, before pycapnp is involved at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from capsvc.codegen.model import SCHEMA_NAMES

#: The schema's spelling of each primitive type.
_PRIMITIVES = {**SCHEMA_NAMES, "anyPointer": "AnyPointer"}


def struct_name(schema: Any) -> str:
    """A struct (enum, interface) name as the schema spells it: ``Echo.ping$Params``."""
    display = str(schema.node.displayName)
    return display.partition(":")[2] or display


def type_name(proto: Any) -> str:
    """A schema.capnp ``Type``, spelt as in a schema file (``List(Text)``, ``Color``)."""
    which = str(proto.which())
    if which == "list":
        return f"List({type_name(proto.list.elementType)})"
    if which in ("struct", "enum", "interface"):
        return which  # the node's name is not at hand here; its kind is
    return _PRIMITIVES.get(which, which)


def _field_type(schema: Any, name: str) -> str:
    try:
        proto = schema.fields[name].proto
    except (KeyError, AttributeError):
        return "?"
    if proto.which() == "group":
        return "a group"
    kind = proto.slot.type
    if kind.which() in ("struct", "enum", "interface"):
        try:
            return struct_name(schema.fields[name].schema)
        except Exception:  # pycapnp cannot give the target's schema: name the kind
            pass
    return type_name(kind)


def unknown_field(schema: Any, name: str) -> TypeError:
    fields = ", ".join(schema.fieldnames) or "none"
    return TypeError(f"{struct_name(schema)} has no field {name}; its fields are {fields}")


def check_call(method: str, schema: Any, args: tuple[Any, ...], names: Iterable[str]) -> None:
    """Positional arguments and unknown keywords of a dynamic call, as TypeErrors that
    name the method and its parameters."""
    known = list(schema.fieldnames)
    if args:
        raise TypeError(
            f"{method}() takes keyword arguments only ({len(args)} positional given);"
            f" its parameters are {', '.join(known) or 'none'}"
        )
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise TypeError(
            f"{method}() has no parameter {', '.join(unknown)};"
            f" its parameters are {', '.join(known) or 'none'}"
        )


def field_type(schema: Any, name: str) -> str:
    """The schema type of field ``name`` of ``schema``, spelt as in a schema file."""
    return _field_type(schema, name)


def from_pycapnp(error: Exception) -> bool:
    """Whether ``error`` is pycapnp's (C++ text) rather than our own or the user's."""
    text = str(error)
    return type(error).__name__ == "KjException" or ".c++:" in text or "Value type" in text
