"""capsvc.rpc.pointers: finding, reading and writing capability pointers in raw segments.

Messages are built with pycapnp (interface fields left null, since pycapnp cannot write
them), serialised with ``to_segments()``, patched with ``write_cap_index`` at ``follow``ed
locations, then read back both ways: ``read_cap_index`` for the capabilities, pycapnp for
everything else (``_has`` tells that pycapnp sees the capability word at the same slot).
Hostile inputs are hand-crafted from the word helpers below.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from typing import Any

import capnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsvc.errors import LocalProtocolError, RemoteProtocolError
from capsvc.rpc.pointers import (
    ROOT,
    Location,
    PointerError,
    field_path,
    follow,
    list_length,
    read_cap_index,
    read_struct_u16,
    scan_caps,
    write_cap_index,
    write_struct_u16,
)

HERE = os.path.dirname(os.path.abspath(__file__))
testing = capnp.load(os.path.join(HERE, "schemas", "testing.capnp"))
Holder = testing.Holder
PKG = os.path.dirname(capnp.__file__)
rpc = capnp.load(os.path.join(PKG, "rpc.capnp"), imports=[os.path.dirname(PKG)])

# Slot paths inside one Holder, from the schema.
CAP = field_path(Holder, "cap")
INNER = field_path(Holder, "inner")
CAPS = field_path(Holder, "caps")
ITEMS = field_path(Holder, "items")
COUNTER = field_path(Holder, "choice.counter")
CALLBACK = field_path(Holder, "extra.callback")

_HOLDER = Holder.schema.node.struct
_CHOICE = Holder.schema.fields["choice"].schema
CHOICE_OFFSET = _CHOICE.node.struct.discriminantOffset  # 16-bit units, in Holder's data
COUNTER_TAG = _CHOICE.fields["counter"].proto.discriminantValue


# --- raw words -------------------------------------------------------------------------


def struct_ptr(offset: int, data: int, ptrs: int) -> int:
    return ((offset << 2) & 0xFFFFFFFF) | (data << 32) | (ptrs << 48)


def list_ptr(offset: int, size: int, count: int) -> int:
    return ((offset << 2) & 0xFFFFFFFF) | 1 | (size << 32) | (count << 35)


def far_ptr(segment: int, pad: int, double: bool = False) -> int:
    return 2 | (4 if double else 0) | (pad << 3) | (segment << 32)


def cap_ptr(index: int) -> int:
    return 3 | (index << 32)


def seg(*words: int) -> bytearray:
    return bytearray(struct.pack(f"<{len(words)}Q", *words))


def at(
    segments: Sequence[bytes | bytearray], path: Sequence[int], start: Location = ROOT
) -> Location:
    """follow(), for a path known to reach a pointer."""
    loc = follow(segments, start, path)
    assert loc is not None
    return loc


def word_at(segments: Sequence[bytes | bytearray], loc: Location) -> int:
    return int.from_bytes(segments[loc[0]][loc[1] * 8 : loc[1] * 8 + 8], "little")


# --- pycapnp messages ----------------------------------------------------------------


def segments_of(builder: Any) -> list[bytearray]:
    return [bytearray(s) for s in builder.to_segments()]


def choose_counter(segments: list[bytearray], struct_path: tuple[int, ...]) -> None:
    """Set `choice` of the Holder at struct_path to `counter` (pycapnp cannot: it would need a
    capability value)."""
    write_struct_u16(segments, ROOT, struct_path, CHOICE_OFFSET, COUNTER_TAG)
    assert read_struct_u16(segments, ROOT, struct_path, CHOICE_OFFSET) == COUNTER_TAG


def far_hops(segments: Sequence[bytes | bytearray], path: Sequence[int]) -> tuple[int, int]:
    """(far, double-far) pointers dereferenced while following `path` from ROOT."""
    far = double = 0
    for k in range(len(path)):
        if k and path[k - 1] < 0 and path[k] >= 0:
            continue  # slot of an inline struct list element: no pointer dereferenced
        w = word_at(segments, at(segments, path[:k]))
        if w & 3 == 2:
            far += 1
            double += bool(w & 4)
    return far, double


def sample_holder(first_segment_words: int | None = None) -> Any:
    """A Holder with every kind of place a capability can live, all left null."""
    kw = {} if first_segment_words is None else {"num_first_segment_words": first_segment_words}
    h = Holder.new_message(**kw)
    h.name = "root"
    h.extra.number = -7
    inner = h.init("inner")
    inner.name = "inner"
    inner.init("inner").name = "inner.inner"
    h.init("caps", 3)
    items = h.init("items", 3)
    for i in range(3):
        items[i].name = f"item{i}"
        items[i].extra.number = i
    return h


# Every place a capability can be, with a check that pycapnp sees a pointer at that slot.
PLACES: list[tuple[str, Any, Callable[[Any], bool]]] = [
    ("cap", "cap", lambda r: r._has("cap")),
    ("inner.cap", "inner.cap", lambda r: r.inner._has("cap")),
    ("inner.inner.cap", "inner.inner.cap", lambda r: r.inner.inner._has("cap")),
    ("caps[0]", ["caps", 0], lambda r: len(r.caps) == 3),
    ("caps[2]", ["caps", 2], lambda r: len(r.caps) == 3),
    ("items[0].cap", ["items", 0, "cap"], lambda r: r.items[0]._has("cap")),
    ("items[2].cap", ["items", 2, "cap"], lambda r: r.items[2]._has("cap")),
    ("choice.counter", "choice.counter", lambda r: r.choice.which() == "counter"),
    ("extra.callback", "extra.callback", lambda r: r.extra._has("callback")),
]


def check_sample(r: Any) -> None:
    """Every non-capability field of sample_holder() reads back through pycapnp."""
    assert r.name == "root"
    assert r.extra.number == -7
    assert r.inner.name == "inner"
    assert r.inner.inner.name == "inner.inner"
    assert len(r.caps) == 3
    assert [(it.name, it.extra.number) for it in r.items] == [(f"item{i}", i) for i in range(3)]


# --- every depth, one and several segments --------------------------------------------


@pytest.mark.parametrize("first_segment_words", [None, 1, 2, 5])
@pytest.mark.parametrize(("label", "names", "seen"), PLACES, ids=[p[0] for p in PLACES])
def test_each_depth(
    first_segment_words: int | None, label: str, names: Any, seen: Callable[[Any], bool]
) -> None:
    segs = segments_of(sample_holder(first_segment_words))
    if label == "choice.counter":
        choose_counter(segs, ())
    path = field_path(Holder, names)
    loc = follow(segs, ROOT, path)
    assert loc is not None
    assert read_cap_index(segs, loc) is None
    write_cap_index(segs, loc, 41)
    assert read_cap_index(segs, at(segs, path)) == 41
    r = Holder.from_segments(segs)
    check_sample(r)
    assert seen(r)
    if label != "cap":
        assert not r._has("cap")  # the word landed where pycapnp has this field, nowhere else


def test_all_places_at_once_distinct_indices() -> None:
    segs = segments_of(sample_holder(1))
    choose_counter(segs, ())
    paths = [field_path(Holder, names) for _, names, _ in PLACES]
    for index, path in enumerate(paths):
        write_cap_index(segs, at(segs, path), index)
    assert [read_cap_index(segs, at(segs, p)) for p in paths] == list(range(len(paths)))
    r = Holder.from_segments(segs)
    check_sample(r)
    assert all(seen(r) for _, _, seen in PLACES)


def test_null_and_absent_read_as_none() -> None:
    h = Holder.new_message()
    h.init("items", 1)
    segs = segments_of(h)
    assert follow(segs, ROOT, field_path(Holder, "inner.cap")) is None
    assert follow(segs, ROOT, field_path(Holder, "inner.inner.cap")) is None
    assert follow(segs, ROOT, (*ITEMS, ~0, *INNER, *CAP)) is None
    assert follow(segs, ROOT, (99,)) is None  # a slot this (older) struct does not have
    assert follow(segs, ROOT, (99, 1, 2)) is None
    assert follow(segs, ROOT, ()) == ROOT
    assert list_length(segs, at(segs, CAPS)) == 0
    with pytest.raises(PointerError, match="out of range"):
        follow(segs, ROOT, (*CAPS, ~0))
    with pytest.raises(PointerError, match="null list"):
        follow(segs, ROOT, (*INNER, *CAPS, ~0))


def test_union_member_slot_is_shared() -> None:
    """follow() does not read discriminants: the caller must (choice.text shares the slot)."""
    h = Holder.new_message()
    h.choice.text = "not a capability"
    segs = segments_of(h)
    loc = at(segs, COUNTER)
    assert loc == at(segs, field_path(Holder, "choice.text"))
    with pytest.raises(PointerError, match="expected a capability pointer"):
        read_cap_index(segs, loc)
    with pytest.raises(LocalProtocolError, match="list pointer"):
        write_cap_index(segs, loc, 0)


def test_list_length() -> None:
    segs = segments_of(sample_holder(1))
    assert list_length(segs, at(segs, CAPS)) == 3
    assert list_length(segs, at(segs, ITEMS)) == 3
    assert list_length(segs, at(segs, field_path(Holder, "name"))) == len("root") + 1
    with pytest.raises(PointerError, match="expected a list pointer"):
        list_length(segs, ROOT)


def test_caps_in_rpc_call_params() -> None:
    """The real use: a Holder as Call.params.content of an rpc Message."""
    m = rpc.Message.new_message(num_first_segment_words=2)
    call = m.init("call")
    h = call.params.content.as_struct(Holder.schema)
    h.name = "x"
    h.init("inner").name = "y"
    h.init("caps", 2)
    segs = segments_of(m)
    content = field_path(rpc.Message, "call.params.content")
    assert content == (0, 1, 0)
    write_cap_index(segs, at(segs, content + field_path(Holder, "inner.cap")), 0)
    write_cap_index(segs, at(segs, content + field_path(Holder, ["caps", 1])), 1)
    assert read_cap_index(segs, at(segs, (*content, *INNER, *CAP))) == 0
    assert read_cap_index(segs, at(segs, (*content, *CAPS, ~1))) == 1
    assert read_cap_index(segs, at(segs, (*content, *CAPS, ~0))) is None
    r = rpc.Message.from_segments(segs).call.params.content.as_struct(Holder.schema)
    assert (r.name, r.inner.name, r.inner._has("cap"), len(r.caps)) == ("x", "y", True, 2)


# --- far pointers ---------------------------------------------------------------------


@pytest.mark.parametrize("first_segment_words", [1, 2])
def test_far_pointers_are_traversed(first_segment_words: int) -> None:
    segs = segments_of(sample_holder(first_segment_words))
    assert len(segs) > 1
    assert word_at(segs, ROOT) & 3 == 2  # the root itself is far: followed at `start`
    total = 0
    for _, names, _ in PLACES:
        path = field_path(Holder, names)
        total += far_hops(segs, path)[0]
        write_cap_index(segs, at(segs, path), 3)
    assert total > len(PLACES)  # more far pointers than just the root ones
    check_sample(Holder.from_segments(segs))


def test_double_far_from_pycapnp() -> None:
    """pycapnp emits a double-far pointer when an orphan is adopted into another segment and
    the orphan's own segment is full (no room for a landing pad). Search a few layouts."""
    found = 0
    path = (*ITEMS, ~1, *INNER, *CAP)
    for first in range(1, 40):
        h = Holder.new_message(num_first_segment_words=first)
        h.init("inner").name = "moved"
        h.init("items", 2)
        h.items[1].adopt("inner", h.disown("inner"))
        segs = segments_of(h)
        if far_hops(segs, path)[1] == 0:
            continue
        found += 1
        write_cap_index(segs, at(segs, path), 5)
        assert read_cap_index(segs, at(segs, path)) == 5
        r = Holder.from_segments(segs)
        assert r.items[1].inner.name == "moved"
        assert r.items[1].inner._has("cap")
    assert found, "pycapnp emitted no double-far pointer in any layout"


