"""The trio driver over real loopback TCP: buffered framing, disconnects, lifetimes.

Timing: these tests wait for events (a server method beginning, tables emptying), never for
a guessed duration. Their waits are real time because the bytes go through real sockets:
on a jumping clock (autojump_clock) a guard would fire while the kernel still carries the
data. What is about trio's clock alone (how long a lone Finish is held) is tested over
in-memory streams on autojump_clock at the end, with exact virtual times.
"""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

import capsvc
from capsvc.connection import HOLD_HOUSEKEEPING, Connection
from capsvc.transport import open_listeners, open_stream
from capsvc.transport.address import parse_address
from capsvc.transport.capabilities import SocketBackedStream
from capsvc.transport.memory import memory_stream_pair
from tests.support.checks import TaskSteps, assert_tables, both_running, poll_until

HERE = os.path.dirname(__file__)
testing = capsvc.load_schema(os.path.join(HERE, "schemas", "testing.capnp"))
echo = capsvc.load_schema(os.path.join(HERE, "..", "schemas", "echo.capnp"))


class Counter(capsvc.Server, interface=testing.Counter):
    def __init__(self, value: int = 0) -> None:
        self.value = value

    async def increment(self, params: object, results: object) -> int:
        self.value += params.by  # type: ignore[attr-defined]
        return self.value

    async def get(self, params: object, results: object) -> int:
        return self.value


class Tester(capsvc.Server, interface=testing.Tester):
    async def echo(self, params: object, results: object) -> str:
        return params.msg  # type: ignore[attr-defined,no-any-return]

    async def newCounter(self, params: object, results: object) -> None:
        results.counter = Counter(params.start)  # type: ignore[attr-defined]

    async def slow(self, params: object, results: object) -> bool:
        # A method that takes ms milliseconds of the server's clock (real time unless a test
        # runs on autojump_clock); no test here depends on how long it really takes.
        await trio.sleep(params.ms / 1000)  # type: ignore[attr-defined]
        return True


class WatchedTester(Tester):
    """Tester whose slow() never ends by itself and reports when it begins and is cancelled."""

    def __init__(self) -> None:
        self.began = trio.Event()
        self.cancelled = trio.Event()

    async def slow(self, params: object, results: object) -> bool:
        self.began.set()
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled.set()


#: Real time (see the module docstring): bounds waits for loopback I/O; a hang needs it.
IO_DEADLINE = 10


@asynccontextmanager
async def tcp_pair(
    nodelay: bool = True, coalesce: bool = True, server_object: Tester | None = None
) -> AsyncIterator[tuple[Connection, Connection]]:
    """A client and a server Connection joined by real loopback TCP, both in this process."""
    listeners = await open_listeners("tcp:127.0.0.1:0", nodelay=nodelay)
    port = listeners[0].socket.getsockname()[1]  # type: ignore[attr-defined]
    client_stream = await open_stream(f"tcp:127.0.0.1:{port}", nodelay=nodelay)
    server_stream = await listeners[0].accept()
    bootstrap = server_object if server_object is not None else Tester()
    server = Connection(server_stream, bootstrap._new_hook(), coalesce=coalesce)
    client = Connection(client_stream, coalesce=coalesce)
    async with both_running(client, server):
        yield client, server
    for listener in listeners:
        await listener.aclose()


@pytest.mark.parametrize("nodelay", [True, False])
async def test_one_write_per_round_trip_each_side(nodelay: bool) -> None:
    """DESIGN.md 'Buffered framing': the Finish of a call leaves with the next Call."""
    async with tcp_pair(nodelay=nodelay) as (client, server):
        tester = client.bootstrap(testing.Tester)
        first = await tester.newCounter(start=1)  # results hold a cap: a Finish is owed
        del first
        client_before, server_before = client.writes, server.writes
        rounds = 50
        for start in range(rounds):
            results = await tester.newCounter(start=start)
            assert (await results.counter.get()).value == start
            del results
        # Two round trips per iteration (newCounter, get): one write each way for each,
        # with every Finish and Release riding along with the next Call.
        assert client.writes - client_before == 2 * rounds
        assert server.writes - server_before == 2 * rounds


async def test_without_coalescing_every_message_is_a_write() -> None:
    """The debug switch really switches coalescing off (the benchmark's ablation)."""
    async with tcp_pair(coalesce=False) as (client, _server):
        tester = client.bootstrap(testing.Tester)
        await tester.echo(msg="warm")
        before = client.writes
        for _ in range(10):
            results = await tester.newCounter(start=1)
            del results
        assert client.writes - before > 10  # calls plus separate finishes and releases


