"""From schema.capnp ``Node``s to the generator's model (capsvc.codegen.model).

Theory of operation: whether the nodes come from a compiler plugin's
``CodeGeneratorRequest`` (``capnp compile -ocapsvc``) or from pycapnp parsing the schema
(``capsvc gen``, which runs the parse in a subprocess: a bad schema aborts the process,
pycapnp-notes.md §1.1), they are schema.capnp ``Node`` readers, and ``build_schema`` reads
them the same way. Node facts (specs/codegen.md §1): a node's scope is the part of its
``displayName`` after the file name; a struct or list default value is an AnyPointer,
which we copy into a small message of our own (rpc.capnp's ``Payload``, whose ``content``
is an AnyPointer) so that generated code can read it with the same reader as any message.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import capnp

from capsvc.codegen.brands import Specializer
from capsvc.codegen.model import (
    Brand,
    Const,
    Cycles,
    Enum,
    Field,
    File,
    Interface,
    Method,
    Schema,
    Struct,
    Type,
    method_names,
)

_PKG = os.path.dirname(capnp.__file__)
schema_capnp: Any = capnp.load(os.path.join(_PKG, "schema.capnp"), imports=[os.path.dirname(_PKG)])

_NO_DISCRIMINANT = 0xFFFF


def build_schema(nodes: Iterable[Any], requested: Iterable[tuple[int, str]]) -> Schema:
    """The model of the ``requested`` files (file ID, file name) given every node."""
    by_id = {node.id: node for node in nodes}
    files_by_name = {node.displayName: node.id for node in by_id.values() if node.which() == "file"}
    where: dict[int, tuple[int, str]] = {}
    for node in by_id.values():
        if node.which() == "file":
            continue
        file_name, _, scope = node.displayName.partition(":")
        file_id = files_by_name.get(file_name, 0)
        where[node.id] = (file_id, scope)
    requested = list(requested)
    names = {file_id: filename for file_id, filename in requested}
    for file_id in files_by_name.values():
        names.setdefault(file_id, by_id[file_id].displayName)
    models_by_id: dict[int, Struct | Enum | Interface | Const | None] = {}

    names_of_methods = _method_namer(by_id)

    def model_of(node_id: int) -> Struct | Enum | Interface | Const | None:
        if node_id not in models_by_id and node_id in by_id and node_id in where:
            node = by_id[node_id]
            models_by_id[node_id] = _node(node, where[node_id][1], names_of_methods)
        return models_by_id.get(node_id)

    files = []
    uses: dict[int, frozenset[int]] = {}
    extends: dict[int, frozenset[int]] = {}
    every: dict[int, Struct | Enum | Interface | Const] = {}
    # Every file's imports, the requested files' and those they import (capsvc.codegen
    # .linking: modules that import each other), found alike for both.
    others = [(i, names[i]) for i in sorted(files_by_name.values()) if i not in dict(requested)]
    for file_id, filename in [*requested, *others]:
        members = sorted(
            (node for node in by_id.values() if where.get(node.id, (None,))[0] == file_id),
            key=lambda node: (where[node.id][1].count("."), where[node.id][1], node.id),
        )
        plain = [m for m in (model_of(node.id) for node in members) if m is not None]
        taken = {m.scope for m in plain if "." not in m.scope}
        specializer = Specializer(file_id, model_of, where, taken)
        models = [specializer.rewrite(m) for m in plain] + specializer.extra
        used = {
            where[target][0]
            for model in models
            for target in _references(model)
            if target in where and where[target][0] != file_id
        }
        imports = {other: _module_of(names.get(other, "")) for other in used}
        uses[file_id] = frozenset(used)
        extends[file_id] = frozenset(
            where[base][0]
            for model in models
            if isinstance(model, Interface)
            for base in model.superclasses
            if base in where and where[base][0] != file_id
        )
        every.update((model.id, model) for model in models)
        if file_id in dict(requested):
            files.append(File(file_id, filename, tuple(models), imports))
    modules = {file_id: _module_of(name) for file_id, name in names.items()}
    cycles = Cycles(modules, uses, extends)
    cycles.check()
    return Schema(tuple(files), where, cycles, every)


def _module_of(filename: str) -> str:
    from capsvc.codegen.model import module_name

    return module_name(filename) if filename else "_unknown"


MethodNamer = Callable[[int], tuple[list[tuple[str, str]], set[str]]]


def _method_namer(by_id: dict[int, Any]) -> MethodNamer:
    """Each interface's methods' Python names (model.method_names), given what its
    superclasses define, transitively: from the raw nodes, so that an interface extending
    one of an imported file is named alike by ``capsvc gen`` and the compiler plugin."""
    memo: dict[int, tuple[list[tuple[str, str]], set[str]]] = {}

    def names(
        interface_id: int, seen: frozenset[int] = frozenset()
    ) -> tuple[list[tuple[str, str]], set[str]]:
        if interface_id in memo:
            return memo[interface_id]
        node = by_id.get(interface_id)
        if node is None or node.which() != "interface" or interface_id in seen:
            return [], set()  # unknown, or a cycle (which the compiler refuses anyway)
        taken: set[str] = set()
        for parent in node.interface.superclasses:
            taken |= names(parent.id, seen | {interface_id})[1]
        memo[interface_id] = method_names([m.name for m in node.interface.methods], taken)
        return memo[interface_id]

    return names


def _node(
    node: Any, scope: str, method_namer: MethodNamer
) -> Struct | Enum | Interface | Const | None:
    which = node.which()
    if which == "struct":
        body = node.struct
        return Struct(
            node.id,
            scope,
            body.dataWordCount,
            body.pointerCount,
            body.isGroup,
            body.discriminantCount,
            body.discriminantOffset,
            tuple(_field(field) for field in body.fields),
            parameters=_parameters(node),
        )
    if which == "enum":
        return Enum(node.id, scope, tuple(e.name for e in node.enum.enumerants))
    if which == "interface":
        body = node.interface
        python_names = method_namer(node.id)[0]
        return Interface(
            node.id,
            scope,
            tuple(
                Method(
                    m.name,
                    ordinal,
                    m.paramStructType,
                    m.resultStructType,
                    Type("struct", target=m.paramStructType, brand=_brand(m.paramBrand)),
                    Type("struct", target=m.resultStructType, brand=_brand(m.resultBrand)),
                    python=python_names[ordinal][0],
                    request=python_names[ordinal][1],
                )
                for ordinal, m in enumerate(body.methods)
            ),
            tuple(s.id for s in body.superclasses),
            tuple(Type("interface", target=s.id, brand=_brand(s.brand)) for s in body.superclasses),
            parameters=_parameters(node),
        )
    if which == "const":
        kind = _type(node.const.type)
        return Const(node.id, scope, kind, _value(node.const.value, kind, explicit=True))
    return None  # annotations: nothing to generate


def _field(field: Any) -> Field:
    discriminant = field.discriminantValue
    union = None if discriminant == _NO_DISCRIMINANT else discriminant
    if field.which() == "group":
        return Field(field.name, field.codeOrder, union, group=field.group.typeId)
    slot = field.slot
    kind = _type(slot.type)
    default = _value(slot.defaultValue, kind, explicit=slot.hadExplicitDefault)
    return Field(field.name, field.codeOrder, union, slot.offset, kind, default)


def _type(proto: Any) -> Type:
    which = proto.which()
    if which == "list":
        return Type("list", element=_type(proto.list.elementType))
    if which == "enum":
        return Type(which, target=proto.enum.typeId)
    if which in ("struct", "interface"):
        body = getattr(proto, which)
        return Type(which, target=body.typeId, brand=_brand(body.brand))
    if which == "anyPointer":
        any_pointer = proto.anyPointer
        kind = any_pointer.which()
        if kind == "unconstrained":
            sub = any_pointer.unconstrained.which()
            if sub == "capability":  # an interface field of no particular interface
                return Type("interface", target=0, any="capability")
            return Type("anyPointer", any={"anyKind": "pointer"}.get(sub, sub))
        if kind == "parameter":
            where = (any_pointer.parameter.scopeId, any_pointer.parameter.parameterIndex)
            return Type("anyPointer", any="parameter", parameter=where)
        return Type("anyPointer", any="parameter")  # a generic method's own parameter
    return Type(which)


def _parameters(node: Any) -> tuple[str, ...]:
    return tuple(parameter.name for parameter in node.parameters)


def _brand(brand: Any) -> Brand:
    """schema.capnp's Brand as the model's: (scope ID, bindings or None to inherit)."""
    scopes: list[tuple[int, tuple[Type | None, ...] | None]] = []
    for scope in brand.scopes:
        if scope.which() == "inherit":
            scopes.append((scope.scopeId, None))
            continue
        bindings = tuple(
            _type(binding.type) if binding.which() == "type" else None for binding in scope.bind
        )
        scopes.append((scope.scopeId, bindings))
    return tuple(scopes)


def _value(value: Any, kind: Type, *, explicit: bool) -> object:
    """A default (or constant) value, as the model holds it (see Field.default)."""
    which = value.which()
    if kind.kind in ("struct", "list", "anyPointer"):
        if not explicit:
            return None
        return _encoded(getattr(value, which))
    if kind.kind == "interface" or which == "void":
        return None
    if which == "data":
        return bytes(value.data)
    if which == "enum":
        return int(value.enum)
    return getattr(value, which)


def _encoded(pointer: Any) -> tuple[bytes, ...] | None:
    """The AnyPointer value as segments of a message whose root struct's pointer 0 holds it."""
    from capsvc.rpc.wire import rpc

    holder = rpc.Payload.new_message()
    holder.content = pointer
    if not holder._has("content"):
        return None
    return tuple(bytes(segment) for segment in holder.to_segments())


def _references(model: Struct | Enum | Interface | Const | None) -> set[int]:
    """The node IDs ``model`` refers to (for imports across files)."""
    targets: set[int] = set()

    def add(kind: Type | None) -> None:
        while kind is not None:
            if kind.target:
                targets.add(kind.target)
            kind = kind.element

    if isinstance(model, Struct):
        for field in model.fields:
            add(field.type)
            if field.group is not None:
                targets.add(field.group)
    elif isinstance(model, Interface):
        for method in model.methods:
            targets.update((method.params, method.results))
        targets.update(model.superclasses)
    elif isinstance(model, Const):
        add(model.type)
    return targets
