"""The lifecycle review's bugs, reached through the public API over real loopback TCP.

Each test is what a user wrote when it went wrong (capsvc client, capsvc server, both in
this process on 127.0.0.1). The message-by-message versions are in
tests/engine/test_regressions.py; against the C++ reference, in tests/interop/.
"""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import capsvc
from capsvc.rpc.session import GONE_ANSWER
from tests.support.tester import CounterImpl, TesterImpl

HERE = os.path.dirname(__file__)
testing = capsvc.load_schema(os.path.join(HERE, "schemas", "testing.capnp"))

#: Real time: bounds each test's loopback I/O so that a hang fails instead of stalling.
IO_DEADLINE = 10


@asynccontextmanager
async def served(server: capsvc.Server) -> AsyncIterator[Any]:
    """A capsvc client connected over TCP to ``server``; yields the bootstrap Tester."""
    with trio.fail_after(IO_DEADLINE):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", server)
            async with capsvc.connect(address) as conn:
                yield conn.bootstrap(testing.Tester)
                assert conn.session.closed is None, conn.session.closed
            nursery.cancel_scope.cancel()


class PlainTester(TesterImpl):
    """Plain ``def`` methods: they run inline and their Return leaves at once."""

    def reflect(self, params: Any, results: Any) -> None:
        results.cap = params.cap  # null when the caller passed none: cap-free results

    def newCounter(self, params: Any, results: Any) -> None:
        self.counters_made += 1
        results.counter = CounterImpl(params.start)


async def test_bug1_a_call_pipelined_on_a_null_field_fails_and_the_connection_stays() -> None:
    async with served(PlainTester()) as tester:
        field = tester.reflect().cap  # the Return (no caps) races this pipelined call
        with pytest.raises(capsvc.Failed) as info:
            await field.increment(by=1)
        assert info.value.reason == GONE_ANSWER
        assert (await tester.echo(msg="still here")).reply == "still here"


async def test_bug2_an_import_passed_as_the_last_reference_reaches_the_callee() -> None:
    async with served(PlainTester()) as tester:
        counter = (await tester.newCounter(start=5)).counter
        request = tester.callCounter_request()
        request.counter = counter
        request.by = 2
        del counter  # the params now hold our only reference to the import
        gc.collect()
        assert (await request.send()).value == 7


async def test_bug3_a_pipelined_capability_of_a_dropped_promise_reaches_the_callee() -> None:
    async with served(PlainTester()) as tester:
        promise = tester.newCounter(start=1)
        counter = promise.counter
        del promise  # only the pipelined capability still wants the question
        request = tester.callCounter_request()
        request.counter = counter
        request.by = 2
        del counter  # ...and now only the params
        gc.collect()
        assert (await request.send()).value == 3


class UnwritableResults(TesterImpl):
    async def holdCaps(self, params: Any, results: Any) -> None:
        holder = results.init("holder")
        holder.init("caps", 3)[2] = CounterImpl()
        holder.init("caps", 1)  # the capability's list element is gone: cannot be written


async def test_results_that_cannot_be_written_fail_the_call_not_the_server() -> None:
    """It used to raise into the runtime's trio task (TrioInternalError: the whole process
    went down) or, for a plain method, to abort the connection blaming the peer."""
    async with served(UnwritableResults()) as tester:
        with pytest.raises(capsvc.Failed) as info:
            await tester.holdCaps()
        assert info.value.reason.startswith("results could not be sent: ")
        assert (await tester.echo(msg="still here")).reply == "still here"


class GatedTester(TesterImpl):
    """newCounter waits for ``gate``; the counters it made are in ``made``."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.started = trio.Event()
        self.made: list[CounterImpl] = []

    async def newCounter(self, params: Any, results: Any) -> None:
        self.started.set()
        await self.gate.wait()
        counter = CounterImpl(params.start)
        self.made.append(counter)
        results.counter = counter


async def test_a_cancelled_call_that_waits_behind_a_promise_never_runs() -> None:
    """rpc-protocol.md §4 callee step 4: the increment waits on the server for newCounter's
    results; the caller gives up on it (its Finish arrives); it must never start."""
    server = GatedTester()
    async with served(server) as tester:
        made = tester.newCounter(start=0)
        counter = made.counter
        increment = counter.increment(by=1)
        assert (await tester.echo(msg="sync")).reply == "sync"  # both calls are there
        await server.started.wait()
        increment.cancel()  # the Finish goes out; the call waits behind the promise
        assert (await tester.echo(msg="sync")).reply == "sync"  # the Finish is there too
        server.gate.set()
        assert (await counter.get()).value == 0
        assert server.made[0].increments == []
        del made
