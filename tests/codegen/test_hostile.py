"""Hostile messages against generated readers (tests/schemas/kitchen.capnp).

Every malformed message must end in ``DecodeError`` with a precise reason: never an
IndexError, a struct.error, a RecursionError, a hang or work out of proportion to the
message (capsvc/codec/reading.py, module docstring). The messages are built by hand,
word by word, with the pointer helpers below; each case says what it is. A Hypothesis
test then feeds mutated copies of valid messages (built by pycapnp) and random bytes to
``to_dict()``, which walks everything: it returns or raises DecodeError, nothing else.

Layouts used throughout (word numbers in segment 0):
- ``tree(...)``: word 0 the root pointer, word 1 Tree's data (value), words 2-5 its
  pointers children, left, other, anything; free words from 6.
- ``lists(...)``: word 0 the root pointer, words 1-19 the pointers of Lists (slot ``s`` is
  word ``1 + s``, ``AT[name]``); free words from 20.
- ``keywords(...)``: word 0 the root pointer, word 1 the data, word 2 the Text pointer
  ``class``; free words from 3.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import capnp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsvc.errors import DecodeError
from tests.codegen.conftest import Generated

MASK = (1 << 64) - 1
VOID, BIT, BYTE, TWO, FOUR, EIGHT, POINTER, COMPOSITE = range(8)
HUGE = 2**29 - 1  # the largest element count a list pointer holds


# ---------------------------------------------------------------------- words and pointers
def seg(*values: int) -> bytes:
    """A segment of little-endian words."""
    return b"".join(struct.pack("<Q", value & MASK) for value in values)


def struct_ptr(at: int, target: int, data: int, pointers: int) -> int:
    """A struct pointer in word ``at`` to a struct starting at word ``target``."""
    return ((target - at - 1) << 2) & 0xFFFFFFFF | data << 32 | pointers << 48


def tag(elements: int, data: int, pointers: int) -> int:
    """A composite list's tag word."""
    return elements << 2 | data << 32 | pointers << 48


def list_ptr(at: int, target: int, code: int, count: int) -> int:
    """A list pointer in word ``at`` to a list starting at word ``target``."""
    return ((target - at - 1) << 2) & 0xFFFFFFFF | 1 | code << 32 | count << 35


def far_ptr(segment: int, pad: int, *, double: bool = False) -> int:
    return 2 | int(double) << 2 | pad << 3 | segment << 32


def cap_ptr(index: int) -> int:
    return 3 | index << 32


def text_words(data: bytes) -> list[int]:
    """``data`` as whole words (zero-padded)."""
    data += bytes(-len(data) % 8)
    return [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]


def tree(children: int = 0, left: int = 0, other: int = 0, anything: int = 0) -> list[int]:
    return [struct_ptr(0, 1, 1, 4), 42, children, left, other, anything]


LIST_FIELDS = (
    "voids bools i8s i16s i32s i64s u8s u16s u32s u64s f32s f64s texts datas structs colors"
    " nested nestedTexts deep"
).split()
AT = {name: 1 + slot for slot, name in enumerate(LIST_FIELDS)}


def lists(**slots: int) -> list[int]:
    words = [struct_ptr(0, 1, 0, 19)] + [0] * 19
    for name, value in slots.items():
        words[AT[name]] = value
    return words


def keywords(text: int) -> list[int]:
    return [struct_ptr(0, 1, 1, 1), 0, text]


@contextmanager
def refused(reason: str) -> Iterator[None]:
    """The block must raise DecodeError whose message contains ``reason`` exactly."""
    with pytest.raises(DecodeError, match=re.escape(reason)):
        yield


# ---------------------------------------------------------------------- empty and truncated
def test_empty_message(generated: Generated) -> None:
    k = generated.kitchen
    for segments in ([], [b""], [b"\0" * 7]):
        with refused("message has no root pointer"):
            k.Tree.read(segments)
    with refused("incomplete message: the framing promises more bytes"):
        k.Tree.from_bytes(b"")
    # A framing header for one segment of 2 words, with only 1 word of it.
    with refused("incomplete message: the framing promises more bytes"):
        k.Tree.from_bytes(struct.pack("<II", 0, 2) + bytes(8))