def test_double_far_hand_crafted() -> None:
    """Root -> double-far pad in segment 1 -> Holder-shaped struct in segment 2."""
    segs = [
        seg(far_ptr(1, 1, double=True)),
        seg(0, far_ptr(2, 0), struct_ptr(0, 1, 7)),
        seg(5 << 32, *([0] * 7)),  # data (choice = none, extra.number = 5), 7 null pointers
    ]
    assert follow(segs, ROOT, CAP) == (2, 1 + CAP[0])
    write_cap_index(segs, at(segs, CALLBACK), 8)
    assert read_cap_index(segs, (2, 1 + CALLBACK[0])) == 8
    r = Holder.from_segments(segs)
    assert r.extra.number == 5
    assert r.extra._has("callback")
    assert not r._has("cap")


def test_far_pointer_to_list_hand_crafted() -> None:
    """A single-far pointer whose landing pad is a list pointer (offset relative to the pad)."""
    segs = [seg(far_ptr(1, 2)), seg(cap_ptr(7), 0, list_ptr(-3, 6, 2))]
    assert list_length(segs, ROOT) == 2
    assert follow(segs, ROOT, (~0,)) == (1, 0)
    assert read_cap_index(segs, at(segs, (~0,))) == 7
    assert read_cap_index(segs, at(segs, (~1,))) is None


