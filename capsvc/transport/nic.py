"""The ``nic`` transport: trio streams over the user-space 82599 driver (or its model).

Theory of operation
-------------------
Address grammar (what follows ``nic:``)::

    nic:DEVICE[,OPTION...]
    DEVICE := model:NAME          a software model port (``capsvc nic start-pair NAME``
                                  creates NAME.0 and NAME.1, wired back to back)
            | dddd:bb:dd.f        a real 82599/X540 by PCI address (``bb:dd.f`` = domain 0)
    OPTION := peer=MAC            connect: send the SYN to MAC rather than to broadcast
            | sysfs=DIR           PCI devices: sysfs root (default /sys)
            | rundir=DIR          model ports: where they live (default $CAPSVC_NIC_RUNDIR,
                                  else /dev/shm/capsvc-nic)
            | link_timeout=SECS   how long opening the device waits for the link (default
                                  10 s, the driver's); 0 opens without waiting, and
                                  frames then wait in the TX ring until the link is up

How two processes find each other on a model pair: each process opens *its own* port of
the pair, e.g. the server ``nic:model:demo.0`` and the client ``nic:model:demo.1``. A device
has one driver, so one process per port. The client's SYN goes to the Ethernet broadcast
address (the pair is a point-to-point cable, so only the peer port hears it); the listening
side answers from its MAC and the connection continues unicast. On real hardware it is the
same with a cable between two ports (or ``peer=MAC`` on a switched network).

Per opened device, one :class:`NicPort` lives in this process (shared by its listener and
all its connections, closed two seconds after the last one is gone): the
:class:`~capsvc.nicdriver.ixgbe.IxgbeDevice` (initialised in a worker thread, since the init
sequence blocks for tens of milliseconds), a :class:`~capsvc.nicdriver.mux.StreamMux` (the
reliable protocol, no I/O) and the *poll loop*, a trio system task. A pass of the loop
receives up to 64 frames, feeds them to the mux, runs its timers, transmits what it
produced and wakes the tasks whose channel changed. The loop is cooperative:

- on hardware (no interrupts without VFIO) it yields once after work, spins 20 passes
  when idle, then sleeps with exponential back-off up to 1 ms;
- on a model port it sleeps on the model's wake-up FIFO (the model pokes it after an RX
  write-back), for up to 50 ms, right after its work (the sleep yields to the woken tasks
  and returns at once if more frames are waiting);

and never past the mux's next timer, so an idle connection costs no CPU. The loop keeps one
cancel scope across many passes and moves its deadline only when a timer comes due
earlier (a scope per sleep cost as much as the rest of an idle pass); ``kick`` cancels it.
While traffic flows (for 100 ms after the last frame) it wakes at least every ``min_rto``,
so a send, whose retransmission timer is at least ``min_rto`` away, never needs to kick
it. Senders transmit directly from ``send_all`` (no scheduler round trip) and kick the
loop only when they created a timer earlier than its wake-up. The port's register
accessor runs in *deferred* mode: a TX doorbell only stores the tail, and a trio
instrument pokes the model in ``before_io_wait``, once this scheduler pass's tasks are done
(waking the model while we still run would make the two processes compete for one CPU).
With a co-located model (``capsvc nic start-pair NAME --wire colocated``) the port's model
runs in this process: the poll loop lets it receive (``bar.service()``) and sleeps on its
wire socket, and the deferred TX engine runs in the same ``before_io_wait`` hook.

Request/response traffic moves one frame at a time, so the single-frame cases have
scalar fast paths all the way down: a small write becomes a segment without passing
through the send buffer (:meth:`~capsvc.nicdriver.stream.Channel.send`), one TX
descriptor is written without column copies (:meth:`~capsvc.nicdriver.rings.TxQueue.tx_one`),
and a lone received frame is taken the same way.

capsvc's :class:`~capsvc.connection.Connection` writes a connection's output at the end of
each scheduler pass, from trio's ``before_io_wait``, through ``stream.send_from_flusher``
(the end-of-pass flusher, :mod:`capsvc.flusher`), when the stream is a
:class:`~capsvc.transport.capabilities.FlusherSendStream`; otherwise a writer task does it
a pass later. :meth:`NicStream.send_from_flusher` is that non-blocking send, so RPC over
``nic:`` saves that pass on each side as TCP does. Code that runs in
``before_io_wait`` must not reschedule tasks (trio has already chosen how long to sleep):
the transmit path never does, and wake-ups it needs go through ``run_sync_soon``. The
Connection also gives each :class:`~capsvc.transport.capabilities.BusyPollingStream` its
adaptive busy-polling policy (:mod:`capsvc.transport.busypoll`, the same as TCP's): a
reader that finds no data then polls the device for a while (zero-timeout scheduler
passes, each running one pass of the port's work from the reader's task,
:meth:`NicPort.poll_now`) instead of sleeping until the poll loop wakes it, when replies
have been coming within the budget (at least :data:`MIN_BUSY_POLL`, since a round trip
over ``nic:`` takes longer than TCP's). A hit also saves the poll loop's hand-off: the
reader gets its bytes in its own pass.

:class:`NicStream` is a :class:`trio.abc.HalfCloseableStream` (it passes
``trio.testing.check_half_closeable_stream``) and a
:class:`~capsvc.transport.capabilities.FastPathStream`: ``send_all_fast`` and
``receive_some_fast`` are the variants capsvc's Connection uses (they skip the extra
scheduler pass when they do not block). It has no OS socket (it is no
``SocketBackedStream``), so the Connection does no Nagle handling for it. Errors: a broken
connection raises ``trio.BrokenResourceError`` with the protocol's reason; opening a device
that is missing raises the driver's :class:`~capsvc.nicdriver.errors.NicError` (an
``OSError``) saying what is missing.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable
from pathlib import Path
from typing import final

import trio

from capsvc.nicdriver.address import NicSpec, parse_nic_spec
from capsvc.nicdriver.errors import NicError
from capsvc.nicdriver.ixgbe import IxgbeDevice
from capsvc.nicdriver.modelhost import MODEL_PCI_ADDRESS, find_port
from capsvc.nicdriver.mux import StreamMux
from capsvc.nicdriver.stream import BROADCAST, Channel, StreamConfig
from capsvc.transport import busypoll
from capsvc.transport.busypoll import BusyPoll
from capsvc.transport.capabilities import BusyPollingStream, FastPathStream, FlusherSendStream

__all__ = [
    "NicListener",
    "NicPort",
    "NicSpec",
    "NicStream",
    "connect_nic",
    "listen_nic",
    "parse_nic_spec",
]

log = logging.getLogger("capsvc.nic")

RX_BATCH = 64
SPIN_PASSES = 20  # hardware only: passes before the first back-off sleep
MIN_SLEEP_HW = 0.0001
MAX_SLEEP_HW = 0.001
MAX_SLEEP_MODEL = 0.05
BUSY_WINDOW = 0.1  # seconds after the last frame during which the loop wakes every min_rto
IDLE_GRACE = 2.0  # keep an unused port open this long (re-opening resets the device)
BACKLOG_LIMIT = 4096
RECEIVE_DEFAULT = 65536
# The least busy-poll budget of a nic: stream (see NicStream.busy_poll): a small call's
# round trip takes ~250-300 µs here against TCP's ~150 µs, beyond TCP's 200 µs budget
MIN_BUSY_POLL = 500e-6


# ----------------------------------------------------------------------------- port
_PORTS: dict[tuple[str, str], NicPort] = {}
_OPENING: dict[tuple[str, str], trio.Event] = {}


class _FlushBeforeWait(trio.abc.Instrument):
    """Runs a port's deferred doorbell wake-ups when trio is about to poll for I/O, i.e.
    after the tasks of this scheduler pass have finished their work (so the process we
    wake does not have to share our CPU with the rest of our work)."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self.flush = flush

    def before_io_wait(self, timeout: float) -> None:
        self.flush()