def test_bytes_after_the_message(generated: Generated) -> None:
    k = generated.kitchen
    one = struct.pack("<II", 0, 1) + seg(0)  # one segment of one word: a null root
    assert k.Tree.from_bytes(one).to_dict() == {"value": 0}
    with refused("more than one message"):
        k.Tree.from_bytes(one + one)
    # A partial second message, or a stray byte, was silently ignored (fixed).
    with refused("junk after the message (6 bytes)"):
        k.Tree.from_bytes(one + one[:6])
    with refused("junk after the message (1 bytes)"):
        k.Tree.from_bytes(one + b"x")


def test_truncated_segments(generated: Generated) -> None:
    k = generated.kitchen
    # The root's one data word is only 4 bytes long (segment of 12 bytes).
    with refused("struct pointer out of bounds"):
        k.Tree.read([seg(struct_ptr(0, 1, 1, 0)) + b"\x01\0\0\0"])
    # Text "ab\0" in a trailing partial word: a partial word does not count.
    r = k.Keywords.read([seg(*keywords(list_ptr(2, 3, BYTE, 3))) + b"ab\0"])
    with refused("Text out of bounds"):
        _ = r.class_
    # A far pointer to a second segment of 7 bytes (no whole word for the landing pad).
    with refused("far pointer's landing pad is outside segment 1"):
        k.Tree.read([seg(far_ptr(1, 0)), seg(struct_ptr(0, 0, 0, 0))[:7]])
    # The pointer section of a struct ends mid-word.
    with refused("struct pointer out of bounds"):
        k.Tree.read([seg(struct_ptr(0, 1, 1, 4), 0, 0, 0, 0) + b"\0\0\0"])


# ---------------------------------------------------------------------- out of bounds
def test_struct_out_of_bounds(generated: Generated) -> None:
    k = generated.kitchen
    # The root struct (1 data word, 4 pointers) would start past the segment's end.
    with refused("struct pointer out of bounds"):
        k.Tree.read([seg(struct_ptr(0, 1, 1, 4))])
    # left points 3 words before the segment's start.
    r = k.Tree.read([seg(*tree(left=struct_ptr(3, -3, 1, 0)))])
    with refused("struct pointer out of bounds"):
        _ = r.left
    # left's data fits (word 6) but its 65535 pointers do not.
    r = k.Tree.read([seg(*tree(left=struct_ptr(3, 6, 1, 0xFFFF)), 7)])
    with refused("struct pointer out of bounds"):
        _ = r.left
    with refused("struct pointer out of bounds"):
        r.to_dict()


def test_list_out_of_bounds(generated: Generated) -> None:
    k = generated.kitchen
    # 3 Int32s need 2 words; 1 is there.
    r = k.Lists.read([seg(*lists(i32s=list_ptr(AT["i32s"], 20, FOUR, 3)), 5)])
    with refused("list out of bounds"):
        _ = r.i32s
    # A list starting before the segment.
    r = k.Lists.read([seg(*lists(i64s=list_ptr(AT["i64s"], -1, EIGHT, 1)))])
    with refused("list out of bounds"):
        _ = r.i64s
    # 65 bools need 2 words; 1 is there.
    r = k.Lists.read([seg(*lists(bools=list_ptr(AT["bools"], 20, BIT, 65)), MASK)])
    with refused("list out of bounds"):
        r.to_dict()
    # An element of a List(Text) points past the end.
    r = k.Lists.read(
        [seg(*lists(texts=list_ptr(AT["texts"], 20, POINTER, 1)), list_ptr(20, 21, BYTE, 9))]
    )
    with refused("Text out of bounds"):
        r.to_dict()


def test_text_and_data_out_of_bounds(generated: Generated) -> None:
    k = generated.kitchen
    # 100 bytes claimed, 8 there.
    r = k.Keywords.read([seg(*keywords(list_ptr(2, 3, BYTE, 100)), 0)])
    with refused("Text out of bounds"):
        _ = r.class_
    # A Data element of a List(Data) 2 words long with 1 there.
    words = lists(datas=list_ptr(AT["datas"], 20, POINTER, 1)) + [list_ptr(20, 21, BYTE, 9), 0]
    with refused("Data out of bounds"):
        k.Lists.read([seg(*words)]).to_dict()


