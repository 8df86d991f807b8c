"""The trio driver of one connection: a reader task, a coalescing writer task.

Theory of operation (DESIGN.md, "Buffered framing"):
- The reader feeds bytes to the framing decoder and each whole message to the engine,
  synchronously, in arrival order (rpc-protocol.md §13.1). Server methods run as their own
  tasks (capsvc.runtime), so a slow method never stalls the reader.
- The engine frames every outgoing message into one outbox. The writer sleeps until the
  outbox becomes non-empty; the first message of a scheduler pass reschedules it, so it
  runs in the next pass, after every task of this pass has added its messages, and writes
  the whole batch with one ``send_all``. The engine defers a question's Finish until the
  caller drops the results, so the Finish is produced by the caller's task together with
  its next Call: they leave in one write, and Nagle's algorithm plus delayed ACKs cannot
  stall a call even with TCP_NODELAY off.
- Calls the reader answers inline (plain ``def`` methods) have their Returns sent by the
  reader itself once the input it read is used up, before it receives again: a receive
  that finds nothing (and the ``epoll_ctl`` of its wait) then follows the send instead of
  delaying it, so that work overlaps the peer's. Anything else produced in the pass still
  leaves at its end (capsvc.flusher).
- Callers read: on a connection that offers no bootstrap and exports nothing (no peer's
  call can arrive for us, so none runs in a caller's task), a caller that would be the
  only one waiting for a result reads the stream itself instead of waiting for the reader
  task to wake it (``read_for``, from capsvc.runtime.wait_result). The reader offers this
  after it delivered input that left no caller waiting (one call at a time, or one task's
  pipelined calls) and stands by: the woken caller's next call sends its Call and
  receives its Return in its own task,
  so a round trip costs the client one scheduler pass instead of two (the reader's, then
  the caller's), and the receive that finds nothing follows the send (measured with raw
  trio: a reader task waking the caller is ~15% slower than one task at one call at a
  time). Anything but plain messages (end of file, an error, the session ending, flow
  control, a long batch) the caller hands back to the reader task, which goes on from
  there; so does a caller cancelled while it reads, and one whose result came while other
  callers still wait. A caller that cannot read wakes a reader standing by; an offer no
  caller takes is withdrawn when the loop is about to sleep, or after a few passes
  (capsvc.flusher), so input is never left unread.
- The reader delivers at most ``MESSAGES_PER_PASS`` messages per scheduler pass, then
  yields: the replies to the first calls leave at the end of that pass while the rest are
  still being read, so with many calls in flight both peers work at once instead of
  taking turns (measured: ~11k -> ~17k echo calls/s at concurrency 12).
- The outbox is bounded: when it holds more than ``max_buffered`` bytes
  (``Limits.max_queued_bytes``) the reader stops reading (so the peer's calls cannot make
  us produce more) and callers that use ``wait_writable`` wait (backpressure).
- Flow control (``Limits.max_calls_in_flight`` / ``max_call_bytes_in_flight``): while the
  peer has more calls in flight than the budget, the reader stops delivering and reading
  until Returns drain them (``RpcSession.flow_blocked`` says when that is safe), so a peer
  that floods calls is held to the budget instead of buffered without bound.
- Timeouts (``Limits``): a watchdog task aborts a served connection whose first message
  does not arrive in time, any connection with a message begun and not finished in time
  (slowloris), one whose peer reads none of our output for too long (the slow-read side),
  and, if asked, one idle for too long. It sleeps until the nearest deadline
  but at most a quarter of the shortest timeout, so a deadline that a new frame starts is
  met within 25%; nothing is timed per read.
- With TCP_NODELAY off, a lone Finish or Release (housekeeping the peer never answers) is
  held for up to ``HOLD_HOUSEKEEPING`` so it leaves with the next message: written alone,
  it would make the next Call wait for the peer's delayed ACK (Nagle).
- ``coalesce=False`` writes each message with its own ``send_all``; it exists only so the
  benchmark can show the stall that coalescing prevents.
- ``drain(reason)`` ends a connection gracefully (a server shutting down): calls that
  arrive from then on are answered ``disconnected`` with the reason, calls already in
  flight finish, and once none is left we send an Abort of type disconnected that says
  why, half-close, and let the peer close (``expire_drain`` cuts the wait short).
- After we abort the peer (a protocol or framing violation), the reader writes the Abort,
  half-closes the stream and reads and discards input until EOF or a bound, then closes
  (``_linger_after_abort``): closing a TCP socket with unread input sends a reset, and a
  reset can make the peer lose the Abort before it reads it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

import trio

from capsvc._mypyc import mypyc_attr
from capsvc.errors import Disconnected, ExceptionType, FramingError, RpcError
from capsvc.flusher import EndOfPassFlusher, current_flusher
from capsvc.framing import FrameDecoder
from capsvc.limits import Limits
from capsvc.rpc.hooks import CallResult, Hook
from capsvc.rpc.session import RpcSession
from capsvc.runtime import handoff_count
from capsvc.transport.busypoll import DEFAULT_BUDGET, BusyPoll
from capsvc.transport.capabilities import (
    BusyPollingStream,
    FastPathStream,
    FlusherSendStream,
    SocketBackedStream,
)

if TYPE_CHECKING:
    from capsvc.typed import Client as _TypedClient
    from capsvc.typed import Interface

TypedClientT = TypeVar("TypedClientT", bound="_TypedClient")


log = logging.getLogger("capsvc")

DEFAULT_MAX_BUFFERED = 4 * 1024 * 1024
#: How many incoming messages one scheduler pass delivers before yielding (see _reader).
MESSAGES_PER_PASS = 4
#: How long a lone Finish or Release may wait for company when Nagle's algorithm is on
#: (longer than Linux's 40 ms delayed-ACK timer, short enough to free remote state soon).
HOLD_HOUSEKEEPING = 0.2
#: After we abort a connection, how long we keep reading (and discarding) the peer's input
#: before closing. Closing a TCP socket whose receive buffer holds unread bytes sends a
#: reset instead of a FIN (RFC 1122 §4.2.2.13), and a reset can destroy the Abort we just
#: sent before the peer reads it (RFC 2525 §2.17). The peer needs about a round trip to read
#: the Abort and see our FIN; one that then closes ends the wait at once. 2 s is Apache
#: httpd's lingering close (SECONDS_TO_LINGER) for the same problem: long enough for any
#: live peer, short enough that a peer which never closes cannot hold a connection slot.
ABORT_LINGER_SECONDS = 2.0
#: ...and at most this many bytes: more than a receive buffer holds (Linux autotunes it up
#: to tcp_rmem's maximum, 6 MiB by default), so input already queued when we aborted is
#: drained whole, while a peer that floods us costs a bounded amount of reading.
ABORT_LINGER_BYTES = 16 * 1024 * 1024
_LINGER_READ = 65536  # bytes per discarding read (memory stays bounded: nothing is kept)


def _nagle_is_on(stream: trio.abc.Stream) -> bool:
    """True for a TCP stream whose TCP_NODELAY is off."""
    sock: socket.socket | trio.socket.SocketType
    if isinstance(stream, SocketBackedStream):
        sock = stream.socket
    elif isinstance(stream, trio.SocketStream):  # trio's own, handed to open_connection
        sock = stream.socket
    else:
        return False
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        return not sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    except OSError:
        return False


def _leave_to_writer(data: bytes) -> int:
    """The ``send_from_flusher`` of a stream without one: leave every byte to the writer."""
    return 0


# Compiled by mypyc: tests (and users) subclass Connection, so it must allow interpreted
# subclasses.
@mypyc_attr(allow_interpreted_subclasses=True)
class Connection:
    """One RPC connection over a trio Stream. Use ``run()`` inside a nursery."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        bootstrap: Hook | None = None,
        *,
        limits: Limits | None = None,
        coalesce: object = True,
        max_buffered: object = None,
        name: object = "connection",
        busy_poll: object = DEFAULT_BUDGET,
        served: object = False,
    ) -> None:
        """``coalesce`` (truth value), ``max_buffered`` (an int), ``name`` (a str) and
        ``busy_poll`` (seconds, or None) come straight from users: typed ``object`` and
        checked here, because compiled by mypyc a declared type is checked on entry with
        mypyc's own TypeError, which names no argument. ``max_buffered`` defaults to
        ``limits.max_queued_bytes``; ``served`` says a server accepted this connection (the
        first-message timeout applies)."""
        self.limits = limits or Limits()
        if max_buffered is None:
            max_buffered = self.limits.max_queued_bytes
        if not isinstance(max_buffered, int):
            raise TypeError(f"max_buffered must be an int, got {max_buffered!r}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        if busy_poll is not None and not isinstance(busy_poll, (int, float)):
            raise TypeError(f"busy_poll must be a number of seconds or None, got {busy_poll!r}")
        self.stream = stream
        self.session = RpcSession(bootstrap, limits=self.limits, on_output=self._on_output)
        self.session.backpressure = self
        self.session.on_flow_released = self._flow_released
        self._flow = trio.Event()
        self.flow_pauses = 0  # times the reader paused for the flow budget (tests count)
        self.served = bool(served)
        # The watchdog's view of the input (see _watchdog): set by the reader, cheaply.
        self._first_message_seen = False
        self._frame_started: float | None = None  # a partial message is buffered since
        self._started = self._last_input = trio.current_time()
        self._track_idle = self.limits.idle_timeout is not None
        self._writes_seen = 0
        self._output_since = -1.0  # no output waiting (see _expired)
        self._reading_paused = False
        #: The engine's outbox: what the writer takes, and the measure of backpressure.
        self.outbox = self.session.outbox
        self.coalesce = bool(coalesce)
        self.max_buffered = max_buffered
        self.messages_per_pass = MESSAGES_PER_PASS
        self.name = name
        self.writes = 0  # send_all calls so far (tests count them)
        self._decoder = FrameDecoder(self.limits)
        self._writer_task: trio.lowlevel.Task | None = None
        self._running = False  # run() has started the writer (it may not have run yet)
        self._writer_parked = False
        self._writer_gone = False  # the writer met a broken stream and ended
        self._writing = False
        self._drained = trio.Event()
        self._closed = trio.Event()
        self.close_reason: RpcError | None = None
        #: Bytes read from and written to the stream (metrics read them).
        self.bytes_received = 0
        self.bytes_sent = 0
        # Graceful close (drain): the reason the Abort will give, whether the grace
        # period ran out, and the event the drain task waits on.
        self._nursery: trio.Nursery | None = None
        # Callers read (module docstring): the reader task while it stands by, whether a
        # caller reads now, and what the last one handed back to the reader.
        #: Callers parked waiting for results of calls on this connection (runtime._Waiter).
        self.waiting = 0
        self._can_stand_by = False  # set below, with the stream's fast paths
        self._standby_task: trio.lowlevel.Task | None = None
        self._caller_reading = False
        self._interrupted = False  # _interrupt_reading_caller woke the reading caller
        self._handback: bytes | bytearray | BaseException | None = None
        self._drain_reason: str | None = None
        self._drain_expired = False
        self._drain_ready = trio.Event()
        #: True once this connection ended by ``drain`` (its calls in flight finished).
        self.drained = False
        # What the stream offers beyond trio's Stream (capsvc.transport.capabilities) is
        # detected here, once, and the methods the per-call path uses are bound now.
        # The end-of-pass fast path (capsvc.flusher) needs a stream that can send without
        # blocking from trio's before_io_wait (a FlusherSendStream: FastSocketStream,
        # NicStream); other streams are written by the writer task, a pass later.
        self._send_from_flusher: Callable[[bytes], int] = _leave_to_writer
        self._flusher: EndOfPassFlusher | None = None
        if isinstance(stream, FlusherSendStream):
            self._send_from_flusher = stream.send_from_flusher
            self._flusher = current_flusher() if self.coalesce else None
        # Reads and the writer task's sends skip trio's extra scheduler pass when they can.
        self._receive_some: Callable[[int], Awaitable[bytes | bytearray]]
        self._send_all: Callable[[bytes], Awaitable[None]]
        if isinstance(stream, FastPathStream):
            self._receive_some = stream.receive_some_fast
            self._send_all = stream.send_all_fast
            self._can_stand_by = self._flusher is not None
        else:
            self._receive_some = stream.receive_some
            self._send_all = stream.send_all
        self._remainder = b""
        self._token = trio.lowlevel.current_trio_token()
        # With TCP_NODELAY off, a Finish or Release written alone makes the next Call wait
        # for the peer's delayed ACK (Nagle): hold such housekeeping back (at most
        # HOLD_HOUSEKEEPING seconds) so that it travels with the next message.
        self._hold_housekeeping = self.coalesce and _nagle_is_on(stream)
        self._urgent_output = trio.Event()
        # Poll briefly for the peer's next message instead of sleeping, while that pays
        # (capsvc.transport.busypoll), on streams that support it (BusyPollingStream).
        if busy_poll is not None and isinstance(stream, BusyPollingStream):
            stream.busy_poll = BusyPoll(busy_poll)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Serve the connection until either side closes it or it breaks."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                if self._timeouts_apply():
                    nursery.start_soon(self._watchdog, nursery.cancel_scope)
                self._nursery = nursery
                if self._drain_reason is not None:
                    nursery.start_soon(self._finish_drain, nursery.cancel_scope)
                self._running = True
                try:
                    await self._reader()
                finally:
                    # From here the nursery may close (its last task ending) before this
                    # task resumes: ``drain`` must not start a task in it (a server
                    # draining a connection whose peer just left, issue 13 point 2).
                    self._nursery = None
                nursery.cancel_scope.cancel()
        finally:
            self._shutdown(self.close_reason or Disconnected("connection closed"))
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

    async def aclose(self) -> None:
        """Close gracefully: flush what is queued, then close the stream."""
        if self._closed.is_set():
            return
        with trio.move_on_after(5):
            await self._wait_output_written()
        self._shutdown(Disconnected("connection closed locally"))
        await trio.aclose_forcefully(self.stream)

    def drain(self, reason: str) -> None:
        """Begin a graceful close (module docstring): new calls are refused with
        ``Disconnected(reason)``, and once the peer's calls in flight have all returned the
        connection sends an Abort of type disconnected giving ``reason`` and ends."""
        session = self.session
        if self._closed.is_set() or self._drain_reason is not None:
            return
        self._drain_reason = reason
        session.draining = Disconnected(reason)
        session.on_idle = self._drain_ready.set
        if self._nursery is not None:
            self._nursery.start_soon(self._finish_drain, self._nursery.cancel_scope)

    def expire_drain(self, reason: str) -> None:
        """The grace period is over: abort now with ``reason``, failing what still runs."""
        if self._drain_reason is None:
            self.drain(reason)
        self._drain_reason = reason
        self._drain_expired = True
        self._drain_ready.set()

    async def _finish_drain(self, scope: trio.CancelScope) -> None:
        session = self.session
        if session.answers.in_flight and session.closed is None:
            await self._drain_ready.wait()
        session.on_idle = None
        reason = self._drain_reason or "the server is shutting down"
        self.drained = not self._drain_expired and session.closed is None
        # rpc.capnp: an Abort says why the connection ends; disconnected tells the peer
        # the fault is not its own and a new connection may succeed.
        session.abort(reason, ExceptionType.DISCONNECTED)
        self._interrupt_reading_caller()
        with trio.move_on_after(5):
            await self._wait_output_written()
        self.close_reason = session.closed
        stream = self.stream
        if isinstance(stream, trio.abc.HalfCloseableStream) and not self._writing:
            try:
                await stream.send_eof()  # the peer reads the Abort, then EOF, and closes
            except (
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                trio.BusyResourceError,
                OSError,
            ):
                pass  # gone already: the reader ends the connection
        # The reader sees the peer close (and ends the connection); a peer that does not
        # close is let go after the same bound as a lingering abort.
        await trio.sleep(ABORT_LINGER_SECONDS)
        scope.cancel()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def _shutdown(self, reason: RpcError) -> None:
        if self._closed.is_set():
            return
        self.close_reason = self.close_reason or reason
        self.session.close(self.close_reason)
        self._closed.set()

    # ------------------------------------------------------------------ reading
    async def _reader(self) -> None:
        session = self.session
        decoder = self._decoder
        outbox = self.outbox
        receive_some = self._receive_some
        handoffs = handoff_count()
        since_yield = 0  # messages delivered since the reader last let other tasks run
        passes = current_flusher()  # counts the loop's passes, whatever this stream is
        passes_seen = -1  # its count when since_yield was last reset
        offer = False  # delivered a whole batch: callers may read in our place next
        while True:
            if outbox.pending_bytes > self.max_buffered:
                self._reading_paused = True
                await self._wait_drained()
                self._resume_reading()
            if session.flow_blocked:
                await self._wait_flow()
            data: bytes | bytearray | None
            try:
                # (Asked here, not when the batch was delivered: we may have waited since.)
                if offer and self._may_stand_by():
                    offer = False
                    data = await self._stand_by()
                else:
                    offer = False
                    # The fast receive parks only when nothing is waiting: a Call answered
                    # inline has its Return flushed at the end of this very pass.
                    data = await receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                # A stream we closed ourselves (aclose) says why in session.closed.
                self.close_reason = self.session.closed or Disconnected(
                    f"connection lost: {error!r}"
                )
                return
            if data is None:
                # A caller read in our place and left us its undelivered messages, or the
                # session's end, or nothing at all (nobody took the offer).
                if session.closed is None and not decoder.buffered:
                    continue
            elif not data:
                decoder.feed_eof()
            else:
                self.bytes_received += len(data)
                decoder.feed(data)
            if passes.passes != passes_seen:
                # A pass ended since we last looked (the receive parked): what we delivered
                # has run and its replies have left, as the yield below would have made
                # them. Without this, one message per receive would still cost a yield (a
                # task step, and a pass) every ``messages_per_pass`` messages.
                passes_seen = passes.passes
                since_yield = 0
            handed_off = handoffs.handed_off
            delivered = False
            try:
                while True:
                    if session.flow_blocked:
                        await self._wait_flow()
                    segments = decoder.next_message()
                    if segments is None:
                        break
                    delivered = True
                    session.receive(segments)
                    if session.closed is not None:
                        break
                    since_yield += 1
                    if since_yield >= self.messages_per_pass:
                        # Let what was delivered run and its replies leave (end of this
                        # pass) before delivering more: the peer starts on the first replies
                        # while we work on the rest, and the output bound above sees what
                        # they produced.
                        since_yield = 0
                        await trio.lowlevel.cancel_shielded_checkpoint()
            except FramingError as error:
                session.abort(str(error))
            if data is not None:
                self._note_input(delivered)
            if session.closed is not None:
                with trio.move_on_after(5):
                    await self._wait_output_written()
                self.close_reason = session.closed
                if session.abort_reason is not None:
                    await self._linger_after_abort()
                return
            if data is not None and not data:
                self.close_reason = Disconnected("peer closed the connection")
                return
            if handoffs.handed_off != handed_off:
                # Calls went to worker tasks: let them run (and queue their replies) before
                # reading more, so that the output bound above sees what they produce. A
                # call answered inline needs no such pass: its Return is already queued.
                since_yield = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
            elif delivered and not decoder.buffered:
                self._flush_now()
                offer = True

    def _flush_now(self) -> None:
        """Send now what is queued, not at the end of the pass: when every call in the
        input just read was answered inline and no message is left half-read (this
        batch's replies are complete), and when a caller reading for itself is about to
        receive. Sending before the receive (which finds nothing and parks, an ``EAGAIN``
        and an ``epoll_ctl``) puts that work after the send, overlapped with the peer's,
        instead of on the round trip (issue 10: what makes a raw ping-pong fast). The same
        one write the end-of-pass flusher would make, a little sooner; held housekeeping
        stays held (``flush_at_end_of_pass`` decides)."""
        flusher = self._flusher
        if flusher is not None and self in flusher.dirty:
            del flusher.dirty[self]
            self.flush_at_end_of_pass()

    # ------------------------------------------------------------------ callers read
    def _may_stand_by(self) -> bool:
        """Whether the reader, having delivered what it read, should let callers read in
        its place (module docstring): no caller waits for a result any more, and the
        connection offers no bootstrap and exports nothing (so no peer's call can run in a
        caller's task), not draining."""
        session = self.session
        return (
            self._can_stand_by
            and self.waiting == 0
            and not session.exports.entries
            and session.bootstrap_hook is None
            and self._drain_reason is None
            and session.closed is None
        )

    async def _stand_by(self) -> bytes | bytearray | None:
        """Park the reader task while callers read; returns what the last one handed back:
        ``b""`` for the end of file it met, else None (what it left undelivered is in the
        decoder). An error it met is raised here, as if our own receive had met it."""
        flusher = self._flusher
        assert flusher is not None
        self._standby_task = trio.lowlevel.current_task()
        flusher.offers[self] = flusher.passes
        await trio.lowlevel.wait_task_rescheduled(self._abort_standby)
        handback, self._handback = self._handback, None
        if isinstance(handback, BaseException):
            raise handback
        return handback

    def _abort_standby(self, _: Any) -> trio.lowlevel.Abort:
        self._standby_task = None
        self._withdraw_offer()
        return trio.lowlevel.Abort.SUCCEEDED

    def _wake_standby(self) -> None:
        task = self._standby_task
        if task is not None:
            self._standby_task = None
            self._withdraw_offer()
            trio.lowlevel.reschedule(task)

    def _withdraw_offer(self) -> None:
        if self._flusher is not None:
            self._flusher.offers.pop(self, None)

    def wake_unclaimed(self) -> None:
        """The flusher: no caller took the reader's offer in time; it reads again."""
        if not self._caller_reading:
            self._wake_standby()

    def _interrupt_reading_caller(self) -> None:
        """The session ended from our side (a drain's Abort, a timeout) while a caller
        reads: its call has failed, so wake it from its receive now instead of when the
        peer next sends or the stream closes (the reader task takes over)."""
        if not self._caller_reading or self._interrupted:
            return
        stream = self.stream
        if isinstance(stream, SocketBackedStream):
            self._interrupted = True
            # trio wakes the socket's waiter with ClosedResourceError; the socket stays
            # open and usable (the next wait registers it again).
            trio.lowlevel.notify_closing(stream.socket)

    def claim_reading(self) -> bool:
        """A caller is about to wait for a result of this connection
        (capsvc.runtime.wait_result): True if it is to read the stream itself
        (``read_for``): the reader stands by, nobody else reads, and it still may
        (``_may_stand_by``: nobody waits, nothing exported, not draining). Otherwise a
        reader standing by reads again now: a waiting caller needs it."""
        if self._standby_task is None or self._caller_reading:
            return False
        if self._may_stand_by():
            self._caller_reading = True
            self._withdraw_offer()
            return True
        self._wake_standby()
        return False

    async def read_for(self, result: CallResult, on_cancel: Callable[[], None] | None) -> None:
        """Receive and deliver the peer's messages in the calling task until ``result``
        settles (``claim_reading`` said so). Anything but whole messages that need nothing
        more goes back to the reader task, which goes on from there; so does the reading
        when the caller is cancelled (``on_cancel`` runs first, as in wait_result)."""
        flusher = self._flusher
        assert flusher is not None
        decoder = self._decoder
        handing_back = False
        try:
            while not result.done:
                self._flush_now()  # our Call leaves before we wait for its Return
                try:
                    data = await self._receive_some(65536)
                except trio.Cancelled:
                    if on_cancel is not None:
                        on_cancel()
                    handing_back = True
                    raise
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                    # After ``_interrupt_reading_caller`` the stream is fine and the session
                    # has ended: the reader task finishes that as its own receive would.
                    if not (self._interrupted and isinstance(error, trio.ClosedResourceError)):
                        self._handback = error
                    handing_back = True
                    return
                if not data:
                    self._handback = data  # end of file: the reader task ends the connection
                    handing_back = True
                    return
                self.bytes_received += len(data)
                decoder.feed(data)
                if not self._deliver_read_for_caller():
                    handing_back = True
                    return
        finally:
            self._caller_reading = False
            self._interrupted = False
            if handing_back or not result.done or not self._may_stand_by():
                # (Other callers wait for Returns we did not read, or the connection now
                # exports something or drains: the reader's job.)
                self._wake_standby()
            elif self._standby_task is not None:
                flusher.offers[self] = flusher.passes  # a next call of ours may read again

    def _deliver_read_for_caller(self) -> bool:
        """Deliver the whole messages a caller read; False when the reader task must take
        over: the session ended, flow control holds delivery, a framing error, or more
        messages than one pass delivers (the reader's yields keep the peers working at
        once)."""
        session = self.session
        decoder = self._decoder
        delivered = 0
        exports = session.exports.entries
        try:
            while delivered < self.messages_per_pass and not session.flow_blocked:
                if exports:
                    # Another task passed a capability while we read: the peer's calls to
                    # it must not run in this caller's task (module docstring).
                    break
                segments = decoder.next_message()
                if segments is None:
                    self._note_input(delivered > 0)
                    return session.closed is None
                delivered += 1
                session.receive(segments)
                if session.closed is not None:
                    break
        except FramingError as error:
            session.abort(str(error))
        self._note_input(delivered > 0)
        return False

    # ------------------------------------------------------------------ limits
    def _flow_released(self) -> None:
        """The engine: calls in flight are back within the budget (or the session ended)."""
        self._flow.set()

    async def _wait_flow(self) -> None:
        """Deliver and read nothing until the peer's calls in flight drain, or a question
        of ours goes out (flow control: RpcSession.flow_blocked)."""
        self.flow_pauses += 1
        self._reading_paused = True
        self.session.flow_waiting = True
        try:
            while self.session.flow_blocked and self.session.closed is None:
                self._flow = trio.Event()
                await self._flow.wait()
        finally:
            self._resume_reading()
            self.session.flow_waiting = False

    def _resume_reading(self) -> None:
        self._reading_paused = False
        if self._frame_started is not None:
            # The time we did not read is ours, not the peer's: its message's clock restarts.
            self._frame_started = trio.current_time()

    def _note_input(self, delivered: bool) -> None:
        """After a read: what the watchdog needs (a clock read only where a timeout wants it)."""
        if delivered:
            self._first_message_seen = True
        if self._track_idle:
            self._last_input = trio.current_time()
        if not self._decoder.buffered:
            self._frame_started = None
        elif delivered or self._frame_started is None:
            self._frame_started = trio.current_time()  # a new message has begun

    def _timeouts_apply(self) -> bool:
        limits = self.limits
        return (
            (self.served and limits.first_message_timeout is not None)
            or limits.frame_timeout is not None
            or limits.idle_timeout is not None
            or limits.send_timeout is not None
        )

    def _expired(self, now: float) -> tuple[str | None, float]:
        """The timeout that has expired (its Abort reason), or None and the next deadline."""
        limits = self.limits
        session = self.session
        deadline = float("inf")
        first = limits.first_message_timeout
        if self.served and first is not None and not self._first_message_seen:
            if now >= self._started + first:
                return f"no message within {first:g} s (Limits.first_message_timeout)", now
            deadline = min(deadline, self._started + first)
        frame = limits.frame_timeout
        if frame is not None and self._frame_started is not None and not self._reading_paused:
            if now >= self._frame_started + frame:
                return (
                    f"a message was not completed within {frame:g} s of its first byte "
                    "(Limits.frame_timeout)",
                    now,
                )
            deadline = min(deadline, self._frame_started + frame)
        send = limits.send_timeout
        if send is not None:
            # Writes are counted, not timed: no clock read per write. Output that waits
            # while the count stands still has made no progress since ``_output_since``.
            # Counted from the first check that saw it waiting: never early, late by at
            # most the watchdog's tick.
            pending = bool(self.outbox.pending_bytes) or self._writing
            if not pending:
                self._output_since = -1.0
            elif self._output_since < 0 or self.writes != self._writes_seen:
                self._writes_seen = self.writes
                self._output_since = now
                deadline = min(deadline, now + send)
            elif now >= self._output_since + send:
                return (
                    f"our output waited {send:g} s and no write completed (Limits.send_timeout)",
                    now,
                )
            else:
                deadline = min(deadline, self._output_since + send)
        idle = limits.idle_timeout
        if (
            idle is not None
            and session.answers.in_flight == 0
            and not session.questions.awaiting_return()
        ):
            if now >= self._last_input + idle:
                return f"idle for {idle:g} s (Limits.idle_timeout)", now
            deadline = min(deadline, self._last_input + idle)
        return None, deadline

    async def _watchdog(self, scope: trio.CancelScope) -> None:
        """Abort the connection when a timeout of ``Limits`` expires (module docstring)."""
        limits = self.limits
        timeouts = [
            t
            for t in (
                limits.first_message_timeout if self.served else None,
                limits.frame_timeout,
                limits.idle_timeout,
                limits.send_timeout,
            )
            if t is not None
        ]
        tick = min(timeouts) / 4
        while True:
            now = trio.current_time()
            reason, deadline = self._expired(now)
            if reason is not None:
                break
            await trio.sleep_until(min(deadline, now + tick))
        assert reason is not None
        # An idle connection is let go (disconnected); a stalled one broke a rule (failed).
        idle = reason.endswith("(Limits.idle_timeout)")
        self.session.abort(reason, ExceptionType.DISCONNECTED if idle else ExceptionType.FAILED)
        self._interrupt_reading_caller()
        with trio.move_on_after(5):
            await self._wait_output_written()
        self.close_reason = self.session.closed
        scope.cancel()

    async def _linger_after_abort(self) -> None:
        """We aborted the peer: let it read the Abort before we close (a lingering close).

        Half-close our side (the peer reads the Abort, then EOF), then read and discard
        input until the peer's EOF, ``ABORT_LINGER_BYTES`` or ``ABORT_LINGER_SECONDS``,
        whichever comes first, so that the close that follows finds no unread input and
        sends a FIN rather than a reset. Nothing is kept, so memory stays bounded; a stream
        that cannot half-close is closed at once (the peer would see no EOF before the
        close anyway), and so is one whose Abort is still unwritten after the writer's
        bound (a peer that does not read has nothing to protect).
        """
        stream = self.stream
        if not isinstance(stream, trio.abc.HalfCloseableStream):
            return
        if self._writing or self.outbox.pending_bytes:
            return
        if isinstance(stream, BusyPollingStream):
            stream.busy_poll = None  # input we discard is not worth spinning a CPU for
        with trio.move_on_after(ABORT_LINGER_SECONDS):
            try:
                await stream.send_eof()
                discarded = 0
                while discarded < ABORT_LINGER_BYTES:
                    data = await stream.receive_some(_LINGER_READ)
                    if not data:
                        return  # the peer closed: it has read all it wanted
                    discarded += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return  # gone already (or closed under us by aclose): nothing to wait for

    # ------------------------------------------------------------------ writing
    def _on_output(self) -> None:
        """The engine's outbox just became non-empty (or got its first urgent message)."""
        if self._hold_housekeeping:
            if not self.outbox.urgent:
                self._wake_writer()  # it holds the housekeeping back, then writes it
                return
            self._urgent_output.set()
        if self._flusher is not None and not self._writing:
            self._flusher.dirty[self] = None
        else:
            self._wake_writer()

    def _wake_writer(self) -> None:
        if self._writer_parked and self._writer_task is not None:
            self._writer_parked = False
            trio.lowlevel.reschedule(self._writer_task)

    def flush_at_end_of_pass(self) -> None:
        """Called by the flusher once per pass: one non-blocking send of the whole batch."""
        outbox = self.outbox
        if self._writing or self._closed.is_set() or not outbox.pending_bytes:
            return
        if self._hold_housekeeping and not outbox.urgent:
            return
        batch = outbox.take()
        data = b"".join(batch) if len(batch) > 1 else batch[0]
        self.writes += 1
        try:
            sent = self._send_from_flusher(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError):
            sent = 0  # the writer task will meet the error again and close properly
        self.bytes_sent += sent
        if sent < len(data):
            self._remainder = data[sent:]
            self._writing = True
            self._token.run_sync_soon(self._wake_writer)
        elif self._drained.statistics().tasks_waiting:
            self._token.run_sync_soon(self._signal_drained)

    def _signal_drained(self) -> None:
        self._drained.set()
        self._drained = trio.Event()

    async def _writer(self) -> None:
        self._writer_task = trio.lowlevel.current_task()
        outbox = self.outbox
        stream = self.stream
        send_all = self._send_all
        while True:
            if not outbox.pending_bytes and not self._remainder:
                self._writer_parked = True
                await trio.lowlevel.wait_task_rescheduled(self._abort_park)
            if (
                self._hold_housekeeping
                and not self._remainder
                and not outbox.urgent
                and outbox.pending_bytes
            ):
                self._urgent_output = trio.Event()
                with trio.move_on_after(HOLD_HOUSEKEEPING):
                    await self._urgent_output.wait()
            # We were woken by the first message of a scheduler pass; by the time we run
            # (the next pass) every task of that pass has added its messages: one write.
            remainder, self._remainder = self._remainder, b""
            batch = [remainder] if remainder else outbox.take()
            if not batch:
                continue
            self._writing = True
            try:
                if remainder:
                    self.bytes_sent += len(remainder)
                    await send_all(remainder)
                elif self.coalesce:
                    data = b"".join(batch) if len(batch) > 1 else batch[0]
                    self.writes += 1
                    self.bytes_sent += len(data)
                    await send_all(data)
                else:
                    for frame in batch:
                        self.writes += 1
                        self.bytes_sent += len(frame)
                        await send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                self.close_reason = self.session.closed or Disconnected(
                    f"connection lost while writing: {error!r}"
                )
                self._shutdown(self.close_reason)
                # Nothing will be written any more: whoever waits for output to be
                # written (the reader, before it closes) must not wait for this.
                self._writer_gone = True
                self._signal_drained()
                await trio.aclose_forcefully(stream)
                return
            finally:
                self._writing = False
            self._signal_drained()

    def _abort_park(self, _: Any) -> trio.lowlevel.Abort:
        self._writer_parked = False
        return trio.lowlevel.Abort.SUCCEEDED

    async def _wait_drained(self) -> None:
        await self._drained.wait()

    @property
    def over_limit(self) -> bool:
        """True while the output buffer holds more than ``max_buffered`` bytes."""
        return self.outbox.pending_bytes > self.max_buffered

    async def wait_writable(self) -> None:
        """Return once the output buffer is within ``max_buffered`` (or the connection ends)."""
        while self.outbox.pending_bytes > self.max_buffered and not self._closed.is_set():
            await self._drained.wait()

    async def _wait_output_written(self) -> None:
        """Wait until the writer has written everything the engine queued so far."""
        # (Not "until the writer task exists": the reader may abort in its very first pass,
        # before the writer task has run, and that Abort must be written before we linger.)
        while (self.outbox.pending_bytes or self._writing) and self._running:
            if self._writer_gone:
                break
            if self.close_reason is not None and not self._writing and self._writer_parked:
                break
            await self._drained.wait()

    # ------------------------------------------------------------------ API
    @overload
    def bootstrap(self, interface: type[Interface[TypedClientT]]) -> TypedClientT: ...
    @overload
    def bootstrap(self, interface: Any) -> Any: ...

    def bootstrap(self, interface: Any) -> Any:
        """The peer's bootstrap capability typed as ``interface`` (usable at once): a
        generated interface (``capsvc gen``) gives its typed ``Client``, a schema loaded
        with ``capsvc.load_schema`` a dynamic ``capsvc.Client``."""
        from capsvc.client import Client
        from capsvc.typed import Client as TypedClient

        typed = getattr(interface, "Client", None)
        if isinstance(typed, type) and issubclass(typed, TypedClient):
            return typed(self.session.bootstrap())
        return Client(self.session.bootstrap(), interface)
