"""Selections: some of a struct's fields as rows (``T.select``; capsvc.codec.rows).

A selection's row must hold what the generated reader's properties hold for the fields
it selects, in schema order, a narrowed struct, list or group field holding rows of its
own selection: for every struct of tests/schemas/kitchen.capnp, random selections of
random messages (pycapnp builds them, also spread over one-word segments), on both
readers of rows (C and Python, the ``row_path`` fixture of test_rows). What it leaves
out it does not read: a fault there costs nothing and is not found. Hostile messages
read as the reader reads them, with the same traversal budget in C and Python.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsvc.codec import rows as rows_module
from capsvc.codec.plans import GROUP, LIST, STRUCT, FieldPlan, StructPlan
from capsvc.errors import DecodeError
from tests.codegen.conftest import Generated
from tests.codegen.test_roundtrip import (
    STRUCTS,
    generated_type,
    new_reference,
    reference_type,
    spread,
)
from tests.codegen.test_rows import (
    _mutated,
    comparable,
    outcomes_of_both_readers,
    plan_of,
    reference_row,
    row_fields,
    row_path,
    seeds,
)
from tests.codegen.values import struct_named, values

__all__ = ["row_path", "seeds"]  # the fixtures, shared with test_rows

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


def _holds(field: FieldPlan) -> StructPlan | None:
    """The struct (or group) whose fields a selection of ``field`` may narrow to."""
    if field.kind in (STRUCT, GROUP):
        return field.target
    if field.kind == LIST and field.list is not None and field.list.kind == STRUCT:
        return field.list.target
    return None


def _draw_selection(
    data: st.DataObject, plan: StructPlan, depth: int = 0
) -> tuple[list[str], dict[str, Any]]:
    """Field names to select whole, and narrowed fields with their selections (a
    ``Selection`` or a tuple of names), drawn from ``plan``'s fields."""
    chosen = data.draw(st.lists(st.sampled_from(plan.keys), min_size=1, unique=True))
    names: list[str] = []
    nested: dict[str, Any] = {}
    for key in chosen:
        target = _holds(plan.fields[key])
        if target is not None and depth < 2 and data.draw(st.booleans()):
            inner, inner_nested = _draw_selection(data, target, depth + 1)
            if inner_nested or data.draw(st.booleans()):
                nested[key] = rows_module.select(target, tuple(inner), inner_nested)
            else:
                nested[key] = tuple(inner)
        else:
            names.append(key)
    return names, nested


@pytest.mark.parametrize(("scope", "file_index"), STRUCTS)
def test_a_selection_holds_what_readers_read(
    generated: Generated, scope: str, file_index: int
) -> None:
    """pycapnp builds, a random selection reads: the reader's values of the fields it
    selects (and of those it narrows, the ones their selections name), also with far
    pointers; a field selected whole holds what the whole row holds."""
    struct_ = struct_named(generated.schema, scope, file_index)
    ours = generated_type(generated, scope, file_index)
    reference = reference_type(generated, scope, file_index)

    @SETTINGS
    @given(values(generated.schema, struct_), st.booleans(), st.data())
    def check(data: dict[str, Any], far: bool, draw: st.DataObject) -> None:
        names, nested = _draw_selection(draw, plan_of(ours))
        selection = ours.select(*names, **nested)
        message = new_reference(reference, data)
        segments = spread(message) if far else [bytes(s) for s in message.to_segments()]
        row = selection.row(ours.Reader.read(segments))
        expected = reference_row(ours.Reader.read(segments), selection.plan)
        assert comparable(row) == comparable(expected)
        assert len(row) == len(selection.labels)
        whole = row_fields(plan_of(ours), ours.row(ours.Reader.read(segments)))
        mine = row_fields(selection.plan, row)
        for key in names:
            assert comparable(mine[key]) == comparable(whole[key])

    check()


def test_a_selection_of_a_car_like_list(generated: Generated) -> None:
    """The shape the carsales benchmark reads: a few fields of every element of a list,
    a nested struct narrowed too; of a list read or being built, and of a root."""
    k = generated.kitchen
    items = [{"i32": n, "color": "green", "i64": -n, "f64": n / 2} for n in range(40)]
    lists = k.Lists.new_message(structs=items)
    chosen = k.Numbers.select("i32", "color")
    assert chosen.labels == ["i32", "color"]
    assert repr(chosen) == "<Numbers selection: i32, color>"
    expected = [(n, k.Color.green) for n in range(40)]
    assert chosen.rows(lists.as_reader().structs) == expected
    built = k.Lists.new_message().init_structs(40)
    for n, item in enumerate(built):
        item.i32, item.color = n, k.Color.green
    assert chosen.rows(built) == expected
    outer = k.Lists.select("i32s", structs=("f64", "i32"))  # schema order, not the given one
    assert repr(outer) == "<Lists selection: i32s, structs(i32, f64)>"
    row = outer.row(lists)
    assert row == ([], [(n, n / 2) for n in range(40)])
    assert outer.row(lists.as_reader()) == row
    assert k.Lists.select(structs="i64").row(lists) == ([(-n,) for n in range(40)],)


