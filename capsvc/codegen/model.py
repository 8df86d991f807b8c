"""The schema model the generator renders: plain frozen data, nothing of pycapnp.

Theory of operation: ``capsvc.codegen.nodes`` turns schema.capnp ``Node``s (from pycapnp or
from a compiler plugin's ``CodeGeneratorRequest``) into these; ``capsvc.codegen.render``
turns them into source text. Both ends are pure, so the model is what golden-file tests
pin down. IDs are the schema's 64-bit IDs; ``scope`` is the dotted path of a node inside its
file (``Car``, ``Car.Engine``, ``Tester.echo$Params``), ``file_id`` the file it belongs to.
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass, field

#: Type kinds with fixed width: (struct format letter, bits, list element size code).
NUMBERS: dict[str, tuple[str, int, int]] = {
    "int8": ("b", 8, 2),
    "int16": ("h", 16, 3),
    "int32": ("i", 32, 4),
    "int64": ("q", 64, 5),
    "uint8": ("B", 8, 2),
    "uint16": ("H", 16, 3),
    "uint32": ("I", 32, 4),
    "uint64": ("Q", 64, 5),
    "float32": ("f", 32, 4),
    "float64": ("d", 64, 5),
}
#: The schema's own spelling of each kind, for messages and docstrings.
SCHEMA_NAMES = {
    "void": "Void",
    "bool": "Bool",
    "int8": "Int8",
    "int16": "Int16",
    "int32": "Int32",
    "int64": "Int64",
    "uint8": "UInt8",
    "uint16": "UInt16",
    "uint32": "UInt32",
    "uint64": "UInt64",
    "float32": "Float32",
    "float64": "Float64",
    "text": "Text",
    "data": "Data",
}
POINTER_KINDS = frozenset({"text", "data", "list", "struct", "interface", "anyPointer"})


#: A brand (schema.capnp ``Brand``): for each generic scope (a node ID) its bindings, one
#: per parameter (None: unbound), or None when the scope inherits the bindings in force.
Brand = tuple[tuple[int, "tuple[Type | None, ...] | None"], ...]


@dataclass(frozen=True)
class Type:
    """A field's type. ``element`` for lists; ``target`` (an ID) for enum/struct/interface;
    ``any`` for AnyPointer: "pointer", "struct", "list", "capability" or "parameter".
    ``brand`` binds a generic struct's or interface's parameters; ``parameter`` is a type
    parameter's (scope ID, index) (capsvc.codegen.brands resolves both away)."""

    kind: str
    element: Type | None = None
    target: int = 0
    any: str = ""
    brand: Brand = ()
    parameter: tuple[int, int] | None = None

    @property
    def is_pointer(self) -> bool:
        return self.kind in POINTER_KINDS


@dataclass(frozen=True)
class Field:
    name: str
    code_order: int
    #: The union discriminant value, or None for a field outside the struct's union.
    discriminant: int | None
    #: For a slot: offset (in units of the type's size; a pointer index for pointers).
    offset: int = 0
    type: Type | None = None
    #: A number, bool, str or bytes default; for struct/list/AnyPointer defaults, the
    #: encoded subtree (segments of a message whose root's pointer 0 is the value).
    default: object = None
    #: For a group: the group's struct ID.
    group: int | None = None


@dataclass(frozen=True)
class Struct:
    id: int
    scope: str
    data_words: int
    pointers: int
    is_group: bool
    discriminant_count: int
    discriminant_offset: int  # in 16-bit units
    fields: tuple[Field, ...]
    #: The type parameters of a generic struct (``struct Box(T)``), by name.
    parameters: tuple[str, ...] = ()
    #: For a specialization (a generic bound to concrete types): the generic's ID, which
    #: is the struct's ID in every schema sense; ``id`` is then the generator's own.
    specializes: int = 0
    #: For a specialization: its bindings as the schema writes them (``Text, Int32``).
    bindings: str = ""

    @property
    def schema_id(self) -> int:
        return self.specializes or self.id


@dataclass(frozen=True)
class Enum:
    id: int
    scope: str
    enumerants: tuple[str, ...]  # by code (Cap'n Proto enums are dense from 0)


@dataclass(frozen=True)
class Method:
    name: str
    ordinal: int
    params: int  # struct ID
    results: int
    #: The params and results types with their brands (generic interfaces).
    params_type: Type | None = None
    results_type: Type | None = None
    #: The Python names of the method and of its ``*_request()`` form on clients and
    #: servers (``method_names``: renamed where a keyword, a client's own name or a
    #: method of an interface it extends would clash).
    python: str = ""
    request: str = ""


@dataclass(frozen=True)
class Interface:
    id: int
    scope: str
    methods: tuple[Method, ...]
    superclasses: tuple[int, ...]
    #: The superclasses with their brands (``extends(Store(Text))``).
    superclass_types: tuple[Type, ...] = ()
    parameters: tuple[str, ...] = ()
    specializes: int = 0
    bindings: str = ""

    @property
    def schema_id(self) -> int:
        """The interface ID on the wire (a specialization's is its generic's)."""
        return self.specializes or self.id


@dataclass(frozen=True)
class Const:
    id: int
    scope: str
    type: Type
    value: object  # as Field.default


Node = Struct | Enum | Interface | Const


@dataclass(frozen=True)
class File:
    """One schema file: every node in it, and the files its types come from."""

    id: int
    filename: str  # as the schema names it (its path as given, or its import name)
    nodes: tuple[Node, ...]
    #: The other files whose types this one uses: file ID -> their module's name.
    imports: dict[int, str] = field(default_factory=dict)

    @property
    def module(self) -> str:
        return module_name(self.filename)


