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
poll and its TX doorbells see the device react at once; the driver's poll loop calls
:meth:`ColocatedBar.service` before looking at the RX ring, and sleeps on the wire's socket
(:meth:`ColocatedBar.idle_fd`). The driver code (ixgbe.py, rings.py) is the same.

The two ports of a co-located pair talk over :class:`DgramWire`: an ``AF_UNIX SOCK_DGRAM``
socket bound to ``<port>/wire.sock`` that sends to the peer port's socket. A frame thus
costs one process wake-up, like a TCP segment on loopback. Carrier is always on (the cable
is plugged); a frame sent while no process drives the peer port is lost, as it would be
on a powered NIC that nobody has initialised, and the stream protocol retransmits.
Fault injection (loss, duplication, reordering) wraps the wire as in the other modes.
"""

from __future__ import annotations

import errno
import mmap
import socket
from pathlib import Path

from capsvc.nicdriver.link import MAX_FRAME, Wire
from capsvc.nicdriver.mmio import Doorbell, ModelBar

__all__ = ["ColocatedBar", "DgramWire"]


class DgramWire(Wire):
    """One end of a co-located pair's cable: datagrams between two port directories."""

    def __init__(self, own: Path, peer: Path) -> None:
        self.path = own / "wire.sock"
        self.peer = str(peer / "wire.sock")
        self.dropped = 0
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.sock.bind(str(self.path))

    def send(self, frame: bytes) -> None:
        try:
            self.sock.sendto(frame, self.peer)
        except OSError as error:  # nobody drives the peer port, or its buffer is full
            if error.errno not in (
                errno.ENOENT,
                errno.ECONNREFUSED,
                errno.EAGAIN,
                errno.ENOBUFS,
            ):
                raise
            self.dropped += 1

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
        self.regs[offset >> 2] = value & 0xFFFFFFFF
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
        return None  # the poll loop's service() runs the model (it must see RX results)

    @property
    def needs_service(self) -> bool:
        """A deferred doorbell waits for :meth:`service`."""
        return self._wakeup_pending

    def _timeout_hint(self) -> str:
        return " (co-located model)"

    # the transport's poll loop
    def service(self) -> None:
        self._wakeup_pending = False
        self.model.step()

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
