"""Generics bound to concrete types: a model-to-model pass before rendering.

Theory of operation: Cap'n Proto generics (``struct Box(T) { value @0 :T; }``) are bound
where they are used (``texts @0 :Box(Text)``, ``interface TextStore extends(Store(Text))``).
The wire format does not change with the binding: a parameter's field is a pointer, and a
specialized interface has its generic's ID. What changes is what a Python user expects to
read there: a ``str`` from ``texts.value``, typed clients and servers for ``Store(Text)``.

So for every binding a file uses, this pass makes a *specialization*: a copy of the generic
node (and of the nodes nested in it that the binding reaches: method params and results,
nested structs) with every parameter replaced by its bound type, under a generator-made ID
(``specializes`` keeps the schema's), named ``<Generic>_<Binding>...`` (``Box_Text``,
``Store_Box_Text``, ``Box_List_Int32``) at the top level of the file that uses it. Field
types that name a binding are rewritten to point at the specialization, so the renderer
sees plain, non-generic nodes. A parameter left unbound (a generic used bare, a binding
``AnyPointer``, a generic method's own parameters) reads as ``AnyPointer``, as in C++.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace

from capsvc.codegen.model import SCHEMA_NAMES, Const, Enum, Field, Interface, Method, Struct, Type

Node = Struct | Enum | Interface | Const
#: A binding in force: generic scope ID -> its bound types (None: unbound).
Env = dict[int, tuple[Type | None, ...]]
_Key = tuple[int, tuple[tuple[int, tuple[Type | None, ...]], ...]]


class Specializer:
    """Rewrites one file's nodes; ``extra`` collects the specializations it made."""

    def __init__(
        self,
        file_id: int,
        model_of: Callable[[int], Node | None],
        where: dict[int, tuple[int, str]],
        taken: set[str],
    ) -> None:
        self._file_id = file_id
        self._model_of = model_of
        self._where = where
        self._taken = taken  # top-level names in the file
        self._made: dict[_Key, int] = {}
        self._scopes: dict[tuple[int, str], int] = {
            (file, scope): node for node, (file, scope) in where.items()
        }
        self.extra: list[Node] = []

    # ------------------------------------------------------------------ the file's nodes
    def rewrite(self, node: Node) -> Node:
        """``node`` (of the file itself) with its types resolved, no binding in force."""
        return self._resolved(node, {}, node.id, node.scope)

    def _resolved(self, node: Node, env: Env, new_id: int, scope: str) -> Node:
        if isinstance(node, Struct):
            fields = tuple(self._field(field, env) for field in node.fields)
            return replace(node, id=new_id, scope=scope, fields=fields)
        if isinstance(node, Interface):
            methods = tuple(self._method(method, env) for method in node.methods)
            supers = tuple(self.type(t, env) for t in node.superclass_types)
            ids = tuple(t.target for t in supers) if supers else node.superclasses
            return replace(
                node, id=new_id, scope=scope, methods=methods, superclasses=ids, superclass_types=()
            )
        if isinstance(node, Const):
            return replace(node, type=self.type(node.type, env))
        return node

    def _field(self, field: Field, env: Env) -> Field:
        if field.type is None:
            if field.group is not None and self._generic_scopes(field.group):
                group = self._specialized(field.group, env)
                return replace(field, group=group)
            return field
        kind = self.type(field.type, env)
        if kind == field.type:
            return field
        default = field.default if field.type.kind != "anyPointer" else None
        return replace(field, type=kind, default=default)

    def _method(self, method: Method, env: Env) -> Method:
        params = self.type(method.params_type, env) if method.params_type else None
        results = self.type(method.results_type, env) if method.results_type else None
        return replace(
            method,
            params=params.target if params else method.params,
            results=results.target if results else method.results,
            params_type=None,
            results_type=None,
        )

    # ------------------------------------------------------------------ types
    def type(self, kind: Type, env: Env) -> Type:
        """``kind`` with parameters replaced and bound generics pointing at their
        specialization."""
        if kind.kind == "anyPointer" and kind.parameter is not None:
            scope, index = kind.parameter
            bound = env.get(scope, ())
            if index < len(bound) and bound[index] is not None:
                return bound[index]  # type: ignore[return-value]
            return Type("anyPointer", any="pointer")
        if kind.kind == "list" and kind.element is not None:
            return replace(kind, element=self.type(kind.element, env))
        if kind.kind in ("struct", "interface"):
            bound_env = self._bindings(kind, env)
            target = kind.target
            if bound_env:
                target = self._specialized(kind.target, bound_env)
            return Type(kind.kind, target=target)
        return kind

    def _bindings(self, kind: Type, env: Env) -> Env:
        """The bindings ``kind``'s brand puts in force for its target's generic scopes
        (empty when none of them is bound to anything)."""
        scopes = self._generic_scopes(kind.target)
        if not scopes:
            return {}
        out: Env = {}
        brand = dict(kind.brand)
        for scope in scopes:
            if scope not in brand:
                continue
            bind = brand[scope]
            if bind is None:  # inherit what is in force where the type is written
                if scope in env:
                    out[scope] = env[scope]
                continue
            out[scope] = tuple(_unless_any(self.type(b, env)) if b else None for b in bind)
        if not any(b is not None for bound in out.values() for b in bound):
            return {}
        return out

    def _generic_scopes(self, node_id: int) -> list[int]:
        """The generic nodes among ``node_id`` and the nodes it is nested in, outermost
        first."""
        out = []
        file_id, scope = self._where.get(node_id, (0, ""))
        parts = scope.split(".")
        for depth in range(1, len(parts) + 1):
            other = self._scopes.get((file_id, ".".join(parts[:depth])))
            model = self._model_of(other) if other is not None else None
            if isinstance(model, Struct | Interface) and model.parameters:
                out.append(model.id)
        return out

    # ------------------------------------------------------------------ specializations
    def _specialized(self, target: int, env: Env) -> int:
        """The generator's ID for ``target`` under ``env`` (made on first use)."""
        scopes = self._generic_scopes(target)
        relevant = tuple((s, env[s]) for s in scopes if s in env)
        key = (target, relevant)
        made = self._made.get(key)
        if made is not None:
            return made
        model = self._model_of(target)
        if not isinstance(model, Struct | Interface) or not relevant:
            return target
        new_id = _synthetic_id(self._file_id, key)
        self._made[key] = new_id
        root = relevant[0][0]
        if root == target:
            scope = self._name(self._where[root][1], relevant)
        else:
            scope = self._nested_scope(target, env)
        self._where[new_id] = (self._file_id, scope)
        local_env = dict(env)
        specialized = self._resolved(model, local_env, new_id, scope)
        assert isinstance(specialized, Struct | Interface)
        spelled = (_schema_spelling(b, self._where) for _, bound in relevant for b in bound)
        bindings = ", ".join(spelled)
        self.extra.append(replace(specialized, specializes=model.schema_id, bindings=bindings))
        return new_id

    def _nested_scope(self, target: int, env: Env) -> str:
        """Where the specialization of ``target``, nested in a generic, lives: inside
        its parent's specialization (made here if need be, so the class exists), named
        after the bindings of ``target``'s own parameters when it has any. Two bindings
        of one nested generic (test.capnp's ``Inner2(Text)`` and ``Inner2(List(UInt32))``
        in one ``TestGenerics(...)``) so get two classes."""
        file_id, path = self._where[target]
        parent_path, _, last = path.rpartition(".")
        parent = self._scopes[file_id, parent_path]
        parent_env = {s: env[s] for s in self._generic_scopes(parent) if s in env}
        container = self._where[self._specialized(parent, parent_env)][1]
        own = env.get(target)  # the bindings of its own parameters, if it has any
        if own is not None:
            last = "_".join([last, *(_name_part(b, self._where) for b in own)])
        return f"{container}.{last}"

    def _name(self, scope: str, relevant: tuple[tuple[int, tuple[Type | None, ...]], ...]) -> str:
        parts = [scope.replace(".", "_")]
        for _, bound in relevant:
            parts.extend(_name_part(b, self._where) for b in bound)
        name = "_".join(parts)
        while name in self._taken:
            name += "_"
        self._taken.add(name)
        return name