def _open_device(spec: NicSpec) -> IxgbeDevice:
    """Open and initialise the device (blocking; runs in a worker thread)."""
    if spec.is_model:
        port = find_port(spec.device[6:], Path(spec.rundir) if spec.rundir else None)
        device = IxgbeDevice.open(MODEL_PCI_ADDRESS, sysfs_root=port.sysfs_root)
    else:
        device = IxgbeDevice.open(spec.device, sysfs_root=spec.sysfs or "/sys")
    try:
        if spec.link_timeout is None:
            device.reset_and_init()
        else:
            device.reset_and_init(link_timeout=spec.link_timeout)
    except BaseException:
        device.close()
        raise
    return device


class NicPort:
    """One device opened by this process, its protocol mux and its poll loop."""

    def __init__(self, spec: NicSpec, device: IxgbeDevice, config: StreamConfig) -> None:
        self.spec = spec
        self.device = device
        self.mux = StreamMux(device.mac, config)
        self.users = 0  # listeners and operations in progress
        self.listener: NicListener | None = None
        self.lot = trio.lowlevel.ParkingLot()  # every waiter of this port parks here
        self.closed = False
        self.error: BaseException | None = None
        self.frames_out = 0
        self.frames_dropped = 0
        self._rxq = device.rx_queues[0]
        self._txq = device.tx_queues[0]
        self._pool = self._rxq.pool
        self._backlog: list[bytes] = []
        self._idle_scope: trio.CancelScope | None = None
        self._sleep_until = 0.0
        self._idle_since: float | None = None
        self._idle_passes = 0
        self._last_work = 0.0
        self._backoff = MIN_SLEEP_HW
        fd = device.idle_fd()
        self._fd = -1 if fd is None else fd
        self._has_fd = fd is not None
        self._service = device.bar.service
        self._device_deadline = device.bar.next_deadline
        device.bar.deferred = True
        self._instrument = _FlushBeforeWait(self.flush_device)

    # ------------------------------------------------------------------ lifetime
    @classmethod
    async def acquire(cls, spec: NicSpec, config: StreamConfig | None = None) -> NicPort:
        """The port for ``spec`` in this process (opened and initialised on first use)."""
        key = spec.key()
        while (opening := _OPENING.get(key)) is not None:
            await opening.wait()  # another task is opening this device: share its port
        port = _PORTS.get(key)
        if port is not None and not port.closed:
            port.users += 1
            return port
        _OPENING[key] = done = trio.Event()
        try:
            device = await trio.to_thread.run_sync(_open_device, spec)
        except NicError:
            raise
        except OSError as error:
            raise NicError(f"cannot open nic:{spec.device}: {error}") from error
        finally:
            del _OPENING[key]
            done.set()
        port = cls(spec, device, config or StreamConfig())
        port.users += 1
        _PORTS[key] = port
        trio.lowlevel.add_instrument(port._instrument)
        trio.lowlevel.spawn_system_task(port._run, name=f"nic poll {spec.device}")
        return port

    def release(self) -> None:
        self.users -= 1
        self.kick()

    @property
    def idle(self) -> bool:
        return self.users <= 0 and not self.mux.channels and not self.mux.connecting

    def now(self) -> float:
        return time.monotonic()

    # ------------------------------------------------------------------ poll loop
    async def _run(self) -> None:
        try:
            await self._loop()
        except trio.Cancelled:
            raise
        except BaseException as error:  # a system task must not crash the run
            log.exception("nic poll loop for %s failed", self.spec.device)
            self.error = error
        finally:
            self._shutdown()

    async def _loop(self) -> None:
        # One cancel scope serves many passes: its deadline is the wake-up timer (moved
        # only when a timer comes due earlier, see _arm), and kick() cancels it. A fresh
        # scope per sleep (move_on_after) cost as much as the rest of an idle pass.
        while not await self._passes():
            pass

    async def _passes(self) -> bool:
        """Poll until the port is idle long enough (True) or the scope fires (False)."""
        with trio.CancelScope() as scope:
            self._idle_scope = scope
            try:
                while True:
                    now = time.monotonic()
                    worked = self._pass(now)
                    if self._wait_done(worked, now):
                        return True
                    if worked and not self._has_fd:
                        await trio.lowlevel.checkpoint()  # hardware: poll again next pass
                        continue
                    if not worked and self._idle_passes < SPIN_PASSES and not self._has_fd:
                        await trio.lowlevel.checkpoint()
                        continue
                    self._arm(scope, now)
                    await self._wait()
            finally:
                self._idle_scope = None
        return False

    def _pass(self, now: float) -> bool:
        """One round of work: device, RX, timers, TX, wake-ups; True if frames moved."""
        self._service()  # a co-located model runs here (no-op otherwise)
        bufs, lens = self._rxq.rx_batch(RX_BATCH)
        mux = self.mux
        if bufs:
            pool = self._pool
            mem = pool.mem
            offset = pool.offset
            receive_frame = mux.receive_frame
            for buf, length in zip(bufs, lens, strict=True):
                start = offset(buf)
                receive_frame(bytes(mem[start : start + length]), now)
            pool.free_batch(bufs)
        deadline = mux.next_deadline()
        if deadline is not None and now >= deadline:
            mux.poll(now)
        sent = self.flush()
        if mux.changed:
            mux.changed.clear()
            self.lot.unpark_all()
        return bool(bufs) or sent > 0

    def _wait_done(self, worked: bool, now: float) -> bool:
        """Idle bookkeeping; True once an unused port has been idle for IDLE_GRACE."""
        if worked:
            self._last_work = now
            self._idle_since = None
            self._backoff = MIN_SLEEP_HW
            self._idle_passes = 0
            return False
        self._idle_passes += 1
        if self.idle:
            if self._idle_since is None:
                self._idle_since = now
            elif now - self._idle_since > IDLE_GRACE:
                return True
        return False

    def _arm(self, scope: trio.CancelScope, now: float) -> None:
        """Set the scope's deadline for the coming wait: the next timer, bounded by the
        poll interval. A deadline left earlier than needed stays (one spurious wake-up
        is cheaper than moving trio's deadline on every frame)."""
        if self._has_fd:  # the model pokes us: no need to poll more often
            wake = now + MAX_SLEEP_MODEL
        else:  # hardware: poll with exponential back-off up to 1 ms
            wake = now + self._backoff
            self._backoff = min(self._backoff * 2, MAX_SLEEP_HW)
        if now - self._last_work < BUSY_WINDOW:
            # while traffic flows, wake at least every min_rto: a send then never creates
            # a timer earlier than our wake-up (an RTO is >= min_rto away), so senders need
            # not kick us (a kick costs this loop a scheduler pass and a new cancel scope)
            wake = min(wake, now + self.mux.config.min_rto)
        for deadline in (self.mux.next_deadline(), self._device_deadline()):
            if deadline is not None and deadline < wake:
                wake = deadline
        if self.idle and self._idle_since is not None:
            wake = min(wake, self._idle_since + IDLE_GRACE + 0.001)
        # trio's clock counts from another origin: convert through the offset
        offset = trio.current_time() - now
        current = scope.deadline - offset
        if wake < current:
            scope.deadline = wake + offset
            current = wake
        self._sleep_until = current

    async def _wait(self) -> None:
        """Sleep until the scope fires, or (model ports) the model pokes us."""
        if not self._has_fd:
            await trio.sleep_forever()
            return
        bar = self.device.bar
        bar.begin_idle()
        poked = False
        try:
            if not self._rxq.pending():  # an RX write-back may have raced the flag
                await trio.lowlevel.wait_readable(self._fd)
                poked = True
        finally:
            bar.end_idle(drain=poked)

    def poll_now(self) -> None:
        """One pass of the poll loop's work, from the calling task (a busy-polling reader):
        the loop itself may be asleep; the pass is synchronous, so the two never overlap."""
        if not self.closed:
            now = time.monotonic()
            if self._pass(now):
                self._last_work = now  # traffic flows (see _arm), even if the loop sleeps
            if self._rxq.pending():
                # more than a batch came: the loop sleeps on a socket or FIFO that may no
                # longer say so (this pass drained it), so it must look itself
                self.kick()

    def flush_device(self) -> None:
        """The deferred doorbell work (runs in trio's ``before_io_wait``): wake the model,
        or run a co-located model's TX engine. That can leave the device with timed work
        (a co-located wire keeps frames the peer's full queue refused, to retry shortly),
        due before the poll loop's wake-up, which trio has already chosen: then the loop
        is woken through ``run_sync_soon`` (it interrupts trio's sleep)."""
        if self.closed:
            return
        self.device.bar.flush_wakeups()
        deadline = self._device_deadline()
        if deadline is not None and deadline < self._sleep_until and self._idle_scope is not None:
            trio.lowlevel.current_trio_token().run_sync_soon(self.kick)

    def kick(self) -> None:
        """Wake the poll loop (new timers, new work, shutdown checks)."""
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    def kick_for(self, channel: Channel, *, from_hook: bool = False) -> None:
        """Wake the poll loop only if ``channel`` now has a timer before its wake-up.

        ``from_hook``: called from trio's ``before_io_wait``, where trio has already chosen
        how long to sleep; the wake-up then goes through ``run_sync_soon``, which
        interrupts that sleep.
        """
        if self._idle_scope is not None:
            deadline = channel.next_deadline()
            if deadline is not None and deadline < self._sleep_until:
                if from_hook:
                    trio.lowlevel.current_trio_token().run_sync_soon(self.kick)
                else:
                    self._idle_scope.cancel()

    def flush(self) -> int:
        """Transmit what the mux produced (and earlier leftovers); returns frames sent."""
        frames = self.mux.take_output()
        if self._backlog:
            frames = self._backlog + frames
            self._backlog = []
        if not frames:
            if self._txq.in_flight:
                self._txq.clean()
            return 0
        if len(frames) == 1:
            sent = self._send_one(frames[0])
            if sent:
                return sent
        pool = self._pool
        mem = pool.mem
        offset = pool.offset
        bufs = pool.alloc_batch(len(frames))
        lens = []
        for buf, frame in zip(bufs, frames, strict=False):
            start = offset(buf)
            mem[start : start + len(frame)] = frame
            lens.append(len(frame))
        # the doorbell is deferred (no model runs inside it), and flush() may run in trio's
        # before_io_wait (NicStream.send_from_flusher): nothing here may reschedule a task
        sent = self._txq.tx_batch(bufs, lens) if bufs else 0
        if sent < len(bufs):
            pool.free_batch(bufs[sent:])
        if sent < len(frames):
            left = frames[sent:]
            if len(left) > BACKLOG_LIMIT:  # the protocol retransmits what is dropped here
                self.frames_dropped += len(left) - BACKLOG_LIMIT
                left = left[-BACKLOG_LIMIT:]
            self._backlog = left
        self.frames_out += sent
        return sent

    def _send_one(self, frame: bytes) -> int:
        """One frame, nothing held back (request/response traffic): scalar ring work.
        Returns 0 (nothing taken) when the pool or the ring is full."""
        pool = self._pool
        buf = pool.alloc()
        if buf < 0:
            return 0
        start = pool.offset(buf)
        pool.mem[start : start + len(frame)] = frame
        if not self._txq.tx_one(buf, len(frame)):
            pool.free(buf)
            return 0
        self.frames_out += 1
        return 1

    def _shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        if _PORTS.get(self.spec.key()) is self:
            del _PORTS[self.spec.key()]
        reason = f"the NIC port {self.spec.device} was shut down"
        for channel in (*self.mux.channels.values(), *self.mux.connecting.values()):
            channel._break(reason)
        self.lot.unpark_all()
        try:
            trio.lowlevel.remove_instrument(self._instrument)
        except (KeyError, ValueError, RuntimeError):
            pass
        try:
            self.device.close()
        except Exception:  # pragma: no cover (best effort on the way out)
            log.exception("closing %s", self.spec.device)

    def check_open(self) -> None:
        if self.closed:
            raise trio.BrokenResourceError(
                f"the NIC port {self.spec.device} is closed"
                + (f" ({self.error!r})" if self.error else "")
            )