# ---------------------------------------------------------------------- segments and far pointers
def test_far_pointer_control(generated: Generated) -> None:
    """The well-formed cases of the far pointers below, so that the hostile ones fail for
    the reason they say."""
    k = generated.kitchen
    # Single far: segment 1 word 0 is the landing pad, the Tree follows it.
    single = [seg(far_ptr(1, 0)), seg(struct_ptr(0, 1, 1, 4), 42, 0, 0, 0, 0)]
    assert k.Tree.read(single).to_dict() == {"value": 42}
    # Double far: the pad (segment 1) points at segment 2 word 0, the tag describes it.
    double = [
        seg(far_ptr(1, 0, double=True)),
        seg(far_ptr(2, 0), tag(0, 1, 4)),
        seg(42, 0, 0, 0, 0),
    ]
    assert k.Tree.read(double).to_dict() == {"value": 42}


def test_pointer_into_missing_segment(generated: Generated) -> None:
    k = generated.kitchen
    # The root is a far pointer to segment 3 of a one-segment message.
    with refused("far pointer to segment 3, which does not exist"):
        k.Tree.read([seg(far_ptr(3, 0))])
    # left is a far pointer to segment 1, which does not exist.
    r = k.Tree.read([seg(*tree(left=far_ptr(1, 0)))])
    with refused("far pointer to segment 1, which does not exist"):
        _ = r.left
    # A double-far whose landing pad sends the content to segment 9.
    with refused("far pointer to segment 9, which does not exist"):
        k.Tree.read([seg(far_ptr(1, 0, double=True)), seg(far_ptr(9, 0), tag(0, 1, 4))])
    # The segment index is the far pointer's upper 32 bits: the largest one.
    with refused("far pointer to segment 4294967295, which does not exist"):
        k.Tree.read([seg(far_ptr(0xFFFFFFFF, 0))])


def test_far_pointer_bad_landing_pad(generated: Generated) -> None:
    k = generated.kitchen
    landing = seg(struct_ptr(0, 1, 1, 4), 42, 0, 0, 0, 0)
    # The landing pad (word 9) is beyond segment 1's 6 words.
    with refused("far pointer's landing pad is outside segment 1"):
        k.Tree.read([seg(far_ptr(1, 9)), landing])
    # The largest landing pad offset (2**29 - 1).
    with refused("far pointer's landing pad is outside segment 0"):
        k.Tree.read([seg(far_ptr(0, 2**29 - 1))])
    # A double-far's pad is two words; segment 1 has one.
    with refused("far pointer's landing pad is outside segment 1"):
        k.Tree.read([seg(far_ptr(1, 0, double=True)), seg(far_ptr(0, 0))])
    # Far to far: the landing pad is itself a far pointer (back to the root).
    with refused("far pointer lands on another far pointer"):
        k.Tree.read([seg(far_ptr(1, 0)), seg(far_ptr(0, 0))])
    # A far pointer that is its own landing pad.
    with refused("far pointer lands on another far pointer"):
        k.Tree.read([seg(far_ptr(0, 0))])
    # ... and a double-far one.
    with refused("double-far pointer's landing pad is not a single far pointer"):
        k.Tree.read([seg(far_ptr(0, 0, double=True), 0)])


def test_double_far_bad_pad_or_tag(generated: Generated) -> None:
    k = generated.kitchen
    content = seg(42, 0, 0, 0, 0)
    # The pad's first word is a struct pointer, not a far pointer.
    with refused("double-far pointer's landing pad is not a single far pointer"):
        k.Tree.read([seg(far_ptr(1, 0, double=True)), seg(tag(0, 1, 4), tag(0, 1, 4)), content])
    # The pad's first word is another double-far.
    with refused("double-far pointer's landing pad is not a single far pointer"):
        k.Tree.read([seg(far_ptr(1, 0, double=True)), seg(far_ptr(2, 0, double=True), 0), content])
    # The tag has a non-zero offset (1 word).
    with refused("double-far pointer's tag word is not an offset-0 pointer"):
        k.Tree.read(
            [seg(far_ptr(1, 0, double=True)), seg(far_ptr(2, 0), struct_ptr(0, 2, 1, 4)), content]
        )
    # The tag is a far pointer.
    with refused("double-far pointer's tag word is not an offset-0 pointer"):
        k.Tree.read([seg(far_ptr(1, 0, double=True)), seg(far_ptr(2, 0), far_ptr(2, 0)), content])
    # The tag describes more than segment 2 holds (1 data word and 4 pointers; 1 word there).
    with refused("struct pointer out of bounds"):
        k.Tree.read([seg(far_ptr(1, 0, double=True)), seg(far_ptr(2, 0), tag(0, 1, 4)), seg(42)])
    # The tag is a list pointer where a struct is expected.
    with refused("expected a struct pointer, found a list pointer"):
        k.Tree.read([seg(far_ptr(1, 0, double=True)), seg(far_ptr(2, 0), 1 | 2 << 32), content])


