"""Struct readers and builders that know where capabilities live.

Theory of operation: pycapnp refuses to read or write interface fields outside its own RPC
system, so for structs that can hold capabilities (capsvc.schema.struct_info) users get these
thin wrappers instead of the pycapnp objects. A wrapper remembers its pointer path from the
payload's content root; interface fields go to the payload (``cap_at`` / ``set_cap``), every
other field straight to pycapnp. Structs that cannot hold capabilities are returned as the
plain pycapnp objects, so the common case costs nothing.
"""

from __future__ import annotations

from typing import Any

from capsvc.checked import Checked, set_field
from capsvc.rpc.hooks import Hook, NullHook, Path
from capsvc.rpc.payload import BuiltPayload, Payload
from capsvc.schema import CapField, FieldKind, StructInfo, struct_info


def wrap_reader(
    reader: Any, schema: Any, payload: Payload, path: Path = (), keep: object = None
) -> Any:
    """``reader`` as users should see it: wrapped only if it can hold capabilities.

    ``keep`` is held by the wrapper for as long as it lives (the owner of the payload's
    capability references, e.g. the call's results).
    """
    info = struct_info(schema)
    if not info.has_caps:
        return Checked(reader, schema)  # mistakes as Python errors (capsvc.checked)
    return StructReader(reader, info, payload, path, keep)


def wrap_builder(builder: Any, schema: Any, payload: BuiltPayload, path: Path = ()) -> Any:
    info = struct_info(schema)
    if not info.has_caps:
        return Checked(builder, schema)
    return StructBuilder(builder, info, payload, path)


def _client(hook: Hook | None, interface: Any) -> Any:
    """The client a field gives: of ``interface``, or (None: a ``Capability`` field) of
    no particular interface."""
    from capsvc.client import capability_client
    from capsvc.rpc.hooks import null_hook

    return capability_client(null_hook() if hook is None else hook, interface)


def _hook_of(value: Any) -> Hook | None:
    """The hook a user value stands for: a Client, a Server object, or None."""
    from capsvc.client import Client
    from capsvc.server import Server

    if value is None:
        return None
    if isinstance(value, Client):
        hook = value._hook
        return None if isinstance(hook, NullHook) else hook.add_ref()
    if isinstance(value, Server):
        return value._new_hook()
    make_hook = getattr(value, "_capsvc_hook", None)  # a typed (generated) client or server
    if make_hook is not None:
        hook = make_hook()
        assert isinstance(hook, Hook)
        return hook
    raise TypeError(f"expected a capability (Client or Server), got {type(value).__name__}")


def union_member_name(info: StructInfo, discriminant: int) -> str:
    """The name of the union member of ``info``'s struct with that discriminant value."""
    for proto in info.schema.node.struct.fields:
        if proto.discriminantValue == discriminant:
            return str(proto.name)
    raise ValueError(f"no union member with discriminant {discriminant}")


class StructReader:
    """A pycapnp struct reader whose interface fields return capsvc Clients."""

    __slots__ = ("_info", "_keep", "_path", "_payload", "_reader")

    def __init__(
        self, reader: Any, info: StructInfo, payload: Payload, path: Path, keep: object = None
    ) -> None:
        self._reader = reader
        self._info = info
        self._payload = payload
        self._path = path
        self._keep = keep

    def __getattr__(self, name: str) -> Any:
        field = self._info.fields.get(name)
        if field is None:
            return getattr(self._reader, name)
        if field.discriminant is not None and self.which() != name:
            raise AttributeError(f"union member {name!r} is not set (it is {self.which()!r})")
        return _read_field(self._reader, field, self._payload, self._path, self._keep)

    def which(self) -> str:
        # A payload built in this vat keeps the capability fields it selected beside the
        # content (pycapnp cannot select them): ask it first.
        chosen = self._payload.union_choice(self._path, self._info.discriminant_offset)
        if chosen is not None:
            return union_member_name(self._info, chosen)
        return str(self._reader.which())

    def _has(self, name: str) -> bool:
        field = self._info.fields.get(name)
        if field is not None and field.kind is FieldKind.INTERFACE:
            if field.discriminant is not None and self.which() != name:
                return False
            hook = self._payload.cap_at(self._path + (field.slot,))
            if hook is None:
                return False
            hook.release()
            return True
        return bool(self._reader._has(name))

    def __dir__(self) -> list[str]:
        return list(self._info.schema.fieldnames)

    def __repr__(self) -> str:
        return f"<capsvc reader {self._info.schema.node.displayName}>"


