"""The software 82599: a register file, RX and TX DMA engines, and a wire.

Theory of operation
-------------------
Spec nicdriver.md 2. Register writes are plain stores into a shared file (no trap), so the
model *polls*: :meth:`IxgbeModel.step` looks at the few registers whose changes mean
something and does the device's share of the work. A host loop
(:mod:`capsvc.nicdriver.modelhost`) calls ``step`` on its models, in a thread or in a
process of its own; tests and benchmarks may call it directly for determinism.

What one ``step`` does:

1. Control (spec 2.3). CTRL.RST or LNK_RST set: :meth:`reset` (every register to its
   default, else 0; EEC.ARD/PRES, RDRXCTL.DMAIDONE, RAL/RAH(0) with Address Valid,
   DCA_RXCTRL bit 12, SRRCTL's reset value, LINKS = 0; all queue state dropped; the RST bits
   are cleared *last*, after the defaults, so the driver's wait cannot overtake the reset).
   AUTOC.AN_RESTART self-clears and starts the link timer: the link comes up
   ``link_delay`` later if the wire has carrier (LINKS = LINK_UP | 10G | KX_AN_COMP) and
   goes down with the carrier. RXDCTL/TXDCTL.ENABLE edges: rising latches the ring (base
   BAL | BAH << 32, LEN / 16 entries; base 128-byte aligned, LEN a multiple of 128, the whole
   ring inside one DMA page, else a ``bad_ring`` fault and the queue stays dead) and, for RX,
   SRRCTL (buffer size, DROP_EN; anything but advanced one-buffer descriptors is a
   ``bad_descriptor`` fault). Falling stops the queue.
2. TX (spec 2.5), for every enabled queue while DMATXCTL.TE and the link is up: from the
   model's head to the tail register (a level, not an event), gather each data
   descriptor's bytes (DTYP 0011b with DEXT; context descriptors are consumed), a frame ends
   at EOP; pad to 60 bytes under HLREG0.TXPADEN; put it on the wire; with RS set DD in the
   status dword; then TDH. Counts GPTC, GOTC (+4 per frame for the FCS), QPTC.
3. RX (spec 2.4) for each frame from the wire: drop unless RXCTRL.RXEN and link up; the
   address filter (broadcast needs BAM, multicast MPE, unicast a match with RAL/RAH(0) or
   UPE); oversize (> MAXFRS, FCS included, unless HLREG0.JUMBOEN) counts ROC, undersize
   (< 64 bytes with the FCS) counts RUC; queue 0. No free
   descriptor (head == tail, or not enough for the frame): with SRRCTL.DROP_EN drop and count
   QPRDC and RNBC, else hold the frame in a packet buffer of RXPBSIZE(0) bytes and count MPC
   when that is full. Otherwise copy the frame into the slot's buffer (appending a CRC-32 if
   CRC stripping is off), split over further slots if it exceeds the buffer size (EOP on the
   last), write back the length, zero the lower words, then the status dword DD|EOP as one
   4-byte store, and RDH after the write-back (spec 2.2's store order). Counts GPRC, GORC,
   QPRC.

Every DMA address goes through a window (:mod:`capsvc.nicdriver.dma`); an address outside
every known page (e.g. the 0xFF ring fill of spec 1.2) counts a ``bad_dma`` fault and stops
the queue, like a real device's DMA error. A tail register outside its ring counts
``torn_doorbell`` (the torn-write check of spec 4.2). Statistics are monotonic 64-bit totals
in the control file; the driver's :class:`~capsvc.nicdriver.mmio.ModelBar` turns them back
into clear-on-read registers. The model never writes a register the driver read-modify-writes
except the self-clearing bits the driver is waiting on (spec 2.3, last point).

Hosts call ``step`` often, so its common case is cheap: the queue-enable check compares all
RXDCTL/TXDCTL words at once (two strided copies) and walks the queues only when one
changed. A host that sees every register write itself (the co-located accessor) calls
:meth:`IxgbeModel.receive_pending` instead between writes: only the wire can have news.

``pause()`` stops all processing (frames keep queueing in the inbox), ``inject(frame)``
delivers a frame as if it came from the wire, and the fault counters are in
``control.faults``.
"""