# ---------------------------------------------------------------------- loops
def test_struct_pointing_to_itself(generated: Generated) -> None:
    """Tree.left points back at the Tree it is in: an endless chain of lefts."""
    k = generated.kitchen
    message = [seg(*tree(left=struct_ptr(3, 1, 1, 4)))]
    with refused("message exceeds the nesting limit"):
        k.Tree.read(message).to_dict()
    # Walked by hand: the root and 63 lefts are 64 levels (libcapnp's default limit).
    r = k.Tree.read(message)
    for _ in range(63):
        r = r.left
        assert r.value == 42
    with refused("message exceeds the nesting limit"):
        _ = r.left
    # Without a useful nesting limit, the traversal budget stops it (5 words a level).
    with refused("message exceeds the traversal limit"):
        k.Tree.read(message, nesting_limit=10**9, traversal_limit_words=500).to_dict()


def test_a_copy_that_fails_changes_nothing(generated: Generated) -> None:
    """A hostile reader (a struct that holds itself) copied into a builder: every way in
    is refused with the typed error, and the builder's message is as it was, byte for
    byte, readable by pycapnp (a failed copy left the field pointing at a half-made copy
    whose pointers were never redone, and a union member's slot at the wrong kind; found
    by a differential sweep)."""
    k = generated.kitchen
    loop = k.Tree.read([seg(*tree(left=struct_ptr(3, 1, 1, 4)))])
    built = k.Tree.new_message(value=1, left={"value": 2}, children=[{"value": 3}])
    before = built.to_bytes()
    edits: list[Callable[[], object]] = [
        lambda: setattr(built, "left", loop),
        lambda: built.assign(value=9, left=loop),
        lambda: setattr(built, "children", [{"value": 4}, loop]),
        lambda: setattr(built, "left", {"value": 5, "left": loop}),
        lambda: built.set_anything(loop.left),
        lambda: k.Tree.new_message(left=loop),
    ]
    for edit in edits:
        with refused("message exceeds the nesting limit"):
            edit()
        assert built.to_bytes() == before
    with generated.reference.Tree.from_bytes(built.to_bytes()) as read:
        assert (read.value, read.left.value, read.children[0].value) == (1, 2, 3)


def test_a_dict_the_message_refuses_midway_changes_nothing(generated: Generated) -> None:
    """A dict set in place over a message whose nested struct pointer holds a list (a
    foreign or hostile writer's): checked whole first, it is refused only when that
    pointer is reached, after the keys before it were set. The message is then as it
    was, byte for byte (the keys before stayed set; found by a differential sweep)."""
    k = generated.kitchen
    # The root's left (word 3) is a Tree (words 6-10) whose own left (word 8) is a list.
    words = tree(left=struct_ptr(3, 6, 1, 4)) + [7, 0, list_ptr(8, 11, BYTE, 8), 0, 0, 99]
    built = k.Tree.read([seg(*words)]).as_builder()
    before = built.to_bytes()
    nested = {"value": 5, "children": [{"value": 1}], "left": {"value": 6}}
    with pytest.raises(ValueError, match="holds a list, not a struct"):
        built.left = nested
    assert built.to_bytes() == before
    with pytest.raises(ValueError, match="holds a list, not a struct"):
        built.left = {"value": 4, "left": nested}  # refused one level further down
    assert built.to_bytes() == before
    built.left = {"value": 8, "children": [{"value": 2}]}  # the message still takes one
    assert (built.left.value, built.left.children[0].value) == (8, 2)


