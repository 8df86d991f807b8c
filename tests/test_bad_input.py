"""Hostile bytes against a live server: precise Aborts, and other clients never notice."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

import capsvc
from capsvc.framing import FrameDecoder, encode_message
from capsvc.rpc import wire
from tests.test_connection import Tester, testing


@pytest.fixture
async def server_address(nursery: trio.Nursery) -> AsyncIterator[str]:
    limits = capsvc.FramingLimits(max_message_words=64 * 1024)
    address = await nursery.start(
        lambda task_status: capsvc.serve(
            "tcp:127.0.0.1:0", Tester(), limits=limits, task_status=task_status
        )
    )
    return address


async def exchange(
    address: str, data: bytes, *, half_close: bool = True, expect: int | None = None
) -> list[Any]:
    """Send raw bytes, then read what the server sends until it closes (or, with
    ``expect``, until that many messages arrived: an EOF from us would make the server
    drop the connection, and with it the calls still running, as C++ does)."""
    host_port = address.split(":", 1)[1]
    host, port = host_port.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    decoder = FrameDecoder()
    replies = []
    # Real time: this guards real socket I/O with the server (a jumping clock would fire it
    # while the kernel still carries our bytes); only a hung server ever gets near it.
    with trio.fail_after(10):
        await stream.send_all(data)
        if half_close:
            await stream.send_eof()
        while chunk := await stream.receive_some(65536):
            decoder.feed(chunk)
            while (segments := decoder.next_message()) is not None:
                replies.append(wire.Message.from_segments(segments))
            if expect is not None and len(replies) >= expect:
                break
    await stream.aclose()
    return replies


def abort_reason(replies: list[Any]) -> str:
    """The reason of the Abort the server ended with (rpc-protocol.md §10: type failed)."""
    assert replies, "the server closed without a word"
    last = replies[-1]
    assert last.which() == "abort", [r.which() for r in replies]
    assert str(last.abort.type) == "failed", last.abort.type
    return str(last.abort.reason)


@pytest.fixture
async def bystander(server_address: str) -> AsyncIterator[Any]:
    """A well-behaved client connected the whole time; it must never notice the others."""
    async with capsvc.connect(server_address) as conn:
        tester = conn.bootstrap(testing.Tester)
        assert (await tester.echo(msg="before")).reply == "before"
        yield tester
        assert (await tester.echo(msg="after")).reply == "after"
        assert not conn.closed


def frame_header(*sizes: int) -> bytes:
    header = struct.pack(f"<I{len(sizes)}I", len(sizes) - 1, *sizes)
    return header + (b"\0" * 4 if len(sizes) % 2 == 0 else b"")


async def test_garbage_bytes(server_address: str, bystander: Any) -> None:
    # The first word of 0xff bytes announces 2**32 segments (count - 1 = 0xffffffff).
    reason = abort_reason(await exchange(server_address, b"\xff" * 64))
    assert reason == (
        "message has 4294967296 segments, over the limit of 511 (Limits.max_segments)"
    )


async def test_huge_segment_count(server_address: str, bystander: Any) -> None:
    reason = abort_reason(await exchange(server_address, struct.pack("<II", 99_999, 1)))
    assert reason == ("message has 100000 segments, over the limit of 511 (Limits.max_segments)")


async def test_oversized_message(server_address: str, bystander: Any) -> None:
    reason = abort_reason(await exchange(server_address, frame_header(1 << 20)))
    assert reason == (
        "message announces 1048576 words (8388608 bytes), over the limit of 65536 words "
        "(Limits.max_message_words)"
    )


async def test_truncated_frame(server_address: str, bystander: Any) -> None:
    data = frame_header(10) + b"\0" * 16  # announces 80 bytes, sends 16, then EOF
    reason = abort_reason(await exchange(server_address, data))
    assert (
        reason == "connection closed in the middle of a message (received 16 of its 80 body bytes)"
    )


async def test_malformed_message_content(server_address: str, bystander: Any) -> None:
    body = struct.pack("<Q", 0x7FFF_FFFC_0001_0000)  # a struct pointer far out of bounds
    reason = abort_reason(await exchange(server_address, frame_header(1) + body))
    # capsvc's prefix (RpcSession.receive), then libcapnp's own words for this pointer.
    assert reason.startswith("malformed message: "), reason
    assert "out-of-bounds struct pointer" in reason, reason


async def test_unknown_message_type_is_echoed_as_unimplemented(
    server_address: str, bystander: Any
) -> None:
    message = wire.Message.new_message()
    message.init("bootstrap").questionId = 0
    segments = [bytearray(s) for s in message.to_segments()]
    struct.pack_into("<H", segments[0], 8, 77)  # union tag 77: no such Message variant
    replies = await exchange(server_address, encode_message(segments))
    assert replies[0].which() == "unimplemented"
    # rpc-protocol.md §11: echoed verbatim, unknown union tag 77 included.
    echoed = replies[0].unimplemented.as_builder().to_segments()
    assert wire.message_tag(echoed) == 77
    assert [bytes(s) for s in echoed] == [bytes(s) for s in segments]
    assert len(replies) == 1  # and no abort: the connection stayed up until we closed it


async def test_call_to_unknown_interface_returns_unimplemented(
    server_address: str, bystander: Any
) -> None:
    bootstrap = wire.Message.new_message()
    bootstrap.init("bootstrap").questionId = 0
    call = wire.Message.new_message()
    body = call.init("call")
    body.questionId = 1
    body.target.init("promisedAnswer").questionId = 0
    body.interfaceId = 0x1234_5678_9ABC_DEF0
    body.methodId = 0
    body.init("params")
    data = encode_message(bootstrap.to_segments()) + encode_message(call.to_segments())
    replies = await exchange(server_address, data, half_close=False, expect=2)
    returns = {getattr(r, "return").answerId: getattr(r, "return") for r in replies[:2]}
    exception = returns[1].exception
    assert str(exception.type) == "unimplemented"
    assert exception.reason == (
        "Tester does not implement method 0 of interface 0x123456789abcdef0"
        " (no schema loaded here has it); it serves Tester"
    )
