"""``Builder.assign(**fields)``, the generated constructor-style setter: the same message
as the per-field setters (pycapnp reads it back), the defaults for every field not
named, pointers cleared, and errors that name the field, as the setters give them."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from hypothesis import given

from capsvc.codegen.model import NUMBERS, Struct
from capsvc.codegen.render import python_name
from tests.codegen.conftest import Generated
from tests.codegen.test_roundtrip import (
    SETTINGS,
    STRUCTS,
    _reference_root,
    generated_type,
    new_reference,
    reference_type,
)
from tests.codegen.values import _code, fill, struct_named, values

# What assign takes as it is: scalars, Text, Data, enums (by code), lists of scalars.
_DIRECT = {"bool", "text", "data", "enum", *NUMBERS}


def split(generated: Generated, struct: Struct, builder: Any, data: dict[str, Any]) -> tuple:
    """``data`` as assign's keywords, and the rest (for ``fill`` after the assign)."""
    keywords = (
        set(inspect.signature(builder.assign).parameters) if hasattr(builder, "assign") else set()
    )
    given_, rest = {}, {}
    by_name = {f.name: f for f in struct.fields}
    for name, value in data.items():
        field = by_name[name]
        kind = field.type
        direct = kind is not None and (
            kind.kind in _DIRECT
            or (kind.kind == "list" and kind.element is not None and kind.element.kind in NUMBERS)
        )
        if python_name(name) in keywords and direct:
            assert kind is not None
            given_[python_name(name)] = (
                _code(generated.schema, kind, value) if kind.kind == "enum" else value
            )
        else:
            rest[name] = value
    return given_, rest


@pytest.mark.parametrize(("scope", "file_index"), STRUCTS)
def test_assign_builds_what_the_setters_build(
    generated: Generated, scope: str, file_index: int
) -> None:
    struct = struct_named(generated.schema, scope, file_index)
    ours = generated_type(generated, scope, file_index)
    reference = reference_type(generated, scope, file_index)

    @SETTINGS
    @given(values(generated.schema, struct))
    def check(data: dict[str, Any]) -> None:
        builder = ours.Builder.new_message()
        keywords, rest = split(generated, struct, builder, data)
        if hasattr(builder, "assign"):
            builder.assign(**keywords)
        else:
            assert not keywords
        fill(generated.schema, builder, struct, rest)
        expected = new_reference(reference, data).as_reader().to_dict()
        segments = [bytes(s) for s in builder.to_segments()]
        assert _reference_root(reference, segments).to_dict() == expected
        assert ours.Reader.read(segments).to_dict() == expected

    check()


def test_assign_resets_what_it_is_not_given(generated: Generated) -> None:
    numbers = generated.kitchen.Numbers.new_message()
    numbers.i32 = 7
    numbers.b2 = True
    numbers.assign(u8=9)
    assert (numbers.i32, numbers.b2, numbers.u8) == (0, False, 9)
    defaults = generated.kitchen.Defaults.new_message()
    defaults.assign(i8=1)
    reader = defaults.as_reader()
    # Every other field reads as its schema default, XOR-stored values included.
    assert (reader.i8, reader.u16, reader.f32, reader.b, reader.text) == (
        1,
        65000,
        1.5,
        True,
        "hello",
    )
    assert reader.color == generated.kitchen.Color.blue
    shapes = generated.kitchen.Shapes.new_message()
    shapes.name = "old"
    shapes.circle = 2.0
    shapes.assign()
    after = shapes.as_reader()
    assert (after.name, after.which()) == ("", "circle")
    assert after.circle == 0.0
    assert not after._has(0)  # the Text pointer is null again


def test_assign_errors_name_the_field(generated: Generated) -> None:
    numbers = generated.kitchen.Numbers.new_message()
    with pytest.raises(ValueError, match=r"Numbers\.u8: 300 is out of range for UInt8"):
        numbers.assign(u8=300)
    with pytest.raises(TypeError, match=r"Numbers\.b2: expected bool"):
        numbers.assign(b2=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Numbers\.i16: expected an int \(Int16\), got str"):
        numbers.assign(i16="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Numbers\.assign\(\): Numbers has no field 'kee'"):
        numbers.assign(kee=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="positional"):
        numbers.assign(1)  # type: ignore[misc]
    keywords = generated.kitchen.Keywords.new_message()
    assert "Keywords.Builder.assign" in repr(keywords.assign)
