"""What the native reads (librt.strings over ``bytes`` segments) and the late-bound field
descriptors must keep: every integer width at its extremes (the reads are signed, the
unsigned widths masked), segments given as any buffer kind, struct lists on both
iteration paths (all readers at once up to ``SHORT_LIST``, one at a time beyond), and
enum, struct, list and group fields read through descriptors bound at the module's end.
Messages are written by pycapnp (the C++ reference), read by the generated readers."""

from __future__ import annotations

from typing import Any

import pytest

from capsvc.codec.reading import SHORT_LIST
from tests.codegen.conftest import Generated

EXTREMES = {
    "i8": (-(1 << 7), (1 << 7) - 1),
    "i16": (-(1 << 15), (1 << 15) - 1),
    "i32": (-(1 << 31), (1 << 31) - 1),
    "i64": (-(1 << 63), (1 << 63) - 1),
    "u8": (0, (1 << 8) - 1),
    "u16": (0, (1 << 16) - 1),
    "u32": (0, (1 << 32) - 1),
    "u64": (0, (1 << 64) - 1),
}


def segments_of(message: Any) -> list[bytes]:
    return [bytes(segment) for segment in message.to_segments()]


@pytest.mark.parametrize("end", [0, 1])
def test_every_width_reads_its_extremes(generated: Generated, end: int) -> None:
    message = generated.reference.Numbers.new_message()
    for name, bounds in EXTREMES.items():
        setattr(message, name, bounds[end])
    message.f64 = -1.5
    message.color = "blue"
    reader = generated.kitchen.Numbers.read(segments_of(message))
    assert {name: getattr(reader, name) for name in EXTREMES} == {
        name: bounds[end] for name, bounds in EXTREMES.items()
    }
    assert reader.f64 == -1.5
    assert reader.color is generated.kitchen.Color.blue


def test_defaults_are_xored_on_every_width(generated: Generated) -> None:
    # Defaults (kitchen.capnp) include a UInt64 above 2**63: stored XOR its default.
    message = generated.reference.Defaults.new_message()
    message.u64 = 1
    message.i64 = -1
    reader = generated.kitchen.Defaults.read(segments_of(message))
    assert (reader.u64, reader.i64) == (1, -1)
    untouched = generated.kitchen.Defaults.read(
        segments_of(generated.reference.Defaults.new_message())
    )
    assert untouched.u64 == 18000000000000000000
    assert untouched.i64 == 1234567890123


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_segments_of_any_buffer_kind(generated: Generated, kind: type) -> None:
    message = generated.reference.Shapes.new_message()
    message.name = "κύκλος"
    segments = [kind(segment) for segment in segments_of(message)]
    reader = generated.kitchen.Shapes.read(segments)
    assert reader.name == "κύκλος"
    assert all(type(segment) is bytes for segment in reader._msg.segments)


@pytest.mark.parametrize("count", [0, 1, SHORT_LIST, SHORT_LIST + 1, 3 * SHORT_LIST])
def test_struct_lists_iterate_on_both_paths(generated: Generated, count: int) -> None:
    message = generated.reference.Lists.new_message()
    elements = message.init("structs", count)
    for index, element in enumerate(elements):
        element.u32 = index * 7
        element.i16 = -index
    structs = generated.kitchen.Lists.read(segments_of(message)).structs
    iterated = [(element.u32, element.i16) for element in structs]
    indexed = [(structs[i].u32, structs[i].i16) for i in range(len(structs))]
    assert iterated == indexed == [(i * 7, -i) for i in range(count)]


@pytest.mark.parametrize("count", [SHORT_LIST, SHORT_LIST + 1])
def test_struct_list_builders_iterate_on_both_paths(generated: Generated, count: int) -> None:
    builder = generated.kitchen.Lists.new_message()
    for index, element in enumerate(builder.init_structs(count)):
        element.u16 = index
    reference = generated.reference.Lists.from_segments([bytes(s) for s in builder.to_segments()])
    assert [element.u16 for element in reference.structs] == list(range(count))


