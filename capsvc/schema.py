"""Schemas: loading them safely, and what capsvc precomputes from them.

Theory of operation:
- ``load_schema`` checks a schema in a subprocess before loading it here, because pycapnp
  aborts the whole interpreter on any schema error (pycapnp-notes.md §1.1). pycapnp keeps
  one loader per process, which already holds capsvc's rpc.capnp and the standard files it
  imports (``/capnp/c++.capnp``) from pycapnp's directory. A second copy of one of those at
  another path (``-I /usr/include`` with Debian's libcapnp-dev, or a copy beside the
  schema) is a duplicate ID, and so an abort: pycapnp's directory is searched first, and
  the check loads rpc.capnp first as this process did, so what it cannot resolve that way
  is a ``SchemaError`` that says so.
- ``interface_info`` gives, per interface, the method table servers dispatch on and clients
  build requests from (superclass methods included).
- ``struct_info`` gives, per struct, the fields through which a capability can be reached
  (interface fields, lists of interfaces, and structs, groups and lists of structs that can
  hold one, transitively). A struct with none is handed to users as plain pycapnp objects:
  capsvc only steps in where capabilities live (DESIGN.md, "Capabilities inside messages").
"""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import capnp

from capsvc.codegen.model import STREAM_RESULT_ID
from capsvc.errors import SchemaError

_LOADED: dict[tuple[str, tuple[str, ...]], Any] = {}


def load_schema(
    path: str | os.PathLike[str], *, imports: Sequence[str] = (), check: bool = True
) -> Any:
    """Load a .capnp file with pycapnp, after checking it in a subprocess.

    Args:
        path: the schema file.
        imports: directories searched for ``import "/..."``, after pycapnp's own
            directory: ``/capnp/c++.capnp`` and friends are always pycapnp's, the copies
            capsvc's rpc.capnp has loaded already.
        check: set False to skip the subprocess check for schemas you trust.

    Raises:
        SchemaError: the file is missing or invalid (with the compiler's message).
    """
    full = os.path.abspath(os.fspath(path))
    search = (_PYCAPNP_INCLUDE, *imports)
    key = (full, search)
    if key in _LOADED:
        return _LOADED[key]
    if not os.path.isfile(full):
        raise SchemaError(f"schema file not found: {full}")
    if check:
        _check_in_subprocess(full, search)
    module = capnp.load(full, imports=list(search))
    _LOADED[key] = module
    return module


_PYCAPNP_INCLUDE = os.path.dirname(os.path.dirname(capnp.__file__))

# The check process first loads what this one has (capsvc.rpc.wire loads rpc.capnp so),
# then the schema.
_CHECK = (
    "import sys, capnp; capnp.load(sys.argv[1], imports=[sys.argv[2]]);"
    " capnp.load(sys.argv[3], imports=sys.argv[4:])"
)


