"""Adaptive busy polling (capsvc.transport.busypoll): the policy, and the socket stream
over real loopback TCP: polls find quick replies, an idle connection stops polling."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio

import capsvc
from capsvc.transport.busypoll import (
    DEFAULT_BUDGET,
    PROBE_EVERY,
    SLEEP_PROBE_EVERY,
    BusyPoll,
)
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


def simulate(poll: BusyPoll, waits: int, poll_cycle: float, sleep_cycle: float) -> int:
    """Drive the policy through ``waits`` cycles on a virtual clock, as the socket stream
    does: a polled wait finds its data after 80% of a poll cycle; returns how many polled."""
    clock = 0.0
    polled = 0
    for _ in range(waits):
        poll.begin_wait(clock)
        if poll.should_poll():
            polled += 1
            poll.polled(found=True, waited=0.8 * poll_cycle)
            clock += poll_cycle
        else:
            poll.slept()
            clock += sleep_cycle
    return polled


def test_polling_goes_on_where_a_wake_up_is_expensive() -> None:
    # A halting vCPU: a cycle that slept takes 300 us, one that polled 120 us.
    poll = BusyPoll(400e-6)
    simulate(poll, 200, poll_cycle=120e-6, sleep_cycle=300e-6)  # learn both averages
    assert poll.wake_ups_worth_polling()
    polled = simulate(poll, 160, poll_cycle=120e-6, sleep_cycle=300e-6)
    # Every wait polls but the sleep probes that keep the sleeping average current.
    assert polled == 160 - 160 // SLEEP_PROBE_EVERY


def test_polling_stops_where_a_wake_up_is_cheap() -> None:
    # A vCPU that never halts: sleeping costs 5 us more per cycle, polling spins ~100 us.
    poll = BusyPoll(400e-6)
    simulate(poll, 200, poll_cycle=120e-6, sleep_cycle=125e-6)
    assert not poll.wake_ups_worth_polling()
    assert poll.score > 0  # polls still find data: rule 1 alone would poll every time
    polled = simulate(poll, 160, poll_cycle=120e-6, sleep_cycle=125e-6)
    assert polled <= 160 // PROBE_EVERY + 1  # only the probes that keep polling measured


def test_polling_resumes_when_wake_ups_become_expensive() -> None:
    poll = BusyPoll(400e-6)
    simulate(poll, 200, poll_cycle=120e-6, sleep_cycle=125e-6)
    assert not poll.wake_ups_worth_polling()
    simulate(poll, 400, poll_cycle=120e-6, sleep_cycle=320e-6)
    assert poll.wake_ups_worth_polling()
    assert simulate(poll, 32, poll_cycle=120e-6, sleep_cycle=320e-6) >= 28


def test_idle_periods_are_not_wake_up_samples() -> None:
    # Cycles of 10 ms (an idle client) say nothing about wake-ups: with no samples, the
    # wake-up rule does not stop polls that find data.
    poll = BusyPoll(400e-6)
    simulate(poll, 200, poll_cycle=120e-6, sleep_cycle=10e-3)
    assert poll.sleep_cycle == 0.0
    assert poll.wake_ups_worth_polling()


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
