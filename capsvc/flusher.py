"""Write each connection's output once per scheduler pass, at the end of the pass.

Theory of operation (DESIGN.md, "Buffered framing"): trio calls an instrument's
``before_io_wait`` once per scheduler pass, after every runnable task has run and just
before it polls for I/O. That is exactly the moment at which "everything produced in one
pass" is known. ``EndOfPassFlusher`` keeps the set of connections that produced output
during the pass and, at that moment, writes each one's whole batch with one non-blocking
send, the stream's ``send_from_flusher``
(:class:`~capsvc.transport.capabilities.FlusherSendStream`: a socket ``send`` for TCP and
Unix, the frame path for ``nic:``). Compared with waking a writer task, this saves a
scheduler pass (an ``epoll_wait`` and a task switch) per batch on each side of every round
trip.

What the flusher cannot finish (the socket buffer is full) is left to the connection's
writer task, and so is all output of a stream that is no ``FlusherSendStream`` (such a
connection never registers with the flusher). The flusher never reschedules a task
directly: at this point of the loop trio has already chosen how long to sleep, so it asks
trio to run the wake-up "soon" through ``run_sync_soon``, which interrupts the sleep.
"""

from __future__ import annotations

from typing import Protocol

import trio


class Flushable(Protocol):
    def flush_at_end_of_pass(self) -> None: ...


#: How many scheduler passes a reader's offer stays open (capsvc.connection, "Callers
#: read") while the loop keeps running: the caller it woke may first start another task
#: that makes the call. A caller that cannot read wakes the reader itself, so this bounds
#: only how long input nobody waits for (an Abort, end of file) stays unread.
OFFER_PASSES = 4


class StandingBy(Protocol):
    """A connection whose reader task stands by while a caller reads for it."""

    def wake_unclaimed(self) -> None: ...


class EndOfPassFlusher(trio.abc.Instrument):
    """The per-run instrument; see the module docstring."""

    def __init__(self) -> None:
        self.dirty: dict[Flushable, None] = {}  # an ordered set
        #: Scheduler passes so far: a reader that sees this move knows that the tasks it
        #: woke have run and their output has left since it last looked.
        self.passes = 0
        #: Connections whose reader stands by for a caller to read in its place
        #: (capsvc.connection, "Callers read"), each with ``passes`` when it began to.
        #: One unclaimed for OFFER_PASSES passes, or when the loop is about to sleep,
        #: gets its reader back.
        self.offers: dict[StandingBy, int] = {}

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1
        if self.dirty:
            dirty, self.dirty = self.dirty, {}
            for connection in dirty:
                try:
                    connection.flush_at_end_of_pass()
                except Exception:  # an instrument that raises is disabled by trio: never
                    trio.lowlevel.current_trio_token().run_sync_soon(_log_flush_error)
        if self.offers:
            # About to sleep: a timeout, or none with nothing runnable (trio's idle pass
            # under an autojump clock or wait_all_tasks_blocked also has timeout 0).
            sleeping = timeout > 0 or not trio.lowlevel.current_statistics().tasks_runnable
            self._wake_unclaimed(sleeping)

    def _wake_unclaimed(self, sleeping: bool) -> None:
        # After the sends above: the wake-up (a write to trio's wake-up socket, which cuts
        # the coming sleep short) follows this pass's output instead of delaying it. A
        # loop about to sleep has no task left that could take an offer: wake them all.
        passes = self.passes
        for standing_by, since in list(self.offers.items()):
            if sleeping or passes - since >= OFFER_PASSES:
                del self.offers[standing_by]
                trio.lowlevel.current_trio_token().run_sync_soon(standing_by.wake_unclaimed)


def _log_flush_error() -> None:
    import logging

    logging.getLogger("capsvc").exception("end-of-pass flush failed")


_FLUSHER: trio.lowlevel.RunVar[EndOfPassFlusher] = trio.lowlevel.RunVar("capsvc_flusher")


def current_flusher() -> EndOfPassFlusher:
    """The flusher of the running trio loop (installed on first use)."""
    try:
        return _FLUSHER.get()
    except LookupError:
        flusher = EndOfPassFlusher()
        trio.lowlevel.add_instrument(flusher)
        _FLUSHER.set(flusher)
        return flusher
