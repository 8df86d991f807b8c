"""capsvc as the client, the C++ reference (tests/peers/pycapnp_server.py) as the server.

Every test runs its calls inside ``exercise`` (tests/support/checks.py): once the test body has
dropped every Client, Promise and result, the connection's tables must hold nothing but the
bootstrap import, and nothing at all once that is closed too (the engine must not leak).

Every test runs under ``peer_deadline()``: a real-time hang guard (the peer is another
process), never a jumping clock.

pycapnp servers can only raise FAILED (tests/peers/README.md), so exception tests against them
check for capsvc.Failed with the reason contained. The tail-call tests use a C++ peer
(tests/support/pycapnp_tailcall_server.py) that forwards each call back to our own bootstrap
(sendResultsTo.yourself / takeFromOtherQuestion, rpc-protocol.md §6.2).

"""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing

import capsvc
from tests.support.checks import assert_tables, exercise, peer_deadline
from tests.support.peers import ROOT, PeerProcess
from tests.support.tester import (
    FAIL_KINDS,
    Callback,
    CallbackImpl,
    CounterImpl,
    Tester,
    TesterImpl,
    Unknown,
)

calc = capsvc.load_schema(os.path.join(ROOT, "schemas", "calculator.capnp"))
Calculator = calc.Calculator


def run(peer: PeerProcess, body: Any, interface: Any = Tester) -> Any:
    return exercise(peer.address, interface, body)


# ------------------------------------------------------------------ bootstrap and echo