def test_list_containing_itself(generated: Generated) -> None:
    """Tree.children is a one-element list whose element's children is that same list."""
    k = generated.kitchen
    words = tree(children=list_ptr(2, 6, COMPOSITE, 5)) + [tag(1, 1, 4), 7]
    words += [list_ptr(8, 6, COMPOSITE, 5), 0, 0, 0]  # the element's pointers (words 8-11)
    message = [seg(*words)]
    assert k.Tree.read(message).children[0].children[0].children[0].value == 7
    with refused("message exceeds the nesting limit"):
        k.Tree.read(message).to_dict()
    with refused("message exceeds the traversal limit"):
        k.Tree.read(message, nesting_limit=10**9, traversal_limit_words=300).to_dict()


def test_any_pointer_loop(generated: Generated) -> None:
    """Tree.anything points back at the root, read as a Tree again and again."""
    k = generated.kitchen
    r = k.Tree.read([seg(*tree(anything=struct_ptr(5, 1, 1, 4)))])
    with refused("message exceeds the nesting limit"):
        for _ in range(100):
            r = r.anything.as_struct(k.Tree.Reader)


# ---------------------------------------------------------------------- amplification
def test_one_list_pointed_at_many_times(generated: Generated) -> None:
    """Lists.nested holds 1000 pointers to one List(Int32) of 64 elements (32 words): the
    message is 1052 words, reading it all would be 32 000."""
    k = generated.kitchen
    count, inner = 1000, 20 + 1000
    words = lists(nested=list_ptr(AT["nested"], 20, POINTER, count))
    words += [list_ptr(20 + i, inner, FOUR, 64) for i in range(count)]
    words += [3] * 32
    message = [seg(*words)]
    assert len(words) == 1052
    with refused("message exceeds the traversal limit"):
        k.Lists.read(message, traversal_limit_words=4 * len(words)).to_dict()
    # Each visit is charged, so a loop over the outer list alone is stopped too.
    r = k.Lists.read(message, traversal_limit_words=4 * len(words))
    with refused("message exceeds the traversal limit"):
        for item in r.nested:
            assert item[0] == 3
    # Under the default (8 Mi words) budget the same message is fine.
    assert k.Lists.read(message).to_dict()["nested"][999] == [3, 0] * 32


def test_one_text_pointed_at_many_times(generated: Generated) -> None:
    """Lists.texts: 2000 pointers to one Text of 799 characters (100 words)."""
    k = generated.kitchen
    count, text = 2000, 20 + 2000
    words = lists(texts=list_ptr(AT["texts"], 20, POINTER, count))
    words += [list_ptr(20 + i, text, BYTE, 800) for i in range(count)]
    words += text_words(b"x" * 799 + b"\0")
    with refused("message exceeds the traversal limit"):
        k.Lists.read([seg(*words)], traversal_limit_words=10_000).to_dict()


# ---------------------------------------------------------------------- lists that lie
def test_composite_list_lies(generated: Generated) -> None:
    k = generated.kitchen
    element = [7, 0, 0, 0, 0]  # one Tree: 1 data word, 4 null pointers

    def children(list_word: int, tag_word: int, *rest: int) -> Any:
        return k.Tree.read([seg(*tree(children=list_word), tag_word, *rest)]).to_dict()

    assert children(list_ptr(2, 6, COMPOSITE, 5), tag(1, 1, 4), *element) == {
        "value": 42,
        "children": [{"value": 7}],
    }
    # The tag claims 3 elements of 5 words; the list pointer says 5 words in all.
    with refused("composite list's elements overrun it"):
        children(list_ptr(2, 6, COMPOSITE, 5), tag(3, 1, 4), *element)
    # The largest element count a tag holds (2**30 - 1).
    with refused("composite list's elements overrun it"):
        children(list_ptr(2, 6, COMPOSITE, 5), tag(2**30 - 1, 1, 4), *element)
    # The list pointer claims more words than the segment holds after the tag.
    with refused("composite list out of bounds"):
        children(list_ptr(2, 6, COMPOSITE, 6), tag(1, 1, 4), *element)
    # No room even for the tag.
    with refused("composite list out of bounds"):
        k.Tree.read([seg(*tree(children=list_ptr(2, 6, COMPOSITE, 0)))]).to_dict()
    # The tag is a list pointer, not struct-shaped.
    with refused("composite list's tag is not struct-shaped"):
        children(list_ptr(2, 6, COMPOSITE, 5), list_ptr(6, 7, EIGHT, 1), *element)


