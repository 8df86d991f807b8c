"""Callers read (capsvc.connection, "Callers read"; issue 10, c1 per-call cost).

A caller that would be the only one waiting for a result, on a connection that offers no
bootstrap and exports nothing, reads its Return in its own task while the connection's
reader task stands by. Both connections
of each test share one trio loop over a socket pair (capsvc's FastSocketStream, the stream
TCP and Unix connections use), so a task's steps can be counted. Every way the reading can
end is checked: the caller's result, a cancelled caller, end of file, an error, a framing
violation, a caller that stops calling, and concurrent callers.
Real time only where a peer must act (the waits are bounded by ``fail_after``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

import capsvc
from capsvc.connection import Connection
from capsvc.transport.fastsocket import FastSocketStream
from tests.support.checks import TaskSteps, both_running
from tests.support.tester import Counter, Tester, TesterImpl
from tests.test_connection import WatchedTester

IO_DEADLINE = 10  # real time: bounds waits on the other end of a socket


@asynccontextmanager
async def pair(
    server_object: Any = None, client_bootstrap: Any = None
) -> AsyncIterator[tuple[Connection, Connection]]:
    left, right = socket.socketpair()
    served_object = server_object if server_object is not None else TesterImpl()
    served = Connection(FastSocketStream(left), served_object._new_hook(), busy_poll=None)
    offered = client_bootstrap._new_hook() if client_bootstrap is not None else None
    client = Connection(FastSocketStream(right), offered, busy_poll=None)
    async with both_running(client, served):
        yield client, served


async def warm(client: Connection) -> Any:
    tester = client.bootstrap(Tester)
    assert (await tester.echo(msg="warm")).reply == "warm"  # the bootstrap has resolved
    return tester


async def reader_steps(work: Callable[[], Awaitable[object]]) -> int:
    """How many steps the client connection's reader task takes while ``work`` runs."""
    steps = TaskSteps("client connection")
    trio.lowlevel.add_instrument(steps)
    try:
        await work()
    finally:
        trio.lowlevel.remove_instrument(steps)
    return steps.steps


async def test_a_lone_call_is_read_by_its_caller_and_the_reader_stands_by() -> None:
    async with pair() as (client, _served):
        tester = await warm(client)

        async def work() -> None:
            for index in range(40):
                assert (await tester.echo(msg=str(index))).reply == str(index)

        steps = await reader_steps(work)
        # Without callers reading, the client's reader takes a step per Return.
        assert steps <= 2, steps


async def test_a_task_awaiting_the_last_of_its_pipelined_calls_reads_them_all() -> None:
    """Two questions in flight, one task waiting (for the call pipelined on the other's
    result): the caller reads both Returns, as the calculator's pipelined calls do."""
    async with pair() as (client, _served):
        tester = await warm(client)

        async def work() -> None:
            for start in range(20):
                counter = tester.newCounter(start=start).counter  # not awaited
                assert (await counter.increment(by=2)).value == start + 2
                del counter

        steps = await reader_steps(work)
        assert steps <= 2, steps


async def test_concurrent_calls_are_read_by_the_reader_task() -> None:
    async with pair() as (client, _served):
        tester = await warm(client)
        replies: list[str] = []

        async def caller(name: str) -> None:
            for index in range(10):
                replies.append((await tester.echo(msg=f"{name}{index}")).reply)

        async def work() -> None:
            with trio.fail_after(IO_DEADLINE):
                async with trio.open_nursery() as nursery:
                    for name in "abcd":
                        nursery.start_soon(caller, name)

        steps = await reader_steps(work)
        assert sorted(replies) == sorted(f"{n}{i}" for n in "abcd" for i in range(10))
        assert steps >= 10, steps  # the reader read (its steps, not callers')


async def test_the_reader_takes_over_when_the_caller_stops_calling() -> None:
    """After its call the caller goes quiet; the peer then ends the connection. Nobody
    calls again, so only the reader can notice: it must be reading again."""
    async with pair() as (client, served):
        tester = await warm(client)
        assert (await tester.echo(msg="last")).reply == "last"
        with trio.fail_after(IO_DEADLINE):
            served.drain("the server is going away")
            await client.wait_closed()
        assert isinstance(client.close_reason, capsvc.Disconnected)
        assert "the server is going away" in str(client.close_reason)


