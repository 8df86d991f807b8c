"""Two engines wired together message by message, with no I/O (h11's ConnectionPair idea).

``SessionPair.pump()`` moves every framed message from one session's outbox into the other's
``receive`` until both are quiet, recording each message's type so tests can assert the
exact conversation. Local server objects run through ``ManualExecutor``: calls wait in a
list until the test runs them, so tests control every interleaving.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import capnp

from capsvc.errors import Failed, Unimplemented
from capsvc.framing import FrameDecoder
from capsvc.rpc import wire
from capsvc.rpc.hooks import CallResult, Hook, LocalServerHook, OutgoingCall, Path, PromiseHook
from capsvc.rpc.payload import BuiltPayload, Payload, new_call_payload, new_return_payload
from capsvc.rpc.session import RpcSession

SCHEMA_DIR = os.path.join(os.path.dirname(__file__), "..", "schemas")
testing: Any = capnp.load(os.path.join(SCHEMA_DIR, "testing.capnp"))
COUNTER_ID = testing.Counter.schema.node.id
TESTER_ID = testing.Tester.schema.node.id


class ManualExecutor:
    """Queues local calls; ``run()`` executes them in order (or one at a time)."""

    def __init__(self) -> None:
        self.pending: list[tuple[Any, OutgoingCall]] = []

    def start(self, hook: LocalServerHook, call: OutgoingCall) -> None:
        call.result.release()  # keep an uncounted link, as the real executor does
        self.pending.append((hook.server, hook.pending.popleft()))

    def run(self, limit: int | None = None) -> int:
        done = 0
        while self.pending and (limit is None or done < limit):
            server, call = self.pending.pop(0)
            if not call.result.done and call.result.refs > 0:
                server.handle(call)
            call.params.release()
            done += 1
        return done


@dataclass
class Counter:
    """A local Counter: records the order of the increments it sees."""

    value: int = 0
    seen: list[int] = field(default_factory=list)

    def handle(self, call: OutgoingCall) -> None:
        method = call.method_id
        if method == 0:  # increment
            by = call.params.content(testing.Counter.schema.methods["increment"].param_type).by
            self.value += by
            self.seen.append(by)
        call.result.set_result(results_with(value=self.value))


@dataclass
class FakeTester:
    """A local FakeTester implementing the few methods engine tests need.

    Beyond the schema's plain meaning, ``newCounter`` with a negative ``start`` returns an
    unresolved promise (kept in ``promises`` until the test resolves it), and ``holdCaps``
    keeps ``holder.cap`` in ``vault`` (so the test can resolve promises to capabilities
    this side holds from the other).
    """

    executor: ManualExecutor
    made: list[Counter] = field(default_factory=list)
    promises: list[PromiseHook] = field(default_factory=list)
    vault: list[Hook] = field(default_factory=list)

    def handle(self, call: OutgoingCall) -> None:
        name = testing.Tester.schema.method_names[call.method_id]
        method = getattr(self, "do_" + name, None)
        if method is None:  # as capsvc.Server answers a method it does not define
            call.result.set_error(Unimplemented(f"FakeTester does not implement {name}"))
            return
        method(call)

    def do_echo(self, call: OutgoingCall) -> None:
        msg = call.params.content(testing.Tester.schema.methods["echo"].param_type).msg
        call.result.set_result(results_with(reply=msg))

    def do_newCounter(self, call: OutgoingCall) -> None:
        params = call.params.content(testing.Tester.schema.methods["newCounter"].param_type)
        results = new_return_payload()
        results.payload_builder.content.as_struct(
            testing.Tester.schema.methods["newCounter"].result_type
        )
        if params.start < 0:
            promise = PromiseHook()
            self.promises.append(promise)
            results.set_cap((0,), promise.add_ref())
        else:
            results.set_cap((0,), LocalServerHook(self.new_counter(params.start), self.executor))
        call.result.set_result(results)

    def new_counter(self, start: int = 0) -> Counter:
        counter = Counter(start)
        self.made.append(counter)
        return counter

    def do_holdCaps(self, call: OutgoingCall) -> None:
        cap = call.params.cap_at((0, 1))  # holder.cap
        if cap is not None:
            self.vault.append(cap)
        results = new_return_payload()
        results.payload_builder.content.as_struct(
            testing.Tester.schema.methods["holdCaps"].result_type
        )
        call.result.set_result(results)

    def do_callCounter(self, call: OutgoingCall) -> None:
        """Call ``counter.increment(by)`` and answer with its value once it returns."""
        by = call.params.content(testing.Tester.schema.methods["callCounter"].param_type).by
        cap = call.params.cap_at((0,))
        if cap is None:
            call.result.set_error(Failed("callCounter: no counter"))
            return
        outer = call.result.add_ref()
        inner = increment(cap, by)
        cap.release()

        def done(result: CallResult) -> None:
            if result.error is not None:
                outer.set_error(result.error)
            else:
                outer.set_result(results_with(value=value_of(result)))
            outer.release()
            result.release()

        inner.add_done_callback(done)

    def do_reflect(self, call: OutgoingCall) -> None:
        results = new_return_payload()
        results.payload_builder.content.as_struct(
            testing.Tester.schema.methods["reflect"].result_type
        )
        results.set_cap((0,), call.params.cap_at((0,)))
        call.result.set_result(results)

    def do_fail(self, call: OutgoingCall) -> None:
        from capsvc.errors import Overloaded

        call.result.set_error(Overloaded("busy"))

    def do_getSelf(self, call: OutgoingCall) -> None:
        raise AssertionError("not used")


def results_with(**fields: Any) -> BuiltPayload:
    """A Return payload whose content is a one-off struct with the given fields."""
    payload = new_return_payload()
    name = next(iter(fields))
    schema = {
        "value": testing.Counter.schema.methods["get"].result_type,
        "reply": testing.Tester.schema.methods["echo"].result_type,
    }[name]
    content = payload.payload_builder.content.as_struct(schema)
    for key, value in fields.items():
        setattr(content, key, value)
    return payload


def call(
    hook: Hook,
    interface_id: int,
    method_id: int,
    fill: Callable[[BuiltPayload], None] | None = None,
) -> CallResult:
    """Make a call on ``hook``; returns the caller's reference to the result."""
    params = new_call_payload()
    if fill is not None:
        fill(params)
    result = CallResult()
    hook.call(OutgoingCall(interface_id, method_id, params, result.add_ref()))
    return result


