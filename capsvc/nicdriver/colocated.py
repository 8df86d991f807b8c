"""Co-located model mode: the port's model runs inside the driver's process, as a trap.

Theory of operation
-------------------
In the default mode (:mod:`capsvc.nicdriver.modelhost`) a model pair runs in a process of
its own, concurrently with the drivers, exactly as spec nicdriver.md 2.1 describes. Every
frame then crosses two process boundaries (driver -> model host -> peer driver), and each
crossing is a wake-up of a sleeping process; on a small machine those wake-ups, not the
Python work, dominate an RPC round trip.

This module provides a third mode beside the spec's thread and process modes: the port's
:class:`~capsvc.nicdriver.model.IxgbeModel` lives in the process that opened the port and is
run *synchronously by the register accessor*, like a trap handler. :class:`ColocatedBar`
(the accessor seam of spec 2.1, nothing else changes) steps the model after every register
write and doorbell and before every register read, so the driver's init waits, its link
poll and its TX doorbells see the device react at once (register reads and writes keep
:class:`~capsvc.nicdriver.mmio.ModelBar`'s device semantics: shared clear-on-read
counters, RXDCTL/TXDCTL.ENABLE as requests that the model latches; timed device work such
as the reset and the EEPROM auto-read advances when a read steps the model); the driver's
poll loop calls :meth:`ColocatedBar.service` before looking at the RX ring, and sleeps on
the wire's socket (:meth:`ColocatedBar.idle_fd`). The driver code (ixgbe.py, rings.py) is
the same. Since every register write already ran the model, ``service`` only needs its
receive half (:meth:`~capsvc.nicdriver.model.IxgbeModel.receive_pending`: the wire and its
timers).

The two ports of a co-located pair talk over :class:`DgramWire`: an ``AF_UNIX SOCK_DGRAM``
socket bound to ``<port>/wire.sock`` receives, and a second one *connected* to the peer
port's path sends (``sendto`` a path would look the path up for every frame; the receiving
socket stays unconnected so that a peer re-opened by another process is heard at once, and
the sender reconnects when its peer socket is gone). A frame thus costs one process
wake-up, like a TCP segment on loopback. An AF_UNIX datagram queue is
short (``net.unix.max_dgram_qlen``, 10 by default): when the peer's is full, the wire keeps
the frames in order and retries every 0.2 ms, like a NIC's transmit FIFO. Carrier is
always on (the cable is plugged); a frame sent while no process drives the peer port is
lost, as it would be on a powered NIC that nobody has initialised, and the stream protocol
retransmits. Fault injection (loss, duplication, reordering) wraps the wire as in the
other modes.

A TX doorbell of a port driven by the trio transport is *deferred*
(:attr:`~capsvc.nicdriver.mmio.Bar.deferred`): the model's TX engine runs in
:meth:`ColocatedBar.flush_wakeups`, which the transport calls when trio is about to wait
for I/O, so the peer process is woken after our own work for this pass is done.
"""

from __future__ import annotations

import errno
import mmap
import socket
import time
from collections import deque
from pathlib import Path

from capsvc.nicdriver.link import MAX_FRAME, Wire
from capsvc.nicdriver.mmio import Doorbell, ModelBar

__all__ = ["ColocatedBar", "DgramWire"]

# a send error meaning "nobody drives the peer port now": the frame is lost on the cable
_PEER_GONE = (errno.ENOENT, errno.ECONNREFUSED, errno.ENOBUFS)
RETRY = 0.0002  # seconds between attempts while the peer's datagram queue is full
BACKLOG_LIMIT = 4096


