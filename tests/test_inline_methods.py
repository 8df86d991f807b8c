"""Plain (non-async) server methods run inline in the connection's reader (capsvc.server).

Over real loopback TCP: where each kind of method runs, that call order survives mixing
the two kinds, how errors and awaitables returned by plain methods are handled, and that
local callers never see the callee run inside their own call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

import capsvc
from capsvc.connection import Connection
from capsvc.transport import open_listeners, open_stream

HERE = os.path.dirname(__file__)
testing = capsvc.load_schema(os.path.join(HERE, "schemas", "testing.capnp"))

WORKER = "capsvc call worker"


def as_plain(method: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """A decorator that hides an async method behind a plain function (as many do)."""

    @functools.wraps(method)
    def wrapper(*args: Any) -> Any:
        return method(*args)

    return wrapper


class MixedTester(capsvc.Server, interface=testing.Tester):
    """echo is plain, slow is async, fail is plain, sum is a decorated async method."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []  # (what, name of the task that ran it)

    def _note(self, what: str) -> None:
        self.log.append((what, trio.lowlevel.current_task().name))

    def echo(self, params: Any, results: Any) -> None:
        self._note("echo " + params.msg)
        results.reply = params.msg

    async def slow(self, params: Any, results: Any) -> bool:
        self._note(f"slow {params.ms} begins")
        # Real time, and no test depends on how long: the echoes that arrive with it are
        # delivered and begin in the same scheduler pass as this call, before any timer.
        await trio.sleep(params.ms / 1000)
        self._note(f"slow {params.ms} ends")
        return True

    def fail(self, params: Any, results: Any) -> None:
        if params.kind == "overloaded":
            raise capsvc.Overloaded(params.reason)
        raise ValueError(params.reason)

    @as_plain
    async def sum(self, params: Any, results: Any) -> int:
        await trio.lowlevel.checkpoint()
        self._note("sum")
        return len(params.counters)


@asynccontextmanager
async def tcp_pair(
    server: capsvc.Server, messages_per_pass: int | None = None
) -> AsyncIterator[Connection]:
    listeners = await open_listeners("tcp:127.0.0.1:0")
    port = listeners[0].socket.getsockname()[1]  # type: ignore[attr-defined]
    async with trio.open_nursery() as nursery:
        client_stream = await open_stream(f"tcp:127.0.0.1:{port}")
        server_stream = await listeners[0].accept()
        server_connection = Connection(server_stream, server._new_hook())
        if messages_per_pass is not None:
            server_connection.messages_per_pass = messages_per_pass
        client = Connection(client_stream)
        nursery.start_soon(server_connection.run, name="server connection")
        nursery.start_soon(client.run, name="client connection")
        try:
            yield client
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()
    for listener in listeners:
        await listener.aclose()


async def test_plain_methods_run_in_the_reader_and_async_ones_in_a_worker() -> None:
    server = MixedTester()
    async with tcp_pair(server) as client:
        tester = client.bootstrap(testing.Tester)
        assert (await tester.echo(msg="hi")).reply == "hi"
        assert (await tester.slow(ms=1)).done
    tasks = dict(server.log)
    assert "server connection" in tasks["echo hi"]  # the reader task itself
    assert tasks["slow 1 begins"] == WORKER


async def test_calls_begin_in_arrival_order_when_kinds_are_mixed() -> None:
    """rpc-protocol.md §13.1: a plain call that arrives after an async call to the same
    object, in the same read, must not begin before it."""
    server = MixedTester()
    # The reader must not yield between the calls of one read (it would let the slow call
    # begin, and the echoes could then rightly run inline).
    # A call taken out of order can leave the other one hanging. Real time: the guard waits
    # on loopback TCP, where a jumping clock would fire it while the kernel carries bytes.
    with trio.fail_after(10):
        await _slow_then_echoes(server)
    order = [what for what, _ in server.log]
    assert order[:4] == ["slow 20 begins", "echo 0", "echo 1", "echo 2"]
    assert order[4] == "slow 20 ends"
    # The echoes waited for the slow call to begin: they ran in workers, not inline.
    assert {task for what, task in server.log if what.startswith("echo")} == {WORKER}


async def _slow_then_echoes(server: MixedTester) -> None:
    async with tcp_pair(server, messages_per_pass=1000) as client:
        tester = client.bootstrap(testing.Tester)
        await tester.echo(msg="warm-up")
        server.log.clear()
        # Sent in one pass, so they leave in one write and are read together (one small
        # loopback segment).
        slow = tester.slow(ms=20)
        echoes = [tester.echo(msg=str(i)) for i in range(3)]
        assert [(await e).reply for e in echoes] == ["0", "1", "2"]
        assert (await slow).done


async def test_a_plain_method_that_returns_an_awaitable_is_awaited() -> None:
    server = MixedTester()
    async with tcp_pair(server) as client:
        tester = client.bootstrap(testing.Tester)
        counters = [capsvc.capability(_Counter(), testing.Counter) for _ in range(3)]
        assert (await tester.sum(counters=counters)).total == 3
    assert [what for what, _ in server.log] == ["sum"]