#: Standard schema files whose modules capsvc ships (file ID -> the package holding the
#: module). A schema importing one (every ``-> stream`` method imports /capnp/stream.capnp)
#: imports capsvc's module, and ``capsvc gen`` writes no copy of it beside the schema's,
#: as C++ code links libcapnp's stream.capnp.h rather than generating its own.
PROVIDED_MODULES: dict[int, str] = {0x86C366A91393F3F8: "capsvc.generated"}  # stream.capnp

#: stream.capnp's StreamResult: the results of every ``-> stream`` method. C++ tells a
#: streaming method by it (schema.capnp has no flag for one), and so do capsvc's generated
#: clients (capsvc.streaming) and its runtime (capsvc.rpc.hooks.LocalServerHook).
STREAM_RESULT_ID = 0x995F9A3377C0B16E


#: Names typed clients define themselves (a method named so gets a trailing underscore).
CLIENT_NAMES = frozenset({"close", "cast_as"})


def method_python_name(name: str) -> str:
    """A method's Python name before inheritance is considered: clients and servers
    define few names of their own (the rest start with ``_``, which schema names cannot),
    so only keywords and those few are renamed (``read`` stays, ``close`` is ``close_``)."""
    return name + "_" if name in CLIENT_NAMES or keyword.iskeyword(name) else name


def method_names(
    schema_names: list[str], taken: set[str]
) -> tuple[list[tuple[str, str]], set[str]]:
    """(Python name, request name) for each method of an interface whose superclasses'
    clients and servers already define ``taken``, and every name the interface's classes
    then define. A method named like one it inherits (capnp allows it: each interface
    has its own methods; capnproto-rust's TestExtends has ``foo`` and ``bar`` again) takes
    trailing underscores until it is free, and its request form follows it
    (``foo_``, ``foo__request``): a Python subclass would otherwise override the
    superclass's method, and a server would answer the superclass's calls with it."""
    used = taken | {method_python_name(name) for name in schema_names}
    out = []
    defined = set(taken)
    for name in schema_names:
        python = method_python_name(name)
        request = f"{name}_request"
        if python in taken or request in taken:
            python += "_"
            while python in used or f"{python}_request" in used:
                python += "_"
            request = f"{python}_request"
        used.add(python)
        defined.update((python, request))
        out.append((python, request))
    return out, defined


def module_name(filename: str) -> str:
    """The Python module a schema file becomes: ``carsales.capnp`` -> ``carsales_capnp``."""
    base = filename.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch if ch.isalnum() else "_" for ch in base)
    return name if not name[0].isdigit() else "_" + name


@dataclass(frozen=True)
class Cycles:
    """Schema files that import each other (legal in Cap'n Proto: ``a.capnp`` uses
    ``b.capnp``'s types and ``b.capnp`` uses ``a.capnp``'s). Their modules import each
    other, so each binds what it takes from the others once all have made their classes
    (capsvc.linking); this says which files are in such a cycle, for every file the
    generator saw (the requested ones and those they import)."""

    #: File ID -> its module's name.
    modules: dict[int, str]
    #: File ID -> the files whose types it uses.
    uses: dict[int, frozenset[int]]
    #: File ID -> the files holding interfaces that its interfaces extend (Python needs
    #: those classes when it creates its own, so it imports them first).
    extends: dict[int, frozenset[int]]

    def peers(self, file_id: int) -> frozenset[int]:
        """The files in a cycle of imports with ``file_id`` (itself included), or none."""
        reach = self._reach(file_id)
        peers = frozenset(other for other in reach if file_id in self._reach(other))
        return peers if len(peers) > 1 else frozenset()

    def _reach(self, file_id: int) -> set[int]:
        seen = {file_id}
        todo = [file_id]
        while todo:
            for other in self.uses.get(todo.pop(), frozenset()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen

    def check(self) -> None:
        """Raises SchemaError for files whose interfaces extend each other's in a cycle
        (``a.I extends(b.J)``, ``b.K extends(a.L)``): each module would need the other's
        classes before it could make its own."""
        for file_id in sorted(self.extends):
            path = self._extends_cycle(file_id, [file_id])
            if path:
                names = " -> ".join(self.modules.get(f, hex(f)) for f in path)
                from capsvc.errors import SchemaError

                raise SchemaError(
                    f"cannot generate modules whose interfaces extend each other's in a cycle"
                    f" ({names}): Python makes a module's base classes before its own;"
                    " move the interfaces one extends into one file"
                )

    def _extends_cycle(self, file_id: int, path: list[int]) -> list[int]:
        for other in sorted(self.extends.get(file_id, frozenset())):
            if other == path[0]:
                return [*path, other]
            if other not in path:
                found = self._extends_cycle(other, [*path, other])
                if found:
                    return found
        return []


@dataclass(frozen=True)
class Schema:
    """Everything the generator sees: the files to generate, and where each node lives."""

    files: tuple[File, ...]
    #: node ID -> (file ID, scope): for references across files.
    where: dict[int, tuple[int, str]]
    #: Files that import each other (none known: none do).
    cycles: Cycles = field(default_factory=lambda: Cycles({}, {}, {}))
    #: node ID -> its model, in every file seen (the requested ones and those they
    #: import): what a reference to another file's node needs of it (an enum's
    #: enumerants), whether that file is generated in this run or not.
    nodes: dict[int, Node] = field(default_factory=dict)