class DgramWire(Wire):
    """One end of a co-located pair's cable: datagrams between two port directories."""

    def __init__(self, own: Path, peer: Path) -> None:
        self.path = own / "wire.sock"
        self.peer = str(peer / "wire.sock")
        self.dropped = 0
        self._backlog: deque[bytes] = deque()
        self._retry_at = 0.0
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(str(self.path))
        # Frames leave through a second, unbound socket *connected* to the peer's path:
        # sendto(path) resolves the path on every frame. The bound socket stays
        # unconnected, so it accepts frames from whichever process drives the peer now.
        self._out: socket.socket | None = None

    def send(self, frame: bytes) -> None:
        backlog = self._backlog
        if backlog:
            if len(backlog) >= BACKLOG_LIMIT:
                self.dropped += 1
                return
            backlog.append(frame)
            self._flush()
            return
        try:
            self._send(frame)
        except (BlockingIOError, InterruptedError):
            backlog.append(frame)  # the peer's queue is full: keep order, retry soon
            self._retry_at = time.monotonic() + RETRY
        except OSError as error:  # nobody drives the peer port: the frame is lost
            if error.errno not in _PEER_GONE:
                raise
            self.dropped += 1

    def _send(self, frame: bytes) -> None:
        """Send on the connected socket; (re)connect when there is none or the peer's
        socket went away (a new process re-creates it: the old connection is refused)."""
        out = self._out
        if out is not None:
            try:
                out.send(frame)
                return
            except OSError as error:
                if error.errno not in (errno.ECONNREFUSED, errno.ENOTCONN):
                    raise
                self._disconnect()
        out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            out.setblocking(False)
            out.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            out.connect(self.peer)
        except BaseException:
            out.close()
            raise
        self._out = out
        out.send(frame)

    def _disconnect(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def _flush(self) -> None:
        backlog = self._backlog
        while backlog:
            try:
                self._send(backlog[0])
            except (BlockingIOError, InterruptedError):
                self._retry_at = time.monotonic() + RETRY
                return
            except OSError:
                self.dropped += len(backlog)
                backlog.clear()
                return
            backlog.popleft()

    def next_deadline(self) -> float | None:
        return self._retry_at if self._backlog else None

    def poll(self, now: float) -> None:
        if self._backlog and now >= self._retry_at:
            self._flush()

    def receive(self) -> list[bytes]:
        frames = []
        recv = self.sock.recv
        try:
            while True:
                frames.append(recv(MAX_FRAME))
        except BlockingIOError:
            pass
        return frames

    def fileno(self) -> int | None:
        return self.sock.fileno()

    def close(self) -> None:
        self._disconnect()
        self.sock.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class ColocatedBar(ModelBar):
    """BAR0 of a model that runs in this process, stepped on every access."""

    def __init__(self, mm: mmap.mmap, port_dir: Path, peer_dir: Path, name: str) -> None:
        super().__init__(mm, port_dir, name=name)
        from capsvc.nicdriver.modelhost import PortFiles, open_model

        self.wire = DgramWire(port_dir, peer_dir)
        self.model = open_model(PortFiles(port_dir), self.wire)

    # every access runs the device first (reads) or after (writes)
    def read32(self, offset: int) -> int:
        self.model.step()
        return super().read32(offset)

    def write32(self, offset: int, value: int) -> None:
        self._store(offset, value)  # ModelBar's store: queue-enable requests are counted
        self.model.step()

    def doorbell(self, offset: int, *, urgent: bool = True) -> Doorbell:
        regs = self.regs
        index = offset >> 2
        if not urgent:

            def store(value: int) -> None:
                regs[index] = value

            return store
        step = self.model.step

        def ring(value: int) -> None:
            regs[index] = value
            if self.deferred:
                self._wakeup_pending = True
            else:
                step()

        return ring

    def flush_wakeups(self) -> None:
        # only the TX engines: frames from the peer stay in the socket, which keeps it
        # readable, so the poll loop (sleeping on it) still wakes up for them
        if self._wakeup_pending:
            self._wakeup_pending = False
            self.model.transmit_pending()

    def _timeout_hint(self) -> str:
        return " (co-located model)"

    # the transport's poll loop
    def service(self) -> None:
        # every register write already stepped the model: only the wire can have news
        self.model.receive_pending()

    def next_deadline(self) -> float | None:
        return self.model.next_deadline()

    def idle_fd(self) -> int | None:
        return self.wire.fileno()

    def begin_idle(self) -> None:
        return None

    def end_idle(self, drain: bool = True) -> None:
        return None

    def close(self) -> None:
        self.model.close()
        self.model.window.close()
        self.wire.close()
        self.model.control.close()
        super().close()


def peer_directory(marker: dict[str, str]) -> Path | None:
    """The peer port of a co-located port's marker, or None for other modes."""
    if marker.get("mode") != "colocated":
        return None
    peer = marker.get("peer")
    if not peer:
        raise OSError("a co-located model port's marker names no peer port")
    return Path(peer)