async def test_errors_from_plain_methods_reach_the_caller_typed() -> None:
    async with tcp_pair(MixedTester()) as client:
        tester = client.bootstrap(testing.Tester)
        with pytest.raises(capsvc.Overloaded, match="busy"):
            await tester.fail(kind="overloaded", reason="busy")
        with pytest.raises(capsvc.Failed, match="ValueError: bad input"):
            await tester.fail(kind="failed", reason="bad input")
        assert (await tester.echo(msg="still fine")).reply == "still fine"


async def test_local_callers_never_run_a_plain_method_inside_their_own_call() -> None:
    server = MixedTester()
    tester = capsvc.capability(server, testing.Tester)
    promise = tester.echo(msg="local")
    assert server.log == []  # not begun inside tester.echo(...)
    assert (await promise).reply == "local"
    # Begun when the caller awaited, in the caller's own task (the caller had given up
    # control), not a pass later in a worker task.
    assert server.log == [("echo local", trio.lowlevel.current_task().name)]


async def test_a_local_call_nobody_awaits_yet_begins_in_a_worker() -> None:
    server = MixedTester()
    tester = capsvc.capability(server, testing.Tester)
    promise = tester.echo(msg="later")
    await trio.testing.wait_all_tasks_blocked()  # the caller waits on something else
    assert server.log == [("echo later", WORKER)]
    assert (await promise).reply == "later"
    assert len(server.log) == 1


async def test_awaiting_a_later_local_call_does_not_begin_it_before_an_earlier_one() -> None:
    """rpc-protocol.md §13.1: calls on one object begin in the order they were made, even
    when the caller awaits the second one first."""
    server = MixedTester()
    tester = capsvc.capability(server, testing.Tester)
    first, second = tester.slow(ms=0), tester.echo(msg="second")
    assert (await second).reply == "second"
    assert [what for what, _ in server.log][:2] == ["slow 0 begins", "echo second"]
    assert (await first).done


class PipelineTester(capsvc.Server, interface=testing.Tester):
    """newCounter is async; the counters' increment is plain. getSelf is plain, but its
    first call waits for ``gate`` (it returns an awaitable, so that call runs in a task)."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, trio.lowlevel.Task]] = []
        self.self_calls = 0
        self.gate = trio.Event()

    async def newCounter(self, params: Any, results: Any) -> None:
        self.tasks.append(("newCounter", trio.lowlevel.current_task()))
        await trio.lowlevel.checkpoint()
        results.counter = capsvc.capability(_Incrementer(self.tasks), testing.Counter)

    def getSelf(self, params: Any, results: Any) -> Any:
        self.self_calls += 1
        results.self = capsvc.capability(self, testing.Tester)
        if self.self_calls == 1:
            return self.gate.wait()
        return None

    def echo(self, params: Any, results: Any) -> None:
        results.reply = params.msg


class _Incrementer(capsvc.Server, interface=testing.Counter):
    def __init__(self, tasks: list[tuple[str, trio.lowlevel.Task]]) -> None:
        self.tasks = tasks

    def increment(self, params: Any, results: Any) -> None:
        self.tasks.append(("increment", trio.lowlevel.current_task()))
        results.value = params.by


async def test_a_pipelined_plain_call_runs_as_its_promise_resolves() -> None:
    """A peer's call queued on the results of an async call begins in the task that
    settles those results, so both Returns leave together (no pass in between)."""
    server = PipelineTester()
    async with tcp_pair(server) as client:
        tester = client.bootstrap(testing.Tester)
        counter = tester.newCounter(start=0).counter
        assert (await counter.increment(by=7)).value == 7
    (first, worker), (second, ran_in) = server.tasks
    assert (first, second) == ("newCounter", "increment")
    assert ran_in is worker


async def test_a_long_chain_of_pipelined_calls_stays_within_the_stack() -> None:
    """A peer's chain of calls, each on the results of the one before, released one inside
    another's settling: the depth that runs inline is bounded, so a long chain costs worker
    tasks, not a RecursionError."""
    server = PipelineTester()
    async with tcp_pair(server, messages_per_pass=1000) as client:
        tester = client.bootstrap(testing.Tester)
        for _ in range(400):
            tester = tester.getSelf().self
        reply = tester.echo(msg="end of chain")
        # Every call has reached the server and waits behind the first, whose results
        # release the whole chain at once.
        await trio.testing.wait_all_tasks_blocked()
        assert server.self_calls == 1
        server.gate.set()
        with trio.fail_after(10):  # real time: loopback TCP; fails only if the chain hangs
            assert (await reply).reply == "end of chain"
    assert server.self_calls == 400


class _Counter(capsvc.Server, interface=testing.Counter):
    async def get(self, params: Any, results: Any) -> int:
        return 0
