"""The trio driver over real loopback TCP: buffered framing, disconnects, lifetimes."""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

import capsvc
from capsvc.connection import Connection
from capsvc.transport import open_listeners, open_stream
from capsvc.transport.address import parse_address

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
        await trio.sleep(params.ms / 1000)  # type: ignore[attr-defined]
        return True


@asynccontextmanager
async def tcp_pair(
    nodelay: bool = True, coalesce: bool = True
) -> AsyncIterator[tuple[Connection, Connection]]:
    """A client and a server Connection joined by real loopback TCP, both in this process."""
    listeners = await open_listeners("tcp:127.0.0.1:0", nodelay=nodelay)
    port = listeners[0].socket.getsockname()[1]  # type: ignore[attr-defined]
    async with trio.open_nursery() as nursery:
        client_stream = await open_stream(f"tcp:127.0.0.1:{port}", nodelay=nodelay)
        server_stream = await listeners[0].accept()
        server = Connection(server_stream, Tester()._new_hook(), coalesce=coalesce)
        client = Connection(client_stream, coalesce=coalesce)
        nursery.start_soon(server.run)
        nursery.start_soon(client.run)
        try:
            yield client, server
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()
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
    async with tcp_pair() as (client, server):
        tester = client.bootstrap(testing.Tester)
        await tester.echo(msg="hi")
        pending = tester.slow(ms=10_000)
        await trio.sleep(0.05)
        await server.stream.aclose()  # the server side vanishes mid-call
        with pytest.raises(capsvc.Disconnected):
            await pending


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
        gc.collect()
        await trio.sleep(0.1)
        assert client.session.tables_empty(), client.session.table_sizes()
        assert server.session.tables_empty(), server.session.table_sizes()


async def test_cancelling_the_caller_sends_finish_and_cancels_the_server() -> None:
    async with tcp_pair() as (client, server):
        tester = client.bootstrap(testing.Tester)
        await tester.echo(msg="warm")
        with trio.move_on_after(0.1):
            await tester.slow(ms=60_000)
        gc.collect()
        await trio.sleep(0.1)
        # The server's answer is gone: the Finish arrived and the method was cancelled.
        assert server.session.answers.entries == {}
        assert client.session.questions.entries.keys() <= {0}


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
                await trio.sleep(0.001)

        nursery.start_soon(sender)
        nursery.start_soon(watch)
        await trio.sleep(1.0)
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
    from capsvc.connection import HOLD_HOUSEKEEPING

    async with tcp_pair(nodelay=False) as (client, server):
        tester = client.bootstrap(testing.Tester)
        first = await tester.newCounter(start=1)
        del first
        await trio.sleep(0.01)
        before = client.writes
        rounds = 10
        for start in range(rounds):
            results = await tester.newCounter(start=start)
            del results  # its Finish is due now...
            await trio.sleep(0.005)  # ...but the caller pauses before the next call
        assert client.writes - before == rounds
        assert len(server.session.answers.entries) == 1  # the last newCounter: its Finish is held
        await trio.sleep(HOLD_HOUSEKEEPING + 0.1)
        assert len(server.session.answers.entries) == 0  # the held Finish went out on its own


async def test_with_nodelay_on_housekeeping_is_not_held() -> None:
    async with tcp_pair(nodelay=True) as (client, server):
        tester = client.bootstrap(testing.Tester)
        results = await tester.newCounter(start=1)
        del results
        await trio.sleep(0.05)
        assert len(server.session.answers.entries) == 0  # the Finish went out at once
