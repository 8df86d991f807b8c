"""A generic caller for the shell (``capsvc call --schema``, ``capsvc describe``), like grpcurl.

Theory of operation
-------------------
Everything is driven by a schema loaded on the dynamic path (``capsvc.load_schema``), and
everything the user typed is checked against it *before* any connection is made:

- :func:`plan_call` turns ``Interface.method field=value ... [field.method field=value
  ...]`` into a :class:`CallPlan`: the interface to bootstrap and one :class:`Step` per
  call. Each value is parsed by its field's schema type (:func:`parse_text`; JSON inside
  structs and lists, :func:`from_json`) into what pycapnp's setters accept (numbers, str,
  bytes, enumerant names, dicts, lists), range-checked, so pycapnp never gets a value it
  would refuse with C++ text. A chained ``field.method`` names a capability field of the
  previous call's results; it is resolved in the results' schema, so a misspelt field or
  method is a usage error too.
- :func:`run_calls` sends the first call to the bootstrap capability and each chained call
  on the previous call's promise (pipelined: no call waits for the one before), then awaits
  the last and renders its results (:func:`render_struct`): fields by schema name, Data as
  base64, enums by name, a union's set member only, capabilities as ``{"capability":
  "Interface"}``.
- :func:`describe_text` / :func:`describe_json` list what a schema file declares.

Mistakes are :class:`CallerUsageError` (the CLI's exit status 2), worded like
capsvc.mistakes: ``Store.put() has no parameter kee; its parameters are key :Text, value
:Data``. This module imports neither trio nor the connection machinery until a call is run.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from capsvc.codegen.model import SCHEMA_NAMES
from capsvc.mistakes import struct_name
from capsvc.schema import interface_info, load_schema

#: A field's ``discriminantValue`` when it is no union member (schema.capnp).
_NOT_IN_UNION = 0xFFFF
_TYPE_NAMES = {**SCHEMA_NAMES, "anyPointer": "AnyPointer"}
_INT_RANGES = {
    **{f"int{bits}": (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) for bits in (8, 16, 32, 64)},
    **{f"uint{bits}": (0, (1 << bits) - 1) for bits in (8, 16, 32, 64)},
}
_FLOATS = ("float32", "float64")
#: JSON has no numbers for these; they are written (and accepted) as strings.
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
#: The kinds whose pycapnp schema object a field (or list element) has.
_WITH_SCHEMA = frozenset({"struct", "enum", "interface", "list"})
#: Prefix that makes a Data value base64 instead of UTF-8 text.
BASE64_PREFIX = "base64:"


class CallerUsageError(ValueError):
    """A command line that does not fit the schema (exit status 2)."""


# --------------------------------------------------------------------------- types
@dataclass(frozen=True, slots=True)
class SchemaType:
    """A field's type: its schema.capnp ``Type`` kind (or ``group``) and what it refers to."""

    kind: str
    #: The struct, group, enum or interface schema (None for other kinds, or when pycapnp
    #: cannot give it, e.g. a generic parameter).
    schema: Any = None
    element: SchemaType | None = None  # a list's element type

    @property
    def name(self) -> str:
        """The type as a schema file spells it: ``List(Calculator.Expression)``."""
        if self.kind == "list":
            assert self.element is not None
            return f"List({self.element.name})"
        if self.kind in ("struct", "enum", "interface"):
            return struct_name(self.schema) if self.schema is not None else self.kind
        return _TYPE_NAMES.get(self.kind, self.kind)


def field_type(schema: Any, name: str) -> SchemaType:
    """The type of field ``name`` of the struct ``schema``."""
    field = schema.fields[name]
    proto = field.proto
    if proto.which() == "group":
        return SchemaType("group", field.schema)
    return _type_of(proto.slot.type, lambda: field.schema)


def _type_of(proto: Any, schema_of: Callable[[], Any]) -> SchemaType:
    # pycapnp gives a schema object only for named types and lists (asking for a
    # primitive's raises), hence the kind from the proto and the schema on demand.
    kind = str(proto.which())
    schema: Any = None
    if kind in _WITH_SCHEMA:
        try:
            schema = schema_of()
        except Exception:  # a generic's parameter: no concrete schema to give
            schema = None
    if kind == "list":
        element_proto = proto.list.elementType
        element = _type_of(element_proto, lambda: schema.elementType)
        return SchemaType("list", None, element)
    return SchemaType(kind, schema)