def test_huge_counts_in_tiny_segments(generated: Generated) -> None:
    """Element counts of 2**29 - 1 behind one-word messages: refused at once, before any
    work proportional to the count."""
    k = generated.kitchen
    cases = [
        ("i32s", FOUR, "list out of bounds"),
        ("bools", BIT, "list out of bounds"),
        ("u8s", BYTE, "list out of bounds"),
        ("texts", POINTER, "list out of bounds"),
        ("structs", COMPOSITE, "composite list out of bounds"),
        # 2**29 - 1 voids take no bytes, but each is charged a word of traversal budget.
        ("voids", VOID, "message exceeds the traversal limit"),
    ]
    for name, code, reason in cases:
        r = k.Lists.read([seg(*lists(**{name: list_ptr(AT[name], 20, code, HUGE)}), 0)])
        with refused(reason):
            getattr(r, name)
    # 2**30 - 1 structs of no size in a composite list of 0 words: charged one word each.
    r = k.Lists.read(
        [seg(*lists(structs=list_ptr(AT["structs"], 20, COMPOSITE, 0)), tag(2**30 - 1, 0, 0))]
    )
    with refused("message exceeds the traversal limit"):
        _ = r.structs
    # Text of 2**29 - 1 bytes.
    with refused("Text out of bounds"):
        _ = k.Keywords.read([seg(*keywords(list_ptr(2, 3, BYTE, HUGE)), 0)]).class_


# ---------------------------------------------------------------------- text
def test_text_without_nul(generated: Generated) -> None:
    k = generated.kitchen
    # "abc" without its NUL.
    with refused("Text is not NUL-terminated"):
        _ = k.Keywords.read([seg(*keywords(list_ptr(2, 3, BYTE, 3)), *text_words(b"abc"))]).class_
    # An empty byte list: not even the NUL.
    with refused("Text is not NUL-terminated"):
        _ = k.Keywords.read([seg(*keywords(list_ptr(2, 3, BYTE, 0)))]).class_
    # The NUL is there but not counted (count 2 of "ab\0").
    with refused("Text is not NUL-terminated"):
        _ = k.Keywords.read([seg(*keywords(list_ptr(2, 3, BYTE, 2)), *text_words(b"ab\0"))]).class_


def test_text_not_utf8(generated: Generated) -> None:
    k = generated.kitchen
    for raw, reason in [
        (b"\xff\0", "Text is not valid UTF-8: invalid start byte"),
        (b"ok\xe2\x82\0", "Text is not valid UTF-8: unexpected end of data"),
        (b"\xed\xa0\x80\0", "Text is not valid UTF-8: invalid continuation byte"),  # surrogate
    ]:
        r = k.Keywords.read([seg(*keywords(list_ptr(2, 3, BYTE, len(raw))), *text_words(raw))])
        with refused(reason):
            _ = r.class_
    # The same inside a List(Text), found by to_dict.
    words = lists(texts=list_ptr(AT["texts"], 20, POINTER, 1)) + [list_ptr(20, 21, BYTE, 2)]
    with refused("Text is not valid UTF-8: invalid start byte"):
        k.Lists.read([seg(*words, *text_words(b"\x80\0"))]).to_dict()


