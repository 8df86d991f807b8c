"""``T.decoder()`` (capsvc.codec.streams.RootDecoder): the roots of a byte stream of
framed messages, fed in whatever pieces the transport delivers. pycapnp (the C++
reference) writes the messages, several segments included; the framing decoder's
fast path (a feed that is one whole message) and its general path both run, and so do
its limits and its faults."""

from __future__ import annotations

import random
import struct
from typing import Any

import capnp
import pytest

from capsvc import Limits
from capsvc.codec import building
from capsvc.errors import DecodeError, FramingError
from tests.codegen.conftest import Generated


def _messages(generated: Generated) -> list[Any]:
    """pycapnp Trees: small ones, and one whose 4-word first segment makes several."""
    reference = generated.reference.Tree
    big = capnp._MallocMessageBuilder(4)
    root = big.init_root(reference.schema)
    root.value = 2
    root.init("children", 40)
    return [
        reference.new_message(value=1),
        root,
        reference.new_message(value=3, left={"value": 4}),
        reference.new_message(),
    ]


def _splits(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` cut at random places (pieces of 1 byte to a whole message and more)."""
    pieces, at = [], 0
    while at < len(data):
        size = rng.choice([1, 2, 7, 8, 9, 24, 100, len(data)])
        pieces.append(data[at : at + size])
        at += size
    return pieces


def test_decoder_reads_every_root_however_the_stream_is_cut(generated: Generated) -> None:
    """Each message's root, in order, equal to what ``from_bytes`` reads of it alone:
    fed whole (a feed that is one message: the fast path), all at once, and in random
    pieces (the general path); ``next()`` is None between messages, and iteration takes
    what is complete so far."""
    built = _messages(generated)
    frames = [message.to_bytes() for message in built]
    assert int.from_bytes(frames[1][:4], "little") > 0  # several segments
    tree = generated.kitchen.Tree
    expected = [tree.from_bytes(frame).to_dict() for frame in frames]

    decoder = tree.decoder()
    for frame, want in zip(frames, expected, strict=True):
        decoder.feed(frame)
        root = decoder.next()
        assert root is not None
        assert root.to_dict() == want
        assert decoder.next() is None
        assert decoder.buffered == 0

    decoder = tree.decoder()
    decoder.feed(b"".join(frames))
    assert [root.to_dict() for root in decoder] == expected
    assert list(decoder) == []

    rng = random.Random(7)
    for _ in range(40):
        decoder = tree.decoder()
        got = []
        for piece in _splits(b"".join(frames), rng):
            decoder.feed(piece)
            got.extend(root.to_dict() for root in decoder)
        assert got == expected
        assert decoder.buffered == 0


def test_decoder_counts_what_a_feed_left_unread(generated: Generated) -> None:
    """A feed kept whole while incomplete (or holding more than one message) counts in
    ``buffered``, and gives its messages once the rest arrives."""
    frame = generated.reference.Tree.new_message(value=9).to_bytes()
    decoder = generated.kitchen.Tree.decoder()
    decoder.feed(frame[:-3])
    assert decoder.buffered == len(frame) - 3
    assert decoder.next() is None
    decoder.feed(frame[-3:] + frame[:5])
    root = decoder.next()
    assert root is not None
    assert root.value == 9
    assert decoder.buffered == 5
    decoder.feed(frame[5:])
    root = decoder.next()
    assert root is not None
    assert root.value == 9
    assert decoder.next() is None


def test_decoder_faults_are_typed_and_final(generated: Generated) -> None:
    """A segment table over the limits is a FramingError at once (before the body is
    waited for), raised again by every later call; a stream that ends inside a message
    is one too; a root over the traversal limit is a DecodeError on reading it."""
    tree = generated.kitchen.Tree
    decoder = tree.decoder(Limits(max_message_words=16))
    decoder.feed(struct.pack("<II", 0, 17))  # one segment of 17 words: over 16
    with pytest.raises(FramingError, match="limit"):
        decoder.next()
    with pytest.raises(FramingError):
        decoder.next()
    with pytest.raises(FramingError):
        decoder.feed(b"\0" * 8)

    decoder = tree.decoder(Limits(max_segments=2))
    decoder.feed(struct.pack("<II", 2, 1))  # three segments
    with pytest.raises(FramingError, match="segment"):
        decoder.next()

    frame = generated.reference.Tree.new_message(value=1).to_bytes()
    decoder = tree.decoder()
    decoder.feed(frame[:-1])
    decoder.feed_eof()
    with pytest.raises(FramingError, match="closed in the middle"):
        decoder.next()

    data: dict[str, Any] = {"value": 0}
    for depth in range(1, 30):
        data = {"value": depth, "left": data}
    deep = generated.reference.Tree.new_message(**data).to_bytes()
    decoder = tree.decoder(Limits(traversal_limit_words=12))
    decoder.feed(deep)
    root = decoder.next()
    assert root is not None
    with pytest.raises(DecodeError, match="traversal limit"):
        tree.row(root)
    decoder = tree.decoder(Limits(nesting_limit=4))
    decoder.feed(deep)
    root = decoder.next()
    assert root is not None
    with pytest.raises(DecodeError, match="nesting limit"):
        root.left.left.left.left.left  # noqa: B018


def test_to_bytes_frames_as_the_python_framing_does(generated: Generated) -> None:
    """``to_bytes`` (in C where compiled) writes the table and the segment exactly as the
    pure build's struct-packed table does, and pycapnp reads it back."""
    rng = random.Random(3)
    for _ in range(50):
        values = [rng.randrange(-(2**31), 2**31) for _ in range(rng.randrange(0, 30))]
        built = generated.kitchen.Tree.new_message(
            value=values[0] if values else 0, children=[{"value": v} for v in values]
        )
        buf = built._b.buf
        assert built.to_bytes() == struct.pack("<II", 0, len(buf) >> 3) + bytes(buf)
        with generated.reference.Tree.from_bytes(built.to_bytes()) as read:
            assert [child.value for child in read.children] == values
    if building._FRAME_ONE is not None:
        with pytest.raises(ValueError, match="whole number of words"):
            building._FRAME_ONE(bytearray(3))


def test_encode_is_from_row_or_new_message_then_to_bytes(generated: Generated) -> None:
    """``T.encode(value)`` gives the bytes that building ``value`` and ``to_bytes`` (or
    ``to_bytes_packed``) give, byte for byte, for a row and for a dict of fields; pycapnp
    reads them back equal."""
    k, reference = generated.kitchen, generated.reference
    tree = {"value": 7, "children": [{"value": 1}, {"value": 2, "left": {"value": 3}}]}
    lists = {"i32s": [1, -2], "texts": ["a", ""], "nested": [[1], []], "colors": ["red"]}
    for root, fields in ((k.Tree, tree), (k.Lists, lists), (k.Tree, {})):
        built = root.new_message(**fields)
        row = root.row(built)  # (a null list reads as [], and is written back as one)
        from_row = root.from_row(row)
        for value, same in ((row, from_row), (fields, built)):
            assert root.encode(value) == same.to_bytes()
            assert root.encode(value, packed=True) == same.to_bytes_packed()
        reference_root = getattr(reference, root.__name__)
        with reference_root.from_bytes(root.encode(row)) as read:
            assert read.to_dict() == from_row.as_reader().to_dict()
        read_packed = reference_root.from_bytes_packed(root.encode(fields, packed=True))
        assert read_packed.to_dict() == built.as_reader().to_dict()


def test_encode_grows_and_shrinks_its_buffer_from_one_message_to_the_next(
    generated: Generated,
) -> None:
    """The compiled encoder starts each message's buffer at the last one's size and grows
    or trims it as it writes (in place, behind the segment table's word): messages far
    larger and far smaller than the one before still give ``to_bytes``'s bytes, and
    their table gives their own size."""
    k = generated.kitchen
    for count in (0, 3, 600, 1, 2_000, 0):
        tree = {"value": count, "children": [{"value": index} for index in range(count)]}
        data = k.Tree.encode(tree)
        assert data == k.Tree.new_message(**tree).to_bytes()
        assert int.from_bytes(data[:4], "little") == 0  # one segment
        assert int.from_bytes(data[4:8], "little") * 8 == len(data) - 8
        children = k.Tree.from_bytes(data).children
        assert [child.value for child in children] == list(range(count))


def test_encode_refuses_what_is_not_a_row_or_a_dict(generated: Generated) -> None:
    """Anything but a row or a mapping of fields is a TypeError naming the struct (a list,
    ``new_message``'s own form, too); a field's mistake names the field; a value holding
    a capability is refused (the bytes cannot carry its cap table), its reference
    released."""
    k = generated.kitchen
    for wrong in ([7], 7, None, "7"):
        with pytest.raises(TypeError, match=r"^Tree\.encode\(\): expected a Tree row"):
            k.Tree.encode(wrong)
    with pytest.raises(TypeError, match=r"Tree has no field 'valu'"):
        k.Tree.encode({"valu": 7})
    with pytest.raises(TypeError, match=r"Tree\.value: expected an int"):
        k.Tree.encode({"value": "7"})
    with pytest.raises(TypeError, match=r"a Tree row holds 5 values"):
        k.Tree.encode((7,))

    class Shop(k.Shop.Server):  # type: ignore[misc, name-defined]
        pass

    client = k.Anything.new_message(shop=Shop()).shop
    hook = client._capsvc_hook()
    refs = hook.refs
    with pytest.raises(ValueError, match=r"^Anything\.encode\(\): the value holds capabilities"):
        k.Anything.encode({"shop": client})
    assert hook.refs == refs