def increment(hook: Hook, by: int) -> CallResult:
    schema = testing.Counter.schema.methods["increment"].param_type

    def fill(params: BuiltPayload) -> None:
        params.payload_builder.content.as_struct(schema).by = by

    return call(hook, COUNTER_ID, 0, fill)


def value_of(result: CallResult) -> int:
    return int(result.payload.content(testing.Counter.schema.methods["get"].result_type).value)


def with_cap(schema_method: str, cap: Hook, path: Path = (0,)) -> Callable[[BuiltPayload], None]:
    schema = testing.Tester.schema.methods[schema_method].param_type

    def fill(params: BuiltPayload) -> None:
        params.payload_builder.content.as_struct(schema)
        params.set_cap(path, cap)

    return fill


class SessionPair:
    """Client session ``a`` and server session ``b``, each with a manual executor."""

    def __init__(self, b_bootstrap: Any = None, a_bootstrap: Any = None) -> None:
        self.a_exec = ManualExecutor()
        self.b_exec = ManualExecutor()
        a_hook = LocalServerHook(a_bootstrap, self.a_exec) if a_bootstrap is not None else None
        b_hook = LocalServerHook(b_bootstrap, self.b_exec) if b_bootstrap is not None else None
        self.a = RpcSession(a_hook)
        self.b = RpcSession(b_hook)
        self.log: list[tuple[str, str]] = []  # (direction, message type)
        self.in_flight: dict[int, list[bytes]] = {}  # taken from an outbox, not delivered

    def pump(self, *, run_executors: bool = True) -> None:
        """Deliver messages both ways (and run local calls) until nothing moves."""
        while True:
            moved = self._deliver(self.a, self.b, "a->b") + self._deliver(self.b, self.a, "b->a")
            ran = (self.a_exec.run() + self.b_exec.run()) if run_executors else 0
            if not moved and not ran:
                return

    def deliver_one_way(self, source: RpcSession, count: int | None = None) -> list[str]:
        """Deliver what ``source`` has queued now (only the first ``count`` messages, if
        given: the rest stay in flight, in order); returns the message types."""
        target = self.b if source is self.a else self.a
        direction = "a->b" if source is self.a else "b->a"
        before = len(self.log)
        self._deliver(source, target, direction, count)
        return [kind for _, kind in self.log[before:]]

    def _deliver(
        self, source: RpcSession, target: RpcSession, direction: str, count: int | None = None
    ) -> int:
        in_flight = self.in_flight.setdefault(id(source), [])
        in_flight.extend(source.take_output())
        todo = len(in_flight) if count is None else min(count, len(in_flight))
        frames, in_flight[:todo] = in_flight[:todo], []
        for frame in frames:
            decoder = FrameDecoder()
            decoder.feed(frame)
            segments = decoder.next_message()
            assert segments is not None
            assert decoder.next_message() is None
            self.log.append((direction, message_type(segments)))
            target.receive(segments)
        return len(frames)

    def kinds(self, direction: str | None = None) -> list[str]:
        return [kind for d, kind in self.log if direction is None or d == direction]


def message_type(segments: Any) -> str:
    tag = wire.message_tag(segments)
    names = {
        getattr(wire, n): n.lower()
        for n in (
            "UNIMPLEMENTED",
            "ABORT",
            "CALL",
            "RETURN",
            "FINISH",
            "RESOLVE",
            "RELEASE",
            "BOOTSTRAP",
            "DISEMBARGO",
        )
    }
    return names.get(tag, f"tag{tag}") if tag is not None else "?"


def release_all(*objects: Hook | CallResult | Payload | None) -> None:
    for obj in objects:
        if obj is not None:
            obj.release()
