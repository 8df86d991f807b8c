"""Schema evolution through generated codecs: struct-size upgrades both ways, list upgrades.

tests/schemas/evolution_v1.capnp and evolution_v2.capnp have the same file and struct IDs;
v2 adds data and pointer fields (some with non-zero defaults) and upgrades a List(Int32)
and a List(Text) to lists of structs whose first field is the old element (the encoding
spec allows both: specs/codegen.md §2). Both versions are generated into one temporary
directory (their modules have different names). pycapnp, the C++ reference, would clash
on the shared IDs if it loaded both in this process, so it runs in a subprocess per
version (``_pycapnp``), loading only that one.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

from capsvc.codegen import schema_of_paths, sources, write

SCHEMAS = os.path.join(os.path.dirname(__file__), "..", "schemas")

#: What a v2 reader gives for the fields v1 does not have (non-pointer ones: to_dict
#: leaves null pointers out, whatever their default).
V2_DATA_DEFAULTS = {"flag": True, "count": -42, "score": 2.5, "color": "blue"}


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType]:
    directory = str(tmp_path_factory.mktemp("evolution"))
    for name in ("evolution_v1.capnp", "evolution_v2.capnp"):
        write(sources(schema_of_paths([os.path.join(SCHEMAS, name)])), directory)
    sys.path.insert(0, directory)
    try:
        v1 = importlib.import_module("evolution_v1_capnp")
        v2 = importlib.import_module("evolution_v2_capnp")
    finally:
        sys.path.remove(directory)
    return v1, v2


_REFERENCE = """
import json, sys
import capnp
request = json.load(sys.stdin)
module = capnp.load(request["schema"])
out = []
for op in request["ops"]:
    kind = getattr(module, op["root"])
    if "data" in op:
        message = kind.new_message(**op["data"])
        out.append([bytes(segment).hex() for segment in message.to_segments()])
    else:
        segments = [bytes.fromhex(segment) for segment in op["segments"]]
        out.append(kind.from_segments(segments).to_dict())