from __future__ import annotations

import mmap
import os
import time
import zlib
from collections import deque
from collections.abc import Callable
from pathlib import Path

from capsvc.nicdriver import control as ctl
from capsvc.nicdriver import regs
from capsvc.nicdriver.control import Control, Fault
from capsvc.nicdriver.dma import DmaWindow, HugepageWindow
from capsvc.nicdriver.link import Wire

__all__ = ["IxgbeModel"]

_BROADCAST = b"\xff" * 6
_ZERO_BAR = bytes(regs.BAR0_SIZE)
_ENABLE = regs.RXDCTL_ENABLE
_RSTS = regs.CTRL_RST_MASK
_C = {offset: slot for offset, slot in regs.COUNTER_SLOT.items()}
S_GPRC = _C[regs.GPRC]
S_GPTC = _C[regs.GPTC]
S_ROC = _C[regs.ROC]
S_RUC = _C[regs.RUC]
S_MPC0 = _C[regs.MPC(0)]
S_RNBC0 = _C[regs.RNBC(0)]
S_QPRC = [_C[regs.QPRC(i)] for i in range(regs.MODEL_QUEUES)]
S_QPTC = [_C[regs.QPTC(i)] for i in range(regs.MODEL_QUEUES)]
S_QPRDC = [_C[regs.QPRDC(i)] for i in range(regs.MODEL_QUEUES)]


class _Queue:
    """Latched state of one enabled queue."""

    def __init__(self, index: int, size: int, mem: memoryview, offset: int) -> None:
        self.index = index
        self.size = size
        ring = mem[offset : offset + size * regs.DESC_SIZE]
        self.ring = ring
        self.d32 = ring.cast("I")
        self.d64 = ring.cast("Q")
        self.head = 0
        self.bsize = 2048  # RX: buffer size from SRRCTL
        self.drop_en = False  # RX: SRRCTL.DROP_EN
        self.partial = bytearray()  # TX: frame gathered so far (before EOP)

    def release(self) -> None:
        self.d32.release()
        self.d64.release()
        self.ring.release()