async def test_a_cancelled_reading_caller_hands_reading_back() -> None:
    slow = WatchedTester()
    async with pair(slow) as (client, _served):
        tester = await warm(client)
        with trio.fail_after(IO_DEADLINE):
            async with trio.open_nursery() as nursery:

                async def caller() -> None:
                    await tester.slow(ms=0)

                nursery.start_soon(caller)
                await slow.began.wait()  # the caller is reading for its Return now
                assert client._caller_reading
                nursery.cancel_scope.cancel()
            await slow.cancelled.wait()  # its Finish reached the server
            assert not client._caller_reading
            # The connection goes on: later calls are read, by callers or the reader.
            for index in range(3):
                assert (await tester.echo(msg=str(index))).reply == str(index)


async def fail_the_reading_caller(
    act: Callable[[Connection, Connection], Awaitable[object]],
) -> tuple[Connection, BaseException]:
    """A caller reads for the Return of a call that never ends; ``act(client, served)``
    then breaks the connection. Returns the client and the error the call failed with."""
    slow = WatchedTester()
    failures: list[BaseException] = []
    async with pair(slow) as (client, served):
        tester = await warm(client)
        with trio.fail_after(IO_DEADLINE):
            async with trio.open_nursery() as nursery:

                async def caller() -> None:
                    with pytest.raises(capsvc.RpcError) as raised:
                        await tester.slow(ms=0)
                    failures.append(raised.value)

                nursery.start_soon(caller)
                await slow.began.wait()
                assert client._caller_reading
                await act(client, served)
            await client.wait_closed()
    assert len(failures) == 1
    return client, failures[0]


async def test_end_of_file_while_the_caller_reads_fails_the_call_typed() -> None:
    async def half_close(client: Connection, served: Connection) -> None:
        served.stream.socket.shutdown(socket.SHUT_WR)  # type: ignore[attr-defined]

    client, failure = await fail_the_reading_caller(half_close)
    assert isinstance(failure, capsvc.Disconnected)
    assert str(client.close_reason) == "peer closed the connection"


async def test_a_stream_closed_under_the_reading_caller_fails_the_call_typed() -> None:
    """The caller's receive meets an error (here ClosedResourceError: another task
    closed the stream); the reader task gets it and ends the connection."""

    async def close(client: Connection, served: Connection) -> None:
        await client.stream.aclose()

    client, failure = await fail_the_reading_caller(close)
    assert isinstance(failure, capsvc.Disconnected)
    assert "ClosedResourceError" in str(client.close_reason), client.close_reason


async def test_a_framing_violation_read_by_a_caller_aborts_with_its_reason() -> None:
    async def garbage(client: Connection, served: Connection) -> None:
        # A frame header claiming 2**31 segments, from the server's side.
        served.stream.socket.send(b"\xff\xff\xff\x7f" + bytes(4))  # type: ignore[attr-defined]

    client, failure = await fail_the_reading_caller(garbage)
    assert "segment" in str(client.session.abort_reason), client.session.abort_reason
    assert str(failure) == str(client.close_reason)


async def test_a_connection_that_exports_keeps_reading_in_its_reader() -> None:
    """The peer may call what we export at any time: such calls must not run in a task
    of ours that happens to be waiting for a Return, so nothing is read by callers."""
    async with pair() as (client, _served):
        tester = await warm(client)

        class Mine(capsvc.Server, interface=Counter):
            async def increment(self, params: Any, results: Any) -> int:
                return 40 + int(params.by)

        async def work() -> None:
            for _ in range(5):
                assert (await tester.callCounter(counter=Mine(), by=1)).value == 41

        steps = await reader_steps(work)
        assert steps >= 5, steps