print(json.dumps(out))
"""


def _pycapnp(version: int, ops: list[dict[str, Any]]) -> list[Any]:
    """Run ``ops`` with pycapnp on evolution_v{version}.capnp, in a subprocess: each op
    builds a message from ``data`` (its segments come back) or reads ``segments`` (its
    to_dict comes back)."""
    schema = os.path.join(SCHEMAS, f"evolution_v{version}.capnp")
    done = subprocess.run(
        [sys.executable, "-c", _REFERENCE],
        input=json.dumps({"schema": schema, "ops": ops}).encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    result: list[Any] = json.loads(done.stdout)
    return result


def _build(version: int, root: str, data: dict[str, Any]) -> list[bytes]:
    (segments,) = _pycapnp(version, [{"root": root, "data": data}])
    return [bytes.fromhex(segment) for segment in segments]


def _read(version: int, root: str, segments: list[bytes] | list[bytearray]) -> Any:
    (result,) = _pycapnp(version, [{"root": root, "segments": [bytes(s).hex() for s in segments]}])
    return result


def _root_sizes(segments: list[bytes] | list[bytearray]) -> tuple[int, int]:
    """(data words, pointers) of the root struct pointer."""
    (word,) = struct.unpack_from("<Q", segments[0], 0)
    assert word & 3 == 0
    return (word >> 32) & 0xFFFF, word >> 48


def _v1_message(v1: ModuleType) -> list[bytearray]:
    """A v1 Record with every field set (and a v1 child with a grandchild)."""
    b = v1.Record.new_message()
    b.id = 7
    b.name = "seven"
    b.set_values([1, -2, 2**31 - 1, -(2**31)])
    child = b.init_child()
    child.id = 8
    child.name = "eight"
    child.init_child().id = 9
    b.set_words(["alpha", "", "gamma"])
    things = b.init_things(2)
    things[0].x = 10
    things[1].x = -11
    segments: list[bytearray] = b.to_segments()
    return segments


def _v2_message(v2: ModuleType) -> list[bytearray]:
    """A v2 Record with every field set, none at its default."""
    b = v2.Record.new_message()
    b.id = 70
    b.name = "seventy"
    values = b.init_values(3)
    for index, (x, label) in enumerate([(1, "one"), (-2, "minus two"), (2**31 - 1, "")]):
        values[index].x = x
        values[index].label = label
        values[index].weight = index + 0.25
    child = b.init_child()
    child.id = 80
    child.count = 5
    child.note = "child note"
    words = b.init_words(2)
    words[0].text = "alpha"
    words[0].n = 1
    words[1].text = "beta"
    words[1].n = 0
    things = b.init_things(1)
    things[0].x = 100
    things[0].label = "hundred"
    b.flag = False
    b.count = 123456789012
    b.score = -1.5
    b.note = "noted"
    extra = b.init_extra()
    extra.x = 6
    b.set_tags(["x", "y", "z"])
    b.color = v2.Color.green
    segments: list[bytearray] = b.to_segments()
    return segments


V1_DICT = {
    "id": 7,
    "name": "seven",
    "values": [1, -2, 2**31 - 1, -(2**31)],
    "child": {"id": 8, "name": "eight", "child": {"id": 9}},
    "words": ["alpha", "", "gamma"],
    "things": [{"x": 10}, {"x": -11}],
}


# ---------------------------------------------------------------------- old writer, new reader
def test_schemas_differ_in_struct_sizes(modules: tuple[ModuleType, ModuleType]) -> None:
    v1, v2 = modules
    assert (v1.Record.Reader._DATA_WORDS, v1.Record.Reader._POINTERS) == (1, 5)
    assert (v2.Record.Reader._DATA_WORDS, v2.Record.Reader._POINTERS) == (3, 8)
    assert (v1.Item.Reader._DATA_WORDS, v1.Item.Reader._POINTERS) == (1, 0)
    assert (v2.Item.Reader._DATA_WORDS, v2.Item.Reader._POINTERS) == (2, 1)
    assert v1.Record._ID == v2.Record._ID
    assert v1.Item._ID == v2.Item._ID


def test_v1_message_reads_as_v2_with_defaults(modules: tuple[ModuleType, ModuleType]) -> None:
    v1, v2 = modules
    segments = _v1_message(v1)
    assert _root_sizes(segments) == (1, 5)  # smaller than v2's (3, 8) in both sections
    r = v2.Record.Reader.read(segments)
    assert (r.id, r.name) == (7, "seven")
    # Fields v1 never wrote read as their (non-zero) defaults.
    assert r.flag is True
    assert r.count == -42
    assert r.score == 2.5
    assert r.color is v2.Color.blue
    assert r.note == "unset"
    assert (r.extra.x, r.extra.label, r.extra.weight) == (5, "five", 0.5)
    assert list(r.tags) == ["a", "b"]
    # The child is a v1-sized struct too, and so is its child.
    assert (r.child.id, r.child.name, r.child.count, r.child.note) == (8, "eight", -42, "unset")
    assert (r.child.child.id, r.child.child.flag, r.child.child.extra.x) == (9, True, 5)
    assert r.child.child.child.id == 0  # null: an all-defaults struct
    assert r.child.child.child.count == -42


def test_v1_message_to_dict_as_v2(modules: tuple[ModuleType, ModuleType]) -> None:
    v1, v2 = modules
    got = v2.Record.Reader.read(_v1_message(v1)).to_dict()
    assert got == {
        "id": 7,
        "name": "seven",
        # Each number is an Item's x; its label is a null Text (left out), its weight 0.5.
        "values": [{"x": x, "weight": 0.5} for x in (1, -2, 2**31 - 1, -(2**31))],
        "child": {
            "id": 8,
            "name": "eight",
            "child": {"id": 9, **V2_DATA_DEFAULTS},
            **V2_DATA_DEFAULTS,
        },
        "words": [{"text": "alpha", "n": 3}, {"text": "", "n": 3}, {"text": "gamma", "n": 3}],
        "things": [{"x": 10, "weight": 0.5}, {"x": -11, "weight": 0.5}],
        **V2_DATA_DEFAULTS,
    }


def test_v1_message_pycapnp_v2_agrees(modules: tuple[ModuleType, ModuleType]) -> None:
    """Generated v1 bytes: generated v2 and pycapnp v2 read the same (and pycapnp v1 reads
    what generated v1 does)."""
    v1, v2 = modules
    segments = _v1_message(v1)
    assert _read(2, "Record", segments) == v2.Record.Reader.read(segments).to_dict()
    assert _read(1, "Record", segments) == V1_DICT == v1.Record.Reader.read(segments).to_dict()


def test_pycapnp_v1_message_reads_as_v2(modules: tuple[ModuleType, ModuleType]) -> None:
    v1, v2 = modules
    segments = _build(1, "Record", V1_DICT)
    assert _root_sizes(segments) == (1, 5)
    assert v1.Record.Reader.read(segments).to_dict() == V1_DICT
    assert v2.Record.Reader.read(segments).to_dict() == _read(2, "Record", segments)


def test_empty_struct_reads_as_all_defaults(modules: tuple[ModuleType, ModuleType]) -> None:
    """A struct pointer with no data and no pointers (offset -1, as C++ writes it)."""
    _, v2 = modules
    root = struct.pack("<Q", (-1 << 2) & 0xFFFFFFFF)
    r = v2.Record.Reader.read([root])
    assert r.to_dict() == {"id": 0, **V2_DATA_DEFAULTS}
    assert (r.note, r.extra.label, list(r.tags), len(r.values)) == ("unset", "five", ["a", "b"], 0)


# ---------------------------------------------------------------------- new writer, old reader
def test_v2_message_reads_as_v1(modules: tuple[ModuleType, ModuleType]) -> None:
    v1, v2 = modules
    segments = _v2_message(v2)
    assert _root_sizes(segments) == (3, 8)  # larger than v1's: the extra is ignored
    r = v1.Record.Reader.read(segments)
    assert r.to_dict() == {
        "id": 70,
        "name": "seventy",
        "values": [1, -2, 2**31 - 1],
        "child": {"id": 80},
        "words": ["alpha", "beta"],
        "things": [{"x": 100}],
    }
    assert v2.Record.Reader.read(segments).to_dict()["tags"] == ["x", "y", "z"]


def test_v2_message_pycapnp_v1_agrees(modules: tuple[ModuleType, ModuleType]) -> None:
    v1, v2 = modules
    segments = _v2_message(v2)
    assert _read(1, "Record", segments) == v1.Record.Reader.read(segments).to_dict()
    assert _read(2, "Record", segments) == v2.Record.Reader.read(segments).to_dict()


def test_pycapnp_v2_message_reads_as_v1(modules: tuple[ModuleType, ModuleType]) -> None:
    v1, v2 = modules
    data = {
        "id": 1,
        "values": [{"x": 3, "label": "three", "weight": 9.0}, {"x": -4}],
        "words": [{"text": "w", "n": 200}],
        "things": [{"x": 5, "label": "l"}],
        "child": {"id": 2, "note": "n", "tags": ["t"]},
        "count": 1,
        "color": "red",
    }
    segments = _build(2, "Record", data)
    assert v2.Record.Reader.read(segments).to_dict() == _read(2, "Record", segments)
    assert v1.Record.Reader.read(segments).to_dict() == {
        "id": 1,
        "values": [3, -4],
        "child": {"id": 2},
        "words": ["w"],
        "things": [{"x": 5}],
    }


# ---------------------------------------------------------------------- list upgrades
def test_list_int32_upgraded_to_structs(modules: tuple[ModuleType, ModuleType]) -> None:
    """List(Int32) written, List(Item) read: each number is the element's first field."""
    v1, v2 = modules
    b = v1.Record.new_message()
    b.set_values([0, 5, -6])
    values = v2.Record.Reader.read(b.to_segments()).values
    assert [(item.x, item.label, item.weight) for item in values] == [
        (0, "", 0.5),
        (5, "", 0.5),
        (-6, "", 0.5),
    ]
    assert values[-1].x == -6
    assert values[1].to_dict() == {"x": 5, "weight": 0.5}


