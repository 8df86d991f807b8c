"""The model's wire: where transmitted frames go and received frames come from.

Theory of operation
-------------------
Spec nicdriver.md 2.6. A :class:`Wire` moves whole Ethernet frames (destination MAC through
payload, no FCS) between a model port and its peer. It is non-blocking: ``send`` never
waits (a full socket buffer drops the frame, like a congested link), ``receive`` returns the
frames available now, and ``fileno`` (when there is one) lets the model host sleep in
``select`` until frames arrive. Backends:

- :class:`PairWire`: two models in the same process; ``send`` appends straight to the peer's
  inbox (deterministic, no system calls). Used by the ``start-pair`` default and the
  benchmarks.
- :class:`SocketWire` over an ``AF_UNIX SOCK_SEQPACKET`` socket pair: models in different
  processes (frame boundaries are kept).
- :class:`SocketWire` over ``AF_PACKET``/``SOCK_RAW`` bound to a Linux interface (a veth end):
  the frames become real kernel frames that tcpdump/tshark see. Frames the socket reports as
  ``PACKET_OUTGOING`` are our own transmissions and are dropped (and
  ``PACKET_IGNORE_OUTGOING`` is asked for where the kernel has it). Carrier is the
  interface's ``/sys/class/net/IF/carrier``.

Wrappers compose over any backend:

- :class:`FaultyWire` injects loss, duplication and reordering on the sending side, at
  rates read from the model's control file (so they can change while it runs) with a
  seeded random generator. A reordered frame is held back and sent after the next frame, or
  after ``hold_time`` if no other frame comes.
- :class:`PcapWire` records every frame sent and received to a pcap file (linktype 1,
  Ethernet) for CI artifacts without a capture tool.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import struct
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "ETH_P_ALL",
    "FaultyWire",
    "PairWire",
    "PcapWire",
    "SocketWire",
    "Wire",
    "open_packet_socket",
    "read_pcap",
    "seqpacket_pair",
]

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SOL_PACKET = 263
PACKET_IGNORE_OUTGOING = 23
MAX_FRAME = 16384


class Wire(ABC):
    """One end of a link."""

    @abstractmethod
    def send(self, frame: bytes) -> None:
        """Put a frame on the wire (never blocks; may drop)."""

    @abstractmethod
    def receive(self) -> list[bytes]:
        """Frames that arrived since the last call."""

    def carrier(self) -> bool:
        """Is there a peer (the light is on)?"""
        return True

    def fileno(self) -> int | None:
        """A descriptor that becomes readable when frames arrive, if any."""
        return None

    def next_deadline(self) -> float | None:
        """When :meth:`poll` has timed work (``time.monotonic`` seconds), if ever."""
        return None

    def poll(self, now: float) -> None:
        """Run timed work (released held frames)."""
        return None

    def close(self) -> None:
        """Release the wire."""
        return None


class PairWire(Wire):
    """One end of an in-process cable (direct hand-off)."""

    def __init__(self) -> None:
        self.peer: PairWire | None = None
        self.inbox: deque[bytes] = deque()
        self.closed = False

    @classmethod
    def pair(cls) -> tuple[PairWire, PairWire]:
        a, b = cls(), cls()
        a.peer, b.peer = b, a
        return a, b

    def send(self, frame: bytes) -> None:
        peer = self.peer
        if peer is not None and not peer.closed:
            peer.inbox.append(frame)

    def receive(self) -> list[bytes]:
        inbox = self.inbox
        if not inbox:
            return []
        frames = list(inbox)
        inbox.clear()
        return frames

    def carrier(self) -> bool:
        return self.peer is not None and not self.peer.closed and not self.closed

    def close(self) -> None:
        self.closed = True


class SocketWire(Wire):
    """A wire over a datagram-like socket (SOCK_SEQPACKET pair or AF_PACKET)."""

    def __init__(self, sock: socket.socket, interface: str | None = None) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.interface = interface
        self.is_packet = sock.family == getattr(socket, "AF_PACKET", -1)
        self.dropped = 0
        self._peer_gone = False
        self._carrier = True
        self._carrier_checked = 0.0

    def send(self, frame: bytes) -> None:
        try:
            self.sock.send(frame)
        except BlockingIOError:
            self.dropped += 1
        except OSError as error:
            if error.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ENXIO):
                self._peer_gone = True
            self.dropped += 1

    def receive(self) -> list[bytes]:
        frames = []
        sock = self.sock
        try:
            if self.is_packet:
                while True:
                    data, address = sock.recvfrom(MAX_FRAME)
                    if address[2] != PACKET_OUTGOING:
                        frames.append(data)
            else:
                while True:
                    data = sock.recv(MAX_FRAME)
                    if not data:
                        self._peer_gone = True
                        break
                    frames.append(data)
        except BlockingIOError:
            pass
        except OSError as error:
            if error.errno in (errno.ECONNRESET, errno.ENOTCONN):
                self._peer_gone = True
            elif error.errno != errno.ENETDOWN:
                raise
        return frames

    def carrier(self) -> bool:
        if self._peer_gone:
            return False
        if self.interface is None:
            return True
        now = time.monotonic()
        if now - self._carrier_checked > 0.1:
            self._carrier_checked = now
            try:
                path = Path("/sys/class/net") / self.interface / "carrier"
                self._carrier = path.read_text().strip() == "1"
            except OSError:
                self._carrier = False
        return self._carrier

    def fileno(self) -> int | None:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()


def seqpacket_pair() -> tuple[socket.socket, socket.socket]:
    """Two connected AF_UNIX SOCK_SEQPACKET sockets (for models in two processes)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in (a, b):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    return a, b