# --- libcapnp's list upgrades: the path says what an element is ------------------------


def test_pointer_list_read_as_struct_list() -> None:
    """A List(Struct) may be encoded as a pointer list: structs of one pointer, no data."""
    segs = [seg(list_ptr(0, 6, 2), 0, cap_ptr(4))]
    assert follow(segs, ROOT, (~1, 0)) == (0, 2)
    assert follow(segs, ROOT, (~1, 1)) is None
    assert follow(segs, ROOT, (~1,)) == (0, 2)


def test_composite_list_read_as_pointer_list() -> None:
    """A List(Pointer) may be encoded as a composite list; its element is the first pointer."""
    segs = [seg(list_ptr(0, 7, 6), struct_ptr(2, 1, 2), 0, 0, 0, 0, cap_ptr(9), 0)]
    assert follow(segs, ROOT, (~1,)) == (0, 6)
    assert read_cap_index(segs, at(segs, (~1,))) == 9
    assert follow(segs, ROOT, (~1, 1)) == (0, 7)
    assert follow(segs, ROOT, (~1, 2)) is None


def test_data_list_read_as_struct_list_has_no_pointers() -> None:
    segs = [seg(list_ptr(0, 5, 2), 1, 2)]
    assert follow(segs, ROOT, (~1, 0)) is None
    with pytest.raises(PointerError, match="without pointers"):
        follow(segs, ROOT, (~1,))


