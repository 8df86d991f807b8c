"""The generator's core: one schema file's model in, one Python module's source out.

Theory of operation (grpclib's split: a pure ``render`` and a thin CLI):
- ``render(file, schema)`` is a pure function; the same model gives the same bytes.
- Every struct becomes a class holding a ``Reader`` and a ``Builder`` (``Car.Reader``,
  ``Car.Builder``), with ``new_message()`` and ``read()``; nested types are nested
  classes (``Car.Engine``), groups are classes named after their field, capitalised
  (``Holder.Extra``), method params and results are ``Iface.MethodParams`` and
  ``Iface.MethodResults``; enums are ``enum.IntEnum``s; constants are class or module
  attributes. Interfaces are classes holding their params/results structs, a typed
  ``Client`` (one keyword-only method per schema method) and a ``Server`` base; every
  struct also has a ``Pipeline`` and a ``Promise`` (a call's pipelinable results).
- Accessors read and write at offsets computed here: one ``unpack_from``/``pack_into``
  per data field, values XOR their defaults (so a zeroed struct reads as defaults).
- Names: a schema name that is a Python keyword, ``self``, or collides with what the
  generator defines in the same namespace (``RESERVED`` below: ``Reader``, ``Builder``,
  ``Init``, ``Row``, ``from_row``, ``Client``, ``read``, ``which``, ``to_dict``, ``init``,
  ...; and names starting ``init_``; a type or constant named ``row``, ``rows``,
  ``select`` or ``METHODS``) gets a trailing underscore: ``return`` -> ``return_``,
  ``self`` -> ``self_``.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from capsvc.codegen.model import (
    NUMBERS,
    PROVIDED_MODULES,
    SCHEMA_NAMES,
    STREAM_RESULT_ID,
    Const,
    Enum,
    Field,
    File,
    Interface,
    Method,
    Node,
    Schema,
    Struct,
    Type,
)
from capsvc.codegen.shadowing import qualify

#: Names the generator itself defines in a type's namespace or on readers and builders.
RESERVED = frozenset(
    {
        "Reader",
        "Builder",
        "Pipeline",
        "Promise",
        "Client",
        "Server",
        "Init",
        "Row",
        "from_row",
        "init",
        "assign",
        "read",
        "new_message",
        "from_bytes",
        "from_bytes_packed",
        "which",
        "to_dict",
        "as_reader",
        "to_bytes",
        "to_bytes_packed",
        "to_segments",
        "cancel",
        "self",
    }
)
_NO_DEFAULT_TEXT = ""

#: Names the generator defines in a type's namespace only (a struct's row functions, an
#: interface's method table): a nested type or a constant named so is renamed, a field
#: (an attribute of readers and builders) keeps its name.
TYPE_RESERVED = frozenset({"row", "rows", "select", "decoder", "row_decoder", "encode", "METHODS"})

#: Names a generated module imports for itself (its header): a type, a group's class or a
#: constant named so would shadow the import in the module or in its class's body (where
#: the annotations name them), so it takes a trailing underscore too (``struct Sequence``
#: is ``Sequence_``, ``const struct`` is ``struct_``).
MODULE_NAMES = frozenset(
    {"annotations", "enum", "struct", "Awaitable", "Sequence", "TYPE_CHECKING", "Any"}
    | {"ClassVar", "Literal", "Never", "TypeAlias", "TypedDict", "Unpack"}
)


def python_name(name: str) -> str:
    """A schema name as a Python identifier (see the module docstring's rule)."""
    if keyword.iskeyword(name) or name in RESERVED or name.startswith("init_"):
        return name + "_"
    return name


#: Names an ``enum.IntEnum`` cannot take as members (``mro``: Python refuses it) or that
#: type checkers see as its own attributes retyped (``name`` is a str there).
ENUM_RESERVED = frozenset({"mro", "name"})


def enumerant_name(name: str) -> str:
    """An enumerant's member name: the schema's, with a trailing underscore only where
    Python needs one (a keyword, ``ENUM_RESERVED``); the generator's own names clash with
    nothing on an enum. ``to_dict`` gives the schema's name back, and the values take
    either (capsvc.codec.scalars.check_enum)."""
    if keyword.iskeyword(name) or name in ENUM_RESERVED:
        return name + "_"
    return name


class _Out:
    """Lines with indentation (grpclib's Buffer)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0

    def add(self, line: str = "") -> None:
        self.lines.append(("    " * self.level + line) if line else "")

    @contextmanager
    def indent(self) -> Iterator[None]:
        self.level += 1
        try:
            yield
        finally:
            self.level -= 1


class _Names:
    """Python paths of every node: local ones, and imported ones through their module."""

    def __init__(self, file: File, schema: Schema) -> None:
        self.file = file
        self.schema = schema
        groups = {n.scope for n in file.nodes if isinstance(n, Struct) and n.is_group}
        self.local: dict[int, str] = {}
        for node in file.nodes:
            self.local[node.id] = _path(node.scope, groups)
        self.groups = groups
        #: Nested interfaces rendered at module level (``_hoisted``): ID -> class name.
        self.hoisted: dict[int, str] = {}

    def schema_node(self, node_id: int) -> Node | None:
        found = self.schema.nodes.get(node_id)
        if found is not None:
            return found
        for file in self.schema.files:  # (a Schema made without ``nodes``)
            for node in file.nodes:
                if node.id == node_id:
                    return node
        return None

    def of(self, node_id: int) -> str:
        if node_id == 0:  # Capability (an interface type of no interface): the typed bases
            return "_t"
        local = self.local.get(node_id)
        if local is not None:
            return local
        file_id, scope = self.schema.where.get(node_id, (0, ""))
        module = self.file.imports.get(file_id, "_unknown")
        return f"{module}.{_path(scope, set())}"


def _path(scope: str, groups: set[str]) -> str:
    parts = scope.split(".")
    out = []
    for index, part in enumerate(parts):
        prefix = ".".join(parts[: index + 1])
        if "$" in part:
            method, _, kind = part.partition("$")
            part = method[:1].upper() + method[1:] + kind
        elif prefix in groups:
            part = part[:1].upper() + part[1:]
        renamed = part in MODULE_NAMES or part in TYPE_RESERVED
        out.append(part + "_" if renamed else python_name(part))
    return ".".join(out)


def render(file: File, schema: Schema, *, relative_imports: bool = False) -> str:
    """The source of the module for ``file``. Modules of imported schema files are
    imported absolutely (``import other_capnp``: the output directory is on ``sys.path``)
    or, with ``relative_imports``, from the same package (``from . import other_capnp``)."""
    names = _Names(file, schema)
    out = _Out()
    _header(out, file, relative_imports)
    children: dict[str, list[Node]] = {}
    for node in file.nodes:
        parent = node.scope.rpartition(".")[0]
        children.setdefault(parent, []).append(node)
    for parent, siblings in children.items():
        children[parent] = _bases_first(siblings, file)
    hoisted = _hoisted(file)
    names.hoisted = {n.id: f"_Nested_{names.local[n.id].replace('.', '_')}" for n in hoisted}
    for node in children.get("", []):
        _node(out, node, children, names)
        for nested in hoisted:
            if nested.scope.partition(".")[0] == node.scope:
                _node(out, nested, children, names)
                owner, _, name = names.local[nested.id].rpartition(".")
                out.add("")
                out.add(f'_t.nest({owner}, "{name}", {names.hoisted[nested.id]})')
    stages = [len(out.lines)]
    _lists(out, file, names)
    stages.append(len(out.lines))
    _plans(out, file, names)
    stages.append(len(out.lines))
    _module_tail(out, file, names)
    if schema.cycles.peers(file.id):
        _link_cycle(out, file, schema, stages)
    return qualify("\n".join(out.lines).rstrip("\n") + "\n")


#: What each stage of a cycle's links does (capsvc.linking), for ``_link``'s docstring.
_LINK_STAGES = ("descriptors and list readers", "value plans", "method tables and constants")


def _link_cycle(out: _Out, file: File, schema: Schema, stages: list[int]) -> None:
    """Rework the module's tail for a file in a cycle of imports (``Cycles``): the
    statements that take another module of the cycle (and those that take what they
    make) move into ``_link(stage)``, which capsvc.linking runs once every module of
    the cycle has made its classes; the modules of the cycle this one needs only there
    are imported by capsvc.linking, not at the top (those holding interfaces that its
    interfaces extend stay there: Python needs them to make its classes).
    ``stages``: where the tail's sections start in ``out.lines``."""
    cycles = schema.cycles
    peers = cycles.peers(file.id) - {file.id}
    early = cycles.extends.get(file.id, frozenset())
    used = sorted(module for other, module in file.imports.items() if other in peers)
    late = sorted(m for other, m in file.imports.items() if other in peers and other not in early)
    header: list[str] = []
    for module in late:
        for line in (f"import {module}", f"from . import {module}"):
            if line in out.lines[: stages[0]]:
                out.lines.remove(line)
                header.append(line)
                for index in range(len(stages)):
                    stages[index] -= 1
    patterns = [rf"\b{module}\.|\b_E_{module}_" for module in used]
    # (stage, whether a statement, lines): the tail's statements, comments and blank lines
    items: list[tuple[int, bool, list[str]]] = []
    for index, line in enumerate(out.lines[stages[0] :], stages[0]):
        stage = sum(1 for start in stages[1:] if index >= start)
        if line and not line[0].isspace() and not line.startswith((")", "#")):
            items.append((stage, True, [line]))
        elif items and items[-1][1] and line and line[0] in " )":
            items[-1][2].append(line)
        else:
            items.append((stage, False, [line]))
    deferred: list[tuple[int, list[str]]] = []
    kept: list[tuple[int, bool, list[str]]] = []
    declared: list[str] = []
    for stage, statement, lines in items:
        text = "\n".join(lines)
        target = re.match(r"([\w.]+) = ", lines[0])
        if statement and (
            any(re.search(pattern, text) for pattern in patterns)
            or (stage == 1 and ".to_dict()" in text)  # reads a struct: bound by stage 0
        ):
            deferred.append((stage, lines))
            if target is not None:  # what takes it is deferred too
                name = target.group(1)
                patterns.append(rf"(?<![\w.]){re.escape(name)}(?!\w)")
                if "." not in name:
                    declared.append(lines[0])
        else:
            kept.append((stage, statement, lines))
    staying = {stage for stage, statement, _ in kept if statement}
    del out.lines[stages[0] :]
    for stage, statement, lines in kept:  # a section's comment goes if it has nothing left
        if statement or stage in staying:
            out.lines.extend(lines)
    while out.lines and not out.lines[-1]:
        out.lines.pop()
    out.add("")
    out.add("")
    out.add("# What this module takes from modules that import it back (capsvc.linking).")
    out.add("from capsvc import linking as _k")
    if header or declared:
        out.add("if TYPE_CHECKING:")
        with out.indent():
            for line in header + declared:
                out.add(line)
    out.add("")
    out.add("def _link(stage: int) -> None:")
    with out.indent():
        done = "; ".join(f"{n}: {what}" for n, what in enumerate(_LINK_STAGES))
        out.add(f'"""Bind what this module takes from {", ".join(used)} ({done})."""')
        if declared:
            names = ", ".join(line.partition(" = ")[0] for line in declared)
            out.add(f"global {names}")
        branch = "if"
        for number in range(len(_LINK_STAGES)):
            body = [line for stage, lines in deferred if stage == number for line in lines]
            if not body:
                continue
            out.add(f"{branch} stage == {number}:")
            branch = "elif"
            with out.indent():
                for line in body:
                    out.add(line)
    members = sorted(cycles.modules[other] for other in cycles.peers(file.id))
    out.add("")
    names_tuple = ", ".join(f'"{m}"' for m in members)
    imports_tuple = "".join(f'"{m}", ' for m in late).rstrip()
    out.add(f"_k.ready(globals(), ({names_tuple}), _link, ({imports_tuple}))")


def _bases_first(siblings: list[Node], file: File) -> list[Node]:
    """``siblings`` in schema order, except that a class whose subtree holds an interface
    comes after the siblings holding that interface's superclasses: Python evaluates base
    classes when it creates a class (``extends``, including the diamond)."""
    scope_of = {node.id: node.scope for node in file.nodes}

    def holder(scope: str) -> Node | None:
        for sibling in siblings:
            if scope == sibling.scope or scope.startswith(sibling.scope + "."):
                return sibling
        return None

    needs: dict[int, set[int]] = {sibling.id: set() for sibling in siblings}
    for node in file.nodes:
        if not isinstance(node, Interface):
            continue
        inside = holder(node.scope)
        for parent in node.superclasses:
            base = holder(scope_of.get(parent, "\0"))
            if inside is not None and base is not None and base is not inside:
                needs[inside.id].add(base.id)
    return _after_needs(siblings, lambda node: node.id, needs)


K = TypeVar("K")
N = TypeVar("N", bound="Node")


def _after_needs(items: list[N], key: Callable[[N], K], needs: dict[K, set[K]]) -> list[N]:
    """``items`` in their order, except that each comes after those its key ``needs``
    (what cannot be ordered so, a cycle, keeps its place)."""
    out: list[N] = []
    placed: set[K] = set()
    pending = list(items)
    while pending:
        ready = next((n for n in pending if needs[key(n)] <= placed), pending[0])
        pending.remove(ready)
        placed.add(key(ready))
        out.append(ready)
    return out


def _hoisted(file: File) -> list[Interface]:
    """The nested interfaces whose bases are not bound where Python would create them:
    inside the classes enclosing them, whose names are bound only once they are complete
    (``interface Outer { interface Base {} interface Derived extends(Base) {} }``, or a
    child extending its parent). Each is rendered at module level instead, after the
    top-level class holding it, as ``_Nested_<path>``; the enclosing class declares it for
    type checkers (``Derived: TypeAlias = "_Nested_Outer_Derived"``) and
    capsvc.typed.nest binds it there. In the order they are rendered: each after the
    hoisted classes enclosing it or holding its bases."""
    interfaces = [node for node in file.nodes if isinstance(node, Interface)]
    scope_of = {node.id: node.scope for node in file.nodes}
    hoisted: set[str] = set()

    def within(scope: str, outer: str) -> bool:
        return scope == outer or scope.startswith(outer + ".")

    def root(scope: str) -> str:
        """The outermost class still being created when ``scope``'s class statement runs."""
        parts = scope.split(".")
        for end in range(len(parts) - 1, 0, -1):
            if ".".join(parts[:end]) in hoisted:
                return ".".join(parts[:end])
        return parts[0]

    def bases(node: Interface) -> list[str]:
        return [scope_of[s] for s in node.superclasses if s in scope_of]

    changed = True
    while changed:
        changed = False
        for node in interfaces:
            if "." in node.scope and node.scope not in hoisted:
                outer = root(node.scope)
                if any(within(base, outer) for base in bases(node)):
                    hoisted.add(node.scope)
                    changed = True

    def holder(scope: str) -> str | None:
        """The hoisted class holding ``scope`` (or being it)."""
        parts = scope.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in hoisted:
                return ".".join(parts[:end])
        return None

    needs: dict[str, set[str]] = {scope: set() for scope in hoisted}
    for scope in hoisted:
        enclosing = holder(scope.rpartition(".")[0])
        if enclosing is not None:
            needs[scope].add(enclosing)
    for node in interfaces:
        created_in = node.scope if node.scope in hoisted else root(node.scope)
        if created_in not in hoisted:
            continue
        for base in bases(node):
            other = holder(base)
            if other is not None and not within(created_in, other):
                needs[created_in].add(other)
    moved = [node for node in interfaces if node.scope in hoisted]
    return _after_needs(moved, lambda node: node.scope, needs)


def _interfaces_bases_first(file: File) -> list[Interface]:
    """The file's interfaces, each after those it extends (for tables built from them)."""
    interfaces = {node.id: node for node in file.nodes if isinstance(node, Interface)}
    out: list[Interface] = []
    placed: set[int] = set()

    def place(node: Interface, seen: frozenset[int]) -> None:
        if node.id in placed or node.id in seen:
            return
        for parent in node.superclasses:
            if parent in interfaces:
                place(interfaces[parent], seen | {node.id})
        placed.add(node.id)
        out.append(node)

    for node in interfaces.values():
        place(node, frozenset())
    return out


def _header(out: _Out, file: File, relative: bool) -> None:
    structs = [node for node in file.nodes if isinstance(node, Struct)]
    has_interfaces = any(isinstance(node, Interface) for node in file.nodes) or any(
        _uses_kind(node, _RUNTIME_TYPED) for node in structs
    )
    # AnyPointer setters name capsvc.typed in their annotations only: imported for the type
    # checker alone, since capsvc's own rpc_capnp (Payload.content) is imported by it.
    typed_for_annotations = not has_interfaces and any(
        _uses_kind(node, _ANNOTATION_TYPED) for node in structs
    )
    source = file.filename.replace("\\", "/").rsplit("/", 1)[-1]
    out.add(f'"""Generated by capsvc gen from {source} (file ID {file.id:#018x}).')
    out.add("")
    out.add("Do not edit: change the schema and run ``capsvc gen`` again.")
    out.add('"""')
    out.add("")
    out.add("# ruff: noqa")
    out.add("# fmt: off")
    out.add("from __future__ import annotations")
    out.add("")
    out.add("import enum")
    out.add("import struct")
    out.add("from collections.abc import Awaitable, Sequence")
    out.add(
        "from typing import TYPE_CHECKING, Any, ClassVar, Literal, Never, TypeAlias, TypedDict,"
        " Unpack"
    )
    out.add("")
    out.add("from capsvc.codec import building as _b")
    out.add("from capsvc.codec import descriptors as _d")
    out.add("from capsvc.codec import pipeline as _p")
    out.add("from capsvc.codec import plans as _v")
    out.add("from capsvc.codec import reading as _r")
    out.add("from capsvc.codec import rows as _w")
    out.add("from capsvc.codec import streams as _s")
    out.add("from capsvc.codec import values as _e")
    if has_interfaces:
        out.add("from capsvc import typed as _t")
    elif typed_for_annotations:
        out.add("if TYPE_CHECKING:")
        out.add("    from capsvc import typed as _t")
    out.add("from capsvc.codec.fields import (")
    with out.indent():
        for width in ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f32", "f64"):
            out.add(f"get_{width}, set_{width},")
        out.add("f32_bits, f32_from_bits, f64_bits, f64_from_bits,")
    out.add(")")
    lines = set()
    for file_id, module in file.imports.items():
        package = PROVIDED_MODULES.get(file_id)
        if package is not None:
            lines.add((module, f"from {package} import {module}"))
        else:
            lines.add((module, f"from . import {module}" if relative else f"import {module}"))
    for _, line in sorted(lines):
        out.add(line)
    out.add("")


#: Field types whose accessors use capsvc.typed at run time (clients of an interface, a
#: Capability's generic client), and those that name it in annotations only (AnyPointer).
_RUNTIME_TYPED = frozenset({"interface", "anyPointer:capability"})
_ANNOTATION_TYPED = frozenset({"anyPointer:pointer"})


def _uses_kind(node: Struct, kinds: frozenset[str]) -> bool:
    """Whether one of ``node``'s fields has a type (or a list element type) of ``kinds``
    (an AnyPointer spelled ``anyPointer:<its constraint>``)."""
    for field in node.fields:
        kind = field.type
        while kind is not None:
            spelled = f"anyPointer:{kind.any}" if kind.kind == "anyPointer" else kind.kind
            if spelled in kinds:
                return True
            kind = kind.element
    return False


def _node(out: _Out, node: Node, children: dict[str, list[Node]], names: _Names) -> None:
    out.add("")
    if isinstance(node, Struct):
        _struct(out, node, children, names)
    elif isinstance(node, Enum):
        _enum(out, node, names)
    elif isinstance(node, Interface):
        _interface(out, node, children, names)
    elif isinstance(node, Const):
        _const(out, node, names)


def _nested(out: _Out, node: Node, children: dict[str, list[Node]], names: _Names) -> None:
    for child in children.get(node.scope, []):
        hoisted = names.hoisted.get(child.id)
        if hoisted is not None:  # rendered at module level (_hoisted): named here for mypy
            out.add("")
            out.add(f'{names.local[child.id].rpartition(".")[2]}: TypeAlias = "{hoisted}"')
            continue
        _node(out, child, children, names)


def _described(node: Struct | Interface) -> str:
    """A node's schema name; a specialization's says what it binds (``Box_Text, the
    generic 0x... bound to (Text)``)."""
    if not node.specializes:
        return node.scope
    return f"{node.scope}: a generic bound to ({node.bindings})"


# ---------------------------------------------------------------------- enums, consts
def _enum(out: _Out, node: Enum, names: _Names) -> None:
    path = names.local[node.id]
    name = path.rpartition(".")[2]
    out.add(f"class {name}(enum.IntEnum):")
    with out.indent():
        out.add(f'"""enum {node.scope} ({node.id:#018x}). Codes unknown to this schema (from a')
        out.add('newer writer) read as pseudo-members named by their number."""')
        out.add("")
        for code, enumerant in enumerate(node.enumerants):
            out.add(f"{enumerant_name(enumerant)} = {code}")
        out.add("")
        out.add("@classmethod")
        out.add(f"def _missing_(cls, value: object) -> {path} | None:")
        with out.indent():
            out.add("if not isinstance(value, int) or not 0 <= value < 65536:")
            out.add("    return None")
            out.add("member = int.__new__(cls, value)")
            out.add("member._name_ = str(value)")
            out.add("member._value_ = value")
            out.add("return member")


#: Constants whose value names a generated class, so set in the module's tail.
_DEFERRED_CONSTS = ("struct", "list", "anyPointer", "enum")


def _const(out: _Out, node: Const, names: _Names) -> None:
    path = names.local[node.id]
    name = path.rpartition(".")[2]
    kind = node.type
    value_type = _value_type(kind, names)
    annotation = f"ClassVar[{value_type}]" if "." in path else value_type
    if kind.kind in _DEFERRED_CONSTS:
        # Set at the end of the module, once the classes it reads with exist (an enum
        # may be declared after a constant of its type: test.capnp's TestConstants).
        out.add(f"{name}: {annotation}")
        return
    out.add(f"{name}: {annotation} = {_literal(node.value, kind, names)}")


# ---------------------------------------------------------------------- interfaces
def _interface(out: _Out, node: Interface, children: dict[str, list[Node]], names: _Names) -> None:
    path = names.local[node.id]
    name = names.hoisted.get(node.id) or path.rpartition(".")[2]
    out.add(f'class {name}(_t.Interface["{path}.Client"]):')
    with out.indent():
        out.add(
            f'"""interface {_described(node)} ({node.schema_id:#018x}): its methods\' params and'
            ' results."""'
        )
        out.add("")
        out.add(f"_ID: ClassVar[int] = {node.schema_id:#x}")
        out.add("#: Method name -> (ordinal, params struct, results struct).")
        out.add("METHODS: ClassVar[dict[str, tuple[int, Any, Any]]]")
        _nested(out, node, children, names)
        out.add("")
        _client(out, node, names)
        out.add("")
        _server(out, node, names)


def _client(out: _Out, node: Interface, names: _Names) -> None:
    path = names.local[node.id]
    bases = ", ".join(f"{names.of(s)}.Client" for s in node.superclasses) or "_t.Client"
    out.add(f"class Client({bases}):")
    with out.indent():
        out.add(f'"""A capability typed as {node.scope}: call its methods."""')
        out.add("")
        out.add("__slots__ = ()")
        out.add(f"_INTERFACE_ID: ClassVar[int] = {node.schema_id:#x}")
        out.add(f'_INTERFACE_NAME: ClassVar[str] = "{node.scope}"')
        for method in node.methods:
            _client_method(out, node, method, path, names)


def _client_method(out: _Out, node: Interface, method: Method, path: str, names: _Names) -> None:
    name = method.python
    params = names.of(method.params)
    results = names.of(method.results)
    struct = names.schema_node(method.params)
    fields = [] if not isinstance(struct, Struct) else _keyword_fields(struct, names)
    # ``self`` positional-only: a schema parameter spelt ``self`` is ``self_``, and a
    # caller's ``self=`` lands among the unknown keywords, with our message.
    signature = ["self", "/", "*"] if fields else ["self", "/"]
    for field, annotation, default in fields:
        signature.append(f"{python_name(field.name)}: {annotation} = {default}")
    # The locals below start with "_": schema names cannot (capnp rejects underscores).
    signature.append("**_unknown: Never")
    # A ``-> stream`` method (results: stream.capnp's StreamResult) gives a StreamCall to
    # await before the next write (flow control: capsvc.streaming), as C++'s does.
    streaming = method.results == STREAM_RESULT_ID
    returns = "_t.StreamCall" if streaming else f"{results}.Promise"
    out.add("")
    out.add(f"def {name}({', '.join(signature)}) -> {returns}:")
    with out.indent():
        if streaming:
            out.add(f'"""Call {node.scope}.{method.name}, a stream: await what it gives before the')
            out.add("next call (it returns once the capability's stream window has room).")
        else:
            out.add(
                f'"""Call {node.scope}.{method.name}; returns the pipelinable promise of its'
                " results."
            )
        out.add("")
        out.add(f"Params keywords cannot express: ``{method.request}()``.")
        out.add('"""')
        known = ", ".join(f'"{python_name(f.name)}"' for f, _, _ in fields)
        comma = "," if len(fields) == 1 else ""
        out.add("if _unknown:")
        qualified = f"{node.scope}.{method.name}"
        # The params fields keywords cannot set (unions, groups...): the error names them
        # and the request form that can.
        taken = {id(f) for f, _, _ in fields}
        others = (
            []
            if not isinstance(struct, Struct)
            else [
                python_name(f.name)
                for f in sorted(struct.fields, key=lambda f: f.code_order)
                if id(f) not in taken
            ]
        )
        tail = ""
        if others:
            listed = ", ".join(f'"{o}"' for o in others) + ("," if len(others) == 1 else "")
            tail = f', "{method.request}", ({listed})'
        out.add(f'    raise _t.unknown_parameters("{qualified}", _unknown, ({known}{comma}){tail})')
        # The Request made here, not through ``*_request()``: one Python frame less a call.
        out.add(f"_request = {_request_of(method, path, params, results)}")
        if fields:
            out.add("_params = _request.params")
        for field, _, default in fields:
            assert isinstance(struct, Struct)
            for line in _keyword_setter(field, default, names, struct.scope):
                out.add(line)
        out.add("return _request.send()")
    out.add("")
    request_type = (
        f"_t.StreamRequest[{params}.Builder]"
        if streaming
        else f"_t.Request[{params}.Builder, {results}.Promise]"
    )
    out.add(f"def {method.request}(self) -> {request_type}:")
    out.add(f'    """A {node.scope}.{method.name} call to fill (``.params``) and ``send()``."""')
    out.add(f"    return {_request_of(method, path, params, results)}")


def _request_of(method: Method, path: str, params: str, results: str) -> str:
    """The expression making a call of ``method`` to fill and send."""
    if method.results == STREAM_RESULT_ID:
        return f"_t.StreamRequest(self, {path}._ID, {method.ordinal}, {params}.Builder)"
    return f"_t.Request(self, {path}._ID, {method.ordinal}, {params}.Builder, {results}.Promise)"


_KEYWORD_ELEMENTS = {"bool": "bool", "text": "str", "data": "bytes", "enum": "int"}


def _keyword_fields(struct: Struct, names: _Names) -> list[tuple[Field, str, str]]:
    """The params fields a keyword argument can set: (field, annotation, default). Groups,
    union members, AnyPointers and lists of structs or lists take ``*_request()``."""
    fields = []
    for field in sorted(struct.fields, key=lambda f: f.code_order):
        if field.group is not None or field.discriminant is not None or field.type is None:
            continue
        kind = field.type
        k = kind.kind
        default = field.default
        if k == "bool":
            fields.append((field, "bool", repr(bool(default))))
        elif k in NUMBERS:
            number = "float" if k.startswith("float") else "int"
            fields.append((field, number, _number_literal(default or 0, k)))
        elif k == "enum":
            fields.append((field, "int", repr(int(default or 0))))  # type: ignore[call-overload]
        elif k == "text":
            fields.append((field, "str", repr(default if isinstance(default, str) else "")))
        elif k == "data":
            fields.append((field, "bytes", repr(default if isinstance(default, bytes) else b"")))
        elif k == "struct":
            target = names.of(kind.target)
            accepted = f"{target}.Init | {target}.Row | {target}.Reader | {target}.Builder | None"
            fields.append((field, accepted, "None"))
        elif k == "interface":
            target = names.of(kind.target)
            fields.append((field, f"{target}.Client | {target}.Server | None", "None"))
        elif k == "list" and kind.element is not None:
            element = kind.element
            if element.kind in NUMBERS:
                python = "float" if element.kind.startswith("float") else "int"
            elif element.kind == "interface":
                target = names.of(element.target)
                python = f"{target}.Client | {target}.Server | None"
            else:
                python = _KEYWORD_ELEMENTS.get(element.kind, "")
            if python:
                fields.append((field, f"Sequence[{python}] | None", "None"))
    return fields


def _keyword_setter(
    field: Field, default: str, names: _Names, scope: str, target: str = "_params"
) -> list[str]:
    """The lines setting ``field`` of builder ``target`` (a struct named ``scope``) from
    its keyword argument."""
    name = python_name(field.name)
    label = f"{scope}.{field.name}"
    assert field.type is not None
    k = field.type.kind
    if k in NUMBERS or k in ("bool", "enum"):
        return [f"{target}.{name} = {name}"]
    if k in ("text", "data"):
        return [f"if {name} != {default}:", f"    {target}.{name} = {name}"]
    if k == "struct":
        assert field.type.target is not None
        struct = names.of(field.type.target)
        return [
            f"if {name} is not None:",
            f'    _b.copy_struct({target}, {field.offset}, {name}, {struct}.Builder, "{label}")',
        ]
    if k == "interface":
        return [f"if {name} is not None:", f"    {target}.set_{field.name}({name})"]
    # A list display, not list(): the field itself may be called "list".
    return [f"if {name} is not None:", f"    {target}.set_{field.name}([*{name}])"]


def _pipeline(out: _Out, node: Struct, path: str, names: _Names) -> None:
    out.add("class Pipeline(_p.StructPipeline):")
    with out.indent():
        out.add(f'"""The pipelined fields of a future {node.scope} (rpc-protocol.md §6)."""')
        out.add("")
        out.add("__slots__ = ()")
        for field in sorted(node.fields, key=lambda f: f.code_order):
            name = python_name(field.name)
            if field.group is not None:
                group = names.of(field.group)
                out.add("")
                out.add("@property")
                out.add(f"def {name}(self) -> {group}.Pipeline:")
                out.add(f"    return self._group({group}.Pipeline)")
            elif field.type is not None and field.type.kind == "interface":
                target = names.of(field.type.target)
                out.add("")
                out.add("@property")
                out.add(f"def {name}(self) -> {target}.Client:")
                out.add(f'    """The {field.name} capability, usable before the results arrive."""')
                out.add(f"    return self._client({field.offset}, {target}.Client)")
            elif field.type is not None and field.type.kind == "struct":
                target = names.of(field.type.target)
                out.add("")
                out.add("@property")
                out.add(f"def {name}(self) -> {target}.Pipeline:")
                out.add(f"    return self._struct({field.offset}, {target}.Pipeline)")


def _server(out: _Out, node: Interface, names: _Names) -> None:
    bases = ", ".join(f"{names.of(s)}.Server" for s in node.superclasses) or "_t.Server"
    out.add(f"class Server({bases}):")
    with out.indent():
        out.add(f'"""Base of objects implementing {node.scope}: override its methods (``def`` or')
        out.add('``async def``; a method not overridden answers ``unimplemented``)."""')
        out.add("")
        out.add(f'_INTERFACE_NAME: ClassVar[str] = "{node.scope}"')
        for method in node.methods:
            params = names.of(method.params)
            results = names.of(method.results)
            out.add("")
            out.add("@_t.unimplemented")
            out.add(
                f"def {method.python}(self, params: {params}.Reader,"
                f" results: {results}.Builder)"
                " -> Awaitable[None] | None:"
            )
            out.add(f'    """{node.scope}.{method.name}: read ``params``, fill ``results``."""')
            out.add("    raise NotImplementedError  # not called: the base answers unimplemented")


def _server_tables(out: _Out, file: File, names: _Names) -> None:
    for node in _interfaces_bases_first(file):
        path = names.local[node.id]
        entries = [f"**{names.of(s)}.Server._METHODS" for s in node.superclasses]
        entries += [
            f'({path}._ID, {m.ordinal}): ("{m.python}", {names.of(m.params)},'
            f" {names.of(m.results)})"
            for m in node.methods
        ]
        out.add(f"{path}.Server._METHODS = {{{', '.join(entries)}}}")


def _interface_tables(out: _Out, file: File, names: _Names) -> None:
    for node in file.nodes:
        if isinstance(node, Interface):
            entries = ", ".join(
                f'"{m.name}": ({m.ordinal}, {names.of(m.params)}, {names.of(m.results)})'
                for m in node.methods
            )
            out.add(f"{names.local[node.id]}.METHODS = {{{entries}}}")


# ---------------------------------------------------------------------- structs
def _struct(out: _Out, node: Struct, children: dict[str, list[Node]], names: _Names) -> None:
    path = names.local[node.id]
    name = path.rpartition(".")[2]
    kind = "group" if node.is_group else "struct"
    out.add(f"class {name}:")
    with out.indent():
        out.add(f'"""{kind} {_described(node)} ({node.schema_id:#018x})."""')
        out.add("")
        out.add(f"_ID: ClassVar[int] = {node.schema_id:#x}")
        _nested(out, node, children, names)
        out.add("")
        _init_type(out, node, path, names)
        out.add("")
        _row_type(out, node, names)
        out.add("")
        _reader(out, node, path, names)
        out.add("")
        _builder(out, node, path, names)
        out.add("")
        _pipeline(out, node, path, names)
        if not node.is_group:
            out.add("")
            out.add("class Promise(Pipeline, _p.ResultPromise[Reader]):")
            out.add(
                f'    """A call\'s future {node.scope} results: await it, or pipeline on it."""'
            )
            out.add("")
            out.add("    __slots__ = ()")
            out.add("")
            out.add("Promise._READER = Reader")
            out.add("")
            out.add("@staticmethod")
            if node.fields:
                _keywords_def(out, "def new_message(", [], node, names, f"{path}.Builder")
                values = f"{_plan_name(path)}, {_values_tuple(node)}, _unknown"
            else:
                out.add(f"def new_message() -> {path}.Builder:")
                values = f"{_plan_name(path)}, [], {{}}"
            out.add(f'    """A new message whose root is a {node.scope}: the fields named take')
            out.add('    their values (plain values, ``Init``), every other field its default."""')
            out.add(f"    return _e.new_message({path}.Builder, {values})")
            out.add("")
            _row_functions(out, node, path)
            out.add("")
            out.add("@staticmethod")
            out.add("def read(")
            out.add("    segments: _r.Segments,")
            out.add("    *,")
            out.add("    traversal_limit_words: int = _r.DEFAULT_TRAVERSAL_LIMIT,")
            out.add("    nesting_limit: int = _r.DEFAULT_NESTING_LIMIT,")
            out.add(f") -> {path}.Reader:")
            out.add(f'    """The root {node.scope} of a message (its segments)."""')
            out.add(
                f"    return _r.read_segments({path}.Reader, segments,"
                " traversal_limit_words, nesting_limit)"
            )
            out.add("")
            for function, what, call in (
                (
                    "from_bytes",
                    "The root of a message in the standard stream framing.",
                    "read_framed",
                ),
                (
                    "from_bytes_packed",
                    "The root of a packed message (the packed encoding of the framing).",
                    "read_packed",
                ),
            ):
                out.add("@staticmethod")
                out.add(f"def {function}(")
                out.add("    data: bytes | bytearray | memoryview,")
                _limit_keywords(out)
                out.add(f") -> {path}.Reader:")
                out.add(f'    """{what}"""')
                arguments = "data, traversal_limit_words, nesting_limit"
                out.add(f"    return _r.{call}({path}.Reader, {arguments})")
                out.add("")
            for function, packed in (
                ("read_multiple_bytes", False),
                ("read_multiple_bytes_packed", True),
            ):
                out.add("@staticmethod")
                out.add(f"def {function}(")
                out.add("    data: bytes | bytearray | memoryview,")
                _limit_keywords(out)
                out.add(f") -> list[{path}.Reader]:")
                framing = "packed framing" if packed else "stream framing"
                doc = f"The root of each message of ``data``, one after another in the {framing}."
                out.add(f'    """{doc}"""')
                out.add(
                    f"    return _r.read_multiple({path}.Reader, data, {packed},"
                    " traversal_limit_words, nesting_limit)"
                )
                out.add("")
            out.add("@staticmethod")
            out.add(
                "def decoder(limits: _s.Limits = _s.DEFAULT_LIMITS)"
                f" -> _s.RootDecoder[{path}.Reader]:"
            )
            out.add(f'    """The {node.scope} roots of a byte stream of framed messages, as they')
            out.add("    arrive: ``feed`` it bytes, then ``next()`` gives each complete message's")
            out.add('    root (None until one is); ``limits`` bound each message."""')
            out.add(f"    return _s.RootDecoder({path}.Reader, limits)")
            out.add("")
            out.add("@staticmethod")
            out.add(
                "def row_decoder(limits: _s.Limits = _s.DEFAULT_LIMITS)"
                f" -> _s.RowDecoder[{path}.Row]:"
            )
            out.add(f'    """``decoder()``, giving each {node.scope} root as its row: what')
            out.add("    ``row(decoder.next())`` gives, with no message or reader object made for")
            out.add('    a message of one segment (the common case)."""')
            # (No schema name can be ``row_decoder``: capnp names have no underscores.)
            out.add(f"    return _s.RowDecoder({path}.Reader, {_plan_name(path)}, limits)")
            out.add("")
            out.lines.pop()


def _limit_keywords(out: _Out) -> None:
    out.add("    *,")
    out.add("    traversal_limit_words: int = _r.DEFAULT_TRAVERSAL_LIMIT,")
    out.add("    nesting_limit: int = _r.DEFAULT_NESTING_LIMIT,")


def _init_type(out: _Out, node: Struct, path: str, names: _Names) -> None:
    """``Init``: the struct's fields as plain values, a TypedDict (``new_message`` and
    ``assign`` take them as keywords; a struct field takes a nested one)."""
    out.add("class Init(TypedDict, total=False):")
    with out.indent():
        out.add(f'"""{node.scope} as plain values: what ``new_message`` and ``assign`` take."""')
        for field in sorted(node.fields, key=lambda f: f.code_order):
            out.add("")
            out.add(f"{python_name(field.name)}: {_init_field_type(field, names)}")


def _row_type(out: _Out, node: Struct, names: _Names) -> None:
    """``Row``: the struct as one tuple of its fields in schema order (capsvc.codec.rows),
    what ``row()`` reads and what the encoder takes wherever it takes an ``Init``."""
    items = ", ".join(_row_items(node, names)) or "()"
    out.add(f'Row: TypeAlias = "tuple[{items}]"')


def _row_items(node: Struct, names: _Names) -> list[str]:
    """The types of a row's values: one per field, a group's own values in its place
    (every group but a union member: capsvc.codec.plans.StructPlan.row_width)."""
    items: list[str] = []
    for field in sorted(node.fields, key=lambda f: f.code_order):
        if field.group is not None and field.discriminant is None:
            group = names.schema_node(field.group)
            assert isinstance(group, Struct)
            items.extend(_row_items(group, names))
        else:
            items.append(_row_field_type(field, names))
    return items


def _row_field_type(field: Field, names: _Names) -> str:
    if field.group is not None:  # a union member: its row, or None when not set
        return f"{names.of(field.group)}.Row | None"
    assert field.type is not None
    if field.type.kind == "void":
        return "Literal[True] | None" if field.discriminant is not None else "None"
    value = _reader_type(field.type, names, row=True)
    if field.type.kind == "struct" and field.default is None:
        return f"{value} | None"  # a null pointer
    return f"{value} | None" if field.discriminant is not None else value


def _row_functions(out: _Out, node: Struct, path: str) -> None:
    """``row(reader)`` and ``rows(list_reader)``: whole structs as tuples, in one call."""
    plan = _plan_name(path)
    out.add("@staticmethod")
    out.add(f"def row(reader: {path}.Reader | {path}.Builder) -> {path}.Row:")
    out.add('    """Every field at once, as a tuple in schema order (a group\'s fields in its')
    out.add("    place, None for a union member not set): what ``from_row``, and any field")
    out.add('    of this type, take back."""')
    out.add(f"    return _w.struct_row(reader, {plan})")
    out.add("")
    out.add("@staticmethod")
    out.add(f"def from_row(row: {path}.Row) -> {path}.Builder:")
    out.add(f'    """A new message whose root is a {node.scope} holding ``row``."""')
    out.add(f"    return _e.new_message_row({path}.Builder, {plan}, row)")
    out.add("")
    out.add("@staticmethod")
    out.add(f"def encode(value: {path}.Row | {path}.Init, *, packed: bool = False) -> bytes:")
    out.add(f'    """The bytes of a message whose root is a {node.scope} holding ``value`` (a')
    out.add("    row, or a dict of its fields), in the standard stream framing (``packed``:")
    out.add("    its packed encoding): ``from_row`` or ``new_message``, then ``to_bytes``, in")
    out.add('    one call with no builder made."""')
    out.add(f"    return _e.encode_message({plan}, value, packed)")
    out.add("")
    out.add("@staticmethod")
    out.add(
        f"def rows(readers: _r.ListReader[{path}.Reader] | _b.StructListBuilder[{path}.Builder])"
        f" -> list[{path}.Row]:"
    )
    out.add(f'    """Every element of a list of {node.scope} (read, or being built) as a row."""')
    out.add(f"    return _w.list_rows(readers, {plan})")
    out.add("")
    out.add("@staticmethod")
    out.add("def select(*names: str, **nested: _w.Selection | Sequence[str]) -> _w.Selection:")
    out.add(f'    """Some fields of {node.scope}, read as rows (its ``row`` and ``rows``): those')
    out.add("    named whole, and of a struct, list or group field given as a keyword the")
    out.add('    fields of its own selection (or sequence of names), in schema order."""')
    out.add(f"    return _w.select({plan}, names, nested)")


def _init_field_type(field: Field, names: _Names) -> str:
    if field.group is not None:
        return f"{names.of(field.group)}.Init | {names.of(field.group)}.Row"
    assert field.type is not None
    return _init_value_type(field.type, names)


def _init_value_type(kind: Type, names: _Names, *, element: bool = False) -> str:
    """What a field (or a list ``element``) of ``kind`` takes as a plain value (a pointer
    field also takes None: null; so does a list of pointers but of structs)."""
    k = kind.kind
    if k == "void":
        return "None"
    if k == "bool":
        return "bool"
    if k in NUMBERS:
        return "float" if k.startswith("float") else "int"
    if k == "enum":
        return f"int | {_enumerant_names(kind.target, names)}"  # a code (a member), a name
    if k == "text":
        return "str | None"
    if k == "data":
        return "bytes | bytearray | memoryview | None"
    if k == "struct":
        target = names.of(kind.target)
        null = "" if element else " | None"
        return f"{target}.Init | {target}.Row | {target}.Reader | {target}.Builder{null}"
    if k == "list":
        assert kind.element is not None
        inner = _init_value_type(kind.element, names, element=True)
        return f"Sequence[{inner}] | _r.ListReader[Any] | None"
    if k == "interface":
        target = names.of(kind.target)
        return f"{target}.Client | {target}.Server | None"
    return "str | bytes | _r.StructReader | _b.StructBuilder | None"


def _union_names(node: Struct) -> list[tuple[int, str]]:
    return sorted((f.discriminant, f.name) for f in node.fields if f.discriminant is not None)


def _reader(out: _Out, node: Struct, path: str, names: _Names) -> None:
    out.add("class Reader(_r.StructReader):")
    with out.indent():
        out.add("__slots__ = ()")
        out.add(f"_DATA_WORDS: ClassVar[int] = {node.data_words}")
        out.add(f"_POINTERS: ClassVar[int] = {node.pointers}")
        out.add(f"_STRUCT_ID: ClassVar[int] = {node.schema_id:#x}")
        for field in sorted(node.fields, key=lambda f: f.code_order):
            out.add("")
            _reader_field(out, node, field, path, names)
        if node.discriminant_count:
            out.add("")
            _reader_which(out, node)
        out.add("")
        _to_dict(out, node, names)
        if not node.is_group:
            out.add("")
            out.add(f"def as_builder(self) -> {path}.Builder:")
            out.add(
                '    """A new message holding a copy of this struct (capabilities too), to'
                ' change: as pycapnp\'s ``as_builder``."""'
            )
            out.add(f"    return _b.copy_as_root({path}.Builder, self)")


def _reader_which(out: _Out, node: Struct) -> None:
    """A reader's ``which()`` is ``StructReader.which`` (compiled), reading ``_WHICH``;
    the generated signature types it for type checkers."""
    members = _union_names(node)
    table = "".join(f'"{name}", ' for _, name in members)
    literal = ", ".join(f'"{name}"' for _, name in members)
    out.add(
        f"_WHICH: ClassVar[tuple[int, tuple[str, ...]]] = ({node.discriminant_offset * 2},"
        f" ({table.rstrip()}))"
    )
    out.add("")
    out.add("if TYPE_CHECKING:")
    out.add(f"    def which(self) -> Literal[{literal}] | None:")
    out.add('        """The union member that is set (None: one this schema does not know)."""')


def _which(out: _Out, node: Struct, buffer: str, *, check_bounds: bool) -> None:
    members = _union_names(node)
    literal = ", ".join(f'"{name}"' for _, name in members)
    table = ", ".join(f'"{name}"' for _, name in members)
    out.add(f"def which(self) -> Literal[{literal}] | None:")
    with out.indent():
        out.add('"""The union member that is set (None: one this schema does not know)."""')
        offset = node.discriminant_offset * 2
        out.add(f"d = get_u16(self.{buffer}, self._data + {offset})[0]")
        out.add(f"names: tuple[Any, ...] = ({table},)")
        out.add("return names[d] if d < len(names) else None")


def _reader_field(out: _Out, node: Struct, field: Field, path: str, names: _Names) -> None:
    name = python_name(field.name)
    if field.group is not None:  # bound at the module's end (_late_bindings)
        group = names.of(field.group)
        out.add(f"{name}: _d.Group[{group}.Reader] = _d.Group()")
        return
    kind = field.type
    assert kind is not None
    descriptor = _descriptor(field)
    if descriptor is not None:
        out.add(f"{name} = {descriptor}")
        return
    late = _late_descriptor(field, names)
    if late is not None:
        annotation, value = late
        out.add(f"{name}: {annotation} = {value}")
        return
    out.add("@property")
    out.add(f"def {name}(self) -> {_reader_type(kind, names)}:")
    with out.indent():
        for line in _read_expression(node, field, path, names):
            out.add(line)


def _descriptor(field: Field) -> str | None:
    """A compiled field descriptor (capsvc.codec.accessors) for a Bool, number or Text
    field: reading it is one C call instead of a property's Python frame. None for the
    other kinds (enums, pointers but Text: their targets are defined later in the module,
    or need a Python-level look-up)."""
    kind = field.type
    assert kind is not None
    k = kind.kind
    if k == "bool":
        byte, bit = divmod(field.offset, 8)
        return f"_d.Bool({byte}, {bit}, {bool(field.default)})"
    if k in NUMBERS:
        bits, offset, xor = _number_layout(field)
        if k in ("float32", "float64"):
            return f"_d.Float({bits}, {offset}, {xor:#x})" if xor else f"_d.Float({bits}, {offset})"
        tail = f", {xor}" if xor else ""
        if _width(k) == "u8":
            return f"_d.UInt8({offset}{tail})"
        return f'_d.Int("{_width(k)}", {offset}{tail})'
    if k == "text":
        text = field.default if isinstance(field.default, str) else _NO_DEFAULT_TEXT
        return f"_d.Text({field.offset}, {text!r})"
    return None


def _late_descriptor(field: Field, names: _Names) -> tuple[str, str] | None:
    """(annotation, value) of a compiled descriptor for an enum, struct or list field,
    whose type the module defines later: the module's tail binds it (``_late_bindings``).
    None for a list with a default (it stays a property)."""
    kind = field.type
    assert kind is not None
    k = kind.kind
    if k == "enum":
        enum = names.of(kind.target)
        xor = int(field.default or 0)  # type: ignore[call-overload]
        tail = f", {xor}" if xor else ""
        return f"_d.Enum[{enum}]", f"_d.Enum({field.offset * 2}{tail})"
    if k == "struct":
        return f"_d.Struct[{names.of(kind.target)}.Reader]", f"_d.Struct({field.offset})"
    if k == "list" and field.default is None:
        element = kind.element
        assert element is not None
        if element.kind == "struct":
            target = names.of(element.target)
            return f"_d.StructList[{target}.Reader]", f"_d.StructList({field.offset})"
        return f"_d.List[{_reader_type(kind, names)}]", f"_d.List({field.offset})"
    return None


def _late_bindings(file: File, names: _Names) -> list[str]:
    """The ``bind`` calls of every late descriptor (``_late_descriptor``), once the
    module has defined every class, enum table, list maker and default."""
    lines = []
    for node in file.nodes:
        if not isinstance(node, Struct):
            continue
        path = names.local[node.id]
        for field in node.fields:
            kind = field.type
            if field.group is not None:
                group = names.of(field.group)
                name = python_name(field.name)
                lines.append(f"{path}.Reader.{name}.bind({group}.Reader)")
                lines.append(f"{path}.Builder.{name}.bind({group}.Builder)")
                continue
            if kind is None or _late_descriptor(field, names) is None:
                continue
            target = f"{path}.Reader.{python_name(field.name)}"
            if kind.kind == "enum":
                enum = names.of(kind.target)
                lines.append(f"{target}.bind({enum}, _E_{enum.replace('.', '_')})")
            elif kind.kind == "struct":
                default = f", {_default_name(path, field)}" if field.default is not None else ""
                lines.append(f"{target}.bind({names.of(kind.target)}.Reader{default})")
            elif kind.element is not None and kind.element.kind == "struct":
                lines.append(f"{target}.bind({names.of(kind.element.target)}.Reader)")
            else:
                lines.append(f"{target}.bind({_list_name(path, field)})")
    return lines


def _number_layout(field: Field) -> tuple[int, int, int]:
    """A number field's width in bits, byte offset and stored XOR (the default, for a float
    its bit pattern: the encoding stores every data field XOR its default)."""
    kind = field.type
    assert kind is not None
    _, bits, _ = NUMBERS[kind.kind]
    if kind.kind in ("float32", "float64"):
        xor = _float_bits(field.default, bits) if field.default else 0
    else:
        xor = int(field.default or 0)  # type: ignore[call-overload]
    return bits, field.offset * bits // 8, xor


def _read_expression(node: Struct, field: Field, path: str, names: _Names) -> list[str]:
    """The getter of a reader field no descriptor serves (``_descriptor`` and
    ``_late_descriptor`` take every other kind): Void, Data, a list with a default, an
    interface, AnyPointer."""
    kind = field.type
    assert kind is not None
    k = kind.kind
    if k == "void":
        return ["return None"]
    pointer = f"w = self._ptr + {field.offset}"
    where = "self._msg, self._si, w if w < self._pend else -1"
    if k == "data":
        data = field.default if isinstance(field.default, bytes) else b""
        return [pointer, f"return _r.read_data({where}, {data!r})"]
    if k == "list":
        assert field.default is not None, "a list without a default is a List descriptor"
        return [
            pointer,
            f"return _r.list_or_default({_list_name(path, field)}, {where}, self._depth,"
            f" {_default_name(path, field)})",
        ]
    if k == "interface":
        return [pointer, f"return _r.read_client({where}, {names.of(kind.target)}.Client)"]
    assert k == "anyPointer", f"no reader getter for {k}"
    return [pointer, f"return _r.AnyPointer({where}, self._depth)"]


def _width(kind: str) -> str:
    if kind == "enum":
        return "u16"
    fmt = NUMBERS[kind][0]
    return {"b": "i8", "h": "i16", "i": "i32", "q": "i64", "B": "u8", "H": "u16", "I": "u32",
            "Q": "u64", "f": "f32", "d": "f64"}[fmt]  # fmt: skip


def _xor_read(kind: str, width: str, default: object, offset: int, buf: str = "self._seg") -> str:
    """The expression reading a number field (stored XOR its default)."""
    at = f"self._data + {offset}" if offset else "self._data"
    if kind == "float32" and default:
        return f"f32_from_bits(get_u32({buf}, {at})[0] ^ {_float_bits(default, 32):#x})"
    if kind == "float64" and default:
        return f"f64_from_bits(get_u64({buf}, {at})[0] ^ {_float_bits(default, 64):#x})"
    raw = f"{buf}[{at}]" if width == "u8" else f"get_{width}({buf}, {at})[0]"
    if default and kind not in ("float32", "float64"):
        return f"{raw} ^ {int(default)}"  # type: ignore[call-overload]
    return raw


def _enumerants(kind: Type, names: _Names) -> tuple[str, ...]:
    node = names.schema_node(kind.target)
    return node.enumerants if isinstance(node, Enum) else ()


def _float_bits(value: object, bits: int) -> int:
    import struct

    if bits == 32:
        return int(struct.unpack("<I", struct.pack("<f", value))[0])
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


def _number(value: object, kind: str) -> object:
    if kind in ("float32", "float64"):
        return float(value)  # type: ignore[arg-type]
    return int(value)  # type: ignore[call-overload]


def _number_literal(value: object, kind: str) -> str:
    """Python source for a number: ``repr``, except that infinities and NaN (a schema's
    ``inf``, ``-inf``, ``nan``) have no literal and are spelt as ``float("inf")``."""
    number = _number(value, kind)
    if isinstance(number, float) and (math.isinf(number) or math.isnan(number)):
        text = "nan" if math.isnan(number) else "inf"
        return f'-float("{text}")' if number < 0 else f'float("{text}")'
    return repr(number)


def _reader_type(kind: Type, names: _Names, *, row: bool = False) -> str:
    """What a reader's field (or list element) of ``kind`` gives; with ``row``, what a row
    holds for it (capsvc.codec.rows: rows for structs, Python lists for lists)."""
    k = kind.kind
    if k == "void":
        return "None"
    if k == "bool":
        return "bool"
    if k in ("float32", "float64"):
        return "float"
    if k in NUMBERS:
        return "int"
    if k == "enum":
        return names.of(kind.target)
    if k == "text":
        return "str"
    if k == "data":
        return "bytes"
    if k == "struct":
        return f"{names.of(kind.target)}.{'Row' if row else 'Reader'}"
    if k == "list":
        assert kind.element is not None
        inner = _reader_type(kind.element, names, row=row)
        return f"list[{inner}]" if row else f"_r.ListReader[{inner}]"
    if k == "interface":
        return f"{names.of(kind.target)}.Client"
    return "_r.AnyPointer"


def _value_type(kind: Type, names: _Names) -> str:
    return _reader_type(kind, names)


def _literal(value: object, kind: Type, names: _Names) -> str:
    k = kind.kind
    if k == "enum":
        return f"{names.of(kind.target)}({int(value or 0)})"  # type: ignore[call-overload]
    if k == "bool":
        return repr(bool(value))
    if k in NUMBERS:
        return _number_literal(value or 0, k)
    if k == "void":
        return "None"
    return repr(value)


def _to_dict(out: _Out, node: Struct, names: _Names) -> None:
    out.add("def to_dict(self) -> dict[str, Any]:")
    with out.indent():
        out.add('"""Every field set, as pycapnp\'s ``to_dict`` gives them (null pointers left out,')
        out.add("only the union member that is set, even null; enums by name; a capability as")
        out.add('its client, an AnyPointer as its reader: what ``new_message`` takes back)."""')
        out.add("out: dict[str, Any] = {}")
        ordered = sorted(node.fields, key=lambda f: f.code_order)
        for field in ordered:
            if field.discriminant is None:
                for line in _dict_entry(field):
                    out.add(line)
        union = [(f, _dict_entry(f, member=True)) for f in ordered if f.discriminant is not None]
        union = [(f, lines) for f, lines in union if lines]
        if union:
            out.add("which = self.which()")
            for field, lines in union:
                out.add(f'if which == "{field.name}":')
                with out.indent():
                    for line in lines:
                        out.add(line)
        out.add("return out")


def _dict_entry(field: Field, *, member: bool = False) -> list[str]:
    """``to_dict``'s lines for ``field``. A pointer field is left out when null, except the
    union member that is set (``member``): pycapnp gives it even then, as its reader
    gives it (an empty Text, list or struct, or the default)."""
    attribute = f"self.{python_name(field.name)}"
    key = repr(field.name)
    if field.group is not None:
        return [f"out[{key}] = {attribute}.to_dict()"]
    kind = field.type
    assert kind is not None
    value = _dict_value(kind, attribute)
    if kind.is_pointer and not member:
        return [f"if self._has({field.offset}):", f"    out[{key}] = {value}"]
    if kind.kind == "struct":  # a member set, its pointer maybe null: its default's dict
        return [
            f"if self._has({field.offset}):",
            f"    out[{key}] = {value}",
            "else:",
            f"    out[{key}] = _r.default_dict({attribute})",
        ]
    return [f"out[{key}] = {value}"]


def _dict_value(kind: Type, expression: str) -> str:
    k = kind.kind
    if k == "struct":
        return f"{expression}.to_dict()"
    if k == "enum":
        return f"_r.enum_name({expression})"
    if k == "list":
        assert kind.element is not None
        inner = _dict_value(kind.element, "item")
        return f"[{inner} for item in {expression}]" if inner != "item" else f"list({expression})"
    return expression


# ---------------------------------------------------------------------- builders
def _builder(out: _Out, node: Struct, path: str, names: _Names) -> None:
    out.add("class Builder(_b.StructBuilder):")
    with out.indent():
        out.add("__slots__ = ()")
        out.add(f"_DATA_WORDS: ClassVar[int] = {node.data_words}")
        out.add(f"_POINTERS: ClassVar[int] = {node.pointers}")
        out.add(f"_STRUCT_ID: ClassVar[int] = {node.schema_id:#x}")
        for field in sorted(node.fields, key=lambda f: f.code_order):
            _builder_field(out, node, field, path, names)
        if node.discriminant_count:
            out.add("")
            _which(out, node, "_b.buf", check_bounds=False)
        _assign(out, node, path, names)
        out.add("")
        out.add("def init(self, name: str, *args: int) -> Any:")
        out.add('    """``init_<name>(*args)``, by name (as pycapnp builders take it)."""')
        out.add("    return _b.init_by_name(self, name, args)")
        out.add("")
        out.add(f"def as_reader(self) -> {path}.Reader:")
        out.add('    """A reader of this struct as built so far."""')
        out.add(f"    return {path}.Reader._of_builder(self)")


def _assign(out: _Out, node: Struct, path: str, names: _Names) -> None:
    """``assign(**fields)``: its keywords go, as one tuple in the plan's order, to the
    value encoder (capsvc.codec.values), which checks and writes them."""
    if not node.fields:
        return
    out.add("")
    _keywords_def(out, "def assign(", ["self", "/"], node, names, "None", "override")
    with out.indent():
        out.add('"""Set the whole struct, as a constructor would: each field named takes its')
        out.add("value (plain values, as ``new_message`` takes them), every other field its")
        out.add('default (a pointer field: null). A value that is refused changes nothing."""')
        out.add(f"_e.assign_values(self, {_plan_name(path)}, {_values_tuple(node)}, _unknown)")


def _keywords_def(
    out: _Out,
    opening: str,
    leading: list[str],
    node: Struct,
    names: _Names,
    returns: str,
    ignore: str = "",
) -> None:
    """A ``def`` taking every field of ``node`` as a keyword (default: not given), and
    ``**_unknown`` for the encoder to name (or to take a field by its schema name)."""
    out.add(f"{opening}  # type: ignore[{ignore}]" if ignore else opening)
    with out.indent():
        for parameter in leading:
            out.add(f"{parameter},")
        out.add("*,")
        for field in sorted(node.fields, key=lambda f: f.code_order):
            name = python_name(field.name)
            out.add(f"{name}: {_init_field_type(field, names)} = _e.MISSING,")
        out.add("**_unknown: Never,")
    out.add(f") -> {returns}:")


def _values_tuple(node: Struct) -> str:
    """The keywords of ``_keywords_def`` as a list in the plan's (schema) order."""
    ordered = [python_name(f.name) for f in sorted(node.fields, key=lambda f: f.code_order)]
    return f"[{', '.join(ordered)}]"


def _select(node: Struct, field: Field) -> list[str]:
    """The line that selects ``field``'s union member (none outside a union)."""
    if field.discriminant is None:
        return []
    return [
        f"set_u16(self._b.buf, self._data + {node.discriminant_offset * 2}, {field.discriminant})"
    ]


def _builder_descriptor(node: Struct, field: Field, label: str) -> str | None:
    """A compiled builder property (capsvc.codec.accessors) for a Bool, number (not enum)
    or Text field: its getter and setter run with no Python frame. None for other kinds."""
    kind = field.type
    assert kind is not None
    k = kind.kind
    select = ""
    if field.discriminant is not None:
        select = f", {node.discriminant_offset * 2}, {field.discriminant}"
    if k == "bool":
        byte, bit = divmod(field.offset, 8)
        return f'_d.bool_property({byte}, {bit}, {bool(field.default)}, "{label}"{select})'
    if k in NUMBERS:
        bits, offset, xor = _number_layout(field)
        names = f'"{label}", "{SCHEMA_NAMES[k]}"{select}'
        if k in ("float32", "float64"):
            return f"_d.float_property({bits}, {offset}, {xor:#x}, {names})"
        return f'_d.int_property("{_width(k)}", {offset}, {xor}, {names})'
    if k == "text":
        text = field.default if isinstance(field.default, str) else ""
        return f'_d.text_property({field.offset}, {text!r}, "{label}"{select})'
    return None


def _builder_field(out: _Out, node: Struct, field: Field, path: str, names: _Names) -> None:
    name = python_name(field.name)
    label = f"{node.scope}.{field.name}"
    if field.group is not None:  # bound at the module's end (_late_bindings)
        group = names.of(field.group)
        where = ""
        if field.discriminant is not None:
            where = f"{node.discriminant_offset * 2}, {field.discriminant}"
        out.add("")
        out.add(f"{name}: _d.BuilderGroup[{group}.Builder] = _d.BuilderGroup({where})")
        selected = ", selected" if field.discriminant is not None else ""
        out.add("")
        out.add(f"def init_{field.name}(self) -> {group}.Builder:")
        out.add(f'    """The group {field.name} with every field at its default{selected}."""')
        out.add(f"    return type(self).{name}.init(self)")
        return
    kind = field.type
    assert kind is not None
    k = kind.kind
    select = _select(node, field)
    if k == "void":
        out.add("")
        out.add("@property")
        out.add(f"def {name}(self) -> None:")
        out.add("    return None")
        out.add(f"@{name}.setter")
        out.add(f"def {name}(self, value: None) -> None:")
        if select:
            out.add(f'    """Select the Void member {field.name} (assign None)."""')
        else:
            out.add('    """Only None: a Void holds nothing (as pycapnp takes it)."""')
        with out.indent():
            out.add("if value is not None:")
            out.add(f'    raise _b.bad_type(value, "{label}", "None (Void)")')
            for line in select:
                out.add(line)
        return
    builder_descriptor = _builder_descriptor(node, field, label)
    if builder_descriptor is not None:
        out.add("")
        out.add(f"{name} = {builder_descriptor}")
        return
    if k == "bool":
        byte, bit = divmod(field.offset, 8)
        default = 1 if field.default else 0
        out.add("")
        out.add("@property")
        out.add(f"def {name}(self) -> bool:")
        out.add(f"    return bool(self._b.buf[self._data + {byte}] >> {bit} & 1 ^ {default})")
        out.add(f"@{name}.setter")
        out.add(f"def {name}(self, value: bool) -> None:")
        with out.indent():
            out.add("if value is not True and value is not False:")
            out.add(f'    raise _b.bad_type(value, "{label}", "bool (Bool)")')
            out.add("buf = self._b.buf")
            out.add(f"p = self._data + {byte}")
            set_bit = "value" if not default else "not value"
            out.add(f"buf[p] = buf[p] | {1 << bit} if {set_bit} else buf[p] & {0xFF ^ (1 << bit)}")
            for line in select:
                out.add(line)
        return
    if k in NUMBERS or k == "enum":
        _number_accessor(out, node, field, label, names)
        return
    pointer = f"self._ptr + {field.offset}"
    if k in ("text", "data"):
        python_type = "str" if k == "text" else "bytes"
        empty: object = field.default if field.default is not None else ("" if k == "text" else b"")
        out.add("")
        out.add("@property")
        out.add(f"def {name}(self) -> {python_type}:")
        out.add(f"    return _b.get_{k}(self._b, {pointer}, {empty!r})")
        out.add(f"@{name}.setter")
        setter_type = "str" if k == "text" else "bytes | bytearray | memoryview"
        out.add(f"def {name}(self, value: {setter_type}) -> None:")
        with out.indent():
            for line in select:
                out.add(line)
            if k == "text":
                out.add(f'self._set_text({field.offset}, value, "{label}")')
            else:
                out.add(f'_b.set_{k}(self._b, {pointer}, value, "{label}")')
        return
    if k == "struct":
        target = names.of(kind.target)
        out.add("")
        out.add("@property")
        out.add(f"def {name}(self) -> {target}.Builder:")
        out.add(f'    """The {field.name} struct (allocated on first use)."""')
        with out.indent():
            if field.discriminant is not None:
                # Selected by the access, as a group is; the slot may hold another member's
                # pointer, which is not this struct: the switch starts from a null slot.
                at = node.discriminant_offset * 2
                out.add(f"_b.switch_member(self, {at}, {field.discriminant}, {field.offset})")
            copy = f", {_default_name(path, field)}" if field.default is not None else ""
            out.add(f"return _b.struct_field(self, {field.offset}, {target}.Builder{copy})")
        out.add(f"@{name}.setter")
        accepted = f"{target}.Init | {target}.Row | {target}.Reader | {target}.Builder"
        out.add(f"def {name}(self, value: {accepted}) -> None:")
        out.add(
            '    """A copy of ``value`` (capabilities too), its row, or a dict of fields to set'
        )
        out.add('    over what the struct holds (its default, if null), as pycapnp does."""')
        with out.indent():
            label = f"{node.scope}.{field.name}"
            extra = f", {_default_name(path, field)}" if field.default is not None else ", None"
            if field.discriminant is not None:
                extra += f", {node.discriminant_offset * 2}, {field.discriminant}"
            elif field.default is None:
                extra = ""
            out.add(
                f'_b.copy_struct(self, {field.offset}, value, {target}.Builder, "{label}"{extra})'
            )
        out.add("")
        out.add(f"def init_{field.name}(self) -> {target}.Builder:")
        out.add(f'    """A new, empty {field.name} struct."""')
        with out.indent():
            for line in select:
                out.add(line)
            out.add(f"return _b.init_struct(self, {pointer}, {target}.Builder)")
        return
    if k == "list":
        assert kind.element is not None
        list_type = _list_builder_type(kind.element, names)
        out.add("")
        out.add("@property")
        out.add(f"def {name}(self) -> {list_type}:")
        out.add(
            f'    """The {field.name} list as built so far (null: its default, or an empty one)."""'
        )
        list_default = _default_name(path, field) if field.default is not None else ""
        with out.indent():
            _member_guard(out, node, field, label)
            out.add(f"return {_list_at(kind.element, pointer, label, names, list_default)}")
        out.add(f"@{name}.setter")
        accepted = _init_value_type(kind, names)
        if kind.element.kind != "anyPointer":
            accepted += f" | {list_type}"  # (a list being built, iterable: copied)
        out.add(f"def {name}(self, value: {accepted}) -> None:")
        out.add('    """A new list of ``value``\'s elements, as ``new_message`` takes them."""')
        with out.indent():
            plan = _plan_ref(node.id, names)
            out.add(f'_e.set_pointer_value(self, {plan}, "{field.name}", value)')
            for line in select:
                out.add(line)
        out.add("")
        out.add(f"def init_{field.name}(self, count: int) -> {list_type}:")
        out.add(f'    """A new list of ``count`` elements in {field.name}."""')
        with out.indent():
            for line in select:
                out.add(line)
            out.add(f"return {_init_list(kind.element, pointer, 'count', label, names)}")
        settable = _list_setter(kind.element, names)
        if settable:
            out.add("")
            out.add(f"def set_{field.name}(self, values: {settable}) -> None:")
            out.add(f'    """{field.name} from a sequence of values (as ``{name} = values``)."""')
            with out.indent():
                out.add(f'_e.set_pointer_value(self, {plan}, "{field.name}", values)')
                for line in select:
                    out.add(line)
        return
    if k == "interface":
        target = names.of(kind.target)
        accepted = f"{target}.Client | {target}.Server | None"
        out.add("")
        out.add("@property")
        out.add(f"def {name}(self) -> {target}.Client:")
        out.add(
            '    """The capability set here, as a client (a new reference; null: a client'
            ' whose calls fail)."""'
        )
        with out.indent():
            _member_guard(out, node, field, label)
            out.add(f'return _b.client_at(self._b, {pointer}, {target}.Client, "{label}")')
        out.add(f"@{name}.setter")
        out.add(f"def {name}(self, value: {accepted}) -> None:")
        out.add('    """Put a capability here: a client, or a server object (None: null)."""')
        with out.indent():
            for line in select:
                out.add(line)
            out.add(f'_b.set_client(self._b, {pointer}, value, "{label}")')
        out.add("")
        out.add(f"def set_{field.name}(self, value: {accepted}) -> None:")
        out.add(f'    """Put a capability here (as ``{name} = value``)."""')
        out.add(f"    self.{name} = value")
        return
    if kind.any == "list":
        return  # an AnyList holds no struct: nothing to initialise it as or copy in
    structs_only = kind.any == "struct"
    accepted = (
        "_r.StructReader | _b.StructBuilder | None"
        if structs_only
        else "str | bytes | _r.StructReader | _b.StructBuilder | _r.AnyPointer | _t.Client"
        " | _t.Server | None"
    )
    out.add("")
    out.add(f"def set_{field.name}(self, value: {accepted}) -> None:")
    out.add(
        '    """Set the Any'
        + ("Struct" if structs_only else "Pointer")
        + f" {field.name}: "
        + (
            "a copy of a struct"
            if structs_only
            else "Text, Data, a copy of a struct or of an AnyPointer, a capability"
        )
        + ', or None (null)."""'
    )
    with out.indent():
        for line in select:
            out.add(line)
        out.add(f'_b.set_any(self, {pointer}, value, "{label}", {structs_only})')
    out.add("")
    out.add(f"def init_{field.name}_as(self, cls: type[_b.B]) -> _b.B:")
    out.add(f'    """Put a new struct of builder class ``cls`` in the AnyPointer {field.name}."""')
    with out.indent():
        for line in select:
            out.add(line)
        out.add(f"return _b.init_struct(self, {pointer}, cls)")


def _member_guard(out: _Out, node: Struct, field: Field, label: str) -> None:
    """A union member's pointer getter refuses while another member is set: the pointer
    may be that member's (as pycapnp's builders refuse it)."""
    if field.discriminant is not None:
        at = f"self._data + {node.discriminant_offset * 2}"
        out.add(f"if get_u16(self._b.buf, {at})[0] != {field.discriminant}:")
        out.add(f'    raise _b.member_not_set(self, "{label}")')


def _number_accessor(out: _Out, node: Struct, field: Field, label: str, names: _Names) -> None:
    kind = field.type
    assert kind is not None
    k = kind.kind
    name = python_name(field.name)
    fmt, bits, _ = NUMBERS.get(k, ("H", 16, 3))
    width = _width(k)
    offset = field.offset * bits // 8
    default = field.default or 0
    schema_type = names.of(kind.target) if k == "enum" else SCHEMA_NAMES[k]
    python_type = _reader_type(kind, names)
    read = _xor_read(k, width, default, offset, "self._b.buf")
    if k == "enum":
        read = f"{names.of(kind.target)}({read})"
    out.add("")
    out.add("@property")
    out.add(f"def {name}(self) -> {python_type}:")
    out.add(f"    return {read}")
    out.add(f"@{name}.setter")
    setter_type = f"int | {_enumerant_names(kind.target, names)}" if k == "enum" else python_type
    out.add(f"def {name}(self, value: {setter_type}) -> None:")
    with out.indent():
        if k == "enum":
            # A name too, as new_message takes it (and pycapnp's setters). Checked before
            # the write: a failed pack_into would have zeroed the field.
            member = f"type(value) is not {schema_type}"  # (a member is always in range)
            out.add(f"if type(value) is not int and {member} or not 0 <= value <= 0xFFFF:")
            out.add(f'    value = _b.enum_code(value, {schema_type}, "{label}")')
            xor = f" ^ {int(default)}" if default else ""  # type: ignore[call-overload]
            out.add(f"set_{width}(self._b.buf, self._data + {offset}, value{xor})")
            for line in _select(node, field):
                out.add(line)
            return
        out.add("try:")
        with out.indent():
            if k in ("float32", "float64") and default:
                size = 32 if k == "float32" else 64
                out.add(
                    f"set_u{size}(self._b.buf, self._data + {offset},"
                    f" f{size}_bits(value) ^ {_float_bits(default, size):#x})"
                )
            elif default and k not in ("float32", "float64"):
                out.add(f"set_{width}(self._b.buf, self._data + {offset}, value ^ {int(default)})")  # type: ignore[call-overload]
            else:
                out.add(f"set_{width}(self._b.buf, self._data + {offset}, value)")
        out.add("except (struct.error, TypeError):")
        out.add(f'    raise _b.bad_value(value, "{label}", "{schema_type}", "{fmt}") from None')
        for line in _select(node, field):
            out.add(line)


def _enumerant_names(enum_id: int, names: _Names) -> str:
    """What an enum value may be given as besides its code: a ``Literal`` of its
    enumerants' schema names (and Python names, where they differ: ``from_``), so that
    mypy catches a misspelt one; ``str`` for an enum this file cannot see."""
    node = names.schema_node(enum_id)
    if not isinstance(node, Enum) or not node.enumerants:
        return "str"
    spelled: list[str] = []
    for name in node.enumerants:
        spelled.append(name)
        if enumerant_name(name) != name:
            spelled.append(enumerant_name(name))
    return "Literal[" + ", ".join(repr(name) for name in spelled) + "]"


def _list_builder_type(element: Type, names: _Names) -> str:
    k = element.kind
    if k == "bool":
        return "_b.BoolListBuilder"
    if k == "enum":
        return f"_b.EnumListBuilder[{_reader_type(element, names)}]"
    if k in NUMBERS:
        return f"_b.PrimitiveListBuilder[{_reader_type(element, names)}]"
    if k == "text":
        return "_b.TextListBuilder"
    if k == "data":
        return "_b.DataListBuilder"
    if k == "struct":
        return f"_b.StructListBuilder[{names.of(element.target)}.Builder]"
    if k == "list":
        assert element.element is not None
        return f"_b.ListListBuilder[{_list_builder_type(element.element, names)}]"
    if k == "interface":
        return f"_b.CapabilityListBuilder[{names.of(element.target)}.Client]"
    if k == "void":
        return "_b.VoidListBuilder"
    return "_b.ListBuilder"


def _init_list(element: Type, at: str, count: str, label: str, names: _Names) -> str:
    k = element.kind
    if k == "bool":
        return f'_b.init_bool_list(self._b, {at}, {count}, "{label}")'
    if k == "enum":
        enum = names.of(element.target)
        return f'_b.init_enum_list(self._b, {at}, {count}, "{label}", {enum})'
    if k in NUMBERS:
        fmt, _, code = NUMBERS[k]
        arguments = f'"{label}", "{fmt}", {code}, "{SCHEMA_NAMES[k]}"'
        return f"_b.init_primitive_list(self._b, {at}, {count}, {arguments})"
    if k == "text":
        return f'_b.init_text_list(self._b, {at}, {count}, "{label}")'
    if k == "data":
        return f'_b.init_data_list(self._b, {at}, {count}, "{label}")'
    if k == "struct":
        builder = f"{names.of(element.target)}.Builder"
        return f'_b.init_struct_list(self._b, {at}, {count}, "{label}", {builder})'
    if k == "list":
        assert element.element is not None
        inner = f"{_inner_init(element.element, names)}, {_inner_at(element.element, names)}"
        return f'_b.init_list_list(self._b, {at}, {count}, "{label}", {inner})'
    if k == "void":
        return f'_b.init_void_list(self._b, {at}, {count}, "{label}")'
    if k == "interface":
        client = f"{names.of(element.target)}.Client"
        return f'_b.init_capability_list(self._b, {at}, {count}, "{label}", {client})'
    return f'_b.init_pointer_list(self._b, {at}, {count}, "{label}")'


def _list_at(element: Type, at: str, label: str, names: _Names, default: str = "") -> str:
    """A builder of the list already at pointer word ``at`` (``_init_list``'s classes);
    ``default``: the name of the field's schema default, which a null pointer gets. A list
    of structs a newer writer made of it is used in place (``_b.list_view``)."""
    k = element.kind
    if k == "struct":  # (its own function: elements of another version's size too)
        builder = f"{names.of(element.target)}.Builder"
        tail = f", default={default}" if default else ""
        call = f'_b.struct_list_at(self._b, {at}, "{label}", {builder}{tail})'
        return call.format()  # (as below: a brace-quoted label becomes one)
    extra = ""
    if k == "bool":
        cls, code = "BoolListBuilder", 1
    elif k == "enum":  # (the class: elements read as its members)
        cls, code, extra = "EnumListBuilder", 3, f", {names.of(element.target)}"
    elif k in NUMBERS:
        fmt, _, code = NUMBERS[k]
        cls, extra = "PrimitiveListBuilder", f', "{fmt}", "{SCHEMA_NAMES[k]}"'
    elif k == "void":
        cls, code = "VoidListBuilder", 0
    elif k == "list":
        assert element.element is not None
        inner = f"{_inner_init(element.element, names)}, {_inner_at(element.element, names)}"
        cls, code, extra = "ListListBuilder", 6, f", {inner}"
    elif k == "interface":
        cls, code, extra = "CapabilityListBuilder", 6, f", {names.of(element.target)}.Client"
    else:
        cls = {"text": "TextListBuilder", "data": "DataListBuilder"}.get(k, "ListBuilder")
        code = 6
    label = label.replace("{{", "{").replace("}}", "}")  # (as ``format`` reads a label)
    return f'_b.list_view(_b.{cls}, self._b, {at}, "{label}", {code}, {default or None}{extra})'


def _inner_init(element: Type, names: _Names) -> str:
    """A function (builder, at, count, label) -> list builder for a list's element lists."""
    body = _init_list(element, "at", "count", "{label}", names).replace("self._b", "builder")
    body = body.replace('"{label}"', "label")
    return f"lambda builder, at, count, label: {body}"


def _inner_at(element: Type, names: _Names) -> str:
    """A function (builder, at, label) -> list builder of the element list already at
    word ``at`` (``_list_at``'s), for a list of lists' ``lst[i]``."""
    body = _list_at(element, "at", "{{label}}", names).replace("self._b", "builder")
    body = body.replace('"{label}"', "label")
    return f"lambda builder, at, label: {body}"


def _list_setter(element: Type, names: _Names | None = None) -> str:
    k = element.kind
    if k == "interface" and names is not None:
        target = names.of(element.target)
        return f"list[{target}.Client | {target}.Server | None]"
    if k in NUMBERS:
        return (
            "list[float] | tuple[float, ...]"
            if k.startswith("float")
            else "list[int] | tuple[int, ...]"
        )
    if k == "enum":
        return "list[int] | tuple[int, ...]"
    if k == "bool":
        return "list[bool] | tuple[bool, ...]"
    if k == "text":
        return "list[str] | tuple[str, ...]"
    if k == "data":
        return "list[bytes] | tuple[bytes, ...]"
    return ""


# ---------------------------------------------------------------------- value plans
def _plan_name(path: str) -> str:
    return f"_P_{path.replace('.', '_')}"


def _plan_ref(node_id: int, names: _Names) -> str:
    """A struct's plan: a module variable here, the builder's ``_PLAN`` for another file's."""
    local = names.local.get(node_id)
    if local is not None:
        return _plan_name(local)
    return f"_v.plan_of({names.of(node_id)}.Builder)"


def _plans(out: _Out, file: File, names: _Names) -> None:
    """Every struct's plan (capsvc.codec.plans), for ``new_message(**fields)`` and
    ``assign(**fields)``: made first, then filled, as plans refer to each other."""
    structs = [node for node in file.nodes if isinstance(node, Struct)]
    if not structs:
        return
    out.add("")
    out.add("")
    out.add("# What new_message(**fields) and assign(**fields) encode with (capsvc.codec.values).")
    for node in structs:
        path = names.local[node.id]
        arguments = f'"{node.scope}", {node.data_words}, {node.pointers}'
        if node.discriminant_count or node.is_group:
            disc_at = node.discriminant_offset * 2 if node.discriminant_count else -1
            arguments += f", {disc_at}"
        if node.is_group:
            arguments += ", True"
        out.add(f"{_plan_name(path)} = {path}.Builder._PLAN = _v.StructPlan({arguments})")
        out.add(f"{_plan_name(path)}.reader = {path}.Reader")
    for node in structs:
        if not node.fields:
            continue
        out.add(f"{_plan_name(names.local[node.id])}.add(")
        with out.indent():
            for field in sorted(node.fields, key=lambda f: f.code_order):
                out.add(f"{_field_plan(field, names.local[node.id], names)},")
        out.add(")")


def _field_plan(field: Field, path: str, names: _Names) -> str:
    name = f'"{field.name}"'
    tail = ""
    if field.discriminant is not None:
        tail += f", disc={field.discriminant}"
    if python_name(field.name) != field.name:
        tail += f', key="{python_name(field.name)}"'
    if field.group is not None:
        return f"_v.group({name}, {_plan_ref(field.group, names)}{tail})"
    kind = field.type
    assert kind is not None
    k = kind.kind
    if k == "void":
        return f"_v.void({name}{tail})"
    if k == "bool":
        return f"_v.boolean({name}, {field.offset}, {bool(field.default)}{tail})"
    if k in NUMBERS:
        bits, offset, xor = _number_layout(field)
        if xor:
            tail = f", xor={xor:#x}{tail}"
        if k.startswith("float"):
            return f'_v.floating({name}, "{SCHEMA_NAMES[k]}", {offset}, {bits // 8}{tail})'
        signed = NUMBERS[k][0].islower()
        return f'_v.integer({name}, "{SCHEMA_NAMES[k]}", {offset}, {bits // 8}, {signed}{tail})'
    if k == "enum":
        xor = int(field.default or 0)  # type: ignore[call-overload]
        if xor:
            tail = f", xor={xor}{tail}"
        enumerants = _enumerants(kind, names)
        members = f"_E_{names.of(kind.target).replace('.', '_')}"
        return (
            f'_v.enumeration({name}, "{_enum_label(kind, names)}", {field.offset * 2},'
            f" {enumerants!r}{tail}, members={members})"
        )
    if field.default and k in ("text", "data", "list"):
        tail += ", defaulted=True"  # rows read a default through the reader's field
    if k == "text":
        return f"_v.text({name}, {field.offset}{tail})"
    if k == "data":
        return f"_v.data({name}, {field.offset}{tail})"
    if k == "struct":
        if field.default is not None:  # a dict given for the field starts from it
            reader = f"{names.of(kind.target)}.Reader"
            tail += f", default=_r.default_struct({reader}, {_default_name(path, field)}).to_dict()"
        return f"_v.struct({name}, {field.offset}, {_plan_ref(kind.target, names)}{tail})"
    if k == "list":
        assert kind.element is not None
        element = _list_plan(kind.element, names)
        return f"_v.list_({name}, {field.offset}, {element}{tail})"
    if k == "interface":
        return f"_v.capability({name}, {field.offset}{tail})"
    return f"_v.any_pointer({name}, {field.offset}{tail})"


def _enum_label(kind: Type, names: _Names) -> str:
    node = names.schema_node(kind.target)
    return node.scope if node is not None else names.of(kind.target)


def _list_plan(element: Type, names: _Names) -> str:
    k = element.kind
    if k == "void":
        return "_v.of_void()"
    if k == "bool":
        return "_v.of_bool()"
    if k in NUMBERS:
        _, bits, _ = NUMBERS[k]
        if k.startswith("float"):
            return f'_v.of_float("{SCHEMA_NAMES[k]}", {bits // 8})'
        signed = NUMBERS[k][0].islower()
        return f'_v.of_integer("{SCHEMA_NAMES[k]}", {bits // 8}, {signed})'
    if k == "enum":
        return f'_v.of_enum("{_enum_label(element, names)}", {_enumerants(element, names)!r})'
    if k == "text":
        return "_v.of_text()"
    if k == "data":
        return "_v.of_data()"
    if k == "struct":
        return f"_v.of_struct({_plan_ref(element.target, names)})"
    if k == "list":
        assert element.element is not None
        return f"_v.of_list({_list_plan(element.element, names)})"
    if k == "interface":
        return "_v.of_capability()"
    return "_v.of_any()"


# ---------------------------------------------------------------------- module tail
def _list_name(path: str, field: Field) -> str:
    return f"_L_{path.replace('.', '_')}_{field.name}"


def _default_name(path: str, field: Field) -> str:
    return f"_D_{path.replace('.', '_')}_{field.name}"


def _maker(element: Type, names: _Names) -> str:
    k = element.kind
    if k == "void":
        return "_r.simple_list(_r.VoidList)"
    if k == "bool":
        return "_r.simple_list(_r.BoolList)"
    if k in NUMBERS:
        return f'_r.primitive_list("{NUMBERS[k][0]}")'
    if k == "enum":
        return f'_r.primitive_list("H", {names.of(element.target)})'
    if k == "text":
        return "_r.simple_list(_r.TextList)"
    if k == "data":
        return "_r.simple_list(_r.DataList)"
    if k == "struct":
        return f"_r.struct_list({names.of(element.target)}.Reader)"
    if k == "list":
        assert element.element is not None
        return f"_r.list_list({_maker(element.element, names)})"
    if k == "interface":
        return f"_r.client_list({names.of(element.target)}.Client)"
    return "_r.simple_list(_r.AnyPointerList)"


def _lists(out: _Out, file: File, names: _Names) -> None:
    lines = []
    for node in file.nodes:
        if isinstance(node, Enum):
            path = names.local[node.id]
            lines.append(f"_E_{path.replace('.', '_')} = tuple({path})")
    for enum_id in sorted(_foreign_enums(file, names)):
        path = names.of(enum_id)
        lines.append(f"_E_{path.replace('.', '_')} = tuple({path})")
    for node in file.nodes:
        if not isinstance(node, Struct):
            continue
        path = names.local[node.id]
        for field in node.fields:
            if field.type is not None and field.type.kind == "list":
                assert field.type.element is not None
                if field.type.element.kind != "struct" or field.default is not None:
                    # (a struct list without a default reads through StructList alone)
                    lines.append(f"{_list_name(path, field)} = {_maker(field.type.element, names)}")
            if (
                field.type is not None
                and field.type.is_pointer
                and field.default is not None
                and field.type.kind not in ("text", "data")
            ):
                segments = ", ".join(f"bytes.fromhex({s.hex()!r})" for s in field.default)  # type: ignore[attr-defined]
                lines.append(f"{_default_name(path, field)} = [{segments}]")
    lines.extend(_late_bindings(file, names))
    if lines:
        out.add("")
        out.add("")
        out.add("# Readers of list fields, and the encoded defaults of struct and list fields.")
        for line in lines:
            out.add(line)


def _foreign_enums(file: File, names: _Names) -> set[int]:
    """Enums of other files that this file's fields use (they need a table here too)."""
    found = set()
    for node in file.nodes:
        if not isinstance(node, Struct):
            continue
        for field in node.fields:
            kind = field.type
            while kind is not None:
                if kind.kind == "enum" and kind.target not in names.local:
                    found.add(kind.target)
                kind = kind.element
    return found


def _module_tail(out: _Out, file: File, names: _Names) -> None:
    tail = _Out()
    _interface_tables(tail, file, names)
    _server_tables(tail, file, names)
    for node in file.nodes:
        if isinstance(node, Const) and node.type.kind == "enum":
            tail.add(f"{names.local[node.id]} = {_literal(node.value, node.type, names)}")
        elif isinstance(node, Const) and node.type.kind in _DEFERRED_CONSTS:
            if node.value is None:
                continue
            segments = ", ".join(f"bytes.fromhex({s.hex()!r})" for s in node.value)  # type: ignore[attr-defined]
            target = names.local[node.id]
            if node.type.kind == "struct":
                reader = f"{names.of(node.type.target)}.Reader"
                tail.add(f"{target} = _r.default_struct({reader}, [{segments}])")
            elif node.type.kind == "list":
                assert node.type.element is not None
                tail.add(
                    f"{target} = _r.default_list({_maker(node.type.element, names)}, [{segments}])"
                )
            else:
                tail.add(f"{target} = _r.default_any([{segments}])")
    if tail.lines:
        out.add("")
        out.add("")
        out.lines.extend(tail.lines)
