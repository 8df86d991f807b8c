"""Schema names for the numbers on the wire: ``Calculator.evaluate`` for (0x97983392df35cc36, 0).

Theory of operation: a Call names its method by two numbers, the interface's ID and the
method's ordinal (rpc.capnp, Call.interfaceId / methodId). Errors and logs should say what
a person wrote in the schema instead. Every interface this process knows is either loaded on
the dynamic path (``capsvc.load_schema``: capsvc.schema keeps its ``InterfaceInfo``) or
generated (``capsvc gen``: each generated ``Iface.Server`` class carries its method table),
so :func:`method_label` asks both, and remembers what it found. An interface no loaded
schema defines keeps its numbers, said as such.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capsvc.rpc.payload import Payload

_FOUND: dict[tuple[int, int], str | None] = {}


def method_label(interface_id: int, method_id: int) -> str:
    """``Interface.method`` by schema names, or the numbers when no schema here has it."""
    name = schema_method_name(interface_id, method_id)
    if name is not None:
        return name
    return f"method {method_id} of interface {interface_id:#x} (no schema loaded here has it)"


def schema_method_name(interface_id: int, method_id: int) -> str | None:
    """``Interface.method`` if a loaded or generated schema defines it, else None."""
    key = (interface_id, method_id)
    if key in _FOUND:
        return _FOUND[key]
    found = _from_loaded_schemas(key) or _from_generated_servers(key)
    if found is not None:  # an unknown one may be loaded later: not remembered
        _FOUND[key] = found
    return found


def _from_loaded_schemas(key: tuple[int, int]) -> str | None:
    from capsvc.schema import known_interfaces

    for info in known_interfaces():
        method = info.by_key.get(key)
        if method is not None:
            return f"{method.interface_name or info.name}.{method.name}"
    return None


def _from_generated_servers(key: tuple[int, int]) -> str | None:
    entry = _generated_entry(key)
    if entry is None:
        return None
    # (name, params struct, results struct); the params struct is nested in the interface
    # that declares the method: its qualified name gives the interface's.
    return f"{entry[1].__qualname__.rpartition('.')[0]}.{entry[0]}"


def _generated_entry(key: tuple[int, int]) -> tuple[str, Any, Any] | None:
    """The generated servers' method table entry for ``key`` (searched only on an error
    path, or once per method for logs and traces: callers remember what they found)."""
    from capsvc.typed import Server

    pending: list[type[Any]] = [Server]
    seen: set[type[Any]] = set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        entry = cls.__dict__.get("_METHODS", {}).get(key)
        if entry is not None:
            return entry  # type: ignore[no-any-return]
        pending.extend(cls.__subclasses__())
    return None


def params_reader(
    interface_id: int, method_id: int, field: str
) -> Callable[[Payload], object] | None:
    """How to read a call's params (a function of its payload), if a loaded or generated
    schema has the method and its params struct has ``field``; else None."""
    key = (interface_id, method_id)
    from capsvc.schema import known_interfaces

    for info in known_interfaces():
        method = info.by_key.get(key)
        if method is not None and field in method.param_schema.fieldnames:
            schema = method.param_schema
            return lambda params: params.content(schema)
    entry = _generated_entry(key)
    if entry is not None and hasattr(entry[1].Reader, field):
        reader = entry[1].Reader
        return lambda params: params.read_as(reader)
    return None
