"""Adaptive busy polling: keep polling a socket briefly instead of sleeping, when it pays.

Theory of operation: a process that blocks in ``epoll_wait`` right after sending pays for
sleeping and being woken again when the reply comes (pycapnp-notes.md §2-4). On virtual
machines that cost dominates a small round trip: an idle vCPU halts, the peer's ``send``
must wake it through the hypervisor, and the scheduler may pack both processes onto one
vCPU so that they take turns. When replies come quickly it is cheaper to keep polling the
socket for a short while (the *budget*): each poll is one zero-timeout trio pass (other
tasks run and the end-of-pass flush still happens) plus a non-blocking ``recv``, with a
``sched_yield`` so that a process waiting for this CPU gets it. This is what the kernel's
``SO_BUSY_POLL`` and user-space network stacks do.

A ``sched_yield`` that took long means another process ran meanwhile: the CPUs are
contended, and polling would take CPU time from others (perhaps from the very peer we wait
for). The poll then stops at once and counts as a miss.

Polling only pays when the data arrives within the budget; otherwise it burns a CPU for
nothing (an idle connection, a slow peer, a machine whose CPUs are all busy). So the
decision adapts: a score moves up when a poll found data and down (twice as fast) when
it ran out of budget. Polling happens while the score is positive; while it is not, one
wait in ``PROBE_EVERY`` polls anyway (a probe), so that a connection whose peer became
fast again is noticed. Waits that slept say nothing either way: a sleeping wait is made
longer by the very wake-up cost that polling avoids.
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
_SCORE_LIMIT = 8
#: A ``sched_yield`` that took longer than this ran another process (an uncontended one
#: returns in about a microsecond).
CONTENDED_YIELD = 20e-6


class BusyPoll:
    """The adaptive polling policy of one socket; see the module docstring."""

    __slots__ = ("_since_probe", "budget", "hits", "misses", "score")

    def __init__(self, budget: float = DEFAULT_BUDGET) -> None:
        if budget <= 0:
            raise ValueError("the busy-poll budget must be positive (use None to disable)")
        self.budget = budget
        self.score = 0
        self.hits = 0  # polls that found data (statistics for tests and benchmarks)
        self.misses = 0  # polls that ran out of budget
        self._since_probe = 0

    def should_poll(self) -> bool:
        if self.score > 0:
            return True
        self._since_probe += 1
        if self._since_probe >= PROBE_EVERY:
            self._since_probe = 0
            return True
        return False

    def yield_cpu(self) -> bool:
        """Let other processes run; False if one did (the CPUs are contended)."""
        started = now()
        _sched_yield()
        return now() - started < CONTENDED_YIELD

    def polled(self, found: bool) -> None:
        """A poll found data within the budget, or ran out of it."""
        if found:
            self.hits += 1
            self.score = min(self.score + 1, _SCORE_LIMIT)
        else:
            self.misses += 1
            self.score = max(self.score - 2, -_SCORE_LIMIT)


now = time.perf_counter
_sched_yield = os.sched_yield