def test_list_of_structs_read_as_int32(modules: tuple[ModuleType, ModuleType]) -> None:
    """List(Item) written (composite, 2 data words and a pointer each), List(Int32) read."""
    v1, v2 = modules
    b = v2.Record.new_message()
    items = b.init_values(3)
    for index, x in enumerate([7, -8, 9]):
        items[index].x = x
        items[index].weight = 1e300
        items[index].label = str(x)
    values = v1.Record.Reader.read(b.to_segments()).values
    assert list(values) == [7, -8, 9]
    assert values[-1] == 9


def test_empty_lists_upgrade_both_ways(modules: tuple[ModuleType, ModuleType]) -> None:
    v1, v2 = modules
    old = v1.Record.new_message()
    old.set_values([])
    old.set_words([])
    r2 = v2.Record.Reader.read(old.to_segments())
    assert (len(r2.values), len(r2.words)) == (0, 0)
    assert r2.to_dict()["values"] == []
    assert r2.to_dict()["words"] == []
    new = v2.Record.new_message()
    new.init_values(0)
    new.init_words(0)
    r1 = v1.Record.Reader.read(new.to_segments())
    assert (list(r1.values), list(r1.words)) == ([], [])


def test_list_text_upgraded_to_structs(modules: tuple[ModuleType, ModuleType]) -> None:
    """List(Text) written (a list of pointers), List(Word) read: the text is the first
    pointer of each element, the rest defaults."""
    v1, v2 = modules
    b = v1.Record.new_message()
    b.set_words(["one", "two"])
    words = v2.Record.Reader.read(b.to_segments()).words
    assert [(word.text, word.n) for word in words] == [("one", 3), ("two", 3)]
    assert [word.to_dict() for word in words] == [{"text": "one", "n": 3}, {"text": "two", "n": 3}]