def test_the_class_attributes_are_bound_descriptors(generated: Generated) -> None:
    # Before its bind call a descriptor reads a plain reader or a raw code: every field
    # of the generated module must be bound by the time the module is imported.
    kitchen = generated.kitchen
    message = generated.reference.Lists.new_message()
    message.colors = ["green", "blue"]
    message.init("structs", 1)[0].color = "green"
    message.nested = [[1, 2], [3]]
    reader = kitchen.Lists.read(segments_of(message))
    assert list(reader.colors) == [kitchen.Color.green, kitchen.Color.blue]
    assert type(reader.structs[0]) is kitchen.Numbers.Reader
    assert reader.structs[0].color is kitchen.Color.green
    assert [list(inner) for inner in reader.nested] == [[1, 2], [3]]
    assert hasattr(type(kitchen.Lists.Reader.__dict__["structs"]), "bind")


def test_groups_read_and_select_through_descriptors(generated: Generated) -> None:
    kitchen = generated.kitchen
    builder = kitchen.Shapes.new_message()
    builder.circle = 1.0
    builder.square.side = 2.5  # a group that is a union member: reaching it selects it
    builder.style.fill.gradient.to = kitchen.Color.green
    segments = [bytes(segment) for segment in builder.to_segments()]
    reference = generated.reference.Shapes.from_segments(segments)
    assert reference.which() == "square"
    assert reference.square.side == 2.5
    assert reference.style.fill.which() == "gradient"
    assert reference.style.fill.gradient.to == "green"
    reader = kitchen.Shapes.read(segments)
    assert reader.which() == "square"
    assert reader.square.side == 2.5
    assert type(reader.style.fill) is kitchen.Shapes.Style.Fill.Reader
    assert reader.style.fill.gradient.to is kitchen.Color.green


def test_a_union_group_reached_while_another_member_is_set_starts_cleared(
    generated: Generated,
) -> None:
    """Union members share their struct's space: reaching ``square`` while ``circle`` and
    then ``points`` were set reads neither the Float64's bits as its side nor the list as
    its label. The switch clears the group, as C++'s ``initSquare()`` does; reaching it
    again keeps what it holds; ``init("square")`` (pycapnp's spelling) and
    ``init_square()`` clear it whatever is set."""
    kitchen = generated.kitchen
    builder = kitchen.Shapes.new_message(name="s")
    builder.circle = -1.5
    builder.points = [1, 2, 3]
    square = builder.square
    assert (square.side, square.label) == (0.0, "")
    reference = generated.reference.Shapes.from_segments(segments_of(builder))
    assert reference.which() == "square"
    assert (reference.square.side, reference.square.label) == (0.0, "")
    square.side, square.label = 2.5, "big"
    assert (builder.square.side, builder.square.label) == (2.5, "big")
    assert (builder.init("square").side, builder.square.label) == (0.0, "")
    builder.square.label = "again"
    assert builder.init_square().label == ""
    builder.style.fill.pattern = "stripes"
    gradient = builder.style.fill.gradient
    assert (gradient.from_, gradient.to) == (kitchen.Color.red, kitchen.Color.red)
    assert generated.reference.Shapes.from_segments(segments_of(builder)).to_dict() == {
        "name": "s",
        "square": {"side": 0.0},
        "style": {"color": "red", "fill": {"gradient": {"from": "red", "to": "red"}}},
    }


def test_struct_and_enum_defaults_through_descriptors(generated: Generated) -> None:
    reader = generated.kitchen.Defaults.read(
        segments_of(generated.reference.Defaults.new_message())
    )
    assert reader.color is generated.kitchen.Color.blue
    assert (reader.numbers.i32, reader.numbers.b) == (42, True)
    assert reader.numbers.color is generated.kitchen.Color.green
    assert list(reader.list) == [1, -2, 3]
