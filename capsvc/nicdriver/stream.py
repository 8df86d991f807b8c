"""A reliable byte stream over Ethernet frames (sans-I/O).

Theory of operation
-------------------
Spec nicdriver.md 2.7: the NIC delivers frames, may drop them (RX ring exhausted, DROP_EN),
refuse them (TX ring full) and, through the model's fault injection, lose, duplicate and
reorder them. This module turns frames into ordered, exactly-once byte streams. Like the RPC
engine (DESIGN.md) it does no I/O and reads no clock: callers hand it frames and the current
time, and take the frames it wants sent from ``outbox`` (the trio side is
:mod:`capsvc.transport.nic`). That makes it testable frame by frame (tests/nic).

:class:`~capsvc.nicdriver.mux.StreamMux` serves one NIC port: it demultiplexes segments
(:mod:`.segment`) to :class:`Channel` objects by (peer MAC, connection id), answers SYNs
when listening and replies RST to segments of unknown connections.

One :class:`Channel` is one connection:

- Handshake: the connector picks a random 32-bit connection id and sends SYN (to the
  broadcast address unless it knows the peer's MAC), retransmitting with exponential
  back-off until ``connect_timeout``. A listening mux answers SYN|ACK and queues the channel
  for ``accept``; a repeated SYN gets the SYN|ACK again. The connector is established by the
  SYN|ACK or, if that was lost, by the first segment of the connection from the peer.
- Segmentation and sequence numbers: the byte stream is cut into segments of at most
  :data:`~.segment.MSS` bytes; each DATA segment, and the final FIN, takes one sequence
  number (32 bits on the wire, unwrapped to Python ints against the expected value).
- Acknowledgements: cumulative (the next sequence number expected) plus a 64-bit selective
  bitmap of the segments held beyond it. A receiver acks at once on every second segment,
  on out-of-order or duplicate segments, on FIN and on a PROBE; otherwise after
  ``delayed_ack`` unless outgoing data carries the ack first.
- Send window: in flight are at most ``max_window`` segments and no more than the peer's
  advertised window (its free receive buffer in segments) beyond its acknowledgement. When
  the window is zero the sender probes every RTO; a receiver that frees half its buffer
  after having advertised less than that sends a window update.
- Retransmission: RTO from smoothed RTT samples (RFC 6298, Karn's rule: no samples from
  retransmitted segments), clamped to ``min_rto``..``max_rto``, doubled on each timeout;
  on a timeout the oldest un-SACKed segments are sent again (up to ``rto_burst``). A segment
  with ``dupthresh`` SACKed segments above it is fast-retransmitted (at most once an RTT).
  After ``max_retries`` timeouts without progress the connection is broken.
- Duplicates and reordering: segments below the cumulative ack are dropped (and acked),
  segments above it are kept (within the window) until the gap is filled, so every byte is
  delivered exactly once and in order.
- Closing: ``send_eof`` queues a FIN after the data; the reader then sees EOF after the last
  byte. ``close`` is ``send_eof`` plus "I will not read any more": every later frame carries
  the CLOSED flag, and a peer that sees it fails its pending and future sends (trio's
  BrokenResourceError) and stops retransmitting to us. A closed channel lingers until its
  own data and FIN are acknowledged (so ``send_all`` followed by ``aclose`` loses nothing),
  then for ``time_wait`` to ack late duplicates, and is then removed. RST (to unknown
  connections, or from :meth:`Channel.abort`) breaks both directions at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from capsvc.nicdriver.segment import (
    ACK,
    CLOSED,
    FIN,
    MSS,
    PROBE,
    RST,
    SYN,
    Segment,
    encode_after,
    ethernet_header,
)

if TYPE_CHECKING:
    from capsvc.nicdriver.mux import StreamMux

__all__ = ["BROADCAST", "Channel", "StreamConfig", "unwrap"]

BROADCAST = b"\xff" * 6

SYN_SENT = "syn-sent"
ESTABLISHED = "established"
DONE = "done"


def unwrap(wire: int, reference: int) -> int:
    """The integer nearest ``reference`` whose low 32 bits are ``wire``."""
    diff = (wire - reference) & 0xFFFFFFFF
    if diff >= 1 << 31:
        diff -= 1 << 32
    return reference + diff


@dataclass
class StreamConfig:
    """Tunables of the protocol (seconds, bytes, segments)."""

    mss: int = MSS
    send_buffer: int = 256 * 1024
    receive_buffer: int = 256 * 1024
    max_window: int = 64
    initial_rto: float = 0.05
    min_rto: float = 0.01
    max_rto: float = 0.5
    max_retries: int = 20
    rto_burst: int = 16
    dupthresh: int = 3
    connect_timeout: float = 5.0
    delayed_ack: float = 0.005  # below min_rto; replies usually carry the ack before
    time_wait: float = 0.5
    keepalive: float = 2.0  # probe a silent peer after this long ...
    keepalive_probes: int = 5  # ... and give up after this many unanswered probes


class _Out:
    """A segment sent and not yet cumulatively acknowledged."""

    __slots__ = ("flags", "payload", "retransmitted", "sacked", "sent", "seq")

    def __init__(self, seq: int, payload: bytes, flags: int) -> None:
        self.seq = seq
        self.payload = payload
        self.flags = flags
        self.sent = 0.0
        self.retransmitted = False
        self.sacked = False


class Channel:
    """One reliable connection. Methods take ``now`` (monotonic seconds)."""

    def __init__(
        self, mux: StreamMux, conn: int, peer: bytes, state: str, now: float, *, accepted: bool
    ) -> None:
        cfg = mux.config
        self.mux = mux
        self.config = cfg
        self.conn = conn
        self.peer = peer
        self.state = state
        self.accepted = accepted  # created by a listener
        # sending
        self.snd_buf = bytearray()
        self.snd_una = 1  # oldest unacknowledged sequence number
        self.snd_next = 1  # next sequence number to assign
        self.unacked: dict[int, _Out] = {}
        self.unacked_bytes = 0
        self.peer_ack = 1
        self.peer_window = cfg.max_window
        self.fin_queued = False
        self.fin_sent = False
        self.fin_acked = False
        self.send_error: str | None = None
        # receiving
        self.rcv_buf = bytearray()
        self.rcv_next = 1
        self.ooo: dict[int, tuple[bytes, bool]] = {}
        self.eof = False
        self.recv_error: str | None = None
        self.local_closed = False  # close() called: we read no more
        self._unacked_in = 0  # segments received since our last ack
        self._advertised = cfg.max_window
        # timers
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = cfg.initial_rto
        self.retries = 0
        self.rto_deadline: float | None = None
        self.ack_deadline: float | None = None
        self.persist_deadline: float | None = None
        self.syn_deadline: float | None = None
        self.connect_deadline = now + cfg.connect_timeout
        self.done_at: float | None = None
        self.retransmits = 0
        self.last_heard = now
        self.keepalive_probes = 0
        self._eth_peer = b""
        self._eth = b""

    # ------------------------------------------------------------------ app side
    @property
    def established(self) -> bool:
        return self.state == ESTABLISHED or (self.state == DONE and self.send_error is None)

    @property
    def send_room(self) -> int:
        return max(0, self.config.send_buffer - len(self.snd_buf) - self.unacked_bytes)

    @property
    def readable(self) -> bool:
        return bool(self.rcv_buf) or self.eof or self.recv_error is not None

    @property
    def writable(self) -> bool:
        return self.send_room > 0 or self.send_error is not None

    @property
    def all_acked(self) -> bool:
        return not self.snd_buf and not self.unacked

    def send(self, data: bytes | bytearray | memoryview, now: float) -> int:
        """Accept up to :attr:`send_room` bytes of ``data``; returns how many."""
        n = min(self.send_room, len(data))
        if n:
            if (
                n <= self.config.mss
                and not self.snd_buf
                and self.state == ESTABLISHED
                and self.send_error is None
                and self.snd_next < self._send_limit()
            ):
                # the common RPC case: a small write, nothing queued, window open. The
                # segment is cut straight from ``data`` (no trip through snd_buf).
                self._new_segment(bytes(data[:n]), 0, now)
            else:
                self.snd_buf += data[:n]
                self._push(now)
        return n

    def receive(self, max_bytes: int, now: float) -> bytes:
        """Up to ``max_bytes`` in-order bytes (b"" if none are buffered)."""
        buf = self.rcv_buf
        if not buf:
            return b""
        if len(buf) <= max_bytes:
            data = bytes(buf)
            buf.clear()
        else:
            data = bytes(buf[:max_bytes])
            del buf[:max_bytes]
        window = self._window()
        half = self.config.max_window // 2
        if self.state == ESTABLISHED and self._advertised < half <= window:
            self._send_ack(now)  # window update
        return data

    def send_eof(self, now: float) -> None:
        """No more data will be sent: the peer reads EOF after the last byte."""
        if not self.fin_queued:
            self.fin_queued = True
            self._push(now)

    def close(self, now: float) -> None:
        """send_eof, and tell the peer we read no more (its sends then fail)."""
        if self.local_closed:
            return
        self.local_closed = True
        self.rcv_buf.clear()
        self.ooo.clear()
        if self.state == SYN_SENT:
            self._finish(now, immediately=True)
            return
        self.send_eof(now)
        if self.state == ESTABLISHED and self.fin_sent:
            self._send_ack(now)  # carries CLOSED even when the FIN went out earlier
        self._check_done(now)

    def abort(self, now: float, reason: str = "connection aborted locally") -> None:
        """Reset: both directions break at once, the peer gets RST."""
        if self.state != DONE:
            self._emit(RST | ACK, self.snd_next, b"")
        self._break(reason)
        self._finish(now, immediately=True)

    # ------------------------------------------------------------------ incoming
    def on_segment(self, seg: Segment, now: float) -> None:
        flags = seg.flags
        mux = self.mux
        mux.changed.add(self)
        self.last_heard = now
        self.keepalive_probes = 0
        if flags & RST:
            if self.state == SYN_SENT:
                self._break("connection refused: no listener on the peer port")
            else:
                self._break("connection reset by the peer")
            self._finish(now, immediately=True)
            return
        if self.state == SYN_SENT:
            self.state = ESTABLISHED
            self.peer = seg.src
            self.syn_deadline = None
        if flags & SYN and not flags & ACK:
            self._emit(SYN | ACK, 0, b"")  # the SYN|ACK was lost: again
            return
        if flags & CLOSED and self.send_error is None:
            self._send_failed("the peer closed the stream (it reads no more)")
        if flags & ACK:
            self._on_ack(seg, now)
        if seg.payload or flags & FIN:
            self._on_data(seg, now)
        elif flags & PROBE:
            self._send_ack(now)
        self._check_done(now)

    def _on_ack(self, seg: Segment, now: float) -> None:
        ack = unwrap(seg.ack, self.snd_una)
        if ack > self.snd_next or ack < self.peer_ack - self.config.max_window:
            return  # nonsense or ancient
        if ack > self.snd_una:
            unacked = self.unacked
            sample = None
            for seq in range(self.snd_una, ack):
                out = unacked.pop(seq, None)
                if out is None:
                    continue
                self.unacked_bytes -= len(out.payload)
                if not out.retransmitted:
                    sample = now - out.sent
                if out.flags & FIN:
                    self.fin_acked = True
            self.snd_una = ack
            self.retries = 0
            if sample is not None:
                self._rtt_sample(sample)
            elif self.srtt is not None:  # progress restores the RTO (after back-off)
                self._rtt_sample(self.srtt)
            self.rto_deadline = now + self.rto if unacked else None
        if ack >= self.peer_ack:
            self.peer_ack = ack
            self.peer_window = seg.window
            if seg.window:
                self.persist_deadline = None
        if seg.sack and self.unacked:
            self._on_sack(ack, seg.sack, now)
        self._push(now)

    def _on_sack(self, ack: int, bits: int, now: float) -> None:
        unacked = self.unacked
        highest = 0
        i = 0
        while bits:
            if bits & 1:
                out = unacked.get(ack + 1 + i)
                if out is not None:
                    out.sacked = True
                highest = ack + 1 + i
            bits >>= 1
            i += 1
        guard = self.srtt if self.srtt is not None else self.config.min_rto
        for seq in range(self.snd_una, highest - self.config.dupthresh + 1):
            out = unacked.get(seq)
            if out is None or out.sacked:
                continue
            if not out.retransmitted or now - out.sent > guard:
                self._retransmit(out, now)

    def _on_data(self, seg: Segment, now: float) -> None:
        seq = unwrap(seg.seq, self.rcv_next)
        fin = bool(seg.flags & FIN)
        if seq < self.rcv_next or seq >= self.rcv_next + self.config.max_window:
            self._send_ack(now)  # duplicate (our ack was lost) or outside the window
            return
        if seq > self.rcv_next:
            self.ooo.setdefault(seq, (seg.payload, fin))
            self._send_ack(now)  # tells the sender about the gap (SACK)
            return
        filled_gap = bool(self.ooo)
        self._deliver(seg.payload, fin)
        ooo = self.ooo
        while self.rcv_next in ooo:
            payload, more_fin = ooo.pop(self.rcv_next)
            self._deliver(payload, more_fin)
        self._unacked_in += 1
        if filled_gap or fin or self._unacked_in >= 2 or self.local_closed:
            self._send_ack(now)
        elif self.ack_deadline is None:
            self.ack_deadline = now + self.config.delayed_ack

    def _deliver(self, payload: bytes, fin: bool) -> None:
        self.rcv_next += 1
        if self.eof:
            return
        if not self.local_closed:
            self.rcv_buf += payload
        if fin:
            self.eof = True

    # ------------------------------------------------------------------ timers
    def next_deadline(self) -> float | None:
        # called on every pass of the transport's poll loop: no temporary list
        best = self.rto_deadline
        for d in (self.ack_deadline, self.persist_deadline, self.syn_deadline, self.done_at):
            if d is not None and (best is None or d < best):
                best = d
        if self.state == ESTABLISHED and self.done_at is None:
            d = self.last_heard + self.config.keepalive * (1 + self.keepalive_probes / 4)
            if best is None or d < best:
                best = d
        return best

    def _keepalive_deadline(self) -> float | None:
        if self.state != ESTABLISHED or self.done_at is not None:
            return None
        cfg = self.config
        return self.last_heard + cfg.keepalive * (1 + self.keepalive_probes / 4)

    def on_timer(self, now: float) -> None:
        cfg = self.config
        if self.syn_deadline is not None and now >= self.syn_deadline:
            if now >= self.connect_deadline:
                self._break(
                    f"no listener answered within {cfg.connect_timeout:g} s "
                    "(is a server listening on the peer port, and is the link up?)"
                )
                self._finish(now, immediately=True)
                return
            self._emit(SYN, 0, b"")
            self.rto = min(self.rto * 2, cfg.max_rto)
            self.syn_deadline = now + self.rto
        if self.ack_deadline is not None and now >= self.ack_deadline:
            self._send_ack(now)
        if self.rto_deadline is not None and now >= self.rto_deadline:
            if self.retries >= cfg.max_retries:
                self._break(f"the peer stopped acknowledging ({self.retries} retransmissions)")
                self._finish(now, immediately=True)
                return
            self.retries += 1
            self.rto = min(self.rto * 2, cfg.max_rto)
            sent = 0
            for out in sorted(self.unacked.values(), key=lambda o: o.seq):
                if not out.sacked:
                    self._retransmit(out, now)
                    sent += 1
                    if sent >= cfg.rto_burst:
                        break
            self.rto_deadline = now + self.rto
        if self.persist_deadline is not None and now >= self.persist_deadline:
            self._send_ack(now, probe=True)
            self.persist_deadline = now + self.rto
        keepalive = self._keepalive_deadline()
        if keepalive is not None and now >= keepalive:
            if self.keepalive_probes >= cfg.keepalive_probes:
                self._break(f"the peer is silent (no answer for {now - self.last_heard:.1f} s)")
                self._finish(now, immediately=True)
                return
            self.keepalive_probes += 1
            self._send_ack(now, probe=True)
        if self.done_at is not None and now >= self.done_at:
            self.state = DONE

    # ------------------------------------------------------------------ sending
    def _send_limit(self) -> int:
        """One past the highest sequence number the windows allow in flight."""
        return min(self.peer_ack + self.peer_window, self.snd_una + self.config.max_window)

    def _push(self, now: float) -> None:
        """Cut buffered data into segments and send what the window allows."""
        if self.state != ESTABLISHED or self.send_error is not None:
            return
        buf = self.snd_buf
        if not buf and (not self.fin_queued or self.fin_sent):
            return  # nothing to send (every incoming ack calls this)
        limit = self._send_limit()
        mss = self.config.mss
        while self.snd_next < limit and (buf or (self.fin_queued and not self.fin_sent)):
            if buf:
                payload = bytes(buf[:mss])
                del buf[:mss]
                self._new_segment(payload, 0, now)
            else:
                self.fin_sent = True
                self._new_segment(b"", FIN, now)
        pending = buf or (self.fin_queued and not self.fin_sent)
        if pending and self.snd_next >= limit and self.persist_deadline is None:
            if not self.unacked:  # window closed and nothing in flight: probe
                self.persist_deadline = now + self.rto

    def _new_segment(self, payload: bytes, flags: int, now: float) -> None:
        """Assign the next sequence number to ``payload`` and send it (window checked)."""
        out = _Out(self.snd_next, payload, flags)
        self.unacked_bytes += len(payload)
        self.unacked[self.snd_next] = out
        self.snd_next += 1
        self._send_segment(out, now)
        if self.rto_deadline is None:
            self.rto_deadline = now + self.rto

    def _send_segment(self, out: _Out, now: float) -> None:
        out.sent = now
        self._emit(out.flags | ACK, out.seq, out.payload)

    def _retransmit(self, out: _Out, now: float) -> None:
        out.retransmitted = True
        self.retransmits += 1
        self.mux.stats["retransmits"] += 1
        self._send_segment(out, now)

    def _send_ack(self, now: float, probe: bool = False) -> None:
        self._emit(ACK | (PROBE if probe else 0), self.snd_next, b"")

    def _emit(self, flags: int, seq: int, payload: bytes) -> None:
        if self.local_closed:
            flags |= CLOSED
        if flags & ACK:
            self._unacked_in = 0
            self.ack_deadline = None
        window = self._window()
        self._advertised = window
        sack = 0
        if self.ooo:
            base = self.rcv_next + 1
            for seq_held in self.ooo:
                i = seq_held - base
                if 0 <= i < 64:
                    sack |= 1 << i
        if self._eth_peer is not self.peer:  # the peer's MAC is learnt at establishment
            self._eth_peer = self.peer
            self._eth = ethernet_header(self.peer, self.mux.mac)
        self.mux.outbox.append(
            encode_after(self._eth, flags, self.conn, seq, self.rcv_next, sack, window, payload)
        )

    def _window(self) -> int:
        cfg = self.config
        if self.local_closed:
            return cfg.max_window  # we discard: never stall the peer
        room = cfg.receive_buffer - len(self.rcv_buf)
        return max(0, min(cfg.max_window, room // cfg.mss))

    # ------------------------------------------------------------------ state
    def _rtt_sample(self, rtt: float) -> None:
        cfg = self.config
        if self.srtt is None:
            self.srtt = rtt
            self.rttvar = rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(cfg.max_rto, max(cfg.min_rto, self.srtt + max(0.001, 4 * self.rttvar)))

    def _send_failed(self, reason: str) -> None:
        self.send_error = reason
        self.snd_buf.clear()
        self.unacked.clear()
        self.unacked_bytes = 0
        self.rto_deadline = None
        self.persist_deadline = None

    def _break(self, reason: str) -> None:
        if self.send_error is None:
            self._send_failed(reason)
        if self.recv_error is None and not self.eof:
            self.recv_error = reason
        self.mux.changed.add(self)

    def _check_done(self, now: float) -> None:
        if not self.local_closed or self.done_at is not None:
            return
        send_done = self.send_error is not None or self.fin_acked
        if send_done:
            self._finish(now)

    def _finish(self, now: float, immediately: bool = False) -> None:
        self.rto_deadline = self.persist_deadline = self.syn_deadline = None
        if immediately:
            self.state = DONE
            self.done_at = now
        else:
            self.done_at = now + self.config.time_wait
        self.mux.changed.add(self)

    def __repr__(self) -> str:
        return (
            f"<Channel {self.conn:08x} {self.state} peer={self.peer.hex(':')} "
            f"snd={self.snd_una}/{self.snd_next} rcv={self.rcv_next}>"
        )
