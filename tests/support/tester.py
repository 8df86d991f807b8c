"""capsvc implementations of the test interfaces (tests/schemas/testing.capnp, schemas/echo.capnp).

The semantics follow the comments of testing.capnp exactly, so that the same checks can be run
against this implementation and against tests/peers/pycapnp_server.py (the C++ reference):

- ``TesterImpl``: every method of ``Tester``.
- ``CounterImpl``: ``Counter``; records every call (``history``) so tests can check ordering.
- ``CallbackImpl``: ``Callback``; ``notify(v)`` answers ``2 * v + 1`` (as the pycapnp peers do)
  and records the values it saw.
- ``EchoImpl``: ``Echo`` (ping, pingData).

``make_bootstrap(kind)`` builds the bootstrap object for a subprocess server
(see tests/support/peers.py).
"""

from __future__ import annotations

import os
from typing import Any

import trio

import capsvc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

testing = capsvc.load_schema(os.path.join(ROOT, "tests", "schemas", "testing.capnp"))
echo_schema = capsvc.load_schema(os.path.join(ROOT, "schemas", "echo.capnp"))

Tester = testing.Tester
Counter = testing.Counter
Callback = testing.Callback
Holder = testing.Holder
Unknown = testing.Unknown
Echo = echo_schema.Echo

#: Tester.fail kinds and the capsvc exception each one raises.
FAIL_KINDS: dict[str, type[capsvc.RpcError]] = {
    "failed": capsvc.Failed,
    "overloaded": capsvc.Overloaded,
    "disconnected": capsvc.Disconnected,
    "unimplemented": capsvc.Unimplemented,
}


class CounterImpl(capsvc.Server, interface=Counter):
    """A counter starting at ``start``. ``history`` lists ("increment", by) / ("get",)."""

    def __init__(self, start: int = 0) -> None:
        self.value = start
        self.history: list[tuple[Any, ...]] = []

    async def increment(self, params: Any, results: Any) -> int:
        self.history.append(("increment", params.by))
        self.value += params.by
        return self.value

    async def get(self, params: Any, results: Any) -> int:
        self.history.append(("get",))
        return self.value

    @property
    def increments(self) -> list[int]:
        return [entry[1] for entry in self.history if entry[0] == "increment"]


class CallbackImpl(capsvc.Server, interface=Callback):
    def __init__(self) -> None:
        self.seen: list[int] = []

    async def notify(self, params: Any, results: Any) -> int:
        self.seen.append(params.value)
        return params.value * 2 + 1


def copy_holder(src: Any, dst: Any) -> None:
    """Copy a Holder reader into a Holder builder, every capability at every depth included.

    Capabilities are read through the capsvc reader (a Client each) and set on the builder.
    Null capability pointers are left null (``_has`` is false for them).
    """
    dst.name = src.name
    if src._has("cap"):
        dst.cap = src.cap
    if src._has("inner"):
        copy_holder(src.inner, dst.init("inner"))
    if src._has("caps"):
        caps = src.caps
        target = dst.init("caps", len(caps))
        for index, cap in enumerate(caps):
            target[index] = cap
    if src._has("items"):
        items = src.items
        target = dst.init("items", len(items))
        for index, item in enumerate(items):
            copy_holder(item, target[index])
    choice = src.choice
    which = choice.which()
    if which == "counter":
        dst.choice.counter = choice.counter
    elif which == "text":
        dst.choice.text = choice.text
    else:
        dst.choice.none = None
    extra = src.extra
    dst.extra.number = extra.number
    if extra._has("callback"):
        dst.extra.callback = extra.callback


class TesterImpl(capsvc.Server, interface=Tester):
    """Tester with exactly the semantics of testing.capnp's comments."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.counters_made = 0
        self.slow_started = 0
        self.slow_cancelled = 0

    async def echo(self, params: Any, results: Any) -> None:
        results.reply = params.msg

    async def newCounter(self, params: Any, results: Any) -> None:
        self.counters_made += 1
        results.counter = CounterImpl(params.start)

    async def callBack(self, params: Any, results: Any) -> None:
        reply = await params.cb.notify(value=params.value)
        results.ack = reply.ack

    async def holdCaps(self, params: Any, results: Any) -> None:
        copy_holder(params.holder, results.init("holder"))

    async def fail(self, params: Any, results: Any) -> None:
        kind = params.kind
        error = FAIL_KINDS.get(kind)
        if error is None:
            raise capsvc.Failed(f"unknown failure kind {kind!r}: {params.reason}")
        raise error(params.reason)

    async def slow(self, params: Any, results: Any) -> None:
        self.slow_started += 1
        try:
            # On the server's trio clock: real time when a test drives it from another
            # process; tests rely only on it lasting while they cancel or disconnect.
            await trio.sleep(params.ms / 1000)
        except trio.Cancelled:
            self.slow_cancelled += 1
            raise
        results.done = True

    async def getSelf(self, params: Any, results: Any) -> None:
        results.self = self

    def reflect(self, params: Any, results: Any) -> None:
        # Plain def: it answers inline, so with no cap the cap-free Return (noFinishNeeded)
        # leaves before a call the client pipelined on it arrives (tests rely on that race).
        results.cap = params.cap

    async def callCounter(self, params: Any, results: Any) -> None:
        reply = await params.counter.increment(by=params.by)
        results.value = reply.value

    async def sum(self, params: Any, results: Any) -> None:
        # Send every get() first (they travel together), then collect.
        promises = [counter.get() for counter in params.counters]
        total = 0
        for promise in promises:
            total += (await promise).value
        results.total = total


class EchoImpl(capsvc.Server, interface=Echo):
    async def ping(self, params: Any, results: Any) -> None:
        results.reply = params.msg

    async def pingData(self, params: Any, results: Any) -> None:
        results.data = params.data


BOOTSTRAPS = {"tester": TesterImpl, "echo": EchoImpl}


def make_bootstrap(kind: str) -> Any:
    if kind == "typed-tester":  # the same Tester on generated bases (capsvc gen)
        from tests.support.typed_tester import TypedTester

        return TypedTester()
    return BOOTSTRAPS[kind]()
