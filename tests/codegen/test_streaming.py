"""``-> stream`` methods (kitchen.capnp's ``Sink.write @0 (chunk :Data) -> stream``) as C++
serves and calls them (capsvc.streaming): over TCP on 127.0.0.1, a typed client's ``await``
of a write returns once the capability's window has room, not when the write returns; the
server runs one stream call at a time per object, even ``async`` ones; a failed write breaks
the object for every later call. tests/codegen/test_hierarchies_rpc.py runs the same
semantics against the C++ reference both ways.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import trio
import trio.testing

import capsvc
from capsvc.streaming import StreamCall
from tests.codegen.conftest import Generated
from tests.codegen.test_hierarchies_rpc import local_server
from tests.support.checks import Ticker

CHUNK = 1000
WINDOW = 4000


def gated_sink(k: ModuleType) -> Any:
    """A Sink whose ``async`` write waits for ``gate`` and yields a few times, counting
    how many writes run at once."""

    class GatedSink(k.Sink.Server):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.gate = trio.Event()
            self.begun = 0
            self.running = 0
            self.most_at_once = 0
            self.chunks: list[int] = []

        async def write(self, params: Any, results: Any) -> None:
            self.begun += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            await self.gate.wait()
            for _ in range(3):  # other writes would begin here, were they not held back
                await trio.lowlevel.checkpoint()
            self.chunks.append(params.chunk[0])
            self.running -= 1

        def total(self, params: Any, results: Any) -> None:
            results.writes = len(self.chunks)

    return GatedSink()


async def test_awaiting_a_write_waits_for_the_window_not_the_return(
    generated: Generated,
) -> None:
    k = generated.kitchen
    sink = gated_sink(k)
    limits = capsvc.Limits(stream_window_bytes=WINDOW)
    sent: list[int] = []
    async with local_server(sink) as address, capsvc.connect(address, limits=limits) as conn:
        client = conn.bootstrap(k.Sink)

        async def writer() -> None:
            for i in range(20):
                await client.write(chunk=bytes([i]) * CHUNK)
                sent.append(i)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            # No write has returned (the first waits for the gate, the rest behind it), yet
            # the writer went on while the bytes in flight were within the window plus one
            # message: 4 of ~1.1 KB (the fifth's bytes reach 4000 + the largest message).
            assert sink.begun == 1
            assert sent == [0, 1, 2, 3]
            sink.gate.set()
        assert sent == list(range(20))
        assert (await client.total()).writes == 20
    assert sink.chunks == list(range(20))  # in order,
    assert sink.most_at_once == 1  # and one at a time, though each awaited in between


async def first_failure(client: Any, indexes: range) -> capsvc.Failed:
    """Write ``indexes`` until an await raises; what it raised."""
    for i in indexes:
        try:
            await client.write(chunk=bytes([i]))
        except capsvc.Failed as error:
            return error
    raise AssertionError("no write failed")


async def test_a_failed_write_breaks_the_stream_and_the_object(generated: Generated) -> None:
    """The sink fails write 3 (out of order): the writes after it fail on the server
    without running, the client's later awaits raise that error, and so does ``total``;
    the connection goes on, and the object stays broken for every caller (as C++'s)."""
    from tests.codegen.test_hierarchies_rpc import sink_server

    k = generated.kitchen
    sink = sink_server(k)()
    limits = capsvc.Limits(stream_window_bytes=WINDOW)
    async with local_server(sink) as address:
        async with capsvc.connect(address, limits=limits) as conn:
            client = conn.bootstrap(k.Sink)
            for i in (0, 1, 2):
                await client.write(chunk=bytes([i]))
            await client.write(chunk=b"\x07")  # out of order: it fails once it arrives
            failed = await first_failure(client, range(3, 100))
            assert "chunk b'\\x07' arrived as write 3" in str(failed)
            with pytest.raises(capsvc.Failed) as total:
                await client.total()
            assert str(total.value) == str(failed)
            assert sink.writes == 3  # nothing ran after the failed write
            assert conn.close_reason is None  # the connection is still up
        async with capsvc.connect(address) as conn:
            with pytest.raises(capsvc.Failed, match="arrived as write 3"):
                await conn.bootstrap(k.Sink).total()


async def test_a_write_too_large_to_send_fails_alone(generated: Generated) -> None:
    """C++'s ``send`` throws for a message it cannot send, and the stream goes on: so
    here, the await of that write raises, and the next writes go out."""
    from tests.codegen.test_hierarchies_rpc import sink_server

    k = generated.kitchen
    sink = sink_server(k)()
    small = capsvc.Limits(max_message_words=4096)
    async with local_server(sink) as address, capsvc.connect(address, limits=small) as conn:
        client = conn.bootstrap(k.Sink)
        await client.write(chunk=b"\x00")
        with pytest.raises(capsvc.Failed, match=r"Limits\.max_message_words"):
            await client.write(chunk=b"\x01" * 100_000)
        await client.write(chunk=b"\x01")
        assert (await client.total()).writes == 2


async def test_a_local_object_is_awaited_call_by_call(generated: Generated) -> None:
    """A capability to an object in this process has no connection to fill: as C++'s local
    requests, the await of a write returns when the write has run."""
    k = generated.kitchen
    sink = gated_sink(k)
    sink.gate.set()
    client = k.Sink.Client(sink._capsvc_hook())
    for i in range(5):
        await client.write(chunk=bytes([i]))
        assert sink.chunks == list(range(i + 1))
    request = client.write_request()
    request.params.chunk = b"\x05"
    call = request.send()
    assert isinstance(call, StreamCall)
    await call.returned()
    assert sink.chunks == list(range(6))


async def test_the_window_defaults_to_the_sockets_send_buffer(generated: Generated) -> None:
    """With no ``stream_window_bytes``, a TCP connection's window is its socket's
    SO_SNDBUF (C++'s TwoPartyVatNetwork): ten 1 KB writes fit in any send buffer."""
    k = generated.kitchen
    sink = gated_sink(k)
    sent: list[int] = []
    async with local_server(sink) as address, capsvc.connect(address) as conn:
        client = conn.bootstrap(k.Sink)
        async with trio.open_nursery() as nursery:

            async def writer() -> None:
                for i in range(10):
                    await client.write(chunk=bytes([i]) * CHUNK)
                    sent.append(i)

            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            assert sent == list(range(10))
            assert sink.begun == 1
            sink.gate.set()
        assert (await client.total()).writes == 10


def test_the_window_is_a_limit() -> None:
    assert capsvc.Limits().stream_window_bytes is None
    assert capsvc.Limits(stream_window_bytes=1).stream_window_bytes == 1
    with pytest.raises(ValueError, match="stream_window_bytes must be a positive int"):
        capsvc.Limits(stream_window_bytes=0)
    assert capsvc.limits.parse_limit("stream_window_bytes=socket") == ("stream_window_bytes", None)
    assert capsvc.limits.parse_limit("stream-window-bytes=65536") == (
        "stream_window_bytes",
        65536,
    )


async def test_a_write_not_awaited_still_happens(generated: Generated) -> None:
    """Dropping what a write gives cancels nothing (the call has gone out; its Return is
    awaited for the window): remotely and locally, every write runs."""
    from tests.codegen.test_hierarchies_rpc import sink_server

    k = generated.kitchen
    remote = sink_server(k)()
    async with local_server(remote) as address, capsvc.connect(address) as conn:
        client = conn.bootstrap(k.Sink)
        for i in range(10):
            client.write(chunk=bytes([i]))  # what it gives is dropped at once
        assert (await client.total()).writes == 10
    local = sink_server(k)()
    client = k.Sink.Client(local._capsvc_hook())
    for i in range(10):
        client.write(chunk=bytes([i]))
    assert (await client.total()).writes == 10


async def test_a_dynamic_server_serves_streams_the_same_way(generated: Generated) -> None:
    """A ``capsvc.Server`` of a ``load_schema`` interface: its ``async`` writes run one
    at a time too, and a failed one breaks the object."""
    ref = generated.reference

    class DynamicSink(capsvc.Server, interface=ref.Sink):
        def __init__(self) -> None:
            self.running = self.most_at_once = 0
            self.chunks: list[int] = []

        async def write(self, params: Any, results: Any) -> None:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            for _ in range(3):
                await trio.lowlevel.checkpoint()
            self.running -= 1
            if params.chunk[0] == 0xFF:
                raise capsvc.Failed("no 0xff here")
            self.chunks.append(params.chunk[0])

        def total(self, params: Any, results: Any) -> None:
            results.writes = len(self.chunks)

    sink = DynamicSink()
    async with local_server(sink) as address, capsvc.connect(address) as conn:
        client = conn.bootstrap(generated.kitchen.Sink)
        for i in range(20):
            await client.write(chunk=bytes([i]))
        assert (await client.total()).writes == 20
        assert sink.chunks == list(range(20))
        assert sink.most_at_once == 1
        await client.write(chunk=b"\xff")
        with pytest.raises(capsvc.Failed, match="no 0xff here"):
            await client.total()


async def test_a_stream_of_writes_lets_other_tasks_run(generated: Generated) -> None:
    """A write that finds room returns without a scheduler pass (one per write would cost
    more than the write), but one in every YIELD_EVERY takes one: a long stream does not
    starve the other tasks of its process."""
    from capsvc.streaming import YIELD_EVERY
    from tests.codegen.test_hierarchies_rpc import sink_server

    k = generated.kitchen
    ticker = Ticker()
    async with local_server(sink_server(k)()) as address, capsvc.connect(address) as conn:
        client = conn.bootstrap(k.Sink)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker.run)
            await client.total()
            start = ticker.ticks
            for i in range(8 * YIELD_EVERY):
                await client.write(chunk=bytes([i % 256]))
            # (8 passes, give or take: trio orders each pass's tasks at random, so the
            # ticker may not have run in the last one yet)
            assert ticker.ticks - start >= 4
            assert ticker.ticks - start < 8 * YIELD_EVERY  # not a pass per write
            nursery.cancel_scope.cancel()
        assert (await client.total()).writes == 8 * YIELD_EVERY