def test_a_selection_of_groups_and_unions(generated: Generated) -> None:
    """A narrowed group that is not a union member splices its selected fields in; one
    that is a union member is its selection's row, or None; a union member not set is
    None."""
    k = generated.kitchen
    shapes = k.Shapes.new_message(
        name="sq",
        square={"side": 2.5, "label": "two"},
        style={"color": "blue", "fill": {"gradient": {"from": "red", "to": "green"}}},
    )
    chosen = k.Shapes.select("circle", square=("label",), style=("color",))
    assert chosen.labels == ["circle", "square", "style.color"]
    assert chosen.row(shapes) == (None, ("two",), k.Color.blue)
    fill = k.Shapes.select(style=("fill",))
    assert fill.row(shapes) == (None, None, (k.Color.red, k.Color.green))
    circle = k.Shapes.new_message(circle=1.5)
    assert chosen.row(circle) == (1.5, None, k.Color.red)  # (the default: code 0)


def test_what_a_selection_leaves_out_is_not_read(generated: Generated) -> None:
    """A Text field that is not UTF-8 fails the whole row, not a selection without it,
    and a selection charges the traversal budget only for what it reads."""
    k = generated.kitchen
    shapes = k.Shapes.new_message(name="ab", square={"side": 1.0, "label": "cd"})
    segment = bytearray(shapes.to_segments()[0])
    at = segment.index(b"ab\x00")
    segment[at : at + 2] = b"\xff\xfe"
    segments = [bytes(segment)]
    with pytest.raises(DecodeError, match="UTF-8"):
        k.Shapes.row(k.Shapes.Reader.read(segments))
    reader = k.Shapes.Reader.read(segments)
    before = reader._msg.budget
    assert k.Shapes.select(square=("side",)).row(reader) == ((1.0,),)
    assert reader._msg.budget == before  # a group is in its struct: nothing followed
    assert k.Shapes.select(square=("label",)).row(reader) == (("cd",),)
    assert reader._msg.budget < before


def test_selection_mistakes_name_the_schema(generated: Generated) -> None:
    k = generated.kitchen
    cases: list[tuple[Any, str]] = [
        (lambda: k.Numbers.select("kee"), r"Numbers\.select\(\): Numbers has no field 'kee'"),
        (lambda: k.Numbers.select(), r"Numbers\.select\(\) selects nothing: name at least one"),
        (lambda: k.Numbers.select(3), r"Numbers\.select\(\) takes field names, not int"),
        (lambda: k.Lists.select("structs", structs=("i32",)), r"Lists\.structs is selected twice"),
        (
            lambda: k.Lists.select(i32s=("x",)),
            r"Lists\.i32s is List: only a struct, a list of structs or a group",
        ),
        (
            lambda: k.Lists.select(structs=k.Shapes.select("name")),
            r"Lists\.structs holds Numbers, not Shapes",
        ),
        (lambda: k.Lists.select(structs=3), r"takes a Numbers selection, or one .* not int"),
        (lambda: k.Lists.select(structs=("kee",)), r"Numbers has no field 'kee'"),
    ]
    for make, message in cases:
        with pytest.raises(TypeError, match=message):
            make()
    with pytest.raises(TypeError, match=r"Numbers\.row\(\) takes a Numbers reader or builder"):
        k.Numbers.select("i32").row(k.Shapes.new_message())
    tree = k.Tree.new_message().init_children(1)
    with pytest.raises(TypeError, match=r"Numbers\.rows\(\) takes a list of Numbers, not of"):
        k.Numbers.select("i32").rows(tree)


# ---------------------------------------------------------------------- hostile input
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hostile_messages_read_as_the_reader_reads_them(
    generated: Generated, seeds: list[tuple[str, list[bytes]]], data: st.DataObject
) -> None:
    """Words of a valid message replaced, a random selection: C and Python give the same
    row and budget, or the same DecodeError, and the row is the reader's values."""
    name, frozen = _mutated(seeds, data, least=0)
    kind = getattr(generated.kitchen, name)
    names, nested = _draw_selection(data, plan_of(kind))
    selection = kind.select(*names, **nested)
    limit = data.draw(st.sampled_from([1 << 12, 64, 16]))
    outcomes = outcomes_of_both_readers(kind, frozen, limit, selection.row)
    assert all(outcome == outcomes[0] for outcome in outcomes)
    outcome, _ = outcomes[0]
    try:
        reader = kind.Reader.read(frozen, traversal_limit_words=limit)
        expected: Any = comparable(reference_row(reader, selection.plan))
    except DecodeError:
        assert isinstance(outcome, str)
        assert outcome.startswith("DecodeError")
        return
    assert outcome == expected


def test_a_pointer_loop_under_a_selection_is_refused(generated: Generated) -> None:
    """A list whose struct pointer points back at itself: refused by the nesting or
    traversal limit, not followed forever."""
    k = generated.kitchen
    tree = k.Tree.new_message(value=1, left={"value": 2})
    segment = bytearray(tree.to_segments()[0])
    plan = plan_of(k.Tree)
    # The root's ``left`` pointer aimed back at the root (word 1: word 0 points at it).
    at = 1 + plan.data_words + plan.fields["left"].offset
    offset = 1 - (at + 1)  # a struct pointer's offset counts from the word after it
    word = (offset << 2) & 0xFFFFFFFF | plan.data_words << 32 | plan.pointers << 48
    segment[at * 8 : at * 8 + 8] = struct.pack("<Q", word)
    selection = k.Tree.select("value", left=("value", "left"))
    with pytest.raises(DecodeError):
        selection.row(k.Tree.Reader.read([bytes(segment)], nesting_limit=64))