async def test_a_connection_that_offers_a_bootstrap_keeps_reading_in_its_reader() -> None:
    async with pair(client_bootstrap=TesterImpl()) as (client, _served):
        tester = await warm(client)

        async def work() -> None:
            for index in range(5):
                assert (await tester.echo(msg=str(index))).reply == str(index)

        steps = await reader_steps(work)
        assert steps >= 5, steps


async def test_an_abort_read_by_a_caller_ends_the_connection_with_its_reason() -> None:
    async def abort(client: Connection, served: Connection) -> None:
        served.expire_drain("the server gave up on this connection")

    client, failure = await fail_the_reading_caller(abort)
    assert isinstance(failure, capsvc.Disconnected)
    assert "the server gave up on this connection" in str(failure)
    assert "the server gave up on this connection" in str(client.close_reason)


async def test_a_peers_call_to_what_another_task_exported_meanwhile_runs_in_the_reader() -> None:
    """While caller A reads, task B passes a capability: the peer's call to it is
    delivered by the reader task, never in A's task (module docstring)."""
    ran_in: list[str] = []

    class Mine(capsvc.Server, interface=Counter):
        def increment(self, params: Any, results: Any) -> int:  # plain: runs where delivered
            ran_in.append(trio.lowlevel.current_task().name)
            return 40 + int(params.by)

    class SlowTester(TesterImpl):
        """Every Tester method (callCounter too), and a slow that never ends."""

        began = trio.Event()

        async def slow(self, params: Any, results: Any) -> None:
            self.began.set()
            await trio.sleep_forever()

    slow = SlowTester()
    async with pair(slow) as (client, _served):
        tester = await warm(client)
        with trio.fail_after(IO_DEADLINE):
            async with trio.open_nursery() as nursery:

                async def reading_caller() -> None:
                    await tester.slow(ms=0)

                nursery.start_soon(reading_caller, name="the reading caller")
                await slow.began.wait()
                assert client._caller_reading
                assert (await tester.callCounter(counter=Mine(), by=1)).value == 41
                nursery.cancel_scope.cancel()
    assert ran_in == ["client connection"]


async def test_input_is_read_before_the_loop_counts_as_idle() -> None:
    """trio's idle pass (wait_all_tasks_blocked, an autojump clock) polls with a zero
    timeout: an offer nobody took must be withdrawn then too, or the peer's Abort sits
    unread in our socket while trio reports every task blocked."""
    async with pair() as (client, served):
        await warm(client)
        served.session.abort("the server says goodbye")
        served.flush_at_end_of_pass()  # the Abort is in our socket, nothing else to run
        await trio.testing.wait_all_tasks_blocked()
        assert client.closed
        assert "the server says goodbye" in str(client.close_reason)


async def test_a_drain_of_our_own_fails_the_reading_callers_call_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The session ends from our side while a caller reads and the peer stays silent (its
    socket open, nothing sent): the caller is woken from its receive at once, not when the
    drain's linger ends (ABORT_LINGER_SECONDS, virtual here)."""
    left, right = socket.socketpair()
    silent = socket.socket(fileno=os.dup(left.fileno()))  # keeps the peer's end open
    slow = WatchedTester()
    served = Connection(FastSocketStream(left), slow._new_hook(), busy_poll=None)
    client = Connection(FastSocketStream(right), busy_poll=None)
    failures: list[tuple[BaseException, float]] = []
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(served.run)
            nursery.start_soon(client.run)
            tester = await warm(client)

            async def caller() -> None:
                with pytest.raises(capsvc.Disconnected) as raised:
                    await tester.slow(ms=0)
                failures.append((raised.value, trio.current_time()))

            nursery.start_soon(caller)
            await slow.began.wait()
            assert client._caller_reading
            await served.stream.aclose()  # the peer's Connection is gone; its socket is not
            started = trio.current_time()
            client.expire_drain("the client is going away")
            await client.wait_closed()
            nursery.cancel_scope.cancel()
    finally:
        silent.close()
    [(failure, failed_at)] = failures
    assert "the client is going away" in str(failure)
    assert failed_at - started < 0.1, failed_at - started