def open_packet_socket(interface: str) -> socket.socket:
    """A raw AF_PACKET socket bound to ``interface`` (needs CAP_NET_RAW)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        try:
            sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        except OSError:
            pass  # older kernels: receive() filters PACKET_OUTGOING itself
        sock.bind((interface, 0))
    except BaseException:
        sock.close()
        raise
    return sock


class FaultyWire(Wire):
    """Loss, duplication and reordering on the sending side (rates from ``rates()``)."""

    def __init__(
        self,
        inner: Wire,
        rates: Callable[[], tuple[float, float, float]],
        seed: int = 0,
        hold_time: float = 0.001,
        on_fault: Callable[[str], None] | None = None,
        faultless: Callable[[], bool] | None = None,
    ) -> None:
        self.inner = inner
        self.rates = rates
        self.faultless = faultless  # optional quick "all rates are zero" test
        self.random = random.Random(seed)
        self.hold_time = hold_time
        self.on_fault = on_fault or (lambda kind: None)
        self._held: tuple[bytes, float] | None = None

    def send(self, frame: bytes) -> None:
        if self._held is None and self.faultless is not None and self.faultless():
            self.inner.send(frame)  # the common case, without computing the rates
            return
        loss, dup, reorder = self.rates()
        if loss or dup or reorder:
            rnd = self.random.random
            if loss and rnd() < loss:
                self.on_fault("loss")
                return
            if reorder and self._held is None and rnd() < reorder:
                self.on_fault("reorder")
                self._held = (frame, time.monotonic() + self.hold_time)
                return
            self.inner.send(frame)
            if dup and rnd() < dup:
                self.on_fault("dup")
                self.inner.send(frame)
        else:
            self.inner.send(frame)
        if self._held is not None:
            self.inner.send(self._held[0])
            self._held = None

    def receive(self) -> list[bytes]:
        return self.inner.receive()

    def carrier(self) -> bool:
        return self.inner.carrier()

    def fileno(self) -> int | None:
        return self.inner.fileno()

    def next_deadline(self) -> float | None:
        return self._held[1] if self._held is not None else self.inner.next_deadline()

    def poll(self, now: float) -> None:
        if self._held is not None and now >= self._held[1]:
            self.inner.send(self._held[0])
            self._held = None
        self.inner.poll(now)

    def close(self) -> None:
        self.inner.close()


class PcapWire(Wire):
    """Records every frame in both directions to a pcap file (linktype 1)."""

    def __init__(self, inner: Wire, path: str | os.PathLike[str]) -> None:
        self.inner = inner
        self.path = Path(path)
        self._file: BinaryIO = open(self.path, "wb")
        # pcap global header: magic, v2.4, tz 0, sigfigs 0, snaplen, linktype 1 (Ethernet)
        self._file.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))

    def _record(self, frame: bytes) -> None:
        now = time.time()
        sec = int(now)
        self._file.write(
            struct.pack("<IIII", sec, int((now - sec) * 1e6), len(frame), len(frame)) + frame
        )

    def send(self, frame: bytes) -> None:
        self._record(frame)
        self.inner.send(frame)

    def receive(self) -> list[bytes]:
        frames = self.inner.receive()
        for frame in frames:
            self._record(frame)
        if frames:
            self._file.flush()
        return frames

    def carrier(self) -> bool:
        return self.inner.carrier()

    def fileno(self) -> int | None:
        return self.inner.fileno()

    def next_deadline(self) -> float | None:
        return self.inner.next_deadline()

    def poll(self, now: float) -> None:
        self.inner.poll(now)

    def close(self) -> None:
        self._file.close()
        self.inner.close()


def read_pcap(path: str | os.PathLike[str]) -> list[bytes]:
    """The frames of a pcap file (microsecond or nanosecond, either byte order)."""
    data = Path(path).read_bytes()
    if len(data) < 24:
        raise ValueError(f"{path} is not a pcap file")
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        endian = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        endian = ">"
    else:
        raise ValueError(f"{path} is not a pcap file (magic {magic.hex()})")
    frames = []
    pos = 24
    while pos + 16 <= len(data):
        _, _, caplen, _ = struct.unpack_from(endian + "IIII", data, pos)
        pos += 16
        frames.append(data[pos : pos + caplen])
        pos += caplen
    return frames
