"""What a pycapnp user writes, on generated code: ``with T.from_bytes(data) as t``,
``read_multiple_bytes`` over a stream of messages, ``reader.as_builder()`` to change a
received message, and the traversal and nesting limits of ``from_bytes``. pycapnp (the C++
reference) writes and reads the bytes on the other side."""

from __future__ import annotations

from typing import Any

import pytest

from capsvc.errors import DecodeError
from tests.codegen.conftest import Generated


def test_from_bytes_is_a_context_manager_as_in_pycapnp(generated: Generated) -> None:
    def tree() -> Any:
        return generated.reference.Tree.new_message(value=3, left={"value": 4})

    with generated.kitchen.Tree.from_bytes(tree().to_bytes()) as read:
        assert (read.value, read.left.value) == (3, 4)
    with generated.kitchen.Tree.from_bytes_packed(tree().to_bytes_packed()) as read:
        assert read.left.value == 4


def test_from_bytes_takes_the_limits(generated: Generated) -> None:
    """A deep chain of ``left`` structs: read with the default limits, refused (the typed
    error, naming the limit) under a lower nesting or traversal limit."""
    data: dict[str, Any] = {"value": 0}
    for depth in range(1, 20):
        data = {"value": depth, "left": data}
    framed = generated.reference.Tree.new_message(**data).to_bytes()
    tree = generated.kitchen.Tree
    assert tree.from_bytes(framed).left.left.value == 17
    shallow = tree.from_bytes(framed, nesting_limit=5)
    with pytest.raises(DecodeError, match="nesting limit"):
        shallow.left.left.left.left.left.left  # noqa: B018
    small = tree.from_bytes(framed, traversal_limit_words=10)
    with pytest.raises(DecodeError, match="traversal limit"):
        tree.row(small)


def test_read_multiple_bytes_reads_a_stream_of_messages(generated: Generated) -> None:
    """Messages one after another (one of them with several segments, as pycapnp writes
    a message whose first segment is small), unpacked and packed: each read in order,
    as pycapnp's ``read_multiple_bytes`` reads them; a message cut short is an error
    naming it."""
    reference, tree = generated.reference.Tree, generated.kitchen.Tree
    import capnp

    def messages() -> list[Any]:
        big = capnp._MallocMessageBuilder(4)  # a 4-word first segment: several segments
        root = big.init_root(reference.schema)
        root.value = 2
        root.init("children", 40)
        return [reference.new_message(value=1), root, reference.new_message(value=3)]

    built = messages()
    frames = [message.to_bytes() for message in built]
    assert int.from_bytes(frames[1][:4], "little") > 0  # (the segment count - 1)
    stream = b"".join(frames)
    packed = b"".join(message.to_bytes_packed() for message in messages())
    expected = [message.as_reader().to_dict() for message in built]
    for read in (tree.read_multiple_bytes(stream), tree.read_multiple_bytes_packed(packed)):
        assert [message.to_dict() for message in read] == expected
    assert [m.value for m in reference.read_multiple_bytes(stream)] == [1, 2, 3]
    with pytest.raises(DecodeError, match=r"^message 2: .*connection closed in the middle"):
        tree.read_multiple_bytes(stream[:-8])
    assert tree.read_multiple_bytes(b"") == []


async def test_as_builder_copies_a_received_message_to_change(generated: Generated) -> None:
    """``reader.as_builder()``: a new message holding a copy, capabilities too; changing
    it leaves the reader's message as it was."""
    k = generated.kitchen

    class Shop(k.Shop.Server):  # type: ignore[misc, name-defined]
        def list(self, params: Any, results: Any) -> None:
            results.items = ["kept"]

    received = k.Tree.new_message(value=1, children=[{"value": 2}]).as_reader()
    copy = received.as_builder()
    copy.value = 10
    copy.children[0].value = 20
    assert received.to_dict() == {"value": 1, "children": [{"value": 2}]}
    assert copy.to_dict() == {"value": 10, "children": [{"value": 20}]}
    holder = k.Anything.new_message(shop=Shop()).as_reader().as_builder()
    assert (await holder.shop.list()).items == ["kept"]
    assert (await holder.as_reader().shop.list()).items == ["kept"]
