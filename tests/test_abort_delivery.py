"""An Abort reaches the peer even when its unread bytes sit in our receive buffer.

Closing a TCP socket whose receive buffer still holds unread bytes makes the kernel send
a reset (RFC 1122 §4.2.2.13, RFC 2525 §2.17) instead of a FIN, and a reset can make the
peer lose data we sent just before it (our Abort). The driver therefore lingers after an
Abort: it shuts down its write side, reads and discards input for a bounded time, then
closes (capsvc/connection.py, ``Connection._linger_after_abort``).
"""

from __future__ import annotations

import collections
import socket
import struct

import pytest
import trio
import trio.testing

import capsvc
from capsvc.connection import ABORT_LINGER_BYTES, ABORT_LINGER_SECONDS, Connection
from capsvc.framing import FrameDecoder, FramingLimits
from capsvc.rpc import wire
from capsvc.transport import listener_address, open_listeners
from capsvc.transport.fastsocket import FastSocketStream
from capsvc.transport.memory import memory_stream_pair

#: A segment table announcing 100000 segments: over the limit, so the server aborts.
MALFORMED = struct.pack("<II", 99_999, 1)
#: What the client sends after it: far more than the server reads before it aborts (one
#: read of 64 KiB), so the rest is still unread in the server's receive buffer when it
#: aborts; and more than the socket buffers hold, so the client is still sending then (the
#: way the hostile battery lost half of its Aborts: the reset failed the client's send).
EXTRA = 4 * 1024 * 1024
TRIES = 30


def expected_reason() -> str:
    """The server's precise reason: what its frame decoder says about MALFORMED."""
    decoder = FrameDecoder(FramingLimits())
    decoder.feed(MALFORMED)
    with pytest.raises(capsvc.FramingError) as error:
        decoder.next_message()
    reason = str(error.value)
    assert reason.startswith("message has 100000 segments, over the limit of")
    return reason


async def abort_then_read(host: str, port: int, reason: str, *, half_close: bool) -> str:
    """One hostile client: send MALFORMED plus EXTRA bytes, then read until EOF.

    Returns ``"ok"`` when it read exactly one message, the Abort with ``reason``, and
    then a clean EOF; otherwise a short description of what went wrong.
    """
    with trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        await sock.connect((host, port))
        with memoryview(MALFORMED + b"\0" * EXTRA) as view:
            sent = 0
            try:
                while sent < len(view):
                    sent += await sock.send(view[sent:])
            except OSError as error:
                return f"send failed: {type(error).__name__}"
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        decoder = FrameDecoder()
        received = 0
        try:
            while chunk := await sock.recv(65536):
                received += len(chunk)
                decoder.feed(chunk)
        except OSError as error:
            return f"{type(error).__name__} after {received} bytes"
        decoder.feed_eof()
        messages = []
        while (segments := decoder.next_message()) is not None:
            messages.append(wire.Message.from_segments(segments))
        if [m.which() for m in messages] != ["abort"]:
            return f"read {[m.which() for m in messages]} then EOF"
        if str(messages[0].abort.reason) != reason:
            return f"wrong reason {messages[0].abort.reason!r}"
        return "ok"


@pytest.mark.parametrize("half_close", [True, False], ids=["half-close", "keep-open"])
async def test_abort_survives_unread_input(nursery: trio.Nursery, half_close: bool) -> None:
    """30 hostile clients in a row each read the whole Abort and then EOF, never a reset."""
    reason = expected_reason()
    address = await nursery.start(
        lambda task_status: capsvc.serve("tcp:127.0.0.1:0", None, task_status=task_status)
    )
    host, port = address.split(":", 1)[1].rsplit(":", 1)
    outcomes: collections.Counter[str] = collections.Counter()
    with trio.fail_after(30):
        for _ in range(TRIES):
            outcomes[await abort_then_read(host, int(port), reason, half_close=half_close)] += 1
    assert outcomes == {"ok": TRIES}, dict(outcomes)


async def read_until_eof(stream: trio.abc.ReceiveStream) -> list[str]:
    """The reasons of the Aborts the peer receives, read until our stream's EOF."""
    decoder = FrameDecoder()
    while chunk := await stream.receive_some(65536):
        decoder.feed(chunk)
    reasons = []
    while (segments := decoder.next_message()) is not None:
        message = wire.Message.from_segments(segments)
        assert message.which() == "abort"
        reasons.append(str(message.abort.reason))
    return reasons


async def test_linger_ends_for_a_peer_that_never_stops_sending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A peer that trickles bytes forever (never EOF, never enough to reach the byte cap)
    holds the aborted connection for ABORT_LINGER_SECONDS, no longer; it still reads the
    Abort and our EOF at once. (Virtual time: the trickle sleeps between sends.)"""
    peer, ours = memory_stream_pair()
    connection = Connection(ours)
    reasons: list[str] = []
    eof_at: list[float] = []

    async def trickle() -> None:
        await peer.send_all(MALFORMED)
        while True:
            await peer.send_all(b"\0" * 1000)
            await trio.sleep(0.01)

    async def read() -> None:
        reasons.extend(await read_until_eof(peer))
        eof_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        nursery.start_soon(read)
        start = trio.current_time()
        await connection.run()
        elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    assert reasons == [expected_reason()]
    assert eof_at[0] - start < 0.1  # the Abort and our EOF came at once
    assert ABORT_LINGER_SECONDS <= elapsed < ABORT_LINGER_SECONDS + 0.1
    assert connection.closed


async def test_linger_ends_for_a_peer_that_floods(autojump_clock: trio.testing.MockClock) -> None:
    """A peer that sends as fast as it can, forever, is read for ABORT_LINGER_BYTES, then
    closed, before the time bound (the clock never jumps: the flood is always runnable)."""
    peer, ours = memory_stream_pair()
    connection = Connection(ours)
    sent = 0

    async def flood() -> None:
        nonlocal sent
        await peer.send_all(MALFORMED)
        chunk = b"\0" * 65536
        try:
            while True:
                await peer.send_all(chunk)
                sent += len(chunk)
        except trio.BrokenResourceError:
            pass  # we closed our side: the flood ends here

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flood)
        start = trio.current_time()
        await connection.run()
        assert trio.current_time() - start < ABORT_LINGER_SECONDS
    assert ABORT_LINGER_BYTES <= sent < 2 * ABORT_LINGER_BYTES


async def test_linger_ends_for_a_tcp_peer_that_floods() -> None:
    """The same over real TCP (FastSocketStream): the server's connection task ends while
    the peer is still sending. Real time, since the kernel moves the bytes; the byte cap
    ends it within milliseconds, well inside the time bound that guards the test."""
    listeners = await open_listeners("tcp:127.0.0.1:0")
    host, port = listener_address(listeners[0]).split(":", 1)[1].rsplit(":", 1)
    with trio.socket.socket() as client:
        await client.connect((host, int(port)))
        stream = await listeners[0].accept()
        assert isinstance(stream, FastSocketStream)
        connection = Connection(stream)

        async def flood() -> None:
            await client.send(MALFORMED)
            chunk = b"\0" * 65536
            try:
                while True:
                    await client.send(chunk)
            except OSError:
                pass  # our close reset the connection: the flood ends here

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood)
            start = trio.current_time()
            with trio.fail_after(ABORT_LINGER_SECONDS + 5):
                await connection.run()
            elapsed = trio.current_time() - start
            nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()
    assert connection.closed
    assert elapsed < ABORT_LINGER_SECONDS  # the byte cap ended it, not the timer
