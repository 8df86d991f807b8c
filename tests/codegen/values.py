"""Random values of any struct of a schema model, as pycapnp's dicts (Hypothesis), and
filling a generated builder from such a dict: the two sides of the round-trip tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from capsvc.codegen.model import NUMBERS, Enum, Field, Schema, Struct, Type
from capsvc.codegen.render import python_name

_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=12,
)
_INT_RANGES = {
    "int8": 8,
    "int16": 16,
    "int32": 32,
    "int64": 64,
}


def node(schema: Schema, node_id: int) -> Any:
    for file in schema.files:
        for item in file.nodes:
            if item.id == node_id:
                return item
    raise KeyError(node_id)


def struct_named(schema: Schema, scope: str, file_index: int = 0) -> Struct:
    for item in schema.files[file_index].nodes:
        if item.scope == scope and isinstance(item, Struct):
            return item
    raise KeyError(scope)


def values(schema: Schema, struct: Struct, depth: int = 2) -> st.SearchStrategy[dict[str, Any]]:
    """A dict of field values for ``struct`` as pycapnp's ``new_message(**d)`` takes it."""
    plain = [f for f in struct.fields if f.discriminant is None]
    union = [f for f in struct.fields if f.discriminant is not None]
    optional = {f.name: _field_values(schema, f, depth) for f in plain if _generatable(schema, f)}
    base = st.fixed_dictionaries({}, optional=optional)
    if not union:
        return base
    members = [f for f in union if _generatable(schema, f)]
    choice = st.sampled_from(members).flatmap(
        lambda f: _field_values(schema, f, depth).map(lambda v: {f.name: v})
    )
    return st.tuples(base, choice).map(lambda pair: {**pair[0], **pair[1]})


def _generatable(schema: Schema, field: Field) -> bool:
    return field.type is None or field.type.kind not in ("interface", "anyPointer")


def _field_values(schema: Schema, field: Field, depth: int) -> st.SearchStrategy[Any]:
    if field.group is not None:
        return values(schema, node(schema, field.group), depth)
    assert field.type is not None
    return type_values(schema, field.type, depth)


def type_values(schema: Schema, kind: Type, depth: int) -> st.SearchStrategy[Any]:
    k = kind.kind
    if k == "void":
        return st.none()
    if k == "bool":
        return st.booleans()
    if k in _INT_RANGES:
        bits = _INT_RANGES[k]
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if k.startswith("uint"):
        return st.integers(0, (1 << NUMBERS[k][1]) - 1)
    if k == "float32":
        return st.floats(width=32, allow_nan=False)
    if k == "float64":
        return st.floats(allow_nan=False)
    if k == "enum":
        enum = node(schema, kind.target)
        assert isinstance(enum, Enum)
        return st.sampled_from(enum.enumerants)
    if k == "text":
        return _TEXT
    if k == "data":
        return st.binary(max_size=12)
    if k == "struct":
        if depth <= 0:
            return st.just({})
        return values(schema, node(schema, kind.target), depth - 1)
    if k == "list":
        assert kind.element is not None
        if kind.element.kind == "struct" and depth <= 0:
            return st.just([])
        return st.lists(type_values(schema, kind.element, depth - 1), max_size=4)
    raise AssertionError(f"no values for {k}")


def fill(schema: Schema, builder: Any, struct: Struct, data: dict[str, Any]) -> None:
    """Set ``data`` (as ``values`` makes it) into a generated builder of ``struct``."""
    for field in sorted(struct.fields, key=lambda f: f.code_order):
        if field.name not in data:
            continue
        value = data[field.name]
        name = python_name(field.name)
        if field.group is not None:
            fill(schema, getattr(builder, name), node(schema, field.group), value)
            continue
        assert field.type is not None
        k = field.type.kind
        if k == "void":
            if field.discriminant is not None:
                setattr(builder, name, None)
        elif k == "enum":
            setattr(builder, name, _code(schema, field.type, value))
        elif k == "struct":
            fill(schema, getattr(builder, name), node(schema, field.type.target), value)
        elif k == "list":
            assert field.type.element is not None
            target = getattr(builder, f"init_{field.name}")(len(value))
            _fill_list(schema, target, field.type.element, value)
        else:
            setattr(builder, name, value)


def _code(schema: Schema, kind: Type, name: str) -> int:
    enum = node(schema, kind.target)
    assert isinstance(enum, Enum)
    return enum.enumerants.index(name)


def _fill_list(schema: Schema, target: Any, element: Type, items: list[Any]) -> None:
    k = element.kind
    for index, item in enumerate(items):
        if k == "void":
            continue
        if k == "struct":
            fill(schema, target[index], node(schema, element.target), item)
        elif k == "list":
            assert element.element is not None
            _fill_list(schema, target.init(index, len(item)), element.element, item)
        elif k == "enum":
            target[index] = _code(schema, element, item)
        else:
            target[index] = item