async def test_a_dynamic_client_streams_with_the_same_window(generated: Generated) -> None:
    """A ``load_schema`` client's ``-> stream`` call gives a ``StreamCall`` with the
    generated path's flow control: the writer runs ahead of the held server by the
    window, not a round trip per write; the writes arrive in order, one at a time."""
    sink = gated_sink(generated.kitchen)
    limits = capsvc.Limits(stream_window_bytes=WINDOW)
    sent: list[int] = []
    async with local_server(sink) as address, capsvc.connect(address, limits=limits) as conn:
        client = conn.bootstrap(generated.reference.Sink)
        first = client.write(chunk=bytes([0]) * CHUNK)
        assert isinstance(first, StreamCall)
        await first
        sent.append(0)

        async def writer() -> None:
            for i in range(1, 20):
                await client.write(chunk=bytes([i]) * CHUNK)
                sent.append(i)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            await trio.testing.wait_all_tasks_blocked()
            assert sink.begun == 1  # the first write holds the server,
            assert sent == [0, 1, 2, 3]  # yet the writer went on by the window
            sink.gate.set()
        request = client.write_request()
        request.chunk = b"\x14"
        await request.send()  # the request form streams too
        assert (await client.total()).writes == 21
    assert sink.chunks == list(range(21))
    assert sink.most_at_once == 1