def _unless_any(kind: Type) -> Type | None:
    """A binding to AnyPointer binds nothing (``Box(AnyPointer)`` is ``Box``)."""
    return None if kind.kind == "anyPointer" and kind.any == "pointer" else kind


def _synthetic_id(file_id: int, key: _Key) -> int:
    """A stable 64-bit ID for a specialization (the top bit set, as schema IDs have)."""
    digest = hashlib.sha256(repr((file_id, key)).encode()).digest()
    return int.from_bytes(digest[:8], "little") | (1 << 63)


def _name_part(kind: Type | None, where: dict[int, tuple[int, str]]) -> str:
    if kind is None:
        return "AnyPointer"
    if kind.kind == "list" and kind.element is not None:
        return "List_" + _name_part(kind.element, where)
    if kind.target:
        return where.get(kind.target, (0, "Unknown"))[1].replace(".", "_")
    if kind.kind == "anyPointer":
        return "AnyPointer"
    return SCHEMA_NAMES.get(kind.kind, kind.kind)


def _schema_spelling(kind: Type | None, where: dict[int, tuple[int, str]]) -> str:
    if kind is None:
        return "AnyPointer"
    if kind.kind == "list" and kind.element is not None:
        return f"List({_schema_spelling(kind.element, where)})"
    if kind.target:
        return where.get(kind.target, (0, "?"))[1]
    if kind.kind == "anyPointer":
        return "AnyPointer"
    return SCHEMA_NAMES.get(kind.kind, kind.kind)
