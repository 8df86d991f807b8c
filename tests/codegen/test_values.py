"""Whole structs from plain values (capsvc.codec.values): ``new_message(**fields)`` and
``assign(**fields)`` build what pycapnp's ``new_message(**fields)`` builds from the same
dict, for every struct of the kitchen schema (Hypothesis: unions, groups, nested structs,
lists of every element size, enums by name, keyword field names); readers and builders
given as values are deep-copied; a refused value names the field and changes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given

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
from tests.codegen.values import struct_named, values


def _types(generated: Generated, scope: str, file_index: int) -> tuple[Any, Any, Any]:
    """The values strategy, the generated type and pycapnp's, of one kitchen struct."""
    struct = struct_named(generated.schema, scope, file_index)
    return (
        values(generated.schema, struct),
        generated_type(generated, scope, file_index),
        reference_type(generated, scope, file_index),
    )


def _python_names(data: dict[str, Any]) -> dict[str, Any]:
    """The top level's keys as generated keywords (``from`` -> ``from_``)."""
    return {python_name(key): value for key, value in data.items()}


@pytest.mark.parametrize(("scope", "file_index"), STRUCTS)
def test_new_message_builds_what_pycapnp_builds(
    generated: Generated, scope: str, file_index: int
) -> None:
    strategy, ours, reference = _types(generated, scope, file_index)

    @SETTINGS
    @given(strategy)
    def check(data: dict[str, Any]) -> None:
        expected = new_reference(reference, data).as_reader().to_dict()
        built = [
            ours.new_message(**_python_names(data)),  # the generated keywords
            ours.Builder.new_message(**data),  # a dict by schema names (the compiled path)
        ]
        assigned = ours.Builder.new_message()
        assigned.assign(**_python_names(data))
        built.append(assigned)
        for builder in built:
            segments = [bytes(s) for s in builder.to_segments()]
            assert _reference_root(reference, segments).to_dict() == expected
            assert ours.Reader.read(segments).to_dict() == expected

    check()


@pytest.mark.parametrize(("scope", "file_index"), STRUCTS)
def test_readers_given_as_values_are_copied(
    generated: Generated, scope: str, file_index: int
) -> None:
    """A struct value (here the whole struct, as a list element and as a field of a holder)
    may be a reader of another message: it is deep-copied."""
    strategy, ours, reference = _types(generated, scope, file_index)

    @SETTINGS
    @given(strategy)
    def check(data: dict[str, Any]) -> None:
        expected = new_reference(reference, data).as_reader().to_dict()
        source = ours.Builder.new_message(**data)
        if scope == "Numbers":
            holder = generated.kitchen.Defaults.new_message(numbers=source.as_reader())
            assert holder.as_reader().numbers.to_dict() == expected
            holder.assign(numbers=source)  # a builder: copied from what it holds now
            assert holder.as_reader().numbers.to_dict() == expected
        copy = ours.Builder.new_message()
        copy.assign(**{python_name(k): v for k, v in source.as_reader().to_dict().items()})
        assert copy.as_reader().to_dict() == expected

    check()


def test_lists_of_structs_take_dicts_readers_and_builders(generated: Generated) -> None:
    kitchen = generated.kitchen
    leaf = kitchen.Tree.new_message(value=7, children=[{"value": 8}])
    built = kitchen.Tree.new_message(
        value=1,
        children=[{"value": 2}, leaf.as_reader(), leaf, {"value": 3, "children": [{}]}],
        left={"value": 4, "left": leaf.as_reader()},
    )
    reader = built.as_reader()
    assert [child.value for child in reader.children] == [2, 7, 7, 3]
    assert [len(child.children) for child in reader.children] == [0, 1, 1, 1]
    assert reader.children[1].children[0].value == 8
    assert (reader.left.value, reader.left.left.value) == (4, 7)