async def test_bootstrap_and_echo(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        assert (await tester.echo(msg="hello")).reply == "hello"
        assert (await tester.echo(msg="")).reply == ""
        assert (await tester.echo(msg="héllo wörld ✓")).reply == "héllo wörld ✓"
        big = "x" * 200_000  # several segments' worth on both sides
        assert (await tester.echo(msg=big)).reply == big

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_many_sequential_and_concurrent_calls(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        for i in range(50):
            assert (await tester.echo(msg=str(i))).reply == str(i)
        promises = [tester.echo(msg=f"c{i}") for i in range(100)]
        replies = [(await p).reply for p in promises]
        assert replies == [f"c{i}" for i in range(100)]

    with peer_deadline():
        await run(pycapnp_tester, body)


# ------------------------------------------------------------------ pipelining


async def test_pipelining_new_counter(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        counter = tester.newCounter(start=5).counter  # pipelined, not awaited
        first = counter.increment(by=2)
        second = counter.increment(by=3)
        third = counter.get()
        assert (await first).value == 7
        assert (await second).value == 10
        assert (await third).value == 10
        # The same capability, after the return.
        assert (await counter.increment(by=1)).value == 11

    with peer_deadline():
        await run(pycapnp_tester, body)


# The lifecycle review's bugs 1-3 against C++ as the callee (tests/engine/test_regressions.py
# has them message by message).


async def test_a_call_pipelined_on_a_null_field_fails_and_the_connection_stays(
    pycapnp_tester: PeerProcess,
) -> None:
    """holdCaps of a holder without capabilities: cap-free results (noFinishNeeded). Our
    call pipelined on holder.cap reaches C++ before the Return (it then resolves to null)
    or after C++ forgot the answer (a broken capability, rpc-protocol.md §13.11): either
    way it fails, and the connection stays."""

    async def body(tester: Any) -> None:
        request = tester.holdCaps_request()
        request.params.init("holder").name = "no capabilities"
        field = request.send().holder.cap
        with pytest.raises(capsvc.Failed) as info:
            await field.increment(by=1)
        reason = info.value.reason
        assert "Called null capability" in reason or "returned no capabilities" in reason
        assert (await tester.echo(msg="still here")).reply == "still here"

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_an_import_passed_as_the_last_reference_reaches_cpp(
    pycapnp_tester: PeerProcess,
) -> None:
    """C++ gets the Call (naming the import receiverHosted) before our Release of it."""

    async def body(tester: Any) -> None:
        counter = (await tester.newCounter(start=5)).counter
        request = tester.callCounter_request()
        request.counter = counter
        request.by = 2
        del counter
        assert (await request.send()).value == 7

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_a_pipelined_capability_of_a_dropped_promise_reaches_cpp(
    pycapnp_tester: PeerProcess,
) -> None:
    """C++ gets the Call (naming the capability receiverAnswer) before our Finish of the
    question whose answer holds it."""

    async def body(tester: Any) -> None:
        promise = tester.newCounter(start=1)
        counter = promise.counter
        del promise
        request = tester.callCounter_request()
        request.counter = counter
        request.by = 2
        del counter
        assert (await request.send()).value == 3

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_pipelining_on_bootstrap_before_it_returns(pycapnp_tester: PeerProcess) -> None:
    async with capsvc.connect(pycapnp_tester.address) as conn:

        async def body() -> None:
            tester = conn.bootstrap(Tester)
            # Nothing awaited: the echo and the newCounter go out as promisedAnswer calls on
            # the bootstrap question, the increment on the newCounter question.
            reply = tester.echo(msg="early")
            value = tester.newCounter(start=40).counter.increment(by=2)
            self_echo = tester.getSelf().self.echo(msg="via getSelf")
            assert (await reply).reply == "early"
            assert (await value).value == 42
            assert (await self_echo).reply == "via getSelf"

        with peer_deadline():
            await body()
        await assert_tables(conn)


async def test_pipelined_capability_passed_back(pycapnp_tester: PeerProcess) -> None:
    """A pipelined cap of theirs goes back to them as a receiverAnswer descriptor."""

    async def body(tester: Any) -> None:
        theirs = tester.newCounter(start=10).counter  # still a promise
        assert (await tester.callCounter(counter=theirs, by=3)).value == 13
        assert (await theirs.get()).value == 13
        # And once it has resolved (receiverHosted).
        assert (await tester.callCounter(counter=theirs, by=1)).value == 14

    with peer_deadline():
        await run(pycapnp_tester, body)


# ------------------------------------------------------------------ callbacks


async def test_callback(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        cb = CallbackImpl()
        assert (await tester.callBack(cb=cb, value=20)).ack == 41
        assert cb.seen == [20]
        # Several at once, the same callback object (one export, several references).
        promises = [tester.callBack(cb=cb, value=v) for v in range(5)]
        assert [(await p).ack for p in promises] == [v * 2 + 1 for v in range(5)]
        assert sorted(cb.seen) == [0, 1, 2, 3, 4, 20]

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_call_counter_calls_us(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        ours = CounterImpl(10)
        assert (await tester.callCounter(counter=ours, by=3)).value == 13
        assert ours.value == 13
        assert ours.history == [("increment", 3)]

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_callback_raises(pycapnp_tester: PeerProcess) -> None:
    """Our callback raises Overloaded: C++ sees it, pycapnp re-raises it as FAILED."""

    class Grumpy(capsvc.Server, interface=Callback):
        async def notify(self, params: Any, results: Any) -> None:
            raise capsvc.Overloaded("grumpy callback says no")

    async def body(tester: Any) -> None:
        with pytest.raises(capsvc.RpcError) as info:
            await tester.callBack(cb=Grumpy(), value=1)
        assert "grumpy callback says no" in info.value.reason
        assert (await tester.echo(msg="still here")).reply == "still here"

    with peer_deadline():
        await run(pycapnp_tester, body)


# ------------------------------------------------------------------ holdCaps


async def _hold_caps_round_trip(tester: Any) -> None:
    starts = [100, 200, 300, 400, 500, 600, 700]
    ours: dict[int, CounterImpl] = {}
    caps: list[Any] = []
    for i, start in enumerate(starts):
        if i % 2 == 0:
            ours[i] = CounterImpl(start)
            caps.append(ours[i])
        else:
            caps.append(tester.newCounter(start=start).counter)  # theirs, still a promise
    callback = CallbackImpl()

    request = tester.holdCaps_request()
    h = request.params.init("holder")
    h.name = "outer"
    h.cap = caps[0]
    inner = h.init("inner")
    inner.name = "inner"
    inner.cap = caps[1]
    deeper = inner.init("inner")  # inner.inner.cap
    deeper.name = "deeper"
    deeper.cap = caps[2]
    lst = h.init("caps", 2)
    lst[0] = caps[3]
    lst[1] = caps[4]
    items = h.init("items", 1)
    items[0].name = "item0"
    items[0].cap = caps[5]
    h.choice.counter = caps[6]
    h.extra.number = 42
    h.extra.callback = callback
    del h, inner, deeper, lst, items

    holder = (await request.send()).holder
    assert holder.name == "outer"
    assert holder.inner.name == "inner"
    assert holder.inner.inner.name == "deeper"
    assert len(holder.caps) == 2
    assert len(holder.items) == 1
    assert holder.items[0].name == "item0"
    assert holder.choice.which() == "counter"
    assert holder.extra.number == 42

    returned = [
        ("cap", holder.cap),
        ("inner.cap", holder.inner.cap),
        ("inner.inner.cap", holder.inner.inner.cap),
        ("caps[0]", holder.caps[0]),
        ("caps[1]", holder.caps[1]),
        ("items[0].cap", holder.items[0].cap),
        ("choice.counter", holder.choice.counter),
    ]
    for i, (where, cap) in enumerate(returned):
        value = (await cap.increment(by=1)).value
        assert value == starts[i] + 1, where
        if i in ours:
            assert ours[i].value == starts[i] + 1, f"{where}: our counter was not reached"
    assert (await holder.extra.callback.notify(value=5)).ack == 11
    assert callback.seen == [5]


async def test_hold_caps_every_depth(pycapnp_tester: PeerProcess) -> None:
    with peer_deadline():
        await run(pycapnp_tester, _hold_caps_round_trip)


async def test_hold_caps_theirs_resolved(pycapnp_tester: PeerProcess) -> None:
    """Their caps, already resolved (receiverHosted), at every depth; plus a text choice."""

    async def body(tester: Any) -> None:
        theirs = [(await tester.newCounter(start=s)).counter for s in (1, 2, 3, 4)]
        request = tester.holdCaps_request()
        h = request.params.init("holder")
        h.cap = theirs[0]
        h.init("inner").cap = theirs[1]
        h.init("caps", 1)[0] = theirs[2]
        h.init("items", 1)[0].cap = theirs[3]
        h.choice.text = "words"
        del h
        holder = (await request.send()).holder
        assert holder.choice.which() == "text"
        assert holder.choice.text == "words"
        got = [holder.cap, holder.inner.cap, holder.caps[0], holder.items[0].cap]
        for start, cap in zip((1, 2, 3, 4), got, strict=True):
            assert (await cap.increment(by=10)).value == start + 10
        for start, cap in zip((1, 2, 3, 4), theirs, strict=True):
            assert (await cap.get()).value == start + 10

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_hold_caps_same_cap_many_times(pycapnp_tester: PeerProcess) -> None:
    """One of ours in every slot: one export, many references, all released afterwards."""

    async def body(tester: Any) -> None:
        ours = CounterImpl(0)
        request = tester.holdCaps_request()
        h = request.params.init("holder")
        h.cap = ours
        h.init("inner").cap = ours
        lst = h.init("caps", 3)
        for i in range(3):
            lst[i] = ours
        h.choice.counter = ours
        del h, lst
        holder = (await request.send()).holder
        caps = [holder.cap, holder.inner.cap, *holder.caps, holder.choice.counter]
        for cap in caps:
            await cap.increment(by=1)
        assert ours.value == len(caps)

    with peer_deadline():
        await run(pycapnp_tester, body)


# ------------------------------------------------------------------ reflect (embargoes)


async def test_reflect_simple(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        ours = CounterImpl(100)
        back = (await tester.reflect(cap=ours)).cap
        assert (await back.increment(by=5)).value == 105
        assert ours.value == 105
        assert (await back.get()).value == 105
        assert len(ours.history) == 2

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_reflect_pipelined_calls_keep_order(pycapnp_tester: PeerProcess) -> None:
    """20 increments pipelined on reflect(ours).cap before it returns arrive in order."""

    async def body(tester: Any) -> None:
        ours = CounterImpl(0)
        cap = tester.reflect(cap=ours).cap
        promises = [cap.increment(by=1) for _ in range(20)]
        values = [(await p).value for p in promises]
        assert values == list(range(1, 21))
        assert ours.value == 20
        # After the embargo: still in order, now straight to our object.
        assert (await cap.increment(by=1)).value == 21

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_reflect_calls_across_the_embargo(pycapnp_tester: PeerProcess) -> None:
    """Calls made before the return, while the embargo is up, and after it: one order."""

    async def body(tester: Any) -> None:
        ours = CounterImpl(0)
        promise = tester.reflect(cap=ours)
        cap = promise.cap
        promises = []
        for i in range(60):
            promises.append(cap.increment(by=1))
            if i % 3 == 0:
                await (
                    trio.lowlevel.checkpoint()
                )  # let messages (return, disembargo) arrive in between
            if i == 30:
                await promise  # the return is in by now
        values = [(await p).value for p in promises]
        assert values == list(range(1, 61))
        assert ours.increments == [1] * 60

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_reflect_of_a_reflection(pycapnp_tester: PeerProcess) -> None:
    """reflect(reflect(ours).cap): C++ returns a promise of its own (senderPromise) that later
    resolves to our object (Resolve -> receiverHosted): calls made on it meanwhile must be
    embargoed and keep their order (rpc-protocol.md §8, §9)."""

    async def body(tester: Any) -> None:
        ours = CounterImpl(0)
        inner = tester.reflect(cap=ours).cap
        outer = tester.reflect(cap=inner).cap
        promises = [outer.increment(by=1) for _ in range(20)]
        promises += [inner.increment(by=1) for _ in range(5)]
        values = [(await p).value for p in promises]
        # E-order holds per reference: each reference's calls arrive in the order made
        # (outer and inner are different references, so they may interleave).
        outer_values, inner_values = values[:20], values[20:]
        assert outer_values == sorted(outer_values), outer_values
        assert inner_values == sorted(inner_values), inner_values
        assert sorted(values) == list(range(1, 26))
        assert ours.value == 25

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_reflect_their_promise(pycapnp_tester: PeerProcess) -> None:
    """reflect(a pipelined cap of theirs): stays remote, calls keep order."""

    async def body(tester: Any) -> None:
        theirs = tester.newCounter(start=0).counter
        cap = tester.reflect(cap=theirs).cap
        promises = [cap.increment(by=1) for _ in range(10)]
        assert [(await p).value for p in promises] == list(range(1, 11))
        assert (await theirs.get()).value == 10

    with peer_deadline():
        await run(pycapnp_tester, body)


# ------------------------------------------------------------------ exceptions


@pytest.mark.parametrize("kind", list(FAIL_KINDS))
async def test_fail_is_failed_with_reason(pycapnp_tester: PeerProcess, kind: str) -> None:
    async def body(tester: Any) -> None:
        reason = f"requested {kind} failure"
        with pytest.raises(capsvc.Failed) as info:
            await tester.fail(kind=kind, reason=reason)
        assert reason in info.value.reason
        assert (await tester.echo(msg="after")).reply == "after"

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_unimplemented_interface(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        unknown = tester.cast_as(Unknown)
        with pytest.raises(capsvc.Unimplemented):
            await unknown.nothing()
        unknown.close()
        assert (await tester.echo(msg="still here")).reply == "still here"

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_slow_and_cancelled_call(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        # Real time, both: the C++ peer sleeps on its own clock. A lower bound cannot flake
        # (a loaded machine only makes the call slower), and the cancel at 0.05 s comes
        # long before the 0.3 s call could answer.
        start = trio.current_time()
        assert (await tester.slow(ms=50)).done is True
        assert trio.current_time() - start >= 0.045
        with trio.move_on_after(0.05) as scope:
            await tester.slow(ms=300)
        assert scope.cancelled_caught
        assert (await tester.echo(msg="after cancel")).reply == "after cancel"

    with peer_deadline():
        await run(pycapnp_tester, body)


# ------------------------------------------------------------------ sum over mixed lists


async def test_sum_mixed(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        pipelined = tester.newCounter(start=1).counter
        resolved = (await tester.newCounter(start=20)).counter
        ours = CounterImpl(300)
        also_ours = CounterImpl(4000)
        counters = [pipelined, ours, resolved, also_ours, ours]
        assert (await tester.sum(counters=counters)).total == 1 + 300 + 20 + 4000 + 300
        assert (await tester.sum(counters=[])).total == 0
        assert ours.history == [("get",), ("get",)]

    with peer_deadline():
        await run(pycapnp_tester, body)


# ------------------------------------------------------------------ calculator


class PowerFunction(capsvc.Server, interface=Calculator.Function):
    def __init__(self) -> None:
        self.calls = 0

    async def call(self, params: Any, results: Any) -> float:
        args = list(params.params)
        if len(args) != 2:
            raise capsvc.Failed("Wrong number of parameters.")
        self.calls += 1
        return float(args[0] ** args[1])


def set_call(expr: Any, function: Any, *args: Any) -> None:
    """Fill ``expr`` as a call (as tests/peers/pycapnp_calc_client.py does)."""
    call = expr.init("call")
    call.function = function
    params = call.init("params", len(args))
    for index, arg in enumerate(args):
        slot = params[index]
        if isinstance(arg, int | float):
            slot.literal = float(arg)
        elif arg[0] == "param":
            slot.parameter = arg[1]
        elif arg[0] == "prev":
            slot.previousResult = arg[1]
        elif arg[0] == "call":
            set_call(slot, arg[1], *arg[2:])
        else:
            raise ValueError(arg)


async def test_calculator_literal(pycapnp_calculator: PeerProcess) -> None:
    async def body(calculator: Any) -> None:
        request = calculator.evaluate_request()
        request.params.expression.literal = 123
        assert (await request.send().value.read()).value == 123.0

    with peer_deadline():
        await run(pycapnp_calculator, body, Calculator)


async def test_calculator_add(pycapnp_calculator: PeerProcess) -> None:
    async def body(calculator: Any) -> None:
        add = calculator.getOperator(op="add").func  # not awaited
        request = calculator.evaluate_request()
        set_call(request.params.expression, add, 12, 34)
        assert (await request.send().value.read()).value == 46.0

    with peer_deadline():
        await run(pycapnp_calculator, body, Calculator)


async def test_calculator_previous_result_pipelining(pycapnp_calculator: PeerProcess) -> None:
    async def body(calculator: Any) -> None:
        add = calculator.getOperator(op="add").func
        multiply = calculator.getOperator(op="multiply").func
        request = calculator.evaluate_request()
        set_call(request.params.expression, multiply, 4, 6)
        product = request.send().value  # a Value promise
        plus3 = calculator.evaluate_request()
        set_call(plus3.params.expression, add, ("prev", product), 3)
        plus5 = calculator.evaluate_request()
        set_call(plus5.params.expression, add, ("prev", product), 5)
        r3 = plus3.send().value.read()
        r5 = plus5.send().value.read()
        assert (await r3).value == 27.0
        assert (await r5).value == 29.0

    with peer_deadline():
        await run(pycapnp_calculator, body, Calculator)


async def test_calculator_def_function(pycapnp_calculator: PeerProcess) -> None:
    async def body(calculator: Any) -> None:
        add = calculator.getOperator(op="add").func
        multiply = calculator.getOperator(op="multiply").func
        f_request = calculator.defFunction_request()
        f_request.params.paramCount = 2
        set_call(f_request.params.body, add, ("call", multiply, ("param", 0), 100), ("param", 1))
        f = f_request.send().func
        g_request = calculator.defFunction_request()
        g_request.params.paramCount = 1
        set_call(
            g_request.params.body,
            multiply,
            ("call", f, ("param", 0), ("call", add, ("param", 0), 1)),
            2,
        )
        g = g_request.send().func
        request = calculator.evaluate_request()
        set_call(request.params.expression, add, ("call", f, 12, 34), ("call", g, 21))
        assert (await request.send().value.read()).value == 1234.0 + 4244.0

    with peer_deadline():
        await run(pycapnp_calculator, body, Calculator)


async def test_calculator_client_function_callback(pycapnp_calculator: PeerProcess) -> None:
    async def body(calculator: Any) -> None:
        add = calculator.getOperator(op="add").func
        power = PowerFunction()
        request = calculator.evaluate_request()
        set_call(request.params.expression, add, ("call", power, 2, 4), 3)
        assert (await request.send().value.read()).value == 19.0
        assert power.calls == 1

    with peer_deadline():
        await run(pycapnp_calculator, body, Calculator)


# ------------------------------------------------------------------ teardown


async def test_close_with_everything_outstanding(pycapnp_tester: PeerProcess) -> None:
    """Closing the connection with calls, imports and exports outstanding fails the calls
    with Disconnected and leaves every table empty."""
    async with capsvc.connect(pycapnp_tester.address) as conn:
        tester = conn.bootstrap(Tester)
        counter = (await tester.newCounter(start=1)).counter
        ours = CounterImpl(0)
        assert (await tester.callCounter(counter=ours, by=1)).value == 1
        pending = tester.slow(ms=2000)
        await trio.testing.wait_all_tasks_blocked()  # the slow Call has been written
        # Outstanding now: the slow question, the bootstrap and counter imports.
        sizes = conn.session.table_sizes()
        assert (sizes["questions"], sizes["imports"]) == (1, 2), sizes
        await conn.aclose()
        with pytest.raises(capsvc.Disconnected):
            await pending
        with pytest.raises(capsvc.Disconnected):
            await counter.get()
        assert conn.session.tables_empty(), conn.session.table_sizes()
        del tester, counter, pending


# ------------------------------------------------------------------ cancellation, reuse


async def test_drop_promises_before_return(pycapnp_tester: PeerProcess) -> None:
    """Dropping a call's promise (and its pipelined caps) before the return sends the
    Finish early; the capabilities in the late results must not leak on either side."""

    async def body(tester: Any) -> None:
        for _ in range(5):
            tester.newCounter(start=1)  # dropped at once
            tester.newCounter(start=2).counter  # noqa: B018 -- pipelined cap dropped at once
            slow = tester.slow(ms=100)
            del slow
        held = tester.newCounter(start=3).counter
        assert (await held.increment(by=1)).value == 4

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_import_and_export_id_reuse(pycapnp_tester: PeerProcess) -> None:
    async def body(tester: Any) -> None:
        for round_ in range(20):
            counter = (await tester.newCounter(start=round_)).counter
            assert (await counter.increment(by=1)).value == round_ + 1
            ours = CounterImpl(round_)
            assert (await tester.callCounter(counter=ours, by=2)).value == round_ + 2
            del counter, ours
            await trio.lowlevel.checkpoint()

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_same_export_resent_while_released(pycapnp_tester: PeerProcess) -> None:
    """One local object sent again and again, concurrently, while the peer releases earlier
    references to it (release racing re-send: rpc-protocol.md §7)."""

    async def body(tester: Any) -> None:
        ours = CounterImpl(0)
        for _ in range(10):
            promises = [tester.callCounter(counter=ours, by=1) for _ in range(5)]
            values = sorted([(await p).value for p in promises])
            assert len(set(values)) == 5
            # Real time: a pause for the C++ peer's Releases of the last round to come in
            # while we send the next one (it shapes the race; no outcome depends on it).
            await trio.sleep(0.005)
        assert ours.value == 50

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_local_promise_passed_to_peer(pycapnp_tester: PeerProcess) -> None:
    """A capability that is still a local promise (the pipelined result of a call on a local
    object) goes out as senderPromise and is resolved later with a Resolve."""

    class SlowFactory(capsvc.Server, interface=Tester):
        async def newCounter(self, params: Any, results: Any) -> None:
            # Still unresolved when serialized either way (this task has not run yet);
            # the delay only makes the Resolve come well after the peer saw the promise.
            await trio.sleep(0.05)
            results.counter = CounterImpl(params.start)

    async def body(tester: Any) -> None:
        local = capsvc.capability(SlowFactory(), Tester)
        promised = local.newCounter(start=100).counter  # a local promise
        assert (await tester.callCounter(counter=promised, by=1)).value == 101
        promised2 = local.newCounter(start=200).counter
        assert (await tester.sum(counters=[promised2, promised])).total == 301
        # Reflected back to us while still a promise: comes home as our own export.
        promised3 = local.newCounter(start=300).counter
        back = tester.reflect(cap=promised3).cap
        values = [back.increment(by=1) for _ in range(5)]
        assert [(await v).value for v in values] == [301, 302, 303, 304, 305]

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_null_capabilities_round_trip(pycapnp_tester: PeerProcess) -> None:
    """Null capability pointers stay null through holdCaps."""

    async def body(tester: Any) -> None:
        request = tester.holdCaps_request()
        h = request.params.init("holder")
        h.name = "empty"
        h.cap = None
        h.init("inner").name = "no caps here"
        h.choice.none = None
        del h
        holder = (await request.send()).holder
        assert holder.name == "empty"
        assert not holder._has("cap")
        assert not holder.inner._has("cap")
        assert holder.choice.which() == "none"
        assert not holder.extra._has("callback")
        with pytest.raises(capsvc.RpcError):
            await holder.cap.get()

    with peer_deadline():
        await run(pycapnp_tester, body)


async def test_peer_dies_with_calls_outstanding() -> None:
    """The reference server is killed mid-call: the call fails with Disconnected, every
    capability from it breaks, and the tables end empty."""
    from tests.support.peers import pycapnp_server, stop_pid

    with pycapnp_server("tester") as peer:
        async with capsvc.connect(peer.address) as conn:
            tester = conn.bootstrap(Tester)
            counter = (await tester.newCounter(start=1)).counter
            ours = CounterImpl(0)
            assert (await tester.callCounter(counter=ours, by=1)).value == 1
            pending = tester.slow(ms=5000)
            await trio.testing.wait_all_tasks_blocked()  # the slow Call has been written
            sizes = conn.session.table_sizes()
            assert (sizes["questions"], sizes["imports"]) == (1, 2), sizes
            await trio.to_thread.run_sync(stop_pid, peer.proc)
            with peer_deadline(10):
                with pytest.raises(capsvc.Disconnected):
                    await pending
                with pytest.raises(capsvc.Disconnected):
                    await counter.get()
                await conn.wait_closed()
            assert conn.session.tables_empty(), conn.session.table_sizes()
            del tester, counter, pending


# ------------------------------------------------------------------ tail calls (§6.2)
#
# tests/support/pycapnp_tailcall_server.py forwards every Tester call back to our own
# bootstrap Tester with context.tail_call(): C++ sends us Call Q2 with sendResultsTo.yourself
# and answers our Q1 with takeFromOtherQuestion = Q2. pycapnp 2.2.4 itself may then crash the
# peer process ("Inner node returned empty value", also against a pycapnp client), so each
# test uses a fresh peer, makes one forwarded call, and distinguishes that crash (the
# connection is simply lost) from a protocol Abort sent by C++ (our fault).


def _peer_aborted(conn: capsvc.Connection) -> str | None:
    closed = conn.session.closed
    return str(closed) if closed is not None and "peer aborted" in str(closed) else None


async def _tail_call_scenario(peer: PeerProcess, body: Any) -> None:
    server = TesterImpl()
    async with capsvc.connect(peer.address, bootstrap=server) as conn:

        async def run_body() -> None:
            tester = conn.bootstrap(Tester)
            with peer_deadline(10):
                await body(tester, server)
                # A barrier instead of a pause: a call C++ answers itself (no tail call, so
                # no risk of the pycapnp crash) comes back only after C++ has handled all
                # we sent before it; an Abort for any of that would have arrived first.
                with pytest.raises((capsvc.Unimplemented, capsvc.Disconnected)):
                    await tester.cast_as(Unknown).nothing()

        await run_body()
        assert _peer_aborted(conn) is None, f"C++ aborted the connection: {_peer_aborted(conn)}"
        if conn.session.closed is None:
            # C++ still holds our bootstrap (it asked for it); ours of it is dropped.
            await assert_tables(conn, exports=1)


async def test_tail_call_echo(pycapnp_tailcall: PeerProcess) -> None:
    async def body(tester: Any, server: TesterImpl) -> None:
        assert (await tester.echo(msg="round trip")).reply == "round trip"

    await _tail_call_scenario(pycapnp_tailcall, body)


async def test_tail_call_pipelined(pycapnp_tailcall: PeerProcess) -> None:
    async def body(tester: Any, server: TesterImpl) -> None:
        counter = tester.newCounter(start=5).counter
        assert (await counter.increment(by=2)).value == 7
        assert server.counters_made == 1

    await _tail_call_scenario(pycapnp_tailcall, body)


async def test_tail_call_callback(pycapnp_tailcall: PeerProcess) -> None:
    async def body(tester: Any, server: TesterImpl) -> None:
        cb = CallbackImpl()
        assert (await tester.callBack(cb=cb, value=3)).ack == 7
        assert cb.seen == [3]

    await _tail_call_scenario(pycapnp_tailcall, body)


async def test_tail_call_get_self(pycapnp_tailcall: PeerProcess) -> None:
    async def body(tester: Any, server: TesterImpl) -> None:
        assert (await tester.getSelf().self.echo(msg="me")).reply == "me"

    await _tail_call_scenario(pycapnp_tailcall, body)


async def test_tail_call_exception(pycapnp_tailcall: PeerProcess) -> None:
    """The forwarded call fails in our own server: Q1 fails with the exact type, and our
    Return for Q2 must be resultsSentElsewhere (C++ aborts on an exception there)."""

    async def body(tester: Any, server: TesterImpl) -> None:
        with pytest.raises(capsvc.Overloaded) as info:
            await tester.fail(kind="overloaded", reason="forwarded failure")
        assert "forwarded failure" in info.value.reason

    await _tail_call_scenario(pycapnp_tailcall, body)


async def test_tail_call_slow(pycapnp_tailcall: PeerProcess) -> None:
    """A forwarded call that takes a while must still complete (not be cancelled by the
    peer's Finish of Q2, which follows our early Finish of Q1)."""

    async def body(tester: Any, server: TesterImpl) -> None:
        assert (await tester.slow(ms=200)).done is True
        assert server.slow_cancelled == 0

    await _tail_call_scenario(pycapnp_tailcall, body)


async def test_tail_call_hold_caps(pycapnp_tailcall: PeerProcess) -> None:
    """holdCaps forwarded back to us: Q1's results are our own local answer's results."""

    async def body(tester: Any, server: TesterImpl) -> None:
        ours = [CounterImpl(start) for start in (10, 20, 30, 40, 50)]
        callback = CallbackImpl()
        request = tester.holdCaps_request()
        h = request.params.init("holder")
        h.name = "outer"
        h.cap = ours[0]
        h.init("inner").cap = ours[1]
        h.init("caps", 1)[0] = ours[2]
        h.init("items", 1)[0].cap = ours[3]
        h.choice.counter = ours[4]
        h.extra.callback = callback
        del h
        holder = (await request.send()).holder
        assert holder.name == "outer"
        assert holder._has("cap")
        assert holder.choice.which() == "counter"
        caps = [
            holder.cap,
            holder.inner.cap,
            holder.caps[0],
            holder.items[0].cap,
            holder.choice.counter,
        ]
        for counter, cap in zip(ours, caps, strict=True):
            assert (await cap.increment(by=1)).value == counter.value
        assert (await holder.extra.callback.notify(value=1)).ack == 3

    await _tail_call_scenario(pycapnp_tailcall, body)
