"""One NIC port's connections: demultiplexing, listening, timers (sans-I/O).

Theory of operation
-------------------
:class:`StreamMux` is the port-wide half of the reliable stream of
:mod:`capsvc.nicdriver.stream`. Every received frame goes to :meth:`StreamMux.receive_frame`:
segments that fail :func:`~capsvc.nicdriver.segment.decode` (other EtherTypes, bad CRC) are
counted and ignored, frames for another MAC are ignored (the port is promiscuous), and the
rest go to the :class:`~capsvc.nicdriver.stream.Channel` keyed by (peer MAC, connection id).
The answer to our own SYN is matched by connection id alone (the SYN may have gone to the
broadcast address). A SYN for no channel creates one if the mux is listening (queued in
``accept_queue``) and is refused with RST otherwise; any other segment of an unknown
connection gets RST, never an RST (no RST storms). :meth:`StreamMux.poll` runs the channels'
timers and drops channels that are done. Frames to send accumulate in ``outbox``; channels
whose state changed (readable, writable, broken, established) are added to ``changed`` for
the caller to wake whoever waits on them.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from capsvc.nicdriver.segment import ACK, FIN, RST, SYN, Segment, decode, encode
from capsvc.nicdriver.stream import (
    BROADCAST,
    DONE,
    ESTABLISHED,
    SYN_SENT,
    Channel,
    StreamConfig,
)

__all__ = ["StreamMux"]


class StreamMux:
    """All channels of one NIC port; feed it frames and time, send its ``outbox``."""

    def __init__(
        self,
        mac: bytes,
        config: StreamConfig | None = None,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.mac = bytes(mac)
        self.config = config or StreamConfig()
        self.random = rng or random.Random()
        self.channels: dict[tuple[bytes, int], Channel] = {}
        self.connecting: dict[int, Channel] = {}
        self.listening = False
        self.accept_queue: deque[Channel] = deque()
        self.outbox: list[bytes] = []
        self.changed: set[Channel] = set()
        self.on_removed: Callable[[Channel], None] | None = None
        self.stats = {"frames_in": 0, "bad_frames": 0, "resets_sent": 0, "retransmits": 0}

    # ------------------------------------------------------------------ API
    def connect(self, now: float, peer: bytes = BROADCAST) -> Channel:
        """Start a connection (SYN); the channel is established once the peer answers."""
        conn = 0
        while not conn or conn in self.connecting or any(k[1] == conn for k in self.channels):
            conn = self.random.getrandbits(32)
        channel = Channel(self, conn, peer, SYN_SENT, now, accepted=False)
        self.connecting[conn] = channel
        channel._emit(SYN, 0, b"")
        channel.syn_deadline = now + channel.rto
        return channel

    def take_output(self) -> list[bytes]:
        out = self.outbox
        self.outbox = []
        return out

    def stop_listening(self, now: float) -> None:
        """No more accepts: connections not yet accepted are reset."""
        self.listening = False
        while self.accept_queue:
            self.accept_queue.popleft().abort(now, "the listener was closed")

    # ------------------------------------------------------------------ frames
    def receive_frame(self, frame: bytes | memoryview, now: float) -> None:
        self.stats["frames_in"] += 1
        seg = decode(frame)
        if seg is None:
            self.stats["bad_frames"] += 1
            return
        if seg.dst != self.mac and seg.dst != BROADCAST:
            return  # for someone else (the port is promiscuous)
        channel = self.channels.get((seg.src, seg.conn))
        if channel is None and seg.conn in self.connecting and seg.flags & (ACK | RST):
            channel = self.connecting.pop(seg.conn)  # the answer to our SYN
            self.channels[(seg.src, seg.conn)] = channel
        if channel is None:
            self._no_channel(seg, now)
            return
        channel.on_segment(seg, now)

    def _no_channel(self, seg: Segment, now: float) -> None:
        if seg.flags & SYN and not seg.flags & ACK:
            if not self.listening:
                self._reset(seg)
                return
            channel = Channel(self, seg.conn, seg.src, ESTABLISHED, now, accepted=True)
            self.channels[(seg.src, seg.conn)] = channel
            self.accept_queue.append(channel)
            channel._emit(SYN | ACK, 0, b"")
            self.changed.add(channel)
        elif not seg.flags & RST:
            self._reset(seg)

    def _reset(self, seg: Segment) -> None:
        self.stats["resets_sent"] += 1
        ack = seg.seq + (1 if seg.payload or seg.flags & FIN else 0)
        self.outbox.append(encode(seg.src, self.mac, RST | ACK, seg.conn, seg.ack, ack, 0, 0))

    # ------------------------------------------------------------------ timers
    def poll(self, now: float) -> None:
        """Run due timers; remove finished channels."""
        for channel in (*self.connecting.values(), *self.channels.values()):
            deadline = channel.next_deadline()
            if deadline is not None and now >= deadline:
                channel.on_timer(now)
        for table in (self.connecting, self.channels):
            for key, channel in list(table.items()):
                if channel.state == DONE and channel.done_at is not None and now >= channel.done_at:
                    del table[key]  # type: ignore[arg-type]
                    if self.on_removed is not None:
                        self.on_removed(channel)

    def next_deadline(self) -> float | None:
        best: float | None = None
        for table in (self.connecting, self.channels):
            for channel in table.values():
                d = channel.next_deadline()
                if d is not None and (best is None or d < best):
                    best = d
        return best
