"""The outbox's reserved places (rpc-protocol.md §13.10): what building a message causes
lands behind it, whatever the building does."""

from __future__ import annotations

import pytest

from capsvc.errors import LocalProtocolError
from capsvc.framing import FrameDecoder
from capsvc.rpc.outbox import Outbox


def message(word: int) -> list[bytes]:
    return [word.to_bytes(8, "little")]


def words(frames: list[bytes]) -> list[int]:
    decoder = FrameDecoder()
    for frame in frames:
        decoder.feed(frame)
    out = []
    while (segments := decoder.next_message()) is not None:
        out.append(int.from_bytes(segments[0], "little"))
    return out


def test_a_message_sent_while_another_is_built_follows_it() -> None:
    outbox = Outbox()
    outer = outbox.reserve()
    inner = outbox.reserve()  # building the first message causes a second one...
    outbox.send(message(3))  # ...and a Release while building that
    outbox.fill(inner, message(2))
    outbox.fill(outer, message(1))
    assert words(outbox.take()) == [1, 2, 3]


def test_a_given_up_place_leaves_no_trace() -> None:
    outbox = Outbox()
    place = outbox.reserve()
    outbox.send(message(2))
    outbox.give_up(place)
    assert outbox.pending_bytes == len(outbox.take()[0])
    assert outbox.take() == []


def test_taking_while_a_message_is_being_built_is_an_engine_bug() -> None:
    outbox = Outbox()
    outbox.reserve()
    with pytest.raises(LocalProtocolError, match="while a message was being built"):
        outbox.take()


def test_the_driver_is_told_of_the_first_message_and_the_first_urgent_one() -> None:
    calls: list[int] = []
    outbox = Outbox(lambda: calls.append(outbox.pending_bytes))
    place = outbox.reserve()
    assert calls == []  # a reservation alone is nothing to write
    outbox.send(message(1), urgent=False)  # a Release: the first message
    outbox.send(message(2), urgent=False)
    assert len(calls) == 1
    assert not outbox.urgent
    outbox.fill(place, message(0))  # the Call: the first urgent one
    assert len(calls) == 2
    assert outbox.urgent
    assert words(outbox.take()) == [0, 1, 2]
    assert not outbox.has_output