# --- scan_caps and union discriminants -------------------------------------------------


def test_scan_caps_finds_every_place() -> None:
    segs = segments_of(sample_holder(1))
    choose_counter(segs, ())
    paths = [field_path(Holder, names) for _, names, _ in PLACES]
    for index, path in enumerate(paths):
        write_cap_index(segs, at(segs, path), index)
    found = scan_caps(segs, ROOT)
    assert sorted((path, index) for path, _, index in found) == sorted(
        (path, index) for index, path in enumerate(paths)
    )
    order = [[s if s >= 0 else ~s for s in path] for path, _, _ in found]
    assert order == sorted(order)  # depth first, slots and elements in increasing order
    inner = at(segs, INNER)
    assert [(p, i) for p, _, i in scan_caps(segs, inner)] == [
        (CAP, paths.index((*INNER, *CAP))),
        ((*INNER, *CAP), paths.index((*INNER, *INNER, *CAP))),
    ]


def test_scan_caps_in_rpc_content_and_at_start() -> None:
    m = rpc.Message.new_message()
    h = m.init("call").params.content.as_struct(Holder.schema)
    h.init("items", 2)
    segs = segments_of(m)
    content = at(segs, field_path(rpc.Message, "call.params.content"))
    capword = at(segs, (*ITEMS, ~1, *CALLBACK), content)
    write_cap_index(segs, capword, 0)
    assert [(p, i) for p, _, i in scan_caps(segs, content)] == [((*ITEMS, ~1, *CALLBACK), 0)]
    assert scan_caps(segs, capword) == [((), capword, 0)]  # the start itself is a capability
    assert scan_caps(segs, at(segs, CAP, content)) == []  # null


def test_scan_caps_lists_of_pointers_and_far_pointers() -> None:
    segs = [
        seg(far_ptr(1, 0)),
        seg(list_ptr(0, 6, 3), cap_ptr(4), 0, list_ptr(0, 6, 1), cap_ptr(5)),
    ]
    assert scan_caps(segs, ROOT) == [((~0,), (1, 1), 4), ((~2, ~0), (1, 4), 5)]
    assert follow(segs, ROOT, (~2, ~0)) == (1, 4)