def test_list_of_structs_read_as_text(modules: tuple[ModuleType, ModuleType]) -> None:
    v1, v2 = modules
    b = v2.Record.new_message()
    words = b.init_words(3)
    words[0].text = "first"
    words[0].n = 9
    words[2].text = "third"  # words[1] keeps a null text: reads as ""
    assert list(v1.Record.Reader.read(b.to_segments()).words) == ["first", "", "third"]


def test_smaller_list_elements_read_as_larger(modules: tuple[ModuleType, ModuleType]) -> None:
    """A List(Item) of v1 Items (1 data word, no pointers) read with v2's larger Item, and
    v2's larger Items read with v1's."""
    v1, v2 = modules
    old = v1.Record.new_message()
    things = old.init_things(2)
    things[0].x = 1
    things[1].x = 2
    read = v2.Record.Reader.read(old.to_segments()).things
    assert [(t.x, t.label, t.weight) for t in read] == [(1, "", 0.5), (2, "", 0.5)]
    new = v2.Record.new_message()
    things = new.init_things(2)
    things[0].x = 3
    things[1].x = 4
    things[1].label = "four"
    assert [t.x for t in v1.Record.Reader.read(new.to_segments()).things] == [3, 4]


def test_an_older_struct_copied_into_a_builder_is_upgraded_when_built_on(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    """A v1 Record copied into a v2 builder keeps v1's sizes, as libcapnp's copy does;
    setting a field v1 has no room for first moves it to a struct of v2's size (libcapnp's
    builders upgrade it so), the nested v1 child and a list of v1 structs too: nothing is
    written past its end, and pycapnp reads back every field."""
    v1, v2 = modules
    old = v2.Record.read(_v1_message(v1))
    holder = v2.Record.new_message(id=1)
    holder.child = old
    holder.child.note = "set on the copy"
    holder.child.count = 12
    holder.child.child.flag = False  # the v1 grandchild, upgraded in turn
    holder.child.child.child = {"id": 99}
    holder.child.extra = {"x": 6, "label": "six"}
    things = holder.child.things  # v1's one-word Items: upgraded to v2's size first
    things[0].label = "ten"
    things[1].weight = 2.0
    holder.child.values[0].label = "one"  # v1's List(Int32): now v2's Items, x kept
    holder.child.words[2].n = 9  # v1's List(Text): now v2's Words, text kept
    segments = holder.to_segments()
    for got in (v2.Record.read(segments).to_dict(), _read(2, "Record", segments)):
        child = got["child"]
        assert (child["id"], child["name"], child["note"], child["count"]) == (
            7,
            "seven",
            "set on the copy",
            12,
        )
        assert child["extra"] == {"x": 6, "label": "six", "weight": 0.5}
        assert child["child"]["id"] == 8
        assert child["child"]["flag"] is False
        assert child["child"]["child"] == {**V2_DATA_DEFAULTS, "id": 99}
        assert child["things"] == [
            {"x": 10, "label": "ten", "weight": 0.5},
            {"x": -11, "weight": 2.0},
        ]
        assert [value["x"] for value in child["values"]] == [1, -2, 2**31 - 1, -(2**31)]
        assert child["values"][0]["label"] == "one"
        assert child["words"][2] == {"text": "gamma", "n": 9}
        assert child["words"][0] == {"text": "alpha", "n": 3}


def test_a_newer_struct_copied_into_a_builder_keeps_what_it_does_not_know(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    """A v2 Record copied into a v1 builder is built in place: v1's fields land where
    the larger struct (and its list of larger Items) has them, and v2's fields survive
    the edits, as pycapnp's v2 reads it."""
    v1, v2 = modules
    new = v1.Record.read(_v2_message(v2))
    holder = v1.Record.new_message(id=1)
    holder.child = new
    holder.child.id = 71
    holder.child.name = "renamed"
    holder.child.child = {"id": 81}
    things = holder.child.things  # v2's larger Items, built in place
    things[0].x = 101
    assert [thing.x for thing in things] == [101]
    # The builder's own view reads the larger struct where its pointers are.
    assert holder.child.as_reader().name == "renamed"
    assert holder.to_dict()["child"]["child"] == {"id": 81}
    assert new.as_builder().to_dict() == new.to_dict()
    for got in (
        v2.Record.read(holder.to_segments()).to_dict(),
        _read(2, "Record", holder.to_segments()),
    ):
        child = got["child"]
        assert (child["id"], child["name"], child["flag"], child["color"]) == (
            71,
            "renamed",
            False,
            "green",
        )
        assert child["child"]["id"] == 81
        assert child["things"] == [{"x": 101, "label": "hundred", "weight": 0.5}]


def test_a_newer_struct_held_by_a_builder_is_copied_whole(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    """Copying from a v1 builder that holds a v2 struct (``dst.child = builder.child``,
    or its ``as_reader()``) keeps v2's pointer fields, as libcapnp's copy keeps them: the
    builder knows where its pointer section ends (found by a sweep against pycapnp)."""
    v1, v2 = modules
    original = v2.Record.read(_v2_message(v2)).to_dict()
    holder = v1.Record.new_message()
    holder.child = v1.Record.read(_v2_message(v2))
    for copied in (holder.child, holder.child.as_reader()):
        dst = v1.Record.new_message()
        dst.child = copied
        assert v2.Record.read(dst.to_segments()).to_dict()["child"] == original
        assert _read(2, "Record", v1.Record.new_message(child=copied).to_segments())[
            "child"
        ] == _read(2, "Record", _v2_message(v2))


def test_an_older_builder_edits_lists_a_newer_writer_upgraded_to_structs(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    """v2 made List(Int32) and List(Text) lists of structs whose first field is the old
    element: a v1 builder uses them in place, as libcapnp's does (each element its
    struct's first data bits, or first pointer), and v2's other fields survive the edits
    (found by a sweep against pycapnp: it raised ValueError before)."""
    v1, v2 = modules
    builder = v1.Record.read(_v2_message(v2)).as_builder()
    assert list(builder.values) == [1, -2, 2**31 - 1]
    assert list(builder.words) == ["alpha", "beta"]
    builder.values[1] = 40
    builder.values.set_all([7, 40, -9])
    builder.words[-1] = "gamma"
    assert (list(builder.values), builder.words[1]) == ([7, 40, -9], "gamma")
    for got in (
        v2.Record.read(builder.to_segments()).to_dict(),
        _read(2, "Record", builder.to_segments()),
    ):
        assert got["values"] == [
            {"x": 7, "label": "one", "weight": 0.25},
            {"x": 40, "label": "minus two", "weight": 1.25},
            {"x": -9, "label": "", "weight": 2.25},
        ]
        assert got["words"] == [{"text": "alpha", "n": 1}, {"text": "gamma", "n": 0}]
    with pytest.raises(IndexError, match=r"Record\.values: index 3 out of range"):
        builder.values[3] = 1


def test_a_list_of_newer_structs_is_copied_at_their_size(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    """A list of v2's larger Items given to a v1 field (a list reader, a list being
    built, or its elements among dicts) is written at the larger size, so v2's fields
    survive the copy, as libcapnp's copy of the list keeps them."""
    v1, v2 = modules
    reader = v1.Record.read(_v2_message(v2))
    builder = reader.as_builder()
    for value in (reader.things, builder.things, [builder.things[0], {"x": 3}]):
        dst = v1.Record.new_message(things=value)
        copied = v2.Record.read(dst.to_segments()).to_dict()["things"]
        assert copied[0] == {"x": 100, "label": "hundred", "weight": 0.5}
        assert copied[1:] in ([], [{"x": 3, "weight": 0.5}])
        assert _read(2, "Record", dst.to_segments())["things"] == copied
        dst.things = value  # (the setter: the same encoder)
        assert v2.Record.read(dst.to_segments()).to_dict()["things"] == copied


def test_a_dict_set_over_a_newer_struct_keeps_what_this_schema_does_not_know(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    """``builder.child = {...}`` sets the fields given on the struct the field holds, in
    place (pycapnp's ``from_dict``): a newer writer's fields there survive, at every
    depth, and so does a pointer left null (no default comes back)."""
    v1, v2 = modules
    builder = v1.Record.read(_v2_message(v2)).as_builder()
    builder.child = {"id": 81, "child": {"name": "grandchild"}}
    got = v2.Record.read(builder.to_segments()).to_dict()["child"]
    assert (got["id"], got["count"], got["note"]) == (81, 5, "child note")
    assert got["child"]["name"] == "grandchild"
    assert _read(2, "Record", builder.to_segments())["child"] == got


def test_assign_over_a_newer_struct_resets_only_what_this_schema_knows(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    """``assign`` on a v1 builder of a v2 struct (received, or copied in) sets v1's fields
    as a constructor would and leaves v2's as they are, the struct at its size: it wrote
    v1's smaller sections over the larger struct, shrinking the message under everything
    after it (found by a sweep against pycapnp)."""
    v1, v2 = modules
    before = v2.Record.read(_v2_message(v2)).to_dict()
    for holder in (
        v1.Record.read(_v2_message(v2)).as_builder(),
        v1.Record.new_message(child=v1.Record.read(_v2_message(v2))).child,
    ):
        holder.assign(name="assigned")
        for got in (
            v2.Record.read(holder.as_reader().as_builder().to_segments()).to_dict(),
            v2.Record.read(v1.Record.new_message(child=holder).to_segments()).to_dict()["child"],
        ):
            assert got["name"] == "assigned"
            assert "id" not in got or got["id"] == 0
            assert "child" not in got  # a pointer of v1's: null, as assign leaves it
            for newer in ("flag", "count", "score", "note", "extra", "color"):
                assert got.get(newer) == before.get(newer), newer
        assert v1.Record.row(holder)[:2] == (0, "assigned")


def test_a_field_holding_a_list_where_the_schema_has_a_struct_is_refused(
    modules: tuple[ModuleType, ModuleType],
) -> None:
    """A struct field whose pointer holds a list (a peer's message of another schema) is
    a ValueError naming it when a builder reaches it, as libcapnp refuses it; its words
    are never taken as a struct's (resized, or zeroed under another field)."""
    v1, _ = modules
    builder = v1.Record.new_message(words=["kept"])
    buf = builder._b.buf
    child_at = builder._ptr + 2  # (pointer slots: name, values, child, words, things)
    words_at = builder._ptr + 3
    word = int.from_bytes(buf[words_at * 8 : words_at * 8 + 8], "little")
    moved = (word & ~0xFFFFFFFC) | (((((word & 0xFFFFFFFF) >> 2) + 1) << 2) & 0xFFFFFFFF)
    buf[child_at * 8 : child_at * 8 + 8] = moved.to_bytes(8, "little")  # the same list
    for reach in (lambda: builder.child, lambda: setattr(builder, "child", {"id": 1})):
        with pytest.raises(ValueError, match=r"^Record: the field's pointer holds a list"):
            reach()
    assert list(builder.words) == ["kept"]