# ---------------------------------------------------------------------- wrong kinds
def test_wrong_pointer_kinds(generated: Generated) -> None:
    k = generated.kitchen
    pad = [0] * 4  # room for whatever the pointers below point at (words 6-9)

    def tree_field(field: str, **slots: int) -> Any:
        return getattr(k.Tree.read([seg(*tree(**slots), *pad)]), field)

    def lists_field(name: str, word: int) -> Any:
        return getattr(k.Lists.read([seg(*lists(**{name: word}), *pad)]), name)

    def keywords_class(word: int) -> Any:
        return k.Keywords.read([seg(*keywords(word), *pad)]).class_

    cases: list[tuple[str, Callable[[], Any]]] = [
        # A list where a struct is expected, and a capability.
        (
            "expected a struct pointer, found a list pointer",
            lambda: tree_field("left", left=list_ptr(3, 6, EIGHT, 1)),
        ),
        (
            "expected a struct pointer, found a capability",
            lambda: tree_field("left", left=cap_ptr(0)),
        ),
        # A struct where a list is expected, and a capability.
        (
            "expected a list pointer, found a struct pointer",
            lambda: tree_field("children", children=struct_ptr(2, 6, 1, 0)),
        ),
        (
            "expected a list pointer, found a capability",
            lambda: tree_field("children", children=cap_ptr(2)),
        ),
        # A capability, a struct, a list of Int32 where Text is expected.
        ("expected Text (a list pointer), found a capability", lambda: keywords_class(cap_ptr(0))),
        (
            "expected Text (a list pointer), found a struct pointer",
            lambda: keywords_class(struct_ptr(2, 3, 1, 0)),
        ),
        (
            "expected Text: a list of bytes, found element size 4",
            lambda: keywords_class(list_ptr(2, 3, FOUR, 2)),
        ),
        # Element sizes that cannot stand for the list's element type.
        (
            "expected a list of 32-bit numbers, found element size code 2",
            lambda: lists_field("i32s", list_ptr(AT["i32s"], 20, BYTE, 4)),
        ),
        (
            "expected a list of 32-bit numbers, found element size code 6",
            lambda: lists_field("i32s", list_ptr(AT["i32s"], 20, POINTER, 1)),
        ),
        (
            "expected a list of 8-bit numbers, found element size code 1",
            lambda: lists_field("u8s", list_ptr(AT["u8s"], 20, BIT, 3)),
        ),
        (
            "expected a list of pointers, found element size code 5",
            lambda: lists_field("texts", list_ptr(AT["texts"], 20, EIGHT, 2)),
        ),
        (
            "expected a list of structs, found a list of Bool",
            lambda: lists_field("structs", list_ptr(AT["structs"], 20, BIT, 3)),
        ),
        (
            "expected a list of Bool, found element size code 2",
            lambda: lists_field("bools", list_ptr(AT["bools"], 20, BYTE, 3)),
        ),
        # A struct where a capability is expected (an AnyPointer read as one).
        (
            "expected a capability, found a struct pointer",
            lambda: tree_field("anything", anything=struct_ptr(5, 6, 1, 0)).capability_index(),
        ),
        # A far pointer landing on a capability where a struct is expected.
        (
            "expected a struct pointer, found a capability",
            lambda: k.Tree.read([seg(far_ptr(1, 0)), seg(cap_ptr(0))]),
        ),
    ]
    for reason, read in cases:
        with refused(reason):
            read()
    # An element of a List(List(Int32)) that is a struct.
    words = lists(nested=list_ptr(AT["nested"], 20, POINTER, 1)) + [struct_ptr(20, 21, 1, 0), 0]
    with refused("expected a list pointer, found a struct pointer"):
        k.Lists.read([seg(*words)]).to_dict()


# ---------------------------------------------------------------------- random messages
@pytest.fixture(scope="module")
def seeds(generated: Generated) -> list[tuple[str, list[bytes]]]:
    """Valid messages of several kitchen structs, each in one segment and spread over
    one-word segments (far pointers everywhere)."""
    values: list[tuple[str, dict[str, Any]]] = [
        (
            "Tree",
            {
                "value": 1,
                "children": [
                    {"value": 2, "left": {"value": 3}},
                    {"value": 4, "other": {"id": 5, "tag": "t", "kind": "large"}},
                ],
                "left": {"value": 6, "children": [{"value": 7}]},
                "other": {"id": 8, "tag": "eight"},
            },
        ),
        (
            "Lists",
            {
                "voids": [None] * 3,
                "bools": [True, False, True],
                "i8s": [-1, 2],
                "i16s": [-300, 4],
                "i32s": [5, -6, 7],
                "i64s": [2**40],
                "u16s": [65535],
                "f32s": [1.5],
                "f64s": [2.5, -0.0],
                "texts": ["a", "bc", ""],
                "datas": [b"\x01\x02"],
                "structs": [{"i32": 1, "color": "blue"}, {"b": True, "u64": 9}],
                "colors": ["red", "blue"],
                "nested": [[1, 2], [], [3]],
                "nestedTexts": [["x"], ["y", "z"]],
                "deep": [[[1, 2]], [[3], []]],
            },
        ),
        ("Defaults", {"text": "t", "numbers": {"i8": 1}, "list": [5], "texts": ["q"]}),
        (
            "Shapes",
            {
                "name": "s",
                "square": {"side": 1.0, "label": "sq"},
                "style": {"color": "green", "fill": {"pattern": "p"}},
            },
        ),
    ]
    out = []
    for name, data in values:
        message = getattr(generated.reference, name).new_message(**data)
        out.append((name, [bytes(s) for s in message.to_segments()]))
        spread = capnp._MallocMessageBuilder(1)
        spread.set_root(message.as_reader())
        out.append((name, [bytes(s) for s in spread.get_segments_for_output()]))
    return out


