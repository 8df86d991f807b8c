"""Adaptive busy polling (capsvc.transport.busypoll): the policy, and the socket stream
over real loopback TCP: polls find quick replies, an idle connection stops polling."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio

import capsvc
from capsvc.transport.busypoll import DEFAULT_BUDGET, PROBE_EVERY, BusyPoll
from capsvc.transport.fastsocket import FastSocketStream

HERE = os.path.dirname(__file__)
echo = capsvc.load_schema(os.path.join(HERE, "..", "schemas", "echo.capnp"))


class Echo(capsvc.Server, interface=echo.Echo):
    def ping(self, params: Any, results: Any) -> None:
        results.reply = params.msg


def test_polling_starts_on_a_probe_hit_and_stops_after_misses() -> None:
    poll = BusyPoll(100e-6)
    decisions = [poll.should_poll() for _ in range(PROBE_EVERY)]
    assert decisions == [False] * (PROBE_EVERY - 1) + [True]  # only the probe polls
    poll.polled(found=True)
    assert poll.should_poll()  # it paid: poll every time
    assert poll.should_poll()
    poll.polled(found=False)  # one miss outweighs one hit
    assert not poll.should_poll()
    for _ in range(6):
        poll.polled(found=True)
    poll.polled(found=False)
    poll.polled(found=False)
    assert poll.should_poll()  # score -1 + 6 - 4: still paying
    poll.polled(found=False)
    assert not poll.should_poll()
    assert (poll.hits, poll.misses) == (7, 4)


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        BusyPoll(0)


class PassCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.passes = 0

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1


class Uncontended(BusyPoll):
    """The policy without its CPU-contention test (test_polling_starts_on_a_probe_hit...
    covers the policy; here a loaded machine must not decide the outcome)."""

    __slots__ = ()

    def yield_cpu(self) -> bool:
        return True


async def test_quick_replies_are_found_by_polling_and_an_idle_connection_sleeps() -> None:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", Echo())
        async with capsvc.connect(address) as connection:
            stream = connection.stream
            assert isinstance(stream, FastSocketStream)
            assert stream.busy_poll is not None  # connect() polls by default...
            assert stream.busy_poll.budget == DEFAULT_BUDGET
            # ...with a budget of real (perf_counter) time, 400 us: on a loaded machine a
            # preemption outlasts it and the contention test stops polls, so the outcome
            # would be the machine's. A 20 ms budget without that test keeps the checks
            # about the stream: polls find quick replies, and an idle one ends.
            poll = stream.busy_poll = Uncontended(0.02)
            client = connection.bootstrap(echo.Echo)
            for _ in range(300):
                assert (await client.ping(msg="hi")).reply == "hi"
            # Server and client share this process's loop: a polling pass runs the server,
            # so replies come within the budget and polling pays.
            assert poll.hits > poll.misses
            # Idle: after at most one budget of polling, the loop sleeps in epoll_wait.
            # Real time, both sleeps: the budget is perf_counter time, which a virtual
            # clock would not advance. 100 ms is 5 budgets; a loop still polling would make
            # thousands of passes in the 50 ms counted, a sleeping one its own timer's
            # wake-up and little else.
            await trio.sleep(0.1)
            counter = PassCounter()
            trio.lowlevel.add_instrument(counter)
            await trio.sleep(0.05)
            trio.lowlevel.remove_instrument(counter)
            assert counter.passes <= 3  # the sleeping task's own wake-up, not polls
        nursery.cancel_scope.cancel()


async def test_busy_poll_none_never_polls() -> None:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", Echo())
        async with capsvc.connect(address, busy_poll=None) as connection:
            assert isinstance(connection.stream, FastSocketStream)
            assert connection.stream.busy_poll is None
            client = connection.bootstrap(echo.Echo)
            assert (await client.ping(msg="hi")).reply == "hi"
        nursery.cancel_scope.cancel()