def test_a_reader_of_another_struct_type_is_refused(generated: Generated) -> None:
    """A reader or builder is copied only into a field (or list) of its own struct type:
    an Other.Thing is not a Tree, as libcapnp refuses it ("Value type mismatch"). It was
    copied in, its words read as a Tree's (found by a sweep against pycapnp)."""
    kitchen = generated.kitchen
    thing = generated.other.Thing.new_message(id=36, tag="not a tree")
    built = kitchen.Tree.new_message(value=1, left={"value": 2})
    before = built.to_bytes()
    message = r"^Tree\.(left|children\[1\]): expected a reader or builder of Tree, got a Thing\."
    for wrong in (thing, thing.as_reader()):
        with pytest.raises(TypeError, match=message):
            built.left = wrong
        with pytest.raises(TypeError, match=message):
            built.assign(left=wrong)
        with pytest.raises(TypeError, match=message):
            built.children = [{"value": 3}, wrong]
        with pytest.raises(TypeError, match=message):
            kitchen.Tree.new_message(left=wrong)
        assert built.to_bytes() == before
    built.other = thing  # its own type: taken
    assert built.as_reader().other.tag == "not a tree"


def test_a_group_takes_a_dict_or_its_row_as_pycapnp_sets_it(generated: Generated) -> None:
    """``builder.group = {...}`` sets the fields given on the group in place (pycapnp's
    ``from_dict``), a union member group is selected (cleared first if another member
    was set), a row sets the whole group, and a refused value changes nothing. It was an
    AttributeError (the property was read-only; found by a sweep against pycapnp)."""
    kitchen, reference = generated.kitchen, generated.reference
    ours = kitchen.Shapes.new_message(square={"side": 2.0, "label": "sq"}, style={"color": "blue"})
    theirs = reference.Shapes.new_message(
        square={"side": 2.0, "label": "sq"}, style={"color": "blue"}
    )
    for builder in (ours, theirs):
        builder.square = {"side": 3.0}  # label kept
        builder.style = {"fill": {"pattern": "dots"}}  # color kept
        builder.style.fill = {"gradient": {"to": "green"}}
    assert ours.to_dict() == theirs.to_dict()
    assert ours.to_dict()["square"] == {"side": 3.0, "label": "sq"}

    ours.circle = 1.5
    ours.square = {"label": "again"}  # selected afresh: side back to its default
    assert (ours.which(), ours.square.side, ours.square.label) == ("square", 0.0, "again")
    ours.style.fill.gradient = (kitchen.Color.red, kitchen.Color.blue)  # its row: the whole
    assert ours.as_reader().style.fill.gradient.to_dict() == {"from": "red", "to": "blue"}

    before = ours.to_bytes()
    for wrong, error in (
        ({"side": "wide"}, TypeError),
        ({"nothing": None}, TypeError),
        (3, TypeError),
    ):
        with pytest.raises(error):
            ours.square = wrong
        assert ours.to_bytes() == before
    ours.circle = 2.0
    with pytest.raises(TypeError):
        ours.square = {"side": "wide"}
    assert ours.to_bytes() != before  # (the circle)
    assert ours.which() == "circle"


def test_a_list_copied_into_one_of_its_own_elements_is_copied_as_it_was(
    generated: Generated,
) -> None:
    """``t.children[0].children = t.children`` copies the list as it was before the
    assignment (value semantics), not the copy in progress: the elements being built were
    read after the new list was already pointed at (found by a sweep)."""
    kitchen = generated.kitchen
    tree = kitchen.Tree.new_message(value=0, children=[{"value": 1}, {"value": 2}])
    tree.children[0].children = tree.children
    assert tree.as_reader().to_dict()["children"] == [
        {"value": 1, "children": [{"value": 1}, {"value": 2}]},
        {"value": 2},
    ]
    tree.assign(value=5, children=[tree.children[1], tree.children[0]])
    assert [child.value for child in tree.as_reader().children] == [2, 1]
    assert tree.as_reader().children[1].children[1].value == 2