def _fields_in_order(schema: Any) -> list[Any]:
    """A struct's field protos in declaration order (the node lists them by ordinal)."""
    return sorted(schema.node.struct.fields, key=lambda proto: proto.codeOrder)


def _spell_fields(schema: Any) -> str:
    """``key :Text, value :Data`` (``none`` for an empty struct)."""
    parts = [
        f"{proto.name} :{field_type(schema, str(proto.name)).name}"
        for proto in _fields_in_order(schema)
    ]
    return ", ".join(parts) or "none"


# --------------------------------------------------------------------------- values
class BadValue(ValueError):
    """A value that does not fit its type: where (``expression.literal``) and why."""

    def __init__(self, where: str, text: str) -> None:
        super().__init__(text)
        self.where = where
        self.text = text


def _shown(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _expected(kind: SchemaType, value: object, where: str, why: str = "") -> BadValue:
    return BadValue(where, f"expected {kind.name}, got {_shown(value)}{why}")


def parse_text(kind: SchemaType, text: str, where: str) -> Any:
    """The value of ``field=TEXT`` for a field of type ``kind``, as pycapnp accepts it.

    Text is taken as is, Data is UTF-8 text (or ``base64:...``), an enum is an enumerant
    name, Bool ``true``/``false``, Void empty (or ``null``); numbers, structs and lists
    are JSON (parsed further by :func:`from_json`).

    Raises:
        BadValue: the text does not fit the type.
    """
    which = kind.kind
    if which in ("interface", "anyPointer") or (
        kind.schema is None and which in ("struct", "group", "enum")
    ):
        return from_json(kind, text, where)  # refused there, in one place
    if which == "text":
        return _checked_text(kind, text, where)
    if which == "data":
        return _data(kind, text, where)
    if which == "enum":
        return _enumerant(kind, text, where)
    if which == "bool":
        if text not in ("true", "false"):
            raise _expected(kind, text, where, " (true or false)")
        return text == "true"
    if which == "void":
        if text not in ("", "null"):
            raise _expected(kind, text, where, " (nothing, or null)")
        return None
    try:
        value = json.loads(text)
    except ValueError as error:
        shape = "a JSON array" if which == "list" else "a number"
        if which in ("struct", "group"):
            shape = "a JSON object"
        raise BadValue(
            where, f"expected {kind.name} as {shape}, got {_shown(text)} (not JSON: {error})"
        ) from None
    return from_json(kind, value, where)


def from_json(kind: SchemaType, value: object, where: str) -> Any:
    """A JSON value (inside a struct or list argument) checked against ``kind``.

    Raises:
        BadValue: the value does not fit the type.
    """
    which = kind.kind
    if which == "void":
        if value is not None:
            raise _expected(kind, value, where, " (null)")
        return None
    if which == "bool":
        if not isinstance(value, bool):
            raise _expected(kind, value, where, " (true or false)")
        return value
    if which in _INT_RANGES:
        return _integer(kind, value, where)
    if which in _FLOATS:
        return _float(kind, value, where)
    if which in ("text", "data", "enum") and not isinstance(value, str):
        raise _expected(kind, value, where, " (a JSON string)")
    if which == "text":
        assert isinstance(value, str)
        return _checked_text(kind, value, where)
    if which == "data":
        assert isinstance(value, str)
        return _data(kind, value, where)
    if which == "interface":
        raise BadValue(where, f"{kind.name} is a capability: capabilities cannot be given as text")
    if which == "anyPointer":
        raise BadValue(where, "an AnyPointer cannot be given as text (its type is not known)")
    if kind.schema is None and which != "list":
        raise BadValue(where, f"{kind.name}: its schema is not known (a generic parameter?)")
    if which == "enum":
        assert isinstance(value, str)
        return _enumerant(kind, value, where)
    if which in ("struct", "group"):
        if not isinstance(value, dict):
            raise _expected(kind, value, where, " (a JSON object)")
        return _struct(kind.schema, value, where)
    if which == "list":
        if not isinstance(value, list):
            raise _expected(kind, value, where, " (a JSON array)")
        element = kind.element
        assert element is not None
        return [from_json(element, item, f"{where}[{index}]") for index, item in enumerate(value)]
    raise BadValue(where, f"{kind.name} values cannot be given as text")


def _integer(kind: SchemaType, value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _expected(kind, value, where, " (an integer)")
    low, high = _INT_RANGES[kind.kind]
    if not low <= value <= high:
        raise _expected(kind, value, where, f" (out of range {low}..{high})")
    return value


def _float(kind: SchemaType, value: object, where: str) -> float:
    if isinstance(value, str) and value in _NON_FINITE:
        return _NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _expected(kind, value, where, " (a number, or NaN, Infinity, -Infinity)")
    try:
        number = float(value)
        if kind.kind == "float32":
            struct.pack("<f", number)  # raises for what a Float32 cannot hold
    except OverflowError:
        raise _expected(kind, value, where, " (out of range)") from None
    return number


def _checked_text(kind: SchemaType, text: str, where: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # argv bytes that were not UTF-8 (surrogate escapes)
        raise _expected(kind, text, where, " (not valid UTF-8)") from None
    return text


def _data(kind: SchemaType, text: str, where: str) -> bytes:
    if text.startswith(BASE64_PREFIX):
        try:
            return base64.b64decode(text[len(BASE64_PREFIX) :], validate=True)
        except binascii.Error as error:
            raise _expected(kind, text, where, f" (not valid base64: {error})") from None
    # Undecodable argv bytes come back as the bytes they were.
    return text.encode("utf-8", "surrogateescape")


def _enumerant(kind: SchemaType, name: str, where: str) -> str:
    names = list(kind.schema.enumerants)
    if name not in names:
        raise _expected(kind, name, where, f" (one of {', '.join(names)})")
    return name


def _struct(schema: Any, value: dict[str, object], where: str) -> dict[str, Any]:
    names = list(schema.fieldnames)
    members = [
        str(proto.name)
        for proto in _fields_in_order(schema)
        if proto.discriminantValue != _NOT_IN_UNION
    ]
    chosen = [key for key in value if key in members]
    if len(chosen) > 1:
        raise BadValue(
            where,
            f"{struct_name(schema)} holds one of {', '.join(members)}, not several;"
            f" got {' and '.join(chosen)}",
        )
    converted: dict[str, Any] = {}
    for key, item in value.items():
        inner = f"{where}.{key}"
        if key not in names:
            raise BadValue(
                inner,
                f"{struct_name(schema)} has no field {key}"
                f" (its fields are {', '.join(names) or 'none'})",
            )
        converted[key] = from_json(field_type(schema, key), item, inner)
    return converted


# --------------------------------------------------------------------------- plans
@dataclass(frozen=True, slots=True)
class Step:
    """One call of a plan."""

    label: str  # Interface.method, in schema names (for messages)
    #: The capability field of the previous call's results this call goes to (dotted
    #: through structs and groups); empty for the first call (the bootstrap capability).
    path: tuple[str, ...]
    method: str
    params: dict[str, Any]  # field name -> a checked value pycapnp's setter accepts
    param_schema: Any
    result_schema: Any


@dataclass(frozen=True, slots=True)
class CallPlan:
    """The interface to bootstrap and the calls to make, first to last."""

    interface: Any  # the pycapnp interface schema (what conn.bootstrap takes)
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Declaration:
    """A struct, enum or interface the schema file declares (nested ones too)."""

    name: str  # its schema name: Calculator.Expression
    kind: str  # "struct", "enum" or "interface"
    schema: Any


def load(path: str, imports: Sequence[str] = ()) -> Any:
    """``capsvc.load_schema(path, imports=...)``; a missing file is a usage error.

    Raises:
        CallerUsageError: no such file.
        capsvc.SchemaError: the file does not compile.
    """
    if not os.path.isfile(path):
        raise CallerUsageError(f"no such schema file: {path}")
    return load_schema(path, imports=list(imports))


def declarations(module: Any) -> list[Declaration]:
    """What the file declares, depth first in declaration order."""
    found: list[Declaration] = []
    _walk(module, module.schema.node, found)
    return found


def _walk(parent: Any, node: Any, found: list[Declaration]) -> None:
    for nested in node.nestedNodes:
        try:
            child = getattr(parent, str(nested.name))
            schema = child.schema
            kind = str(schema.node.which())
        except Exception:  # an annotation, or a constant (its value has no schema)
            continue
        # A struct constant's value has its *type's* schema: only the node itself counts.
        if schema.node.id != nested.id or kind not in ("struct", "enum", "interface"):
            continue
        found.append(Declaration(struct_name(schema), kind, schema))
        _walk(child, schema.node, found)


def find_interface(module: Any, name: str, path: str) -> Any:
    """The interface called ``name`` (``Calculator.Value``) in the file ``path``.

    Raises:
        CallerUsageError: no such interface (the message lists the file's interfaces).
    """
    found = declarations(module)
    interfaces = [d for d in found if d.kind == "interface"]
    for declaration in found:
        if declaration.name == name:
            if declaration.kind != "interface":
                raise CallerUsageError(f"{name} is a {declaration.kind}, not an interface")
            return declaration.schema
    listed = ", ".join(d.name for d in interfaces) or "none"
    raise CallerUsageError(f"{path} has no interface {name}; its interfaces are {listed}")


def plan_call(module: Any, target: str, words: Sequence[str], path: str = "the schema") -> CallPlan:
    """Check ``Interface.method field=value ... [field.method field=value ...] ...``.

    A word with ``=`` sets a parameter of the current call; a word without one but with a
    dot (``store.put``) starts a call on that capability field of the current call's
    results.

    Raises:
        CallerUsageError: anything that does not fit the schema.
    """
    interface_name, dot, method_name = target.rpartition(".")
    if not dot or not interface_name or not method_name:
        raise CallerUsageError(f"expected Interface.method, got {target!r}")
    interface = find_interface(module, interface_name, path)
    steps: list[Step] = []
    current = _begin(interface, method_name, ())
    for word in words:
        name, equals, text = word.partition("=")
        if equals:
            _add_param(current, name, text)
        elif "." in word:
            steps.append(current)
            current = _chain(current, word)
        else:
            raise CallerUsageError(
                f"expected field=value or field.method after {current.label}, got {word!r}"
            )
    steps.append(current)
    return CallPlan(interface, tuple(steps))


def _begin(interface: Any, method_name: str, path: tuple[str, ...]) -> Step:
    info = interface_info(interface)
    method = info.by_name.get(method_name)
    if method is None:
        methods = ", ".join(info.by_name) or "none"
        raise CallerUsageError(
            f"{info.name} has no method {method_name}; its methods are {methods}"
        )
    label = f"{info.name}.{method_name}"
    return Step(label, path, method_name, {}, method.param_schema, method.result_schema)


def _add_param(step: Step, name: str, text: str) -> None:
    schema = step.param_schema
    params = _spell_fields(schema)
    if name not in schema.fieldnames:
        raise CallerUsageError(
            f"{step.label}() has no parameter {name or repr(name)}; its parameters are {params}"
        )
    if name in step.params:
        raise CallerUsageError(f"{step.label}() parameter {name} is given twice")
    try:
        step.params[name] = parse_text(field_type(schema, name), text, name)
    except BadValue as bad:
        raise CallerUsageError(
            f"{step.label}() parameter {bad.where}: {bad.text}; its parameters are {params}"
        ) from None


def _chain(previous: Step, word: str) -> Step:
    """The call ``field.method`` (``field`` may be dotted through structs and groups) on a
    capability field of ``previous``'s results."""
    *path, method_name = word.split(".")
    if not method_name or not all(path):
        raise CallerUsageError(f"expected field.method after {previous.label}, got {word!r}")
    schema = previous.result_schema
    owner = f"{previous.label} results"
    for depth, name in enumerate(path):
        if name not in schema.fieldnames:
            raise CallerUsageError(
                f"{owner} have no field {name}; they are {_spell_fields(schema)}"
            )
        kind = field_type(schema, name)
        where = ".".join(path[: depth + 1])
        last = depth == len(path) - 1
        if last and kind.kind == "interface" and kind.schema is not None:
            return _begin(kind.schema, method_name, tuple(path))
        if not last and kind.kind in ("struct", "group") and kind.schema is not None:
            schema = kind.schema
            owner = f"{previous.label} result {where}"
            continue
        wanted = "a capability" if last else "a struct or group"
        raise CallerUsageError(
            f"{previous.label} result {where} is {kind.name}, not {wanted}: a chained call"
            f" names a capability field of the results and a method ({word!r})"
        )
    raise AssertionError("unreachable: path is not empty")  # split gives at least 2 parts


# --------------------------------------------------------------------------- calls
async def run_calls(address: str, plan: CallPlan) -> dict[str, Any]:
    """Make the plan's calls on a connection to ``address``; the last one's results.

    Every chained call is sent on its predecessor's promise at once (promise pipelining):
    the whole chain costs one round trip.

    Raises:
        capsvc.RpcError: a call failed (a failed call fails the calls chained on it).
        OSError: the connection could not be made.
    """
    from capsvc.api import connect
    from capsvc.checked import set_field
    from capsvc.client import Client, Promise, Request
    from capsvc.streaming import StreamCall

    async with connect(address) as conn:
        target: Client = conn.bootstrap(plan.interface)
        promises: list[Promise | StreamCall] = []  # held to the end: each keeps its question
        for step in plan.steps:
            if promises:
                target = _pipelined(promises[-1], step.path)
            # Request, not getattr(target, name): a method called ``close`` or ``interface``
            # must not find Client's own attributes.
            request = Request(target, target.interface.by_name[step.method])
            for name, value in step.params.items():
                set_field(request.params, step.param_schema, name, value)
            promises.append(request.send())
        last = promises[-1]
        if isinstance(last, StreamCall):  # a `-> stream` method: wait for its own Return;
            await last.returned()  # its results (StreamResult) have no fields to show
            return {}
        results = await last
        return render_struct(results, plan.steps[-1].result_schema)


def _pipelined(promise: Any, path: tuple[str, ...]) -> Any:
    """The capability at ``path`` of a promise's results (structs and groups on the way
    give deeper promises, the last field a pipelined Client)."""
    from capsvc.client import Promise

    target = promise
    for name in path:
        # Promise.__getattr__ itself: a result field called ``cancel`` must not find
        # Promise's own method.
        target = Promise.__getattr__(target, name)
    return target


# --------------------------------------------------------------------------- results
def render_struct(reader: Any, schema: Any) -> dict[str, Any]:
    """A struct reader as JSON-ready data: fields by schema name in declaration order,
    a union's set member only (rendered with :func:`render_value`)."""
    chosen = str(reader.which()) if schema.node.struct.discriminantCount else None
    rendered: dict[str, Any] = {}
    for proto in _fields_in_order(schema):
        name = str(proto.name)
        if proto.discriminantValue != _NOT_IN_UNION and name != chosen:
            continue
        kind = field_type(schema, name)
        if kind.kind in ("interface", "anyPointer"):
            # Never read through pycapnp (it cannot read capabilities outside its own RPC
            # system): whether the pointer is set is all there is to show.
            rendered[name] = _pointer(kind) if _has(reader, name) else None
        else:
            rendered[name] = render_value(getattr(reader, name), kind)
    return rendered


def render_value(value: Any, kind: SchemaType) -> Any:
    """One value as JSON-ready data: Data as base64, an enum by name (its number if the
    schema has no such enumerant), a non-finite float as ``NaN``/``Infinity``/``-Infinity``,
    a capability as ``{"capability": "Interface"}`` (None for a null one)."""
    which = kind.kind
    if which == "void":
        return None
    if which == "bool":
        return bool(value)
    if which in _INT_RANGES:
        return int(value)
    if which in _FLOATS:
        return _render_float(float(value), which == "float32")
    if which == "text":
        return str(value)
    if which == "data":
        return base64.b64encode(bytes(value)).decode("ascii")
    if which == "enum":
        number = int(getattr(value, "raw", value))
        names = {number: name for name, number in kind.schema.enumerants.items()}
        return names.get(number, number)
    if which in ("struct", "group"):
        return render_struct(value, kind.schema)
    if which == "list":
        element = kind.element
        assert element is not None
        return [render_value(item, element) for item in value]
    if which == "interface":
        return None if _is_null_client(value) else _pointer(kind)
    return _pointer(kind)


def _render_float(number: float, single: bool) -> float | str:
    if not math.isfinite(number):
        return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
    if single:
        # The shortest decimal that reads back as the same Float32 (1.1, not
        # 1.100000023841858, which is what its double is).
        for digits in range(1, 10):
            shorter = float(f"{number:.{digits}g}")
            if struct.unpack("<f", struct.pack("<f", shorter))[0] == number:
                return shorter
    return number


def _pointer(kind: SchemaType) -> dict[str, Any]:
    if kind.kind == "interface":
        return {"capability": kind.name}
    return {"anyPointer": "not shown (its type is not known)"}


def _has(reader: Any, name: str) -> bool:
    try:
        return bool(reader._has(name))
    except Exception:  # a reader that cannot tell: say it is there
        return True


def _is_null_client(value: Any) -> bool:
    from capsvc.client import Client
    from capsvc.rpc.hooks import NullHook

    return isinstance(value, Client) and isinstance(value._hook, NullHook)


def to_json(data: Any, *, compact: bool = False) -> str:
    """``data`` as JSON text: indented by 2, or on one line."""
    if compact:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(data, ensure_ascii=False, indent=2)


# --------------------------------------------------------------------------- describe
def describe_text(module: Any) -> str:
    """Every interface (superclasses, methods with their parameters and results), struct
    and enum of the schema file, in a readable text form."""
    found = declarations(module)
    blocks: list[list[str]] = []
    for declaration in found:
        if declaration.kind == "interface":
            blocks.append(_interface_lines(declaration))
    for declaration in found:
        if declaration.kind == "struct":
            lines = [f"struct {declaration.name}"]
            lines += _struct_lines(declaration.schema, 1) or ["  (no fields)"]
            blocks.append(lines)
    for declaration in found:
        if declaration.kind == "enum":
            names = ", ".join(declaration.schema.enumerants)
            blocks.append([f"enum {declaration.name}: {names}"])
    return "\n\n".join("\n".join(block) for block in blocks)


def _interface_lines(declaration: Declaration) -> list[str]:
    schema = declaration.schema
    supers = [struct_name(parent) for parent in schema.superclasses]
    header = f"interface {declaration.name}"
    if supers:
        header += f" extends {', '.join(supers)}"
    lines = [header]
    for method in _methods(schema):
        line = f"  {declaration.name}.{method['name']}("
        line += ", ".join(f"{p['name']} :{p['type']}" for p in method["params"])
        line += ") -> ("
        line += ", ".join(f"{r['name']} :{r['type']}" for r in method["results"]) + ")"
        if method["from"] != declaration.name:
            line += f"  (from {method['from']})"
        lines.append(line)
    if len(lines) == 1:
        lines.append("  (no methods)")
    return lines


def _methods(schema: Any) -> list[dict[str, Any]]:
    """Own methods first (in ordinal order), then inherited ones."""
    info = interface_info(schema)
    own = [m for m in info.by_name.values() if m.interface_id == info.id]
    inherited = [m for m in info.by_name.values() if m.interface_id != info.id]
    return [
        {
            "name": method.name,
            "from": method.interface_name,
            "params": _field_list(method.param_schema),
            "results": _field_list(method.result_schema),
        }
        for method in own + inherited
    ]


def _field_list(schema: Any) -> list[dict[str, Any]]:
    fields: list[dict[str, Any]] = []
    for proto in _fields_in_order(schema):
        name = str(proto.name)
        kind = field_type(schema, name)
        entry: dict[str, Any] = {"name": name, "type": kind.name}
        if proto.discriminantValue != _NOT_IN_UNION:
            entry["union"] = True
        if kind.kind == "group":
            entry["fields"] = _field_list(kind.schema)
        fields.append(entry)
    return fields


def _struct_lines(schema: Any, depth: int) -> list[str]:
    indent = "  " * depth
    lines: list[str] = []
    fields = _field_list(schema)
    members = [f for f in fields if f.get("union")]
    for entry in [f for f in fields if not f.get("union")]:
        lines += _field_lines(entry, schema, indent, depth)
    if members:
        lines.append(f"{indent}union (one of):")
        for entry in members:
            lines += _field_lines(entry, schema, indent + "  ", depth + 1)
    return lines


def _field_lines(entry: dict[str, Any], schema: Any, indent: str, depth: int) -> list[str]:
    lines = [f"{indent}{entry['name']} :{entry['type']}"]
    if "fields" in entry:
        lines += _struct_lines(schema.fields[entry["name"]].schema, depth + 1)
    return lines


def describe_json(module: Any) -> dict[str, Any]:
    """What :func:`describe_text` says, as JSON-ready data."""
    found = declarations(module)
    return {
        "interfaces": [
            {
                "name": d.name,
                "extends": [struct_name(parent) for parent in d.schema.superclasses],
                "methods": _methods(d.schema),
            }
            for d in found
            if d.kind == "interface"
        ],
        "structs": [
            {"name": d.name, "fields": _field_list(d.schema)} for d in found if d.kind == "struct"
        ],
        "enums": [
            {"name": d.name, "enumerants": list(d.schema.enumerants)}
            for d in found
            if d.kind == "enum"
        ],
    }