async def test_disconnect_fails_pending_calls_with_disconnected() -> None:
    watched = WatchedTester()
    async with tcp_pair(server_object=watched) as (client, server):
        tester = client.bootstrap(testing.Tester)
        await tester.echo(msg="hi")
        pending = tester.slow(ms=0)
        with trio.fail_after(IO_DEADLINE):
            await watched.began.wait()  # the call runs on the server
            await server.stream.aclose()  # the server side vanishes mid-call
            with pytest.raises(capsvc.Disconnected):
                await pending
            await watched.cancelled.wait()  # and the server stopped working on it


async def test_tables_empty_after_everything_is_dropped() -> None:
    async with tcp_pair() as (client, server):
        tester = client.bootstrap(testing.Tester)
        counter = tester.newCounter(start=3).counter
        assert (await counter.increment(by=4)).value == 7
        mine = Counter(10)
        del counter
        results = await tester.echo(msg="x")
        del results, mine
        tester.close()
        # Until the Releases and Finishes have crossed the socket (collecting garbage in
        # between); fails with the sizes left after IO_DEADLINE.
        await assert_tables(client, within=IO_DEADLINE)
        await assert_tables(server, within=IO_DEADLINE)


async def test_cancelling_the_caller_sends_finish_and_cancels_the_server() -> None:
    watched = WatchedTester()
    async with tcp_pair(server_object=watched) as (client, server):
        tester = client.bootstrap(testing.Tester)
        await tester.echo(msg="warm")

        async def caller() -> None:
            await tester.slow(ms=0)

        with trio.fail_after(IO_DEADLINE):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(caller)
                await watched.began.wait()  # the call runs on the server...
                assert len(server.session.answers.entries) == 1
                nursery.cancel_scope.cancel()  # ...when its caller gives up
            await watched.cancelled.wait()  # the Finish arrived and cancelled the method

        def finished() -> bool:
            gc.collect()
            answers = server.session.answers.entries
            return not answers and client.session.questions.entries.keys() <= {0}

        await poll_until(finished, within=IO_DEADLINE)


def test_address_is_parsed() -> None:
    assert str(parse_address("tcp:127.0.0.1:4000")) == "tcp:127.0.0.1:4000"


class PlainTester(Tester):
    """Tester whose echo is a plain method: answered inline by the reader (capsvc.server)."""

    def echo(self, params: object, results: object) -> str:  # type: ignore[override]
        return params.msg  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("tester", [Tester, PlainTester])
async def test_output_stays_bounded_when_the_peer_stops_reading(tester: type[Tester]) -> None:
    """A peer that floods calls but never reads its replies cannot make us buffer without
    bound: once the output passes max_buffered the reader stops reading (backpressure),
    whether the calls run in worker tasks or inline."""
    from capsvc.framing import encode_message
    from capsvc.rpc import wire

    listeners = await open_listeners("tcp:127.0.0.1:0")
    port = listeners[0].socket.getsockname()[1]  # type: ignore[attr-defined]
    payload = "x" * 60_000
    limit = 256 * 1024
    frames = []
    bootstrap = wire.Message.new_message()
    bootstrap.init("bootstrap").questionId = 0
    frames.append(encode_message(bootstrap.to_segments()))
    echo_params = testing.Tester.schema.methods["echo"].param_type
    for question in range(1, 400):
        message = wire.Message.new_message()
        body = message.init("call")
        body.questionId = question
        body.target.init("promisedAnswer").questionId = 0
        body.interfaceId = testing.Tester.schema.node.id
        body.methodId = 0
        body.init("params").content.as_struct(echo_params).msg = payload
        frames.append(encode_message(message.to_segments()))
    flood = b"".join(frames)  # ~24 MB of calls whose replies are as large
    async with trio.open_nursery() as nursery:
        raw = await trio.open_tcp_stream("127.0.0.1", port)
        server = Connection(await listeners[0].accept(), tester()._new_hook(), max_buffered=limit)
        nursery.start_soon(server.run)
        highest = 0

        async def sender() -> None:
            await raw.send_all(flood)  # blocks for good once both directions are full

        async def watch() -> None:
            nonlocal highest
            while True:
                highest = max(highest, server.session.pending_bytes)
                await trio.sleep(0.001)  # a sampling interval (real time, as below)

        nursery.start_soon(sender)
        nursery.start_soon(watch)
        # Real time: 24 MB through real kernel socket buffers. First until the output
        # really reached the bound (before that the checks below would hold trivially),
        # then a while longer, for an output that kept growing to show it.
        await poll_until(lambda: highest > limit, within=30)
        await trio.sleep(0.3)
        # One receive_some (64 KiB) can hold at most two of these calls past the check.
        assert highest <= limit + 3 * 61_000, highest
        assert len(server.session.answers.entries) < 399  # it stopped reading calls
        nursery.cancel_scope.cancel()
    await raw.aclose()
    for listener in listeners:
        await listener.aclose()


