"""Adaptive busy polling: keep polling a socket briefly instead of sleeping, when it pays.

Theory of operation: a process that blocks in ``epoll_wait`` right after sending pays for
sleeping and being woken again when the reply comes (pycapnp-notes.md §2-4). On virtual
machines that cost can dominate a small round trip: an idle vCPU halts, the peer's ``send``
must wake it through the hypervisor, and the scheduler may pack both processes onto one
vCPU so that they take turns. When replies come quickly it is cheaper to keep polling the
socket for a short while (the *budget*): each poll is one zero-timeout trio pass (other
tasks run and the end-of-pass flush still happens) plus a non-blocking ``recv``, with a
``sched_yield`` so that a process waiting for this CPU gets it. This is what the kernel's
``SO_BUSY_POLL`` and user-space network stacks do.

A ``sched_yield`` that took long means another process ran meanwhile: the CPUs are
contended, and polling would take CPU time from others (perhaps from the very peer we wait
for). The poll then stops at once and counts as a miss.

Polling only pays when two things hold, and the policy checks both as it goes:

1. **The data comes within the budget.** Otherwise polling burns a CPU for nothing (an
   idle connection, a slow peer, a machine whose CPUs are all busy). A score moves up when
   a poll found data and down (twice as fast) when it ran out of budget. Polling happens
   while the score is positive; while it is not, one wait in ``PROBE_EVERY`` polls anyway
   (a probe), so that a connection whose peer became fast again is noticed.
2. **Sleeping would have been slower by enough to be worth the CPU.** On a machine where
   a wake-up is cheap (a few microseconds, e.g. a vCPU that never halts), a poll that
   finds the reply saves little time yet spends the whole wait on a CPU, 7-16 scheduler
   passes per call (issue 10). What a wake-up costs is more than the wait itself: a vCPU
   that halted also runs the work after it slower (cold caches, the hypervisor's
   scheduling). So the policy times whole *cycles*, from one wait's start to the next
   one's (the wait and all the work it led to), and keeps two running averages: cycles
   whose wait polled and found data (``poll_cycle``) and cycles whose wait slept
   (``sleep_cycle``); cycles longer than ``CYCLE_SAMPLE_LIMIT`` budgets are idle
   periods, not calls, and are not samples. It also averages how long a poll that found
   data spun (``poll_wait``: the CPU time polling costs). While polling pays by the
   score, one wait in ``SLEEP_PROBE_EVERY`` sleeps anyway (a sleep probe) so that
   ``sleep_cycle`` stays current. Polling goes on only while the time it saves per cycle,
   ``sleep_cycle - poll_cycle``, is at least ``MIN_WAKE_GAIN`` and at least
   ``WAKE_GAIN_SHARE`` of ``poll_wait``. Until both cycle averages have ``MIN_SAMPLES``
   samples, rule 1 alone decides. When rule 2 says no, one wait in ``PROBE_EVERY`` still
   polls, to keep ``poll_cycle`` current, so a machine whose wake-ups became expensive is
   noticed. A stream that does not time its waits (``begin_wait``, ``slept``) gets rule
   1 alone.

A cycle whose poll ran out of budget says nothing either way: it is made longer by the
very wake-up cost that polling avoids, and its length is mostly the budget already spent.
"""

from __future__ import annotations

import os
import time

#: The default budget: a few times a small call's turnaround when both peers poll (~100 µs
#: here), short enough that a wasted poll costs little.
DEFAULT_BUDGET = 400e-6
DEFAULT_BUSY_POLL = DEFAULT_BUDGET  # the public name (capsvc.DEFAULT_BUSY_POLL)
#: While polling does not pay, one wait in this many polls anyway (a probe).
PROBE_EVERY = 16
#: While polling pays, one wait in this many sleeps anyway, to measure what a wake-up costs.
SLEEP_PROBE_EVERY = 16
#: A cycle longer than this many budgets is an idle period, not a call: not a sample.
CYCLE_SAMPLE_LIMIT = 4.0
#: Polling must save at least this much time per cycle (seconds) ...
MIN_WAKE_GAIN = 20e-6
#: ... and at least this share of the time it spends polling.
WAKE_GAIN_SHARE = 0.25
#: Samples of each kind of wait before the wake-up rule decides anything.
MIN_SAMPLES = 4
#: Weight of a new sample in the running averages (an exponential moving average).
_SMOOTHING = 0.125
_SCORE_LIMIT = 8
# What the current cycle's wait did (the cycle is a sample only if it polled or slept).
_UNTIMED, _POLLED, _SLEPT = 0, 1, 2
#: A ``sched_yield`` that took longer than this ran another process (an uncontended one
#: returns in about a microsecond).
CONTENDED_YIELD = 20e-6