def _check_in_subprocess(path: str, imports: tuple[str, ...]) -> None:
    from capsvc.rpc.wire import RPC_SCHEMA

    done = subprocess.run(
        [sys.executable, "-c", _CHECK, RPC_SCHEMA, _PYCAPNP_INCLUDE, path, *imports],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        detail = next((line for line in lines if "failed:" in line or "error" in line.lower()), "")
        detail = detail or (lines[-1] if lines else "crashed")
        raise SchemaError(f"invalid schema {path}: {_explained(detail.strip())}")


def _explained(detail: str) -> str:
    """The compiler's complaint, without kj's ``what():`` prefix; a duplicate ID (a
    second copy of a file already loaded) says which file and what to do."""
    detail = detail.removeprefix("what():").strip()
    if "Duplicate ID" not in detail:
        return detail
    copy = detail.split(":", 1)[0]
    return (
        f"{copy} has the ID of a file already loaded from pycapnp's directory"
        f' ({_PYCAPNP_INCLUDE}/capnp): import that one as "/capnp/{os.path.basename(copy)}"'
        f" rather than a copy of it ({detail})"
    )


# ---------------------------------------------------------------------- interfaces
@dataclass(frozen=True, slots=True)
class MethodInfo:
    """One method: where it lives and the structs of its params and results."""

    name: str
    interface_id: int
    method_id: int
    param_schema: Any
    result_schema: Any
    #: The declaring interface's schema name (a superclass's, for an inherited method).
    interface_name: str = ""
    #: A ``-> stream`` method (results: stream.capnp's StreamResult).
    streaming: bool = False


@dataclass(slots=True)
class InterfaceInfo:
    """The method tables of one interface, superclasses included."""

    schema: Any
    id: int
    name: str
    by_name: dict[str, MethodInfo] = field(default_factory=dict)
    by_key: dict[tuple[int, int], MethodInfo] = field(default_factory=dict)
    #: The ``-> stream`` methods (results: stream.capnp's StreamResult), by key: the
    #: runtime runs them one at a time per object (capsvc.rpc.hooks.LocalServerHook).
    streaming: frozenset[tuple[int, int]] = frozenset()


_INTERFACES: dict[int, InterfaceInfo] = {}


def known_interfaces() -> list[InterfaceInfo]:
    """Every interface of the schemas loaded so far (capsvc.names asks them for names)."""
    for key, module in list(_LOADED.items()):
        if key not in _WALKED:
            _WALKED.add(key)
            _register_interfaces(module, depth=0)
    return list(_INTERFACES.values())


_WALKED: set[tuple[str, tuple[str, ...]]] = set()


def _register_interfaces(scope: Any, depth: int) -> None:
    """``interface_info`` for each interface declared in ``scope``, nested ones too."""
    if depth > 16:  # nesting is finite, but a schema's scopes are not ours to trust
        return
    for node in scope.schema.node.nestedNodes:
        member = getattr(scope, node.name, None)
        schema = getattr(member, "schema", None)
        if schema is None:
            continue
        if schema.node.which() == "interface":
            interface_info(member)
        _register_interfaces(member, depth + 1)


def interface_schema(interface: Any) -> Any:
    """Accept a pycapnp interface module (``calc.Calculator``) or its ``.schema``."""
    return getattr(interface, "schema", interface)


def interface_info(interface: Any) -> InterfaceInfo:
    schema = interface_schema(interface)
    node_id = schema.node.id
    info = _INTERFACES.get(node_id)
    if info is not None:
        return info
    info = InterfaceInfo(schema, node_id, schema.node.displayName.split(":")[-1])
    _add_methods(info, schema, seen=set())
    info.streaming = frozenset(key for key, method in info.by_key.items() if method.streaming)
    _INTERFACES[node_id] = info
    return info


def _add_methods(info: InterfaceInfo, schema: Any, seen: set[int]) -> None:
    if schema.node.id in seen:
        return
    seen.add(schema.node.id)
    for method_id, name in enumerate(schema.method_names):
        method = schema.methods[name]
        entry = MethodInfo(
            name,
            schema.node.id,
            method_id,
            method.param_type,
            method.result_type,
            schema.node.displayName.split(":")[-1],
            method.result_type.node.id == STREAM_RESULT_ID,
        )
        info.by_key[(schema.node.id, method_id)] = entry
        info.by_name.setdefault(name, entry)
    for parent in schema.superclasses:
        _add_methods(info, parent, seen)


# ---------------------------------------------------------------------- structs
class FieldKind(enum.Enum):
    INTERFACE = "interface"
    STRUCT = "struct"
    GROUP = "group"
    LIST_OF_INTERFACES = "list of interfaces"
    LIST_OF_STRUCTS = "list of structs"


@dataclass(slots=True)
class CapField:
    """A field through which a capability can be reached."""

    name: str
    kind: FieldKind
    slot: int  # pointer slot (unused for groups)
    target: Any  # interface schema, or struct schema (struct, group, list element)
    discriminant: int | None  # union discriminant value if the field is a union member


@dataclass(slots=True)
class StructInfo:
    schema: Any
    fields: dict[str, CapField]
    discriminant_offset: int  # in 16-bit units, for unions
    union_members: frozenset[str] = frozenset()
    has_caps: bool = False


_STRUCTS: dict[int, StructInfo] = {}


_BY_OBJECT: dict[int, tuple[Any, StructInfo]] = {}


def struct_info(schema: Any) -> StructInfo:
    """Where capabilities can live in ``schema`` (cached per node, and per schema object:
    pycapnp schema objects are unhashable and reading their node costs microseconds, which
    matters on every call)."""
    entry = _BY_OBJECT.get(id(schema))
    if entry is not None and entry[0] is schema:
        return entry[1]
    info = _struct_info_by_node(schema)
    if len(_BY_OBJECT) > 4096:  # schema objects made on the fly must not pile up
        _BY_OBJECT.clear()
    _BY_OBJECT[id(schema)] = (schema, info)  # holding the object keeps its id unique
    return info


def _struct_info_by_node(schema: Any) -> StructInfo:
    schema = getattr(schema, "schema", schema)
    node_id = schema.node.id
    info = _STRUCTS.get(node_id)
    if info is None:
        _compute_struct_infos(schema)
        info = _STRUCTS[node_id]
    return info


def _compute_struct_infos(root: Any) -> None:
    # Collect every struct reachable from root, then iterate to a fixpoint: a struct can
    # hold a capability if one of its fields can (recursive types converge).
    pending = [root]
    found: dict[int, tuple[StructInfo, list[tuple[CapField, bool]]]] = {}
    while pending:
        schema = pending.pop()
        node = schema.node
        if node.id in found or node.id in _STRUCTS:
            continue
        fields: list[tuple[CapField, bool]] = []
        for proto in node.struct.fields:
            cap_field = _classify(schema, proto)
            if cap_field is None:
                continue
            direct = cap_field.kind in (FieldKind.INTERFACE, FieldKind.LIST_OF_INTERFACES)
            fields.append((cap_field, direct))
            if not direct:
                pending.append(cap_field.target)
        members = frozenset(f.name for f in node.struct.fields if f.discriminantValue != 0xFFFF)
        info = StructInfo(schema, {}, node.struct.discriminantOffset, members)
        found[node.id] = (info, fields)
    changed = True
    while changed:
        changed = False
        for info, fields in found.values():
            if info.has_caps:
                continue
            for cap_field, direct in fields:
                if direct or _has_caps(cap_field.target, found):
                    info.has_caps = True
                    changed = True
                    break
    for node_id, (info, fields) in found.items():
        info.fields = {f.name: f for f, direct in fields if direct or _has_caps(f.target, found)}
        _STRUCTS[node_id] = info


def _has_caps(
    schema: Any, found: dict[int, tuple[StructInfo, list[tuple[CapField, bool]]]]
) -> bool:
    node_id = schema.node.id
    if node_id in _STRUCTS:
        return _STRUCTS[node_id].has_caps
    return found[node_id][0].has_caps


def _is_capability(any_pointer: Any) -> bool:
    """Whether a schema.capnp ``Type.anyPointer`` is the ``Capability`` constraint."""
    if any_pointer.which() != "unconstrained":
        return False
    return bool(any_pointer.unconstrained.which() == "capability")


def _classify(schema: Any, proto: Any) -> CapField | None:
    name = proto.name
    discriminant = proto.discriminantValue if proto.discriminantValue != 0xFFFF else None
    if proto.which() == "group":
        return CapField(name, FieldKind.GROUP, -1, schema.fields[name].schema, discriminant)
    kind = proto.slot.type.which()
    slot = proto.slot.offset
    if kind == "interface":
        return CapField(name, FieldKind.INTERFACE, slot, schema.fields[name].schema, discriminant)
    if kind == "anyPointer" and _is_capability(proto.slot.type.anyPointer):
        # A `Capability` field: a capability of no particular interface (target None:
        # its client is capsvc.typed.Client, which cast_as retypes).
        return CapField(name, FieldKind.INTERFACE, slot, None, discriminant)
    if kind == "struct":
        return CapField(name, FieldKind.STRUCT, slot, schema.fields[name].schema, discriminant)
    if kind == "list":
        element = proto.slot.type.list.elementType.which()
        if element == "interface":
            target = schema.fields[name].schema.elementType
            return CapField(name, FieldKind.LIST_OF_INTERFACES, slot, target, discriminant)
        if element == "struct":
            target = schema.fields[name].schema.elementType
            return CapField(name, FieldKind.LIST_OF_STRUCTS, slot, target, discriminant)
    return None