async def test_nagle_on_a_paused_caller_still_sends_one_write_per_call() -> None:
    """With TCP_NODELAY off, a Finish written alone would make the next Call wait for the
    peer's delayed ACK: it is held back and leaves with the next Call instead, or alone
    after at most HOLD_HOUSEKEEPING when no call follows."""
    async with tcp_pair(nodelay=False) as (client, server):
        tester = client.bootstrap(testing.Tester)
        first = await tester.newCounter(start=1)
        del first
        await trio.testing.wait_all_tasks_blocked()
        assert client.session.has_output  # first's Finish is held, not written
        before = client.writes
        rounds = 10
        for start in range(rounds):
            results = await tester.newCounter(start=start)
            del results  # its Finish is due now...
            # ...but the caller pauses before the next call. Real time: over real TCP
            # with Nagle on, the kernel's delayed-ACK timer is part of what is tested, and
            # a jumping clock would expire the hold while we wait for the socket. The
            # pause is 1/40 of the hold: only a 0.2 s stall of this process could make a
            # Finish leave alone.
            await trio.sleep(0.005)
        assert client.writes - before == rounds
        assert len(server.session.answers.entries) == 1  # the last newCounter: its Finish is held
        # The held Finish goes out on its own (when exactly: the autojump_clock test below).
        await poll_until(lambda: len(server.session.answers.entries) == 0, within=IO_DEADLINE)
        assert client.writes - before == rounds + 1


async def test_with_nodelay_on_housekeeping_is_not_held() -> None:
    async with tcp_pair(nodelay=True) as (client, server):
        tester = client.bootstrap(testing.Tester)
        results = await tester.newCounter(start=1)
        await trio.testing.wait_all_tasks_blocked()
        before = client.writes
        del results
        await trio.testing.wait_all_tasks_blocked()
        assert not client.session.has_output  # nothing held back...
        assert client.writes == before + 1  # ...the Finish went out alone, at once
        await poll_until(lambda: len(server.session.answers.entries) == 0, within=IO_DEADLINE)


# -- the housekeeping hold on trio's clock alone ------------------------------------------


class NagleMemoryStream(trio.abc.Stream, SocketBackedStream):
    """An in-memory stream that Connection takes for TCP with TCP_NODELAY off (or on): it
    declares a socket (SocketBackedStream) and Connection reads the option on it. Records
    when each write starts."""

    def __init__(self, inner: trio.abc.Stream, *, nodelay: bool) -> None:
        self.inner = inner
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # never connected
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(nodelay))
        self.writes: list[float] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(trio.current_time())
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        self.socket.close()
        await self.inner.aclose()


@asynccontextmanager
async def memory_pair(*, nodelay: bool) -> AsyncIterator[tuple[Connection, Connection]]:
    left, right = memory_stream_pair()
    stream = NagleMemoryStream(right, nodelay=nodelay)
    client = Connection(stream)
    server = Connection(left, Tester()._new_hook())
    try:
        async with both_running(client, server):
            yield client, server
    finally:
        stream.socket.close()  # whether or not the connection got to close its stream


async def warm_tester(client: Connection, server: Connection) -> object:
    """The bootstrap Tester after one call, once every Finish owed so far has left."""
    tester = client.bootstrap(testing.Tester)
    assert (await tester.echo(msg="warm")).reply == "warm"
    await trio.sleep(2 * HOLD_HOUSEKEEPING)  # virtual: past any hold
    assert server.session.answers.entries == {}
    return tester


def writes_of(connection: Connection) -> list[float]:
    assert isinstance(connection.stream, NagleMemoryStream)
    return connection.stream.writes