@pytest.mark.parametrize(
    ("segs", "kwargs", "match"),
    [
        ([seg(struct_ptr(0, 0, 1), struct_ptr(-1, 0, 1))], {}, "traversal limit"),
        (
            [seg(struct_ptr(0, 0, 1), struct_ptr(-1, 0, 1))],
            {"traversal_limit": 10**6},
            "nesting limit",
        ),
        # Each struct's two pointers both point at the next one: 2**n paths, n + 1 structs.
        (
            [seg(struct_ptr(0, 0, 2), *[struct_ptr(1, 0, 2), struct_ptr(0, 0, 2)] * 20, 0, 0)],
            {},
            "traversal limit",
        ),
        ([seg(struct_ptr(0, 0, 1), 7)], {}, "unknown 'other' pointer"),
        ([seg(far_ptr(1, 0)), seg(cap_ptr(1))], {}, "lands on a capability"),
        ([seg(struct_ptr(0, 0, 2), 0)], {}, "out of bounds"),
        ([seg(list_ptr(0, 6, 2), 0)], {}, "out of bounds"),
        ([], {}, "outside the message"),
    ],
)
def test_scan_caps_hostile(segs: list[bytearray], kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(PointerError, match=match):
        scan_caps(segs, ROOT, **kwargs)


def test_struct_u16_in_inline_and_pointed_structs() -> None:
    h = sample_holder(2)
    h.items[2].extra.number = 0x12345678
    segs = segments_of(h)
    number_offset = 2  # extra.number is Int32 number 1 of the data section: u16 fields 2, 3
    assert read_struct_u16(segs, ROOT, (*ITEMS, ~2), number_offset) == 0x5678
    assert read_struct_u16(segs, ROOT, (*ITEMS, ~2), number_offset + 1) == 0x1234
    write_struct_u16(segs, ROOT, (*ITEMS, ~2), number_offset + 1, 0x0BCD)
    choose_counter(segs, INNER)
    choose_counter(segs, (*ITEMS, ~0))
    r = Holder.from_segments(segs)
    assert r.items[2].extra.number == 0x0BCD5678
    assert r.inner.choice.which() == "counter"
    assert r.items[0].choice.which() == "counter"
    assert r.choice.which() == "none"
    assert read_struct_u16(segs, ROOT, (*INNER, *INNER, *INNER), 0) == 0  # null struct
    assert read_struct_u16(segs, ROOT, (), 1000) == 0  # beyond the data section


def test_write_struct_u16_misuse() -> None:
    segs = segments_of(sample_holder())
    with pytest.raises(LocalProtocolError, match="no struct"):
        write_struct_u16(segs, ROOT, (*INNER, *INNER, *INNER), 0, 1)
    with pytest.raises(LocalProtocolError, match="outside"):
        write_struct_u16(segs, ROOT, (), _HOLDER.dataWordCount * 4, 1)
    with pytest.raises(LocalProtocolError, match="16 bits"):
        write_struct_u16(segs, ROOT, (), 0, 1 << 16)
    with pytest.raises(LocalProtocolError, match="read-only"):
        write_struct_u16([bytes(s) for s in segs], ROOT, (), 0, 1)
    with pytest.raises(LocalProtocolError, match="read-only"):
        write_cap_index([bytes(s) for s in segs], at(segs, CAP), 1)
    with pytest.raises(PointerError, match="no struct element"):
        write_struct_u16(segs, ROOT, (*ITEMS, ~3), 0, 1)


# --- hostile input --------------------------------------------------------------------

HOSTILE: list[tuple[str, list[bytearray], Location, tuple[int, ...]]] = [
    ("no segments", [], ROOT, ()),
    ("empty segment", [bytearray()], ROOT, ()),
    ("start outside", [seg(0)], (0, 1), ()),
    ("negative start segment", [seg(0)], (-1, 0), ()),
    ("struct past end", [seg(struct_ptr(5, 0, 1))], ROOT, (0,)),
    ("struct before start", [seg(0, struct_ptr(-3, 0, 1))], (0, 1), (0,)),
    ("struct overruns", [seg(struct_ptr(0, 1, 2), 0, 0)], ROOT, (0,)),
    ("truncated segment", [seg(struct_ptr(0, 0, 1)) + b"\0\0\0\0"], ROOT, (0,)),
    ("far to unknown segment", [seg(far_ptr(7, 0))], ROOT, (0,)),
    ("far pad past end", [seg(far_ptr(1, 9)), seg(0)], ROOT, (0,)),
    ("far loop", [seg(far_ptr(0, 0))], ROOT, (0,)),
    ("far to far", [seg(far_ptr(1, 0)), seg(far_ptr(2, 0)), seg(struct_ptr(0, 0, 0))], ROOT, (0,)),
    ("double-far pad past end", [seg(far_ptr(1, 0, double=True)), seg(far_ptr(0, 0))], ROOT, (0,)),
    (
        "double-far pad not far",
        [seg(far_ptr(1, 0, double=True)), seg(struct_ptr(0, 0, 1), struct_ptr(0, 0, 1))],
        ROOT,
        (0,),
    ),
    (
        "double-far to unknown segment",
        [seg(far_ptr(1, 0, double=True)), seg(far_ptr(5, 0), struct_ptr(0, 0, 1))],
        ROOT,
        (0,),
    ),
    (
        "double-far tag is a capability",
        [seg(far_ptr(1, 0, double=True)), seg(far_ptr(0, 0), cap_ptr(1))],
        ROOT,
        (0,),
    ),
    (
        "double-far content past end",
        [seg(far_ptr(1, 0, double=True)), seg(far_ptr(0, 0), struct_ptr(0, 2, 1))],
        ROOT,
        (0,),
    ),
    ("index out of range", [seg(list_ptr(0, 6, 2), 0, 0)], ROOT, (~2,)),
    (
        "composite index out of range",
        [seg(list_ptr(0, 7, 1), struct_ptr(1, 0, 1), 0)],
        ROOT,
        (~1, 0),
    ),
    ("null list", [seg(0)], ROOT, (~0,)),
    ("list past end", [seg(list_ptr(0, 6, 3), 0)], ROOT, (~0,)),
    ("list before start", [seg(list_ptr(-2, 6, 1))], ROOT, (~0,)),
    ("composite past end", [seg(list_ptr(0, 7, 4), struct_ptr(1, 0, 1), 0)], ROOT, (~0, 0)),
    ("composite tag not struct", [seg(list_ptr(0, 7, 1), list_ptr(0, 6, 1), 0)], ROOT, (~0, 0)),
    ("composite overrun", [seg(list_ptr(0, 7, 2), struct_ptr(3, 0, 1), 0, 0)], ROOT, (~0, 0)),
    ("bit list", [seg(list_ptr(0, 1, 8), 0)], ROOT, (~0, 0)),
    ("void list as pointers", [seg(list_ptr(0, 0, 1000))], ROOT, (~5,)),
    ("struct where list expected", [seg(struct_ptr(0, 0, 1), 0)], ROOT, (~0,)),
    ("list where struct expected", [seg(list_ptr(0, 6, 1), 0)], ROOT, (0,)),
    ("capability where struct expected", [seg(cap_ptr(0))], ROOT, (0,)),
    ("capability where list expected", [seg(cap_ptr(0))], ROOT, (~0,)),
    ("other pointer where struct expected", [seg(7)], ROOT, (0,)),
]


#: Why each hostile case is refused: exact texts, so a refusal for another reason fails.
HOSTILE_REASONS = {
    "no segments": "location (0, 0) is outside the message",
    "empty segment": "location (0, 0) is outside the message",
    "start outside": "location (0, 1) is outside the message",
    "negative start segment": "location (-1, 0) is outside the message",
    "struct past end": (
        "path step 0: struct of 0 + 1 words at (0, 6) (pointer (0, 0)) is out of bounds"
    ),
    "struct before start": (
        "path step 0: struct of 0 + 1 words at (0, -1) (pointer (0, 1)) is out of bounds"
    ),
    "struct overruns": (
        "path step 0: struct of 1 + 2 words at (0, 1) (pointer (0, 0)) is out of bounds"
    ),
    "truncated segment": (
        "path step 0: struct of 0 + 1 words at (0, 1) (pointer (0, 0)) is out of bounds"
    ),
    "far to unknown segment": "far pointer at (0, 0) names segment 7; the message has 1",
    "far pad past end": "far pointer at (0, 0): landing pad (1, 9) is outside the segment",
    "far loop": "far pointer at (0, 0) lands on another far pointer at (0, 0)",
    "far to far": "far pointer at (0, 0) lands on another far pointer at (1, 0)",
    "double-far pad past end": (
        "double-far pointer at (0, 0): landing pad (1, 0) is outside the segment"
    ),
    "double-far pad not far": (
        "double-far pointer at (0, 0): its landing pad starts with a struct pointer (0 data words, "
        "1 pointers), not a far pointer"
    ),
    "double-far to unknown segment": (
        "double-far landing pad at (1, 0) names segment 5; the message has 2"
    ),
    "double-far tag is a capability": (
        "double-far landing pad at (1, 0): the tag is a capability pointer (index 1), not a struct "
        "or list"
    ),
    "double-far content past end": (
        "path step 0: struct of 2 + 1 words at (0, 0) (pointer (0, 0)) is out of bounds"
    ),
    "index out of range": (
        "path step 0 (~2): index 2 out of range for the list at (0, 0) (2 elements)"
    ),
    "composite index out of range": (
        "path step 0 (~1): index 1 out of range for the list at (0, 0) (1 elements)"
    ),
    "null list": "path step 0 (~0): index 0 out of range for the list at (0, 0) (0 elements)",
    "list past end": "list at (0, 0) (3 elements) is out of bounds",
    "list before start": "list at (0, 0) (1 elements) is out of bounds",
    "composite past end": "composite list at (0, 0) (4 words) is out of bounds",
    "composite tag not struct": (
        "composite list at (0, 0): its tag is a list pointer (element size code 6)"
    ),
    "composite overrun": "composite list at (0, 0): 3 elements overrun 2 words",
    "bit list": (
        "path step 0 (~0): the list at (0, 0) is a bit list, not a list of structs or pointers"
    ),
    "void list as pointers": (
        "path step 0 (~5): expected a list of pointers at (0, 0), found a list without pointers"
    ),
    "struct where list expected": (
        "expected a list pointer at (0, 0), found a struct pointer (0 data words, 1 pointers)"
    ),
    "list where struct expected": (
        "path step 0 (0): expected a struct pointer at (0, 0), found a list pointer (element size "
        "code 6)"
    ),
    "capability where struct expected": (
        "path step 0 (0): expected a struct pointer at (0, 0), found a capability pointer (index 0)"
    ),
    "capability where list expected": (
        "expected a list pointer at (0, 0), found a capability pointer (index 0)"
    ),
    "other pointer where struct expected": (
        "path step 0 (0): expected a struct pointer at (0, 0), found an unknown 'other' pointer "
        "0x0000000000000007"
    ),
}


@pytest.mark.parametrize(("label", "segs", "start", "path"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_follow_raises_pointer_error(
    label: str, segs: list[bytearray], start: Location, path: tuple[int, ...]
) -> None:
    with pytest.raises(PointerError) as info:
        follow(segs, start, path)
    assert isinstance(info.value, RemoteProtocolError)
    assert str(info.value) == HOSTILE_REASONS[label]


@pytest.mark.parametrize(
    ("segs", "loc", "match"),
    [
        ([seg(7)], ROOT, "unknown 'other' pointer"),
        ([seg(3 | (2 << 2) | (1 << 32))], ROOT, "unknown 'other' pointer"),
        ([seg(struct_ptr(0, 0, 0) | 1 << 48)], ROOT, "struct pointer"),
        ([seg(list_ptr(0, 6, 1))], ROOT, "list pointer"),
        ([seg(far_ptr(0, 0))], ROOT, "far pointer"),
        ([seg(0)], (0, 1), "outside the message"),
        ([seg(0)], (1, 0), "outside the message"),
        ([bytearray(4)], ROOT, "outside the message"),
    ],
)
def test_read_cap_index_rejects(segs: list[bytearray], loc: Location, match: str) -> None:
    with pytest.raises(PointerError, match=match):
        read_cap_index(segs, loc)


def test_read_cap_index_accepts() -> None:
    segs = [seg(0, cap_ptr(0), cap_ptr(0xFFFFFFFF))]
    assert [read_cap_index(segs, (0, i)) for i in range(3)] == [None, 0, 0xFFFFFFFF]
    assert read_cap_index([bytes(segs[0])], (0, 2)) == 0xFFFFFFFF
    assert read_cap_index([memoryview(segs[0])], (0, 1)) == 0


def test_write_cap_index_misuse() -> None:
    segs = [seg(0, struct_ptr(0, 0, 0) | 1 << 48)]
    with pytest.raises(LocalProtocolError, match="struct pointer"):
        write_cap_index(segs, (0, 1), 0)
    with pytest.raises(LocalProtocolError, match="outside"):
        write_cap_index(segs, (0, 2), 0)
    with pytest.raises(LocalProtocolError, match="32 bits"):
        write_cap_index(segs, (0, 0), 1 << 32)
    with pytest.raises(LocalProtocolError, match="32 bits"):
        write_cap_index(segs, (0, 0), -1)
    write_cap_index([memoryview(segs[0])], (0, 0), 2)
    assert read_cap_index(segs, ROOT) == 2
    with pytest.raises(LocalProtocolError, match="capability pointer"):
        write_cap_index(segs, ROOT, 2)  # a capability is never overwritten either


# --- field_path -----------------------------------------------------------------------


def test_field_path_values() -> None:
    slot = {f.name: f.slot.offset for f in _HOLDER.fields if f.which() == "slot"}
    assert CAP == (slot["cap"],) == (1,)
    assert field_path(Holder, "inner.cap") == (slot["inner"], slot["cap"]) == (2, 1)
    assert field_path(Holder, ["inner", "inner", "cap"]) == (2, 2, 1)
    assert field_path(Holder, ["caps", 2]) == (3, ~2)
    assert field_path(Holder, ["items", 1, "cap"]) == (4, ~1, 1)
    assert field_path(Holder, ["items", 0, "inner", "caps", 3]) == (4, ~0, 2, 3, ~3)
    assert COUNTER == (5,)
    assert CALLBACK == (6,)
    assert field_path(Holder.schema, ("extra", "callback")) == CALLBACK  # _StructSchema too
    assert field_path(Holder, []) == ()
    assert field_path(rpc.Message, "return.results.content") == (0, 0, 0)


@pytest.mark.parametrize(
    ("names", "error"),
    [
        ("nope", KeyError),
        ("inner.nope", KeyError),
        ("extra.nope", KeyError),
        ("extra.number", ValueError),  # data field
        ("choice.none", ValueError),  # void field
        ("extra", ValueError),  # a group is not a pointer
        (["items", 0], ValueError),  # an inline struct is not a pointer
        ("name.x", ValueError),  # through a text field
        ("caps.x", ValueError),  # a name after a list needs an index first
        (["cap", 0], ValueError),  # an index after a non-list
        (["caps", -1], ValueError),
    ],
)
def test_field_path_errors(names: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        field_path(Holder, names)


# --- Hypothesis: random Holder trees ---------------------------------------------------

_NAMES = st.none() | st.text(alphabet="abcxyz-", max_size=10)


def _holder_spec(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "name": _NAMES,
            "number": st.integers(-(2**31), 2**31 - 1),
            "choice": st.sampled_from(["none", "counter", "text"]),
            "caps": st.none() | st.integers(0, 4),
            "inner": st.none() | children,
            "items": st.none() | st.lists(children, max_size=3),
        }
    )


_LEAF = st.fixed_dictionaries(
    {
        "name": _NAMES,
        "number": st.integers(-(2**31), 2**31 - 1),
        "choice": st.sampled_from(["none", "counter", "text"]),
        "caps": st.none() | st.integers(0, 4),
        "inner": st.none(),
        "items": st.none(),
    }
)
HOLDER_SPECS = st.recursive(_LEAF, _holder_spec, max_leaves=16)


def build(b: Any, spec: dict[str, Any], here: tuple[int, ...], out: dict[str, list[Any]]) -> None:
    """Fill Holder builder `b` from `spec`; record the path of every interface slot created
    (out["slots"]) and of every struct whose choice must become `counter` (out["counters"])."""
    if spec["name"] is not None:
        b.name = spec["name"]
    b.extra.number = spec["number"]
    out["slots"] += [here + CAP, here + CALLBACK]
    if spec["choice"] == "text":
        b.choice.text = "t"
    elif spec["choice"] == "counter":
        out["counters"].append(here)
        out["slots"].append(here + COUNTER)
    if spec["inner"] is not None:
        build(b.init("inner"), spec["inner"], here + INNER, out)
    if spec["caps"] is not None:
        b.init("caps", spec["caps"])
        out["slots"] += [(*here, *CAPS, ~i) for i in range(spec["caps"])]
    if spec["items"] is not None:
        items = b.init("items", len(spec["items"]))
        for i, sub in enumerate(spec["items"]):
            build(items[i], sub, (*here, *ITEMS, ~i), out)


def check(r: Any, spec: dict[str, Any]) -> None:
    """pycapnp reads every non-capability field of the patched message as built."""
    assert r.name == (spec["name"] or "")
    assert r.extra.number == spec["number"]
    assert r._has("cap")
    assert r.extra._has("callback")
    assert r.choice.which() == spec["choice"]
    if spec["choice"] == "text":
        assert r.choice.text == "t"
    assert r._has("inner") == (spec["inner"] is not None)
    if spec["inner"] is not None:
        check(r.inner, spec["inner"])
    assert len(r.caps) == (spec["caps"] or 0)
    assert len(r.items) == len(spec["items"] or [])
    for item, sub in zip(r.items, spec["items"] or [], strict=True):
        check(item, sub)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=HOLDER_SPECS, first_segment_words=st.integers(1, 16))
def test_random_holder_trees(spec: dict[str, Any], first_segment_words: int) -> None:
    h = Holder.new_message(num_first_segment_words=first_segment_words)
    out: dict[str, list[Any]] = {"slots": [], "counters": []}
    build(h, spec, (), out)
    segs = segments_of(h)
    for here in out["counters"]:
        choose_counter(segs, here)
    slots: list[tuple[int, ...]] = out["slots"]
    for index, path in enumerate(slots):
        write_cap_index(segs, at(segs, path), index)
    assert [read_cap_index(segs, at(segs, p)) for p in slots] == list(range(len(slots)))
    found = scan_caps(segs, ROOT)
    assert {path: index for path, _, index in found} == {p: i for i, p in enumerate(slots)}
    assert all(at(segs, path) == loc for path, loc, _ in found)
    check(Holder.from_segments(segs), spec)


# --- Hypothesis: garbage in, PointerError out ------------------------------------------

_SMALL = st.integers(-4, 8)
_WORDS = st.one_of(
    st.integers(0, 2**64 - 1),
    st.just(0),
    st.builds(struct_ptr, _SMALL, st.integers(0, 3), st.integers(0, 4)),
    st.builds(list_ptr, _SMALL, st.integers(0, 7), st.integers(0, 9)),
    st.builds(far_ptr, st.integers(0, 3), st.integers(0, 8), st.booleans()),
    st.builds(cap_ptr, st.integers(0, 2**32 - 1)),
)
_SEGMENT = st.builds(
    lambda words, cut: seg(*words)[: len(words) * 8 - cut],  # cut > 0: a truncated segment
    st.lists(_WORDS, min_size=1, max_size=10),
    st.just(0) | st.integers(0, 7),
)


@st.composite
def garbage(draw: st.DrawFn) -> tuple[list[bytes | bytearray], Location]:
    """Segments of random and pointer-shaped words, and a start that is usually inside."""
    segs: list[bytes | bytearray] = draw(
        st.lists(_SEGMENT | st.binary(max_size=40), min_size=1, max_size=3)
    )
    si = draw(st.integers(0, len(segs) - 1))
    start = (si, draw(st.integers(0, max(0, len(segs[si]) // 8 - 1))))
    if draw(st.integers(0, 9)) == 0:
        start = draw(st.tuples(st.integers(-1, 3), st.integers(-1, 10)))
    return segs, start


@settings(max_examples=1000, deadline=None)
@given(case=garbage(), path=st.lists(st.integers(-4, 4), max_size=6))
def test_random_segments_never_crash(
    case: tuple[list[bytes | bytearray], Location], path: list[int]
) -> None:
    segs, start = case
    try:
        loc = follow(segs, start, path)
    except PointerError:
        return
    if loc is None:
        return
    assert 0 <= loc[0] < len(segs)
    assert 0 <= loc[1] < len(segs[loc[0]]) // 8
    for read in (read_cap_index, list_length):
        try:
            read(segs, loc)
        except PointerError:
            pass
    try:
        found = scan_caps(segs, loc)
    except PointerError:
        return
    for sub, where, index in found:
        assert follow(segs, loc, sub) == where
        assert read_cap_index(segs, where) == index
