"""Random interleavings of calls, drops, resolves and deliveries between two engines.

Invariants (rpc-protocol.md §13.9): no session ever aborts (both sides follow the protocol,
so any abort is an engine bug), every call ends with results or a typed RpcError, calls on
one reference run in the order they were made, and once everything is released both
sessions' tables are empty.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsvc.errors import RpcError
from capsvc.rpc.hooks import CallResult, Hook, LocalServerHook, PromiseHook
from tests.engine.pair import (
    TESTER_ID,
    Counter,
    FakeTester,
    SessionPair,
    call,
    increment,
    testing,
    with_cap,
)

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "new_counter",
                "increment",
                "reflect_local",
                "reflect_promise",
                "resolve_promise",
                "drop_cap",
                "drop_result",
                "deliver_a",
                "deliver_b",
                "run_a",
                "run_b",
            ]
        ),
        st.integers(min_value=0, max_value=50),
    ),
    max_size=60,
)


class World:
    def __init__(self) -> None:
        self.pair = SessionPair()
        self.pair.b.bootstrap_hook = LocalServerHook(
            FakeTester(executor=self.pair.b_exec), self.pair.b_exec
        )
        self.tester = self.pair.a.bootstrap()
        self.caps: list[tuple[Hook, list[int], Counter | None]] = []  # (hook, sent order, local)
        self.results: list[CallResult] = []
        self.promises: list[PromiseHook] = []
        self.counters: list[Counter] = []
        self.next_value = 1

    def step(self, op: str, n: int) -> None:
        getattr(self, op)(n)

    def new_counter(self, n: int) -> None:
        schema = testing.Tester.schema.methods["newCounter"].param_type

        def fill(params: Any) -> None:
            params.payload_builder.content.as_struct(schema).start = 0

        result = call(self.tester, TESTER_ID, 1, fill)
        self.caps.append((result.pipeline((0,)), [], None))
        self.results.append(result)

    def increment(self, n: int) -> None:
        if not self.caps:
            return
        hook, sent, _ = self.caps[n % len(self.caps)]
        sent.append(self.next_value)
        self.results.append(increment(hook, self.next_value))
        self.next_value += 1

    def reflect_local(self, n: int) -> None:
        counter = Counter()
        self.counters.append(counter)
        hook = LocalServerHook(counter, self.pair.a_exec)
        result = call(self.tester, TESTER_ID, 7, with_cap("reflect", hook))
        self.caps.append((result.pipeline((0,)), [], counter))
        self.results.append(result)

    def reflect_promise(self, n: int) -> None:
        promise = PromiseHook()
        self.promises.append(promise)
        result = call(self.tester, TESTER_ID, 7, with_cap("reflect", promise.add_ref()))
        self.caps.append((result.pipeline((0,)), [], None))
        self.results.append(result)

    def resolve_promise(self, n: int) -> None:
        if not self.promises:
            return
        promise = self.promises.pop(n % len(self.promises))
        counter = Counter()
        self.counters.append(counter)
        promise.resolve(LocalServerHook(counter, self.pair.a_exec))
        promise.release()

    def drop_cap(self, n: int) -> None:
        if self.caps:
            hook, _, _ = self.caps.pop(n % len(self.caps))
            hook.release()

    def drop_result(self, n: int) -> None:
        if self.results:
            self.results.pop(n % len(self.results)).release()

    def deliver_a(self, n: int) -> None:
        self.pair.deliver_one_way(self.pair.a)

    def deliver_b(self, n: int) -> None:
        self.pair.deliver_one_way(self.pair.b)

    def run_a(self, n: int) -> None:
        self.pair.a_exec.run(limit=1 + n % 3)

    def run_b(self, n: int) -> None:
        self.pair.b_exec.run(limit=1 + n % 3)

    def settle_and_check(self) -> None:
        for promise in self.promises:
            promise.resolve(LocalServerHook(Counter(), self.pair.a_exec))
            promise.release()
        self.promises.clear()
        self.pair.pump()
        assert self.pair.a.closed is None, self.pair.a.abort_reason
        assert self.pair.b.closed is None, self.pair.b.abort_reason
        for result in self.results:
            assert result.done
            if result.error is not None:
                assert isinstance(result.error, RpcError)
        for _, sent, counter in self.caps:
            if counter is not None:
                assert counter.seen == sent  # E-order on one reference
        for hook, _, _ in self.caps:
            hook.release()
        for result in self.results:
            result.release()
        self.tester.release()
        self.pair.pump()
        assert self.pair.a.tables_empty(), self.pair.a.table_sizes()
        assert self.pair.b.tables_empty(), self.pair.b.table_sizes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_sequences_keep_invariants(ops: list[tuple[str, int]]) -> None:
    world = World()
    for op, n in ops:
        world.step(op, n)
    world.settle_and_check()