def test_a_refused_value_names_the_field_and_changes_nothing(generated: Generated) -> None:
    kitchen = generated.kitchen
    numbers = kitchen.Numbers.new_message(u8=1, i16=-2)
    before = bytes(numbers.to_segments()[0])
    with pytest.raises(ValueError, match=r"^Numbers\.u8: 300 is out of range for UInt8"):
        numbers.assign(i16=5, u8=300)
    with pytest.raises(TypeError, match=r"^Numbers\.assign\(\): Numbers has no field 'kee'"):
        numbers.assign(i16=5, kee=1)  # type: ignore[call-arg]
    assert bytes(numbers.to_segments()[0]) == before
    tree = kitchen.Tree.new_message(value=5)
    before = bytes(tree.to_segments()[0])
    with pytest.raises(TypeError, match=r"^Tree\.value: expected an int \(Int32\), got str"):
        tree.assign(children=[{"value": 1}, {"value": "x"}])
    assert bytes(tree.to_segments()[0]) == before


def test_union_members_one_at_a_time_by_name(generated: Generated) -> None:
    shapes = generated.kitchen.Shapes
    square = shapes.new_message(square={"side": 2.0}, style={"fill": {"pattern": "dots"}})
    reader = square.as_reader()
    assert (reader.which(), reader.square.side, reader.style.fill.which()) == (
        "square",
        2.0,
        "pattern",
    )
    assert shapes.new_message(nothing=None).as_reader().which() == "nothing"
    with pytest.raises(TypeError, match=r"one union member at a time, not both circle and"):
        shapes.new_message(circle=1.0, square={"side": 2.0})
    with pytest.raises(TypeError, match=r"^Shapes\.square: expected a dict of Shapes\.square"):
        shapes.new_message(square=2.0)  # type: ignore[arg-type]


def test_enums_by_code_member_or_name(generated: Generated) -> None:
    kitchen = generated.kitchen
    blue = kitchen.Color.blue
    for value in (int(blue), blue, "blue"):
        assert kitchen.Numbers.new_message(color=value).as_reader().color == blue
    with pytest.raises(ValueError, match=r"Numbers\.color: Color has no enumerant 'mauve'"):
        kitchen.Numbers.new_message(color="mauve")


async def test_to_dict_gives_capabilities_and_any_pointers_for_new_message(
    generated: Generated,
) -> None:
    """``to_dict`` gives a capability as its client and an AnyPointer as its reader, as
    pycapnp's does, so ``new_message(**reader.to_dict())`` copies them too: the copy's
    clients call the same object, a null one stays null."""
    k = generated.kitchen

    class Shop(k.Shop.Server):  # type: ignore[misc, name-defined]
        def list(self, params: Any, results: Any) -> None:
            results.set_items(["kept"])

    shop = Shop()
    source = k.Anything.new_message(pointer="text", capability=shop, shop=shop, shops=[shop, None])
    data = source.as_reader().to_dict()
    assert set(data) == {"pointer", "capability", "shop", "shops"}
    copy = k.Anything.new_message(**data).as_reader()
    assert copy.pointer.as_text() == "text"
    assert copy.anyStruct.is_null
    assert (await copy.shop.list()).items == ["kept"]
    assert (await copy.capability.cast_as(k.Shop).list()).items == ["kept"]
    assert (await copy.shops[0].list()).items == ["kept"]
    assert copy.shops[1]._capsvc_hook().is_null


def test_an_enum_setter_takes_a_name_as_new_message_does(generated: Generated) -> None:
    """``builder.color = "blue"`` as pycapnp's setters and ``new_message(color="blue")``
    take it (an XOR default too); an unknown name or a code out of range is an error
    naming the field, a float a TypeError, and none of them changes the field."""
    k = generated.kitchen
    for builder in (k.Numbers.new_message(), k.Defaults.new_message()):
        builder.color = "red"
        assert builder.color is k.Color.red
        builder.color = k.Color.green
        assert builder.as_reader().color is k.Color.green
        with pytest.raises(ValueError, match=r"\.color: Color has no enumerant 'purple' \("):
            builder.color = "purple"
        with pytest.raises(TypeError, match=r"\.color: expected a Color \(an int or a name\)"):
            builder.color = 2.5
        with pytest.raises(ValueError, match=r"\.color: 70000 is not an enum code \(0\.\.65535\)"):
            builder.color = 70000
        assert builder.color is k.Color.green