async def test_a_lone_finish_is_held_for_exactly_hold_housekeeping(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_pair(nodelay=False) as (client, server):
        tester: Any = await warm_tester(client, server)
        results = await tester.newCounter(start=1)  # results hold a cap: a Finish is owed
        await trio.testing.wait_all_tasks_blocked()
        writes = len(writes_of(client))
        due = trio.current_time()
        del results  # the Finish is due now, and no call follows
        await trio.sleep(HOLD_HOUSEKEEPING - 0.001)
        assert len(writes_of(client)) == writes  # still held
        assert len(server.session.answers.entries) == 1
        await trio.sleep(0.002)
        assert writes_of(client)[writes:] == [due + HOLD_HOUSEKEEPING]  # then alone, on time
        assert server.session.answers.entries == {}


async def test_a_held_finish_leaves_with_the_next_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_pair(nodelay=False) as (client, server):
        tester: Any = await warm_tester(client, server)
        results = await tester.newCounter(start=1)
        del results
        await trio.sleep(HOLD_HOUSEKEEPING / 2)  # the caller pauses, the Finish waits
        writes = len(writes_of(client))
        assert len(server.session.answers.entries) == 1
        call_time = trio.current_time()
        assert (await tester.echo(msg="next")).reply == "next"
        assert writes_of(client)[writes:] == [call_time]  # Finish and Call: one write, at once
        assert server.session.answers.entries == {}


async def test_with_nodelay_a_lone_finish_leaves_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with memory_pair(nodelay=True) as (client, server):
        tester: Any = await warm_tester(client, server)
        results = await tester.newCounter(start=1)
        await trio.testing.wait_all_tasks_blocked()
        writes = len(writes_of(client))
        due = trio.current_time()
        del results
        await trio.testing.wait_all_tasks_blocked()
        assert writes_of(client)[writes:] == [due]
        assert server.session.answers.entries == {}


class VanishingPeerStream(trio.abc.HalfCloseableStream):
    """A peer that sends a malformed frame and is gone before our Abort can be written:
    every write fails as a vanished peer's does."""

    def __init__(self) -> None:
        # A segment table claiming 2**32 segments: capsvc.framing refuses it at once.
        self.input = [b"\xff\xff\xff\xff" + bytes(4)]

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        raise trio.BrokenResourceError("the peer is gone")

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()
        raise trio.BrokenResourceError("the peer is gone")

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        return self.input.pop(0) if self.input else b""

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_an_abort_the_vanished_peer_cannot_read_does_not_hold_the_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The writer's failed write ends it; the reader, waiting for the Abort to be written,
    # must see that at once rather than wait out its bound (5 s, virtual here).
    connection = Connection(VanishingPeerStream())
    began = trio.current_time()
    await connection.run()
    assert trio.current_time() - began < 1
    assert connection.close_reason is not None
    assert "segment" in str(connection.close_reason)


class InlineTester(capsvc.Server, interface=testing.Tester):
    def echo(self, params: object, results: object) -> str:  # plain: runs in the reader
        return params.msg  # type: ignore[attr-defined,no-any-return]


async def test_one_call_at_a_time_costs_the_reader_one_step_each() -> None:
    # A Call per receive, with a scheduler pass between calls (the caller waits for each
    # Return): the reader wakes once per Call. The bound on messages delivered between
    # yields (Connection.messages_per_pass) counts only messages delivered within a pass;
    # before it did, every fourth Call cost the reader an extra step (and a pass).
    from capsvc.transport.fastsocket import FastSocketStream

    left, right = socket.socketpair()
    served = Connection(FastSocketStream(left), InlineTester()._new_hook(), busy_poll=None)
    client = Connection(FastSocketStream(right), busy_poll=None)
    steps = TaskSteps("served connection")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(served.run, name="served connection")
        nursery.start_soon(client.run, name="client connection")
        tester = client.bootstrap(testing.Tester)
        assert (await tester.echo(msg="warm")).reply == "warm"
        trio.lowlevel.add_instrument(steps)
        calls = 40
        for index in range(calls):
            assert (await tester.echo(msg=str(index))).reply == str(index)
        trio.lowlevel.remove_instrument(steps)
        assert calls <= steps.steps <= calls + 2, steps.steps
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_a_drain_while_the_connection_closes_is_harmless() -> None:
    """Regression: a server draining (SIGTERM) a connection whose peer had just left
    started the drain's task in the connection's nursery after that nursery had closed,
    and the RuntimeError took every other connection of the server down with it. The
    drain here comes k scheduler passes after the peer closed, for every k up to the
    connection's end, so one of them lands between its last task ending and ``run``
    returning."""
    for passes in range(12):
        left, right = memory_stream_pair()
        server = Connection(left, Tester()._new_hook())
        ended = trio.Event()

        async def serve(server: Connection = server, ended: trio.Event = ended) -> None:
            await server.run()
            ended.set()

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve)
                await trio.testing.wait_all_tasks_blocked()
                await right.aclose()  # the peer leaves
                for _ in range(passes):
                    await trio.lowlevel.checkpoint()
                server.drain("the server is shutting down")
                await ended.wait()
        assert isinstance(server.close_reason, capsvc.Disconnected)