class IxgbeModel:
    """One modelled 82599 port over a BAR file, a control file and a DMA window."""

    def __init__(
        self,
        bar_path: Path,
        control: Control,
        window: DmaWindow,
        wire: Wire,
        *,
        mac: bytes,
        num_queues: int = 4,
        link_delay: float = 0.01,
        name: str = "model",
    ) -> None:
        if not 1 <= num_queues <= regs.MODEL_QUEUES:
            raise ValueError(f"the model implements 1..{regs.MODEL_QUEUES} queues")
        fd = os.open(bar_path, os.O_RDWR)
        try:
            self._bar_mm = mmap.mmap(fd, regs.BAR0_SIZE, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.name = name
        self.bar = memoryview(self._bar_mm)
        self.regs = self.bar.cast("I")
        self.control = control
        self.window = window
        self.wire = wire
        self.mac = mac
        self.num_queues = num_queues
        self.link_delay = link_delay
        self.counters = control.counters
        self.faults = control.faults
        self.inbox: deque[bytes] = deque()  # frames from the wire, not yet processed
        self.packet_buffer: deque[bytes] = deque()  # frames waiting for descriptors
        self.packet_buffer_bytes = 0
        self.rxq: list[_Queue | None] = [None] * num_queues
        self.txq: list[_Queue | None] = [None] * num_queues
        self.link_up = False
        self._an_deadline: float | None = None
        self._paused = False
        self._poke_driver_fd = -1
        self._driver_fifo = control.path.parent / "kick-driver"
        self.on_transmit: Callable[[bytes], None] | None = None  # benchmark hook
        w = control.words
        w[ctl.W_MAC] = int.from_bytes(mac, "big")
        w[ctl.W_MODEL_PID] = os.getpid()
        w[ctl.W_STATE] = ctl.STATE_RUNNING
        # register indexes (offset >> 2) used on every step
        self._i_rdt = [regs.RDT(q) >> 2 for q in range(num_queues)]
        self._i_rdh = [regs.RDH(q) >> 2 for q in range(num_queues)]
        self._i_tdt = [regs.TDT(q) >> 2 for q in range(num_queues)]
        self._i_tdh = [regs.TDH(q) >> 2 for q in range(num_queues)]
        self._i_rxdctl = [regs.RXDCTL(q) >> 2 for q in range(num_queues)]
        self._i_txdctl = [regs.TXDCTL(q) >> 2 for q in range(num_queues)]
        stride = (regs.RXDCTL(1) - regs.RXDCTL(0)) >> 2
        self._rxdctl_cols = slice(self._i_rxdctl[0], self._i_rxdctl[-1] + 1, stride)
        self._txdctl_cols = slice(self._i_txdctl[0], self._i_txdctl[-1] + 1, stride)
        self._ctl_seen: tuple[list[int], list[int]] | None = None
        self.reset()

    # ------------------------------------------------------------------ public API
    def pause(self) -> None:
        self._paused = True
        self.control.words[ctl.W_STATE] = ctl.STATE_PAUSED

    def resume(self) -> None:
        self._paused = False
        self.control.words[ctl.W_STATE] = ctl.STATE_RUNNING

    def inject(self, frame: bytes) -> None:
        """Deliver ``frame`` as if it had come from the wire (processed by the next step)."""
        self.inbox.append(frame)

    def fault_counts(self) -> dict[str, int]:
        return self.control.fault_dict()

    def counter(self, offset: int) -> int:
        """The monotonic total of the counter at register ``offset``."""
        return int(self.counters[regs.COUNTER_SLOT[offset]])

    def next_deadline(self) -> float | None:
        """When this model has timed work (the link timer, held frames)."""
        best = self.wire.next_deadline()  # asked on every pass of a poll loop: no list
        if self._an_deadline is not None and (best is None or self._an_deadline < best):
            best = self._an_deadline
        if self.packet_buffer:  # retry held frames soon
            held = time.monotonic() + 0.001
            if best is None or held < best:
                best = held
        return best

    def step(self) -> int:
        """Do everything that is due; returns a work count (0: idle)."""
        if self._paused:
            return 0
        r = self.regs
        work = 0
        if r[0] & _RSTS:
            self.reset()
            return 1
        if r[regs.AUTOC >> 2] & regs.AUTOC_AN_RESTART or self._an_deadline is not None:
            self._link_state()
        elif self.link_up and not self.wire.carrier():
            self._set_link(False)
        self._queue_edges()
        if self.wire.next_deadline() is not None:
            self.wire.poll(time.monotonic())
        work += self.transmit_pending()
        frames = self.wire.receive()
        if frames:
            self.faults[Fault.WIRE_RX] += len(frames)
            self.inbox.extend(frames)
        if self.inbox or self.packet_buffer:
            received = self._receive_all()
            if received:
                work += received
                if self.control.words[ctl.W_DRIVER_SLEEPING]:
                    self._poke_driver()
        return work

    def receive_pending(self) -> int:
        """The RX half of :meth:`step`, for a host that sees every register write itself
        (the co-located accessor steps the model on each write): control and queue-enable
        changes cannot be pending, so only the wire and its timers need a look. Falls back
        to :meth:`step` while the link trains or when the carrier is lost."""
        if self._paused:
            return 0
        wire = self.wire
        if self._an_deadline is not None or (self.link_up and not wire.carrier()):
            return self.step()
        if wire.next_deadline() is not None:
            wire.poll(time.monotonic())
        frames = wire.receive()
        if frames:
            self.faults[Fault.WIRE_RX] += len(frames)
            if not self.inbox and not self.packet_buffer:
                received = self._receive_frames(frames)  # nothing queued ahead of them
            else:
                self.inbox.extend(frames)
                received = self._receive_all()
        elif self.inbox or self.packet_buffer:
            received = self._receive_all()
        else:
            return 0
        if received and self.control.words[ctl.W_DRIVER_SLEEPING]:
            self._poke_driver()
        return received

    def _receive_frames(self, frames: list[bytes]) -> int:
        """:meth:`_receive_all` for frames with nothing queued ahead of them."""
        done = 0
        for i, frame in enumerate(frames):
            if not self._accept(frame):
                continue
            result = self._deliver(frame)
            if result == 0:  # out of descriptors: the rest waits in order, as usual
                self._no_room(frame)
                self.inbox.extend(frames[i + 1 :])
                return done + self._receive_all()
            done += result > 0
        return done

    def transmit_pending(self) -> int:
        """Only the TX engines (the part of :meth:`step` a TX doorbell asks for)."""
        if self._paused:
            return 0
        r = self.regs
        work = 0
        if self.link_up and r[regs.DMATXCTL >> 2] & regs.DMATXCTL_TE:
            i_tdt = self._i_tdt
            for q in self.txq:
                if q is not None and q.head != r[i_tdt[q.index]]:
                    work += self._transmit(q)
        return work

    # ------------------------------------------------------------------ reset (2.3)
    def reset(self) -> None:
        """Device reset: defaults, queue state dropped, RST bits cleared last."""
        r = self.regs
        for queues in (self.rxq, self.txq):
            for i, q in enumerate(queues):
                if q is not None:
                    q.release()
                    queues[i] = None
        self.packet_buffer.clear()
        self.packet_buffer_bytes = 0
        self._ctl_seen = None
        self.bar[4:] = _ZERO_BAR[4:]  # everything but CTRL
        r[regs.EEC >> 2] = regs.EEC_ARD | regs.EEC_PRES
        r[regs.RDRXCTL >> 2] = regs.RDRXCTL_DMAIDONE
        r[regs.RAL0 >> 2] = int.from_bytes(self.mac[:4], "little")
        r[regs.RAH0 >> 2] = int.from_bytes(self.mac[4:], "little") | regs.RAH_AV
        r[regs.RXPBSIZE(0) >> 2] = regs.RXPBSIZE_DEFAULT
        r[regs.TXPBSIZE(0) >> 2] = regs.TXPBSIZE_DEFAULT
        r[regs.MAXFRS >> 2] = regs.MAXFRS_DEFAULT
        for n in range(self.num_queues):
            r[regs.DCA_RXCTRL(n) >> 2] = regs.DCA_RXCTRL_BIT12
            r[regs.SRRCTL(n) >> 2] = regs.SRRCTL_DEFAULT
        r[regs.LINKS >> 2] = 0
        self.link_up = False
        self.control.words[ctl.W_LINK_UP] = 0
        self._an_deadline = None
        # statistics restart from zero for the driver
        self.control.counter_base[:] = self.control.counters
        if isinstance(self.window, HugepageWindow):
            self.window.attach(int(self.control.words[ctl.W_DRIVER_PID]))
        self.faults[Fault.RESETS] += 1
        r[0] = 0  # CTRL last: the driver's wait ends only now

    # ------------------------------------------------------------------ link (2.3)
    def _link_state(self) -> None:
        r = self.regs
        autoc = r[regs.AUTOC >> 2]
        now = time.monotonic()
        if autoc & regs.AUTOC_AN_RESTART:
            r[regs.AUTOC >> 2] = autoc & ~regs.AUTOC_AN_RESTART  # self-clearing
            self._an_deadline = now + self.link_delay
            self._set_link(False)
        elif self._an_deadline is not None and now >= self._an_deadline:
            if self.wire.carrier():
                self._an_deadline = None
                self._set_link(True)
            else:
                self._an_deadline = now + 0.05  # keep trying while the cable is out

    def _set_link(self, up: bool) -> None:
        self.link_up = up
        self.regs[regs.LINKS >> 2] = (
            regs.LINKS_UP | regs.LINKS_SPEED_10G | regs.LINKS_KX_AN_COMP if up else 0
        )
        self.control.words[ctl.W_LINK_UP] = int(up)
        if not up and self._an_deadline is None and self.regs[regs.AUTOC >> 2] != 0:
            self._an_deadline = time.monotonic() + 0.05  # retrain when the carrier returns

    # ------------------------------------------------------------------ queue enables
    def _queue_edges(self) -> None:
        r = self.regs
        # every step looks: compare all RXDCTL/TXDCTL words at once (two strided copies)
        # and walk the queues only when one of them changed since the last walk
        seen = (r[self._rxdctl_cols].tolist(), r[self._txdctl_cols].tolist())
        if seen == self._ctl_seen:
            return
        # remember what the walk is based on, not what it leaves: a driver write during
        # the walk (another process) then differs at the next step, which walks again
        self._ctl_seen = seen
        self._queue_walk()

    def _queue_walk(self) -> None:
        r = self.regs
        rxq, txq = self.rxq, self.txq
        i_rx, i_tx = self._i_rxdctl, self._i_txdctl
        for q in range(self.num_queues):
            on = r[i_rx[q]] & _ENABLE
            if on and rxq[q] is None:
                rxq[q] = self._latch(q, regs.RDBAL(q), regs.RDBAH(q), regs.RDLEN(q), rx=True)
                if rxq[q] is None:
                    r[i_rx[q]] = r[i_rx[q]] & ~_ENABLE  # a dead queue reads back disabled
            elif not on and rxq[q] is not None:
                rxq[q].release()  # type: ignore[union-attr]
                rxq[q] = None
            on = r[i_tx[q]] & _ENABLE
            if on and txq[q] is None:
                txq[q] = self._latch(q, regs.TDBAL(q), regs.TDBAH(q), regs.TDLEN(q), rx=False)
                if txq[q] is None:
                    r[i_tx[q]] = r[i_tx[q]] & ~_ENABLE
            elif not on and txq[q] is not None:
                txq[q].release()  # type: ignore[union-attr]
                txq[q] = None

    def _latch(self, q: int, bal: int, bah: int, dlen: int, *, rx: bool) -> _Queue | None:
        r = self.regs
        base = r[bal >> 2] | (r[bah >> 2] << 32)
        length = r[dlen >> 2]
        if base % 128 or length == 0 or length % 128:
            self.faults[Fault.BAD_RING] += 1
            return None
        where = self.window.locate(base, length)
        if where is None:
            self.faults[Fault.BAD_RING] += 1
            return None
        queue = _Queue(q, length // regs.DESC_SIZE, where[0], where[1])
        if rx:
            srrctl = r[regs.SRRCTL(q) >> 2]
            if srrctl & regs.SRRCTL_DESCTYPE_MASK != regs.SRRCTL_DESCTYPE_ADV_ONEBUF:
                self.faults[Fault.BAD_DESCRIPTOR] += 1
                queue.release()
                return None
            queue.bsize = ((srrctl & regs.SRRCTL_BSIZEPACKET_MASK) or 2) * 1024
            queue.drop_en = bool(srrctl & regs.SRRCTL_DROP_EN)
            queue.head = r[self._i_rdh[q]] % queue.size
        else:
            queue.head = r[self._i_tdh[q]] % queue.size
        return queue

    def _stop(self, queue: _Queue, rx: bool, fault: int) -> None:
        self.faults[fault] += 1
        index = queue.index
        i = self._i_rxdctl[index] if rx else self._i_txdctl[index]
        self.regs[i] = self.regs[i] & ~_ENABLE
        queue.release()
        (self.rxq if rx else self.txq)[index] = None

    # ------------------------------------------------------------------ TX engine (2.5)
    def _transmit(self, q: _Queue) -> int:
        r = self.regs
        tail = r[self._i_tdt[q.index]]
        if tail >= q.size:
            self._stop(q, False, Fault.TORN_DOORBELL)
            return 0
        d32, d64 = q.d32, q.d64
        locate = self.window.locate
        head = q.head
        size = q.size
        pad = r[regs.HLREG0 >> 2] & regs.HLREG0_TXPADEN
        wire_send = self.wire.send
        tap = self.on_transmit
        frames = 0
        octets = 0
        partial = q.partial
        while head != tail:
            cmd = d32[4 * head + 2]
            dtyp = cmd & regs.TX_DTYP_MASK
            if dtyp == regs.TX_DTYP_DATA and cmd & regs.TX_CMD_DEXT:
                length = cmd & 0xFFFF
                where = locate(d64[2 * head], length)
                if where is None:
                    q.head = head
                    self._stop(q, False, Fault.BAD_DMA)
                    break
                mem, off = where
                if cmd & regs.TX_CMD_EOP:
                    if partial:
                        partial += mem[off : off + length]
                        frame = bytes(partial)
                        partial.clear()
                    else:
                        frame = bytes(mem[off : off + length])
                    if pad and len(frame) < 60:
                        frame += bytes(60 - len(frame))
                    if tap is None:
                        wire_send(frame)
                    else:
                        tap(frame)
                    frames += 1
                    octets += len(frame) + 4
                else:
                    partial += mem[off : off + length]
            elif dtyp != regs.TX_DTYP_CONTEXT:
                q.head = head
                self._stop(q, False, Fault.BAD_DESCRIPTOR)
                break
            if cmd & regs.TX_CMD_RS:
                d32[4 * head + 3] = regs.TX_STATUS_DD  # write-back: status dword, DD
            head = (head + 1) % size
        else:
            q.head = head
            r[self._i_tdh[q.index]] = head
        if frames:
            c = self.counters
            c[S_GPTC] += frames
            c[regs.SLOT_GOTC] += octets
            c[S_QPTC[q.index]] += frames
            self.faults[Fault.WIRE_TX] += frames
        return frames or 1

    # ------------------------------------------------------------------ RX engine (2.4)
    def _receive_all(self) -> int:
        done = 0
        pb = self.packet_buffer
        while pb:
            result = self._deliver(pb[0])
            if result == 0:
                break
            self.packet_buffer_bytes -= len(pb.popleft())
            done += result > 0
        inbox = self.inbox
        while inbox:
            frame = inbox.popleft()
            if not self._accept(frame):
                continue
            if pb:
                self._no_room(frame)  # keep arrival order behind the buffered frames
            else:
                result = self._deliver(frame)
                if result == 0:
                    self._no_room(frame)
                done += result > 0
        return done

    def _no_room(self, frame: bytes) -> None:
        """No descriptor for ``frame``: drop (DROP_EN) or hold it in the packet buffer."""
        c = self.counters
        if self.regs[regs.SRRCTL(0) >> 2] & regs.SRRCTL_DROP_EN:
            c[S_QPRDC[0]] += 1
            c[S_RNBC0] += 1
        elif self.packet_buffer_bytes + len(frame) <= self.regs[regs.RXPBSIZE(0) >> 2]:
            self.packet_buffer.append(frame)
            self.packet_buffer_bytes += len(frame)
        else:
            c[S_MPC0] += 1

    def _accept(self, frame: bytes) -> bool:
        """RXEN, link, address filter and size checks; counts what it drops."""
        r = self.regs
        if not (self.link_up and r[regs.RXCTRL >> 2] & regs.RXCTRL_RXEN):
            self.faults[Fault.RX_NO_LINK] += 1
            return False
        fctrl = r[regs.FCTRL >> 2]
        dst = frame[:6]
        if dst == _BROADCAST:
            ok = fctrl & regs.FCTRL_BAM
        elif dst[0] & 1:
            ok = fctrl & regs.FCTRL_MPE
        else:
            ok = fctrl & regs.FCTRL_UPE or dst == self._station_address()
        if not ok:
            self.faults[Fault.RX_FILTERED] += 1
            return False
        if not r[regs.HLREG0 >> 2] & regs.HLREG0_JUMBOEN and len(frame) + 4 > (
            r[regs.MAXFRS >> 2] >> 16
        ):
            self.counters[S_ROC] += 1
            return False
        if len(frame) < 60:  # under 64 bytes with the FCS: a runt
            self.counters[S_RUC] += 1
            return False
        return True

    def _station_address(self) -> bytes | None:
        """The unicast address in RAL(0)/RAH(0), None unless RAH.AV (spec 2.3: the RX
        engine reads RAL/RAH; the driver may program another address than the reset one)."""
        r = self.regs
        ral, rah = r[regs.RAL0 >> 2], r[regs.RAH0 >> 2]
        if not rah & regs.RAH_AV:
            return None
        return ral.to_bytes(4, "little") + (rah & 0xFFFF).to_bytes(2, "little")

    def _deliver(self, frame: bytes) -> int:
        """Write ``frame`` into queue 0's ring: 1 done, 0 no free descriptor, -1 lost to a
        DMA fault (the queue stops)."""
        q = self.rxq[0]
        if q is None:
            return 0
        r = self.regs
        tail = r[self._i_rdt[0]]
        if tail >= q.size:
            self._stop(q, True, Fault.TORN_DOORBELL)
            return 0
        data = frame
        if not r[regs.RDRXCTL >> 2] & regs.RDRXCTL_CRCSTRIP:
            data = frame + zlib.crc32(frame).to_bytes(4, "little")
        if (tail - q.head) % q.size < -(-len(data) // q.bsize):
            return 0
        d32, d64 = q.d32, q.d64
        locate = self.window.locate
        head = q.head
        size = q.size
        bsize = q.bsize
        pos = 0
        total = len(data)
        while pos < total:
            chunk = min(bsize, total - pos)
            where = locate(d64[2 * head], chunk)
            if where is None:
                q.head = head
                self._stop(q, True, Fault.BAD_DMA)
                return -1
            mem, off = where
            mem[off : off + chunk] = data if chunk == total else data[pos : pos + chunk]
            pos += chunk
            # store order (spec 2.2): data, then length and lower words, then status
            d32[4 * head + 3] = chunk  # length (VLAN tag 0)
            d64[2 * head] = 0
            d32[4 * head + 2] = regs.RX_STATUS_DD | (regs.RX_STATUS_EOP if pos >= total else 0)
            head = (head + 1) % size
        q.head = head
        r[self._i_rdh[0]] = head
        c = self.counters
        c[S_GPRC] += 1
        c[regs.SLOT_GORC] += len(frame) + 4
        c[S_QPRC[0]] += 1
        return 1

    def _poke_driver(self) -> None:
        if self._poke_driver_fd < 0:
            try:
                self._poke_driver_fd = os.open(self._driver_fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                return
        try:
            os.write(self._poke_driver_fd, b"\0")
        except BlockingIOError:
            pass
        except OSError:
            os.close(self._poke_driver_fd)
            self._poke_driver_fd = -1

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        for queues in (self.rxq, self.txq):
            for q in queues:
                if q is not None:
                    q.release()
        self.rxq = [None] * self.num_queues
        self.txq = [None] * self.num_queues
        self.control.words[ctl.W_STATE] = ctl.STATE_STOPPED
        self.control.words[ctl.W_LINK_UP] = 0
        if self._poke_driver_fd >= 0:
            os.close(self._poke_driver_fd)
            self._poke_driver_fd = -1
        self.regs.release()
        self.bar.release()
        self._bar_mm.close()