# ----------------------------------------------------------------------------- stream
@final
class NicStream(trio.abc.HalfCloseableStream, FastPathStream, FlusherSendStream, BusyPollingStream):
    """One reliable connection over a NIC port, as a trio stream."""

    def __init__(self, port: NicPort, channel: Channel) -> None:
        self.port = port
        self.channel = channel
        self._closed = False
        self._sending = False
        self._receiving = False
        self._poll_policy: BusyPoll | None = None

    @property
    def peer_mac(self) -> bytes:
        return self.channel.peer

    @property
    def busy_poll(self) -> BusyPoll | None:
        """Adaptive busy polling of receives (:mod:`capsvc.transport.busypoll`), the same
        policy as TCP's; capsvc's Connection sets it. None: sleep until the poll loop
        wakes us. A budget below :data:`MIN_BUSY_POLL` is raised to it: a round trip over
        ``nic:`` takes longer than one over TCP (the frame path runs in Python on both
        sides), so TCP's budget would give up just before the reply comes."""
        return self._poll_policy

    @busy_poll.setter
    def busy_poll(self, policy: BusyPoll | None) -> None:
        if policy is not None and policy.budget < MIN_BUSY_POLL:
            policy.budget = MIN_BUSY_POLL
        self._poll_policy = policy

    def send_from_flusher(self, data: bytes | bytearray | memoryview) -> int:
        """Send what fits without blocking (0 if nothing does), from trio's
        ``before_io_wait``: capsvc's end-of-pass flusher (:mod:`capsvc.flusher`) writes a
        connection's output through this, so RPC over ``nic:`` saves the writer task's
        scheduler pass per batch as TCP does. The transmit doorbell it rings is deferred
        like every other (the port's own ``before_io_wait`` hook does the wake-up); since
        this may run after that hook, the wake-up work is done here at once."""
        sent = self.send_nowait(data, from_hook=True)
        if sent:
            self.port.flush_device()
        return sent

    def send_nowait(self, data: bytes | bytearray | memoryview, *, from_hook: bool = False) -> int:
        """Queue what fits of ``data`` and transmit it now, without blocking; returns the
        byte count (0 when the send buffer is full). Raises ``trio.ClosedResourceError`` or
        ``trio.BrokenResourceError`` like :meth:`send_all`. ``from_hook``: the caller runs
        in trio's ``before_io_wait`` (see :meth:`NicPort.kick_for`)."""
        if self._closed or self.channel.fin_queued:
            raise trio.ClosedResourceError("the stream is closed for sending")
        channel = self.channel
        if channel.send_error is not None:
            raise trio.BrokenResourceError(channel.send_error)
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        port = self.port
        sent = channel.send(data, port.now())
        if sent:
            port.flush()
            port.kick_for(channel, from_hook=from_hook)
        return sent

    # ------------------------------------------------------------------ sending
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.send_all_fast(data)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def send_all_fast(self, data: bytes | bytearray | memoryview) -> None:
        """``send_all`` that yields only when it has to wait for window or buffer."""
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        if self._closed or self.channel.fin_queued:
            raise trio.ClosedResourceError("the stream is closed for sending")
        await trio.lowlevel.checkpoint_if_cancelled()
        self._sending = True
        try:
            port = self.port
            channel = self.channel
            with memoryview(data) as view:
                total = len(view)
                sent = 0
                while True:
                    if channel.send_error is not None:
                        raise trio.BrokenResourceError(channel.send_error)
                    if sent < total:
                        sent += channel.send(view[sent:], port.now())
                        port.flush()
                        port.kick_for(channel)
                    if sent >= total:
                        return
                    await self._park()
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        self._sending = True
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            while not self.channel.writable and not self._closed:
                await self._park()
            if self._closed:
                raise trio.ClosedResourceError("the stream was closed")
        finally:
            self._sending = False
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def send_eof(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        await trio.lowlevel.checkpoint()
        self.channel.send_eof(self.port.now())
        self.port.flush()
        self.port.kick()

    # ------------------------------------------------------------------ receiving
    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.receive_some_fast(max_bytes)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return data

    async def receive_some_fast(self, max_bytes: int | None = None) -> bytes:
        """``receive_some`` that yields only when it has to wait for data."""
        if max_bytes is None:
            max_bytes = RECEIVE_DEFAULT
        else:
            max_bytes = operator.index(max_bytes)
            if max_bytes < 1:
                raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this stream")
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        await trio.lowlevel.checkpoint_if_cancelled()
        self._receiving = True
        try:
            channel = self.channel
            port = self.port
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("the stream was closed")
                if channel.rcv_buf:
                    data = channel.receive(max_bytes, port.now())
                    port.flush()  # a window update may be due
                    return data
                if channel.eof:
                    return b""
                if channel.recv_error is not None:
                    raise trio.BrokenResourceError(channel.recv_error)
                policy = self._poll_policy
                if policy is None or not await self._busy_poll(policy):
                    await self._park()
        finally:
            self._receiving = False

    async def _busy_poll(self, poll: BusyPoll) -> bool:
        """Poll the device for our data a while instead of sleeping, when it pays (the
        policy and its budget are :mod:`capsvc.transport.busypoll`'s, as for TCP): each
        poll is one zero-timeout scheduler pass plus one pass of the port's work (a
        poll-mode driver's RX check; ixy never sleeps at all), with a ``sched_yield`` so
        that a process waiting for this CPU gets it. True if the channel became readable."""
        if not poll.should_poll():
            return False
        channel = self.channel
        port = self.port
        deadline = busypoll.now() + poll.budget
        while True:
            await trio.lowlevel.checkpoint()
            if port.closed:
                return False
            if not channel.readable:
                port.poll_now()
            if channel.readable:
                poll.polled(found=True)
                return True
            if busypoll.now() >= deadline or not poll.yield_cpu():
                poll.polled(found=False)  # out of budget, or the CPUs are contended
                return False

    # ------------------------------------------------------------------ closing
    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.channel.close(self.port.now())
            if not self.port.closed:
                self.port.flush()
            self.port.kick()
            self.port.lot.unpark_all()
        await trio.lowlevel.checkpoint()

    async def _park(self) -> None:
        if self.port.closed:  # the poll loop is gone: nothing will ever wake us
            self.channel._break(f"the NIC port {self.port.spec.device} was shut down")
            await trio.lowlevel.checkpoint()
            return
        await self.port.lot.park()

    def __repr__(self) -> str:
        return f"<NicStream {self.port.spec.device} {self.channel!r}>"


# ----------------------------------------------------------------------------- listener
@final
class NicListener(trio.abc.Listener[NicStream]):
    """Accepts connections arriving on a NIC port."""

    def __init__(self, port: NicPort, address: str) -> None:
        self.port = port
        self.address = address
        self._closed = False

    async def accept(self) -> NicStream:
        port = self.port
        mux = port.mux
        while True:
            if self._closed:
                raise trio.ClosedResourceError("the listener is closed")
            port.check_open()
            while mux.accept_queue:
                channel = mux.accept_queue.popleft()
                if channel.recv_error is None:
                    await trio.lowlevel.checkpoint()
                    return NicStream(port, channel)
            await port.lot.park()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            port = self.port
            if port.listener is self:
                port.listener = None
                port.mux.stop_listening(port.now())
                if not port.closed:
                    port.flush()
            port.lot.unpark_all()
            port.release()
        await trio.lowlevel.checkpoint()

    def __repr__(self) -> str:
        return f"<NicListener {self.address}>"


# ----------------------------------------------------------------------------- API
async def connect_nic(spec: str | NicSpec, *, config: StreamConfig | None = None) -> NicStream:
    """Open a connection over the NIC named by ``spec`` (see the module docstring).

    Gives up after ``config.connect_timeout`` (5 s by default; or cancel it).

    Raises:
        NicError: the device cannot be opened or initialised (says what is missing).
        ConnectionRefusedError: the peer port has no listener.
        TimeoutError: nobody answered (no link, no peer process).
    """
    nic = spec if isinstance(spec, NicSpec) else parse_nic_spec(spec)
    port = await NicPort.acquire(nic, config)
    try:
        channel = port.mux.connect(port.now(), nic.peer or BROADCAST)
        port.flush()
        port.kick()
        try:
            while channel.state == "syn-sent":
                port.check_open()
                await port.lot.park()
        except BaseException:
            channel.close(port.now())
            raise
        if not channel.established:
            reason = channel.recv_error or "connection failed"
            if "refused" in reason:
                raise ConnectionRefusedError(f"nic:{nic.device}: {reason}")
            raise TimeoutError(f"nic:{nic.device}: {reason}")
        return NicStream(port, channel)
    finally:
        port.release()


async def listen_nic(
    spec: str | NicSpec, *, config: StreamConfig | None = None
) -> list[trio.abc.Listener[trio.abc.Stream]]:
    """Listen for connections on the NIC named by ``spec``; one listener per device.

    Raises:
        NicError: the device cannot be opened; OSError: this process already listens there.
    """
    nic = spec if isinstance(spec, NicSpec) else parse_nic_spec(spec)
    port = await NicPort.acquire(nic, config)
    if port.listener is not None:
        port.release()
        raise OSError(f"this process already listens on nic:{nic.device}")
    listener = NicListener(port, str(NicSpec(nic.device, None, nic.sysfs, nic.rundir)))
    port.listener = listener
    port.mux.listening = True
    return [listener]