def _read_field(reader: Any, field: CapField, payload: Payload, path: Path, keep: object) -> Any:
    kind = field.kind
    if kind is FieldKind.INTERFACE:
        return _client(payload.cap_at(path + (field.slot,)), field.target)
    if kind is FieldKind.GROUP:
        return wrap_reader(getattr(reader, field.name), field.target, payload, path, keep)
    if kind is FieldKind.STRUCT:
        inner = path + (field.slot,)
        return wrap_reader(getattr(reader, field.name), field.target, payload, inner, keep)
    inner = path + (field.slot,)
    if kind is FieldKind.LIST_OF_INTERFACES:
        count = len(getattr(reader, field.name))
        return [_client(payload.cap_at(inner + (~i,)), field.target) for i in range(count)]
    elements = getattr(reader, field.name)
    return [
        wrap_reader(element, field.target, payload, inner + (~i,), keep)
        for i, element in enumerate(elements)
    ]


class StructBuilder:
    """A pycapnp struct builder whose interface fields accept capsvc capabilities."""

    __slots__ = ("_builder", "_info", "_path", "_payload")

    def __init__(self, builder: Any, info: StructInfo, payload: BuiltPayload, path: Path) -> None:
        object.__setattr__(self, "_builder", builder)
        object.__setattr__(self, "_info", info)
        object.__setattr__(self, "_payload", payload)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        field = self._info.fields.get(name)
        if field is None:
            return getattr(self._builder, name)
        kind = field.kind
        if kind is FieldKind.INTERFACE:
            return _client(self._payload.cap_at(self._path + (field.slot,)), field.target)
        if kind is FieldKind.GROUP:
            return wrap_builder(
                getattr(self._builder, name), field.target, self._payload, self._path
            )
        if kind is FieldKind.STRUCT:
            inner = self._path + (field.slot,)
            return wrap_builder(getattr(self._builder, name), field.target, self._payload, inner)
        return _ListBuilder(
            getattr(self._builder, name), field, self._payload, self._path + (field.slot,)
        )

    def __setattr__(self, name: str, value: Any) -> None:
        field = self._info.fields.get(name)
        if field is None:
            set_field(self._builder, self._info.schema, name, value)
            if name in self._info.union_members:
                self._forget_union_caps()
            return
        if field.kind is FieldKind.INTERFACE:
            self._set_cap(field, value)
            return
        if field.kind is FieldKind.LIST_OF_INTERFACES:
            items = list(value)
            target = self.init(name, len(items))
            for index, item in enumerate(items):
                target[index] = item
            return
        set_field(self._builder, self._info.schema, name, value)

    def _forget_union_caps(self) -> None:
        """Another union member was set through pycapnp: drop our capability member."""
        self._payload.clear_union(self._path, self._info.discriminant_offset)
        for other in self._info.fields.values():
            if other.discriminant is not None and other.kind is FieldKind.INTERFACE:
                existing = self._payload.cap_at(self._path + (other.slot,))
                if existing is not None:
                    existing.release()
                    self._payload.set_cap(self._path + (other.slot,), None)

    def _set_cap(self, field: CapField, value: Any) -> None:
        union = None
        if field.discriminant is not None:
            union = (self._path, self._info.discriminant_offset, field.discriminant)
        self._payload.set_cap(self._path + (field.slot,), _hook_of(value), union=union)

    def init(self, name: str, *args: Any) -> Any:
        field = self._info.fields.get(name)
        result = self._builder.init(name, *args)
        if field is None:
            return result
        if field.kind is FieldKind.GROUP:
            return wrap_builder(result, field.target, self._payload, self._path)
        if field.kind is FieldKind.STRUCT:
            return wrap_builder(result, field.target, self._payload, self._path + (field.slot,))
        if field.kind is FieldKind.INTERFACE:
            raise TypeError(f"{name!r} is an interface field: assign a capability to it")
        return _ListBuilder(result, field, self._payload, self._path + (field.slot,))

    def which(self) -> str:
        chosen = self._payload.union_choice(self._path, self._info.discriminant_offset)
        if chosen is not None:
            return union_member_name(self._info, chosen)
        return str(self._builder.which())

    def __dir__(self) -> list[str]:
        return list(self._info.schema.fieldnames)


class _ListBuilder:
    """A list field that holds (or leads to) capabilities."""

    __slots__ = ("_builder", "_field", "_path", "_payload")

    def __init__(self, builder: Any, field: CapField, payload: BuiltPayload, path: Path) -> None:
        self._builder = builder
        self._field = field
        self._payload = payload
        self._path = path

    def __len__(self) -> int:
        return len(self._builder)

    def __getitem__(self, index: int) -> Any:
        index = self._index(index)
        if self._field.kind is FieldKind.LIST_OF_INTERFACES:
            return _client(self._payload.cap_at(self._path + (~index,)), self._field.target)
        element = self._builder[index]
        return wrap_builder(element, self._field.target, self._payload, self._path + (~index,))

    def __setitem__(self, index: int, value: Any) -> None:
        if self._field.kind is not FieldKind.LIST_OF_INTERFACES:
            raise TypeError("assign to the fields of a struct list element instead")
        self._payload.set_cap(self._path + (~self._index(index),), _hook_of(value))

    def _index(self, index: int) -> int:
        count = len(self._builder)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(f"list index {index} out of range ({count} elements)")
        return index
