"""The Tester of tests/schemas/testing.capnp written on generated bases (``capsvc gen``):
the same semantics as tests/support/tester.py's TesterImpl, through typed readers, builders
and clients, so the interop checks run against both."""

from __future__ import annotations

import trio

import capsvc
from tests.generated import testing_capnp as t

FAILURES: dict[str, type[capsvc.RpcError]] = {
    "failed": capsvc.Failed,
    "overloaded": capsvc.Overloaded,
    "disconnected": capsvc.Disconnected,
    "unimplemented": capsvc.Unimplemented,
}


class TypedCounter(t.Counter.Server):
    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.increments: list[int] = []

    def increment(
        self, params: t.Counter.IncrementParams.Reader, results: t.Counter.IncrementResults.Builder
    ) -> None:
        self.increments.append(params.by)
        self.value += params.by
        results.value = self.value

    async def get(
        self, params: t.Counter.GetParams.Reader, results: t.Counter.GetResults.Builder
    ) -> None:
        results.value = self.value


class TypedCallback(t.Callback.Server):
    def __init__(self) -> None:
        self.seen: list[int] = []

    def notify(
        self, params: t.Callback.NotifyParams.Reader, results: t.Callback.NotifyResults.Builder
    ) -> None:
        self.seen.append(params.value)
        results.ack = params.value * 2 + 1


class TypedTester(t.Tester.Server):
    def __init__(self) -> None:
        self.counters_made = 0

    def echo(
        self, params: t.Tester.EchoParams.Reader, results: t.Tester.EchoResults.Builder
    ) -> None:
        results.reply = params.msg

    def newCounter(
        self, params: t.Tester.NewCounterParams.Reader, results: t.Tester.NewCounterResults.Builder
    ) -> None:
        self.counters_made += 1
        results.set_counter(TypedCounter(params.start))

    async def callBack(
        self, params: t.Tester.CallBackParams.Reader, results: t.Tester.CallBackResults.Builder
    ) -> None:
        reply = await params.cb.notify(value=params.value)
        results.ack = reply.ack

    def holdCaps(
        self, params: t.Tester.HoldCapsParams.Reader, results: t.Tester.HoldCapsResults.Builder
    ) -> None:
        results.holder = params.holder  # a deep copy, capabilities included

    def fail(
        self, params: t.Tester.FailParams.Reader, results: t.Tester.FailResults.Builder
    ) -> None:
        error = FAILURES.get(params.kind)
        if error is None:
            raise capsvc.Failed(f"unknown failure kind {params.kind!r}: {params.reason}")
        raise error(params.reason)

    async def slow(
        self, params: t.Tester.SlowParams.Reader, results: t.Tester.SlowResults.Builder
    ) -> None:
        # On the server's trio clock: real time when a test drives it from another process.
        await trio.sleep(params.ms / 1000)
        results.done = True

    def getSelf(
        self, params: t.Tester.GetSelfParams.Reader, results: t.Tester.GetSelfResults.Builder
    ) -> None:
        results.set_self(self)

    def reflect(
        self, params: t.Tester.ReflectParams.Reader, results: t.Tester.ReflectResults.Builder
    ) -> None:
        results.set_cap(params.cap)

    async def callCounter(
        self,
        params: t.Tester.CallCounterParams.Reader,
        results: t.Tester.CallCounterResults.Builder,
    ) -> None:
        reply = await params.counter.increment(by=params.by)
        results.value = reply.value

    async def sum(
        self, params: t.Tester.SumParams.Reader, results: t.Tester.SumResults.Builder
    ) -> None:
        promises = [counter.get() for counter in params.counters]  # all sent at once
        total = 0
        for promise in promises:
            total += (await promise).value
        results.total = total