class BusyPoll:
    """The adaptive polling policy of one socket; see the module docstring."""

    __slots__ = (
        "_cycle_kind",
        "_cycle_start",
        "_poll_samples",
        "_since_probe",
        "_since_sleep_probe",
        "_sleep_samples",
        "budget",
        "hits",
        "misses",
        "poll_cycle",
        "poll_wait",
        "score",
        "sleep_cycle",
    )

    def __init__(self, budget: float = DEFAULT_BUDGET) -> None:
        if budget <= 0:
            raise ValueError("the busy-poll budget must be positive (use None to disable)")
        self.budget = budget
        self.score = 0
        self.hits = 0  # polls that found data (statistics for tests and benchmarks)
        self.misses = 0  # polls that ran out of budget
        # Running averages in seconds, valid once sampled (the module docstring).
        self.poll_wait = 0.0
        self.poll_cycle = 0.0
        self.sleep_cycle = 0.0
        self._poll_samples = 0  # cycles sampled into poll_cycle
        self._sleep_samples = 0
        self._cycle_start = 0.0
        self._cycle_kind = _UNTIMED
        self._since_probe = 0
        self._since_sleep_probe = 0

    def should_poll(self) -> bool:
        """Whether this wait polls (True) or sleeps (False); see the module docstring."""
        if self.score > 0:
            self._since_sleep_probe += 1
            if self._since_sleep_probe >= SLEEP_PROBE_EVERY:
                self._since_sleep_probe = 0
                return False  # a sleep probe: what would this cycle have cost asleep?
            if self.wake_ups_worth_polling():
                return True
        return self._probe()

    def wake_ups_worth_polling(self) -> bool:
        """Rule 2: cycles that sleep are slower than cycles that poll by enough to pay for
        the CPU polling spends (True until both averages are known)."""
        if self._poll_samples < MIN_SAMPLES or self._sleep_samples < MIN_SAMPLES:
            return True
        gain = self.sleep_cycle - self.poll_cycle
        return gain >= MIN_WAKE_GAIN and gain >= WAKE_GAIN_SHARE * self.poll_wait

    def _probe(self) -> bool:
        self._since_probe += 1
        if self._since_probe >= PROBE_EVERY:
            self._since_probe = 0
            return True
        return False

    def begin_wait(self, started: float) -> None:
        """A wait begins at ``started`` (``now()``): the cycle of the previous wait ends."""
        kind = self._cycle_kind
        if kind != _UNTIMED:
            cycle = started - self._cycle_start
            if cycle <= CYCLE_SAMPLE_LIMIT * self.budget:
                if kind == _POLLED:
                    self.poll_cycle = _average(self.poll_cycle, cycle, self._poll_samples)
                    self._poll_samples += 1
                else:
                    self.sleep_cycle = _average(self.sleep_cycle, cycle, self._sleep_samples)
                    self._sleep_samples += 1
        self._cycle_start = started
        self._cycle_kind = _UNTIMED

    def yield_cpu(self) -> bool:
        """Let other processes run; False if one did (the CPUs are contended)."""
        started = now()
        _sched_yield()
        return now() - started < CONTENDED_YIELD

    def polled(self, found: bool, waited: float | None = None) -> None:
        """A poll found data within the budget, or ran out of it; ``waited`` (seconds,
        from the wait's start to the data) is how long a poll that found data spun."""
        if found:
            self.hits += 1
            self.score = min(self.score + 1, _SCORE_LIMIT)
            if waited is not None:
                self.poll_wait = _average(self.poll_wait, waited, self.hits - 1)
                self._cycle_kind = _POLLED
        else:
            self.misses += 1
            self.score = max(self.score - 2, -_SCORE_LIMIT)
            self._cycle_kind = _UNTIMED

    def slept(self) -> None:
        """This cycle's wait did not poll: it slept until data came."""
        self._cycle_kind = _SLEPT


def _average(average: float, sample: float, samples: int) -> float:
    if samples == 0:
        return sample
    return average + (sample - average) * _SMOOTHING


now = time.perf_counter
_sched_yield = os.sched_yield