#: A pointer-like word: any kind, small offsets and sizes (more often meaningful than a
#: random 64-bit number), or a far pointer to one of the first few segments.
_POINTERS = st.one_of(
    st.builds(
        lambda kind, offset, a, b: kind | (offset << 2) & 0xFFFFFFFF | a << 32 | b << 48,
        st.sampled_from([0, 1, 3]),
        st.integers(-8, 8),
        st.one_of(st.integers(0, 8), st.just(0xFFFF)),
        st.integers(0, 6),
    ),
    st.builds(
        lambda offset, code, count: list_ptr(0, offset + 1, code, count),
        st.integers(-8, 8),
        st.integers(0, 7),
        st.one_of(st.integers(0, 40), st.just(HUGE)),
    ),
    st.builds(
        lambda segment, pad, double: far_ptr(segment, pad, double=double),
        st.integers(0, 4),
        st.integers(0, 40),
        st.booleans(),
    ),
)
_WORDS = st.one_of(_POINTERS, st.integers(0, MASK), st.just(0))
#: The upper half of a pointer: small data and pointer section sizes, or anything.
_SIZES = st.one_of(
    st.builds(lambda data, pointers: data | pointers << 16, st.integers(0, 8), st.integers(0, 8)),
    st.integers(0, 0xFFFFFFFF),
)


def _walk(reader: Any) -> None:
    reader.to_dict()
    if hasattr(reader, "anything"):  # to_dict leaves the AnyPointer out
        anything = reader.anything
        if not anything.is_null:
            anything.as_struct(type(reader)).to_dict()


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_messages_decode_or_refuse(
    generated: Generated, seeds: list[tuple[str, list[bytes]]], data: st.DataObject
) -> None:
    """Up to 6 words of a valid message replaced (pointer-like words or any), a bit
    flipped, or given other sizes (a pointer's upper half), and maybe a segment cut short:
    the reader walks it all or raises DecodeError."""
    name, original = data.draw(st.sampled_from(seeds))
    segments = [bytearray(segment) for segment in original]
    for _ in range(data.draw(st.integers(1, 6))):
        si = data.draw(st.integers(0, len(segments) - 1))
        words = len(segments[si]) >> 3
        if not words:
            continue
        at = data.draw(st.integers(0, words - 1)) << 3
        (word,) = struct.unpack_from("<Q", segments[si], at)
        how = data.draw(st.sampled_from(["replace", "flip", "resize"]))
        if how == "replace":
            word = data.draw(_WORDS)
        elif how == "flip":
            word ^= 1 << data.draw(st.integers(0, 63))
        else:  # same kind and offset, other sizes (struct) or element size and count (list)
            word = word & 0xFFFFFFFF | data.draw(_SIZES) << 32
        segments[si][at : at + 8] = struct.pack("<Q", word & MASK)
    if data.draw(st.integers(0, 9)) == 0:
        si = data.draw(st.integers(0, len(segments) - 1))
        del segments[si][data.draw(st.integers(0, len(segments[si]))) :]
    kind = getattr(generated.kitchen, name)
    try:
        _walk(kind.read(segments, traversal_limit_words=1 << 16))
    except DecodeError:
        pass


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.sampled_from(["Tree", "Lists", "Defaults", "Shapes", "Keywords"]),
    segments=st.lists(
        st.lists(_WORDS, max_size=24).map(lambda words: seg(*words)), min_size=1, max_size=4
    ),
)
def test_random_words_decode_or_refuse(
    generated: Generated, name: str, segments: list[bytes]
) -> None:
    kind = getattr(generated.kitchen, name)
    try:
        _walk(kind.read(segments, traversal_limit_words=1 << 16))
    except DecodeError:
        pass
