"""The software 82599: a register file, RX and TX DMA engines, and a wire.

Theory of operation
-------------------
Spec nicdriver.md 2. Register writes are plain stores into a shared file (no trap), so the
model *polls*: :meth:`IxgbeModel.step` looks at the few registers whose changes mean
something and does the device's share of the work. A host loop
(:mod:`capsvc.nicdriver.modelhost`) calls ``step`` on its models, in a thread or in a
process of its own; tests and benchmarks may call it directly for determinism.

The model is *strict* where a driver's correctness depends on device behaviour that plain
shared memory would not show (issue 14); each point below names what a sloppy driver
would get away with otherwise.

What one ``step`` does:

1. Control (spec 2.3). CTRL.RST or LNK_RST seen set starts a reset that *takes time*
   (datasheet 4.6.3.2): every register goes to its default at once (else 0; all queue state
   dropped; SRRCTL's reset value, DCA_RXCTRL bit 12, LINKS = 0), but the RST bits stay set
   for ``reset_delay`` (default 1 ms) and the model does nothing else meanwhile; then CTRL
   is cleared (last, so the driver's wait cannot overtake the reset). The EEPROM auto-read
   completes ``eeprom_delay`` after that (EEC.ARD set, EEC.PRES is set throughout, and
   RAL/RAH(0) get the MAC with Address Valid: a driver that reads the MAC before ARD sees
   0) and the DMA init ``dma_init_delay`` after it (RDRXCTL.DMAIDONE), so a driver that
   reads too early sees 0. The model's own start is an immediate reset with all of this
   done. AUTOC.AN_RESTART self-clears and starts the link timer: the link comes up
   ``link_delay`` later if the wire has carrier (LINKS = LINK_UP | 10G | KX_AN_COMP) and
   goes down with the carrier.
2. Queue enables (datasheet 4.6.7.1, 4.6.8.1). The BAR word RXDCTL(n)/TXDCTL(n) holds what
   the driver wrote; its ENABLE is a *request*. The device's ENABLE is a bit per queue in
   the control file that only the model writes, and the model-side accessors
   (:class:`~capsvc.nicdriver.mmio.ModelBar`, the co-located bar) read it in place of the
   stored bit. A request (a change of the stored bit, or any accessor write of the
   register, counted in the control file) is acted on between steps: rising latches the
   ring (base BAL | BAH << 32, LEN / 16 entries; base 128-byte aligned, LEN a non-zero
   multiple of 128, the whole ring inside registered DMA memory of one page, else a
   ``bad_ring`` fault and the bit stays 0, so the driver's wait times out naming the
   register) and, for RX, SRRCTL (buffer size, DROP_EN; anything but advanced one-buffer
   descriptors is a ``bad_descriptor`` fault); only then does the bit read 1. Falling
   stops the queue and clears the bit, which therefore reads 1 until the DMA of the step
   that was running when the driver wrote 0 is complete (4.6.7.1.2: ENABLE clears only
   after pending memory accesses): a driver must poll it to read 0 before it frees the
   ring or the buffers. A queue the model stops itself (a DMA fault, a torn doorbell)
   reads 0 too; writing ENABLE again re-latches it. Two more handshakes of the stop and
   init sequences: CTRL.GIO_MASTER_DISABLE (datasheet 5.2.5.3.2) stops all DMA from the
   next step on (queue enables still latch and stop; frames wait on the wire) and then
   clears STATUS.GIO_MASTER_ENABLE (set again by a reset or when the bit is cleared),
   and SECRXSTAT.SECRX_RDY follows SECRXCTRL.RX_DIS (4.6.7: the RX security path is idle
   between steps).
3. Descriptor fetch. When a tail register (RDT/TDT, a level: only the latest value
   matters) has moved past descriptors, the model copies them (the device's descriptor
   cache) and from then on works from that copy, like the 82599's prefetch: a descriptor
   the driver changes after its doorbell is not seen. When the model uses a fetched
   descriptor and finds the ring no longer holds what it fetched, it counts a
   ``late_descriptor`` fault (always checked for RX at write-back; for TX when the
   descriptors waited, e.g. while the link was down or TE off: fetched and sent in the
   same step leaves no window to see). A tail outside its ring counts ``torn_doorbell``
   (the torn-write check of spec 4.2) and stops the queue.
4. TX (spec 2.5), for every enabled queue while DMATXCTL.TE and the link is up: from the
   model's head to the fetched tail, gather each data descriptor's bytes (DTYP 0011b with
   DEXT; context descriptors are consumed), a frame ends at EOP; pad to 60 bytes under
   HLREG0.TXPADEN; put it on the wire; with RS, write back the descriptor as the 82599
   does in advanced format: bytes 0-11 zeroed (reserved, NXTSEQ_SEED), then the status
   dword with DD as the last store, so the buffer address does not survive completion;
   then TDH. Counts GPTC, GOTC (+4 per frame for the FCS), QPTC.
5. RX (spec 2.4) for each frame from the wire: drop unless RXCTRL.RXEN and link up;
   HLREG0.RXCRCSTRP and RDRXCTL.CRCSTRIP must agree (the datasheet requires it): while
   they differ, frames are dropped and each counts ``crc_strip_mismatch``; the address
   filter (broadcast needs BAM, multicast MPE, unicast a match with RAL/RAH(0) or UPE);
   MAC errors: a bad FCS (``inject(frame, bad_crc=True)``) counts CRCERRS, a frame longer
   than the maximum counts ROC, one under 64 bytes with the FCS RUC. The maximum is
   MAXFRS.MFS (bits 31:16, FCS included) only when HLREG0.JUMBOEN is set, else the
   hard-wired 1518; a VLAN-tagged frame (TPID 0x8100) may be 4 bytes longer. A frame with
   a MAC error is dropped unless FCTRL.SBP (store bad packets) is set; then it is written
   with the RXE error bit (bit 29 of the status/error dword, on the EOP descriptor), so
   the driver's drop path runs. Queue 0. No free descriptor (head == fetched tail, or not
   enough for the frame): with SRRCTL.DROP_EN drop and count QPRDC and RNBC, else hold the
   frame in a packet buffer of RXPBSIZE(0) bytes and count MPC when that is full.
   Otherwise copy the frame into the buffer of the fetched descriptor (appending a CRC-32
   if CRC stripping is off; a wrong one for a bad-FCS frame), split over further slots if
   it exceeds the buffer size (EOP on the last), write back the length, zero the lower
   words, then the status dword DD|EOP as one 4-byte store, and RDH after the write-back
   (spec 2.2's store order). Counts GPRC, GORC, QPRC (errored frames only QPRC).

DMA checks. Every DMA address goes through a window (:mod:`capsvc.nicdriver.dma`). An
address outside every known page (e.g. the 0xFF ring fill of spec 1.2) counts ``bad_dma``;
an access that is inside a page but not inside memory the driver currently has registered
with its DMA backend (past the end of a pool's last buffer, or memory freed at close)
counts ``dma_violation``. Both are recorded in :attr:`IxgbeModel.dma_violations` (what,
queue, address, length, reason), the access does not happen (an IOMMU would block it) and
the queue stops, like a real device's DMA error. When the driver's registrations change
(the control file's DMA generation), the model first re-reads the queue enables (a driver
that disabled a queue before freeing its ring is fine) and then checks every ring still
enabled: a freed ring of an enabled queue is a violation too, since the device may write
back into it at any time.

Statistics are monotonic 64-bit totals in the control file; the driver's
:class:`~capsvc.nicdriver.mmio.ModelBar` turns them back into clear-on-read registers, a
read by any accessor clearing them for all. The model never writes a register the driver
read-modify-writes except the self-clearing bits the driver is waiting on (spec 2.3, last
point): the queue-enable state lives outside the BAR for that reason.

Hosts call ``step`` often, so its common case is cheap: the queue-enable check compares
the accessors' write count and all RXDCTL/TXDCTL words at once (two strided copies) and
walks the queues only when one changed; the other new checks are one word or one register
compare each. A host that sees every register write itself (the co-located accessor) calls
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
from dataclasses import dataclass
from pathlib import Path

from capsvc.nicdriver import control as ctl
from capsvc.nicdriver import regs
from capsvc.nicdriver.control import Control, Fault
from capsvc.nicdriver.dma import DmaWindow, HugepageWindow
from capsvc.nicdriver.link import Wire

__all__ = ["DmaViolation", "IxgbeModel"]

_BROADCAST = b"\xff" * 6
_VLAN_TPID = b"\x81\x00"
_ZERO_BAR = bytes(regs.BAR0_SIZE)
_ENABLE = regs.RXDCTL_ENABLE
_RSTS = regs.CTRL_RST_MASK
_FCTRL_SBP = 1 << 1  # store bad packets (ixgbe_type.h IXGBE_FCTRL_SBP)
# master disable [datasheet 5.2.5.3.2] and the RX security-path handshake [4.6.7]
# (ixgbe_type.h values; private here so the model does not depend on newer regs.py names)
_CTRL_GIO_MASTER_DISABLE = 1 << 2
_STATUS = 0x00008
_STATUS_GIO_MASTER_ENABLE = 1 << 19
_CTRL_SLOW = _RSTS | _CTRL_GIO_MASTER_DISABLE
_SECRXCTRL = 0x08D00
_SECRXCTRL_RX_DIS = 1 << 1
_SECRXSTAT = 0x08D04
_SECRXSTAT_SECRX_RDY = 1 << 0
_MAX_STD_FRAME = 1518  # with FCS, when HLREG0.JUMBOEN is clear (MAXFRS is then ignored)
# HLREG0.RXCRCSTRP and RDRXCTL.CRCSTRIP are the same bit (1) of their registers
_STRIP_BIT = regs.HLREG0_RXCRCSTRP
assert _STRIP_BIT == regs.RDRXCTL_CRCSTRIP
_C = {offset: slot for offset, slot in regs.COUNTER_SLOT.items()}
S_GPRC = _C[regs.GPRC]
S_GPTC = _C[regs.GPTC]
S_CRCERRS = _C[regs.CRCERRS]
S_ROC = _C[regs.ROC]
S_RUC = _C[regs.RUC]
S_MPC0 = _C[regs.MPC(0)]
S_RNBC0 = _C[regs.RNBC(0)]
S_QPRC = [_C[regs.QPRC(i)] for i in range(regs.MODEL_QUEUES)]
S_QPTC = [_C[regs.QPTC(i)] for i in range(regs.MODEL_QUEUES)]
S_QPRDC = [_C[regs.QPRDC(i)] for i in range(regs.MODEL_QUEUES)]
# timed reset events
_EV_RESET_DONE, _EV_EEPROM, _EV_DMA_INIT = range(3)
# control-file words and register indexes read on every step (module constants: cheaper
# than attribute chains in the hot path)
_W_QCTL_WRITES = ctl.W_QCTL_WRITES
_W_DMA_GEN = ctl.W_DMA_GEN
_W_DRIVER_SLEEPING = ctl.W_DRIVER_SLEEPING
_I_SECRXCTRL = _SECRXCTRL >> 2
_I_AUTOC = regs.AUTOC >> 2
_I_DMATXCTL = regs.DMATXCTL >> 2
_I_RDRXCTL = regs.RDRXCTL >> 2
_I_RXCTRL = regs.RXCTRL >> 2
_I_HLREG0 = regs.HLREG0 >> 2
_I_FCTRL = regs.FCTRL >> 2
_I_MAXFRS = regs.MAXFRS >> 2
_RXEN = regs.RXCTRL_RXEN
_JUMBOEN = regs.HLREG0_JUMBOEN
_BAM, _MPE, _UPE = regs.FCTRL_BAM, regs.FCTRL_MPE, regs.FCTRL_UPE
_DD_EOP = regs.RX_STATUS_DD | regs.RX_STATUS_EOP
_SLOT_GORC = regs.SLOT_GORC
_S_QPRC0 = S_QPRC[0]


class _BadCrcFrame(bytes):
    """A frame from :meth:`IxgbeModel.inject` whose FCS is wrong."""


class _RxeFrame(bytes):
    """A frame with a MAC error that FCTRL.SBP lets through: written back with RXE."""

    bad_crc = False


@dataclass(frozen=True)
class DmaViolation:
    """One refused device access (see the module docstring, DMA checks)."""

    what: str  # "rx buffer", "rx ring", "tx buffer", "tx ring"
    queue: int
    phys: int
    length: int
    registry: bool  # inside a known page but outside the driver's registered memory
    reason: str


class _Queue:
    """Latched state of one enabled queue, with its fetched descriptors."""

    def __init__(
        self, index: int, size: int, mem: memoryview, offset: int, phys: int, i_tail: int
    ) -> None:
        self.index = index
        self.size = size
        self.phys = phys
        self.nbytes = size * regs.DESC_SIZE
        ring = mem[offset : offset + self.nbytes]
        self.ring = ring  # live descriptors (host memory)
        self.d32 = ring.cast("I")
        self.d64 = ring.cast("Q")
        # the device's copy of the descriptors it fetched (slots head..tail)
        self.s8 = memoryview(bytearray(self.nbytes))
        self.s32 = self.s8.cast("I")
        self.s64 = self.s8.cast("Q")
        self.i_tail = i_tail  # register index of RDT/TDT
        self.head = 0
        self.tail = 0  # fetched up to here (exclusive): the tail as last seen
        self.held = False  # TX: fetched descriptors waited for a later step
        self.bsize = 2048  # RX: buffer size from SRRCTL
        self.drop_en = False  # RX: SRRCTL.DROP_EN
        self.partial = bytearray()  # TX: frame gathered so far (before EOP)

    def fetch(self, tail: int) -> None:
        """Copy the descriptors from the last fetched tail up to ``tail``."""
        a, b = 16 * self.tail, 16 * tail
        if b > a:
            self.s8[a:b] = self.ring[a:b]
        else:
            self.s8[a:] = self.ring[a:]
            if b:
                self.s8[:b] = self.ring[:b]
        self.tail = tail

    def late_slots(self) -> list[int]:
        """Fetched slots (head..tail) whose descriptor in memory differs from the copy."""
        head, tail = self.head, self.tail
        spans = [(head, tail)] if head <= tail else [(head, self.size), (0, tail)]
        found: list[int] = []
        for a, b in spans:
            if bytes(self.ring[16 * a : 16 * b]) != bytes(self.s8[16 * a : 16 * b]):
                d64, s64 = self.d64, self.s64
                found += [
                    k
                    for k in range(a, b)
                    if d64[2 * k] != s64[2 * k] or d64[2 * k + 1] != s64[2 * k + 1]
                ]
        return found

    def release(self) -> None:
        self.size = 0  # marks a stopped queue for loops that still hold it
        for view in (self.d32, self.d64, self.ring, self.s32, self.s64, self.s8):
            view.release()


class IxgbeModel:
    """One modelled 82599 port over a BAR file, a control file and a DMA window.

    ``reset_delay``: how long CTRL.RST stays set after the driver sets it;
    ``eeprom_delay``/``dma_init_delay``: when, after the reset completed, EEC.ARD and
    RDRXCTL.DMAIDONE become set (seconds; attributes of the same names may be changed).
    """

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
        reset_delay: float = 0.001,
        eeprom_delay: float = 0.001,
        dma_init_delay: float = 0.002,
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
        self.reset_delay = reset_delay
        self.eeprom_delay = eeprom_delay
        self.dma_init_delay = dma_init_delay
        self.counters = control.counters
        self.faults = control.faults
        self.inbox: deque[bytes] = deque()  # frames from the wire, not yet processed
        self.packet_buffer: deque[bytes] = deque()  # frames waiting for descriptors
        self.packet_buffer_bytes = 0
        self.rxq: list[_Queue | None] = [None] * num_queues
        self.txq: list[_Queue | None] = [None] * num_queues
        # the latched queues of rxq/txq, rebuilt when one latches or stops (a loop over
        # them stays valid: it holds the old tuple and skips a queue that stopped)
        self._rx_live: tuple[_Queue, ...] = ()
        self._tx_live: tuple[_Queue, ...] = ()
        self._words = control.words
        self.dma_violations: deque[DmaViolation] = deque(maxlen=1024)
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
        self._ctl_seen: tuple[int, list[int], list[int]] | None = None
        # queue-enable requests as last acted on: stored bit and accessor write count
        self._rx_req = [0] * num_queues
        self._tx_req = [0] * num_queues
        self._rx_gen = [0] * num_queues
        self._tx_gen = [0] * num_queues
        self._rx_on = 0  # the device's ENABLE bits (mirror of the control words)
        self._tx_on = 0
        self._dma_gen = 0
        self._in_reset = False
        self._master_off = False  # CTRL.GIO_MASTER_DISABLE seen: no DMA
        self._secrx_dis = 0  # SECRXCTRL.RX_DIS as last seen
        self._boot: list[tuple[float, int]] = []  # pending timed reset events
        self._boot_at: float | None = None  # the earliest of them
        self.reset()

    # ------------------------------------------------------------------ public API
    def pause(self) -> None:
        self._paused = True
        self.control.words[ctl.W_STATE] = ctl.STATE_PAUSED

    def resume(self) -> None:
        self._paused = False
        self.control.words[ctl.W_STATE] = ctl.STATE_RUNNING

    def inject(self, frame: bytes, *, bad_crc: bool = False) -> None:
        """Deliver ``frame`` as if it had come from the wire (processed by the next step).

        ``bad_crc``: the frame arrives with a wrong FCS (counted in CRCERRS; dropped by the
        MAC unless FCTRL.SBP, then written back with the RXE error bit).
        """
        self.inbox.append(_BadCrcFrame(frame) if bad_crc else bytes(frame))

    def fault_counts(self) -> dict[str, int]:
        return self.control.fault_dict()

    def counter(self, offset: int) -> int:
        """The monotonic total of the counter at register ``offset``."""
        return int(self.counters[regs.COUNTER_SLOT[offset]])

    def next_deadline(self) -> float | None:
        """When this model has timed work (the reset, the link timer, held frames)."""
        best = self.wire.next_deadline()  # asked on every pass of a poll loop: no list
        if self._an_deadline is not None and (best is None or self._an_deadline < best):
            best = self._an_deadline
        if self._boot_at is not None and (best is None or self._boot_at < best):
            best = self._boot_at
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
        if r[0] & _CTRL_SLOW or self._boot_at is not None or self._master_off:
            busy = self._control()
            if busy is not None:
                return busy  # in reset: the device does nothing else
        if r[_I_SECRXCTRL] & _SECRXCTRL_RX_DIS != self._secrx_dis:
            self._secrx_handshake()
        work = 0
        if r[_I_AUTOC] & regs.AUTOC_AN_RESTART or self._an_deadline is not None:
            self._link_state()
        elif self.link_up and not self.wire.carrier():
            self._set_link(False)
        words = self._words
        # queue enables: the accessors' write count (read first: they store the register,
        # then count) and all RXDCTL/TXDCTL words at once (two strided copies); the queues
        # are walked only when something changed since the last walk
        seen = (words[_W_QCTL_WRITES], r[self._rxdctl_cols].tolist(), r[self._txdctl_cols].tolist())
        if seen != self._ctl_seen:
            # remember what the walk is based on, not what it leaves: a driver write during
            # the walk (another process) then differs at the next step, which walks again
            self._ctl_seen = seen
            self._queue_walk()
        if words[_W_DMA_GEN] != self._dma_gen:
            self._revalidate()
        if self._master_off:
            return work  # GIO master disable: no DMA (queues still stop and start)
        wire = self.wire
        if wire.next_deadline() is not None:
            wire.poll(time.monotonic())
        for q in self._rx_live:  # descriptor fetch for the RX tails that moved
            if r[q.i_tail] != q.tail and q.size:
                self._fetch(q, True)
        if self._tx_live:
            work += self.transmit_pending()
        frames = wire.receive()
        if frames:
            self.faults[Fault.WIRE_RX] += len(frames)
            self.inbox.extend(frames)
        if self.inbox or self.packet_buffer:
            received = self._receive_all()
            if received:
                work += received
                if words[_W_DRIVER_SLEEPING]:
                    self._poke_driver()
        return work

    def receive_pending(self) -> int:
        """The RX half of :meth:`step`, for a host that sees every register write itself
        (the co-located accessor steps the model on each write): control and queue-enable
        changes cannot be pending, so only the wire and its timers need a look. Falls back
        to :meth:`step` while the link trains, a reset runs, the carrier is lost or the
        driver's DMA registrations changed."""
        if self._paused:
            return 0
        wire = self.wire
        if (
            self._an_deadline is not None
            or self._boot_at is not None
            or self._master_off
            or (self.link_up and not wire.carrier())
            or self._words[_W_DMA_GEN] != self._dma_gen
        ):
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
        if received and self._words[_W_DRIVER_SLEEPING]:
            self._poke_driver()
        return received

    def _receive_frames(self, frames: list[bytes]) -> int:
        """:meth:`_receive_all` for frames with nothing queued ahead of them."""
        done = 0
        for i, arrived in enumerate(frames):
            frame = self._accept(arrived)
            if frame is None:
                continue
            result = self._deliver(frame)
            if result == 0:  # out of descriptors: the rest waits in order, as usual
                self._no_room(frame)
                self.inbox.extend(frames[i + 1 :])
                return done + self._receive_all()
            done += result > 0
        return done

    def transmit_pending(self) -> int:
        """Only the TX engines (the part of :meth:`step` a TX doorbell asks for): fetch
        the descriptors a moved tail gave, send them while TE and the link are up."""
        if self._paused or self._master_off:
            return 0
        r = self.regs
        work = 0
        go = self.link_up and r[_I_DMATXCTL] & regs.DMATXCTL_TE
        for q in self._tx_live:
            if not q.size:
                continue  # stopped meanwhile
            if r[q.i_tail] != q.tail:
                if q.head != q.tail:
                    q.held = True  # earlier descriptors waited: check them when sent
                if not self._fetch(q, False):
                    continue
                work += 1
            if q.head != q.tail:
                if go:
                    work += self._transmit(q)
                else:
                    q.held = True
        return work

    # ------------------------------------------------------------------ control (2.3)
    def _control(self) -> int | None:
        """CTRL.RST/LNK_RST, the timed reset and GIO master disable: a work count when
        the device must do nothing else this step (reset), None when the step goes on
        (with ``_master_off`` set while master disable holds: no DMA)."""
        r = self.regs
        ctrl = r[0]
        if ctrl & _RSTS and not self._in_reset:
            self._begin_reset()
            return 1
        if self._boot_at is not None and self._boot_events():
            return 0  # in reset: the device does nothing else
        if ctrl & _CTRL_GIO_MASTER_DISABLE:
            # 5.2.5.3.2: no new master requests; STATUS.GIO_MASTER_ENABLE reads 0 once
            # none is pending, i.e. after the DMA of the previous step
            if not self._master_off:
                self._master_off = True
                r[_STATUS >> 2] = r[_STATUS >> 2] & ~_STATUS_GIO_MASTER_ENABLE
            return None
        if self._master_off:  # master disable cleared without a reset
            self._master_off = False
            r[_STATUS >> 2] = r[_STATUS >> 2] | _STATUS_GIO_MASTER_ENABLE
        return None

    def _secrx_handshake(self) -> None:
        """SECRXCTRL.RX_DIS changed: SECRXSTAT.SECRX_RDY follows it (the model's RX
        security path is empty between steps, so it is ready at once)."""
        r = self.regs
        self._secrx_dis = r[_SECRXCTRL >> 2] & _SECRXCTRL_RX_DIS
        rdy = _SECRXSTAT_SECRX_RDY if self._secrx_dis else 0
        r[_SECRXSTAT >> 2] = (r[_SECRXSTAT >> 2] & ~_SECRXSTAT_SECRX_RDY) | rdy

    # ------------------------------------------------------------------ reset (2.3)
    def reset(self) -> None:
        """Immediate device reset (the model's power-on): defaults, queue state dropped,
        EEPROM auto-read and DMA init done, RST bits cleared last."""
        self._reset_registers()
        self._boot.clear()
        self._boot_at = None
        self._eeprom_loaded()
        self._dma_init_done()
        self._in_reset = False
        self.regs[0] = 0  # CTRL last: the driver's wait ends only now

    def _begin_reset(self) -> None:
        """CTRL.RST seen: defaults now, RST cleared ``reset_delay`` later (4.6.3.2)."""
        self._reset_registers()
        self._in_reset = True
        self._boot[:] = [(time.monotonic() + self.reset_delay, _EV_RESET_DONE)]
        self._boot_at = self._boot[0][0]

    def _boot_events(self) -> bool:
        """Run the timed reset events that are due; True while the reset itself runs."""
        now = time.monotonic()
        boot = self._boot
        while boot and boot[0][0] <= now:
            _, event = boot.pop(0)
            if event == _EV_RESET_DONE:
                self._in_reset = False
                self.regs[0] = 0  # CTRL last: the driver's wait ends only now
                boot.append((now + self.eeprom_delay, _EV_EEPROM))
                boot.append((now + self.dma_init_delay, _EV_DMA_INIT))
                boot.sort()
            elif event == _EV_EEPROM:
                self._eeprom_loaded()
            else:
                self._dma_init_done()
        self._boot_at = boot[0][0] if boot else None
        return self._in_reset

    def _eeprom_loaded(self) -> None:
        """EEPROM auto-read done: the MAC in RAL/RAH(0), then EEC.ARD."""
        r = self.regs
        r[regs.RAL0 >> 2] = int.from_bytes(self.mac[:4], "little")
        r[regs.RAH0 >> 2] = int.from_bytes(self.mac[4:], "little") | regs.RAH_AV
        r[regs.EEC >> 2] = r[regs.EEC >> 2] | regs.EEC_ARD | regs.EEC_PRES

    def _dma_init_done(self) -> None:
        r = self.regs
        r[regs.RDRXCTL >> 2] = r[regs.RDRXCTL >> 2] | regs.RDRXCTL_DMAIDONE

    def _reset_registers(self) -> None:
        """Every register but CTRL to its default (auto-read and DMA init not yet done)."""
        r = self.regs
        for queues in (self.rxq, self.txq):
            for i, q in enumerate(queues):
                if q is not None:
                    q.release()
                    queues[i] = None
        self.packet_buffer.clear()
        self.packet_buffer_bytes = 0
        self.bar[4:] = _ZERO_BAR[4:]  # everything but CTRL
        r[regs.EEC >> 2] = regs.EEC_PRES
        r[regs.RXPBSIZE(0) >> 2] = regs.RXPBSIZE_DEFAULT
        r[regs.TXPBSIZE(0) >> 2] = regs.TXPBSIZE_DEFAULT
        r[regs.MAXFRS >> 2] = regs.MAXFRS_DEFAULT
        for n in range(self.num_queues):
            r[regs.DCA_RXCTRL(n) >> 2] = regs.DCA_RXCTRL_BIT12
            r[regs.SRRCTL(n) >> 2] = regs.SRRCTL_DEFAULT
        r[regs.LINKS >> 2] = 0
        r[_STATUS >> 2] = _STATUS_GIO_MASTER_ENABLE
        self._master_off = False
        self._secrx_dis = 0
        w = self.control.words
        self._rx_on = self._tx_on = 0
        w[ctl.W_RXQ_ENABLED] = w[ctl.W_TXQ_ENABLED] = 0
        self._rx_live = self._tx_live = ()
        nq = self.num_queues
        self._rx_req = [0] * nq
        self._tx_req = [0] * nq
        self._rx_gen = w[ctl.W_QGEN_RX : ctl.W_QGEN_RX + nq].tolist()
        self._tx_gen = w[ctl.W_QGEN_TX : ctl.W_QGEN_TX + nq].tolist()
        self._ctl_seen = None
        self._dma_gen = int(w[ctl.W_DMA_GEN])
        self.link_up = False
        w[ctl.W_LINK_UP] = 0
        self._an_deadline = None
        # statistics restart from zero for the driver
        self.control.counter_base[:] = self.control.counters
        if isinstance(self.window, HugepageWindow):
            self.window.attach(int(w[ctl.W_DRIVER_PID]))
        self.faults[Fault.RESETS] += 1

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
    def _queue_walk(self) -> None:
        r = self.regs
        w = self.control.words
        nq = self.num_queues
        rx_gens = w[ctl.W_QGEN_RX : ctl.W_QGEN_RX + nq].tolist()
        tx_gens = w[ctl.W_QGEN_TX : ctl.W_QGEN_TX + nq].tolist()
        rxq, txq = self.rxq, self.txq
        for q in range(nq):
            req = r[self._i_rxdctl[q]] & _ENABLE
            if req != self._rx_req[q] or rx_gens[q] != self._rx_gen[q]:
                self._rx_req[q] = req
                self._rx_gen[q] = rx_gens[q]
                self._follow_request(q, req, rxq, rx=True)
            req = r[self._i_txdctl[q]] & _ENABLE
            if req != self._tx_req[q] or tx_gens[q] != self._tx_gen[q]:
                self._tx_req[q] = req
                self._tx_gen[q] = tx_gens[q]
                self._follow_request(q, req, txq, rx=False)

    def _follow_request(self, q: int, req: int, queues: list[_Queue | None], *, rx: bool) -> None:
        """The driver's ENABLE request of queue ``q`` changed (or was written again):
        latch the ring and set the device's bit, or stop the queue."""
        queue = queues[q]
        if req and queue is None:
            queue = self._latch(q, rx=rx)
            if queue is not None:
                queues[q] = queue
                self._set_enabled(q, rx, True)
        elif not req and queue is not None:
            self._drop(queue, rx)

    def _set_enabled(self, q: int, rx: bool, on: bool) -> None:
        """The device's ENABLE bit of queue ``q`` (what the accessors read)."""
        w = self.control.words
        if rx:
            self._rx_on = self._rx_on | (1 << q) if on else self._rx_on & ~(1 << q)
            w[ctl.W_RXQ_ENABLED] = self._rx_on
            self._rx_live = tuple(x for x in self.rxq if x is not None)
        else:
            self._tx_on = self._tx_on | (1 << q) if on else self._tx_on & ~(1 << q)
            w[ctl.W_TXQ_ENABLED] = self._tx_on
            self._tx_live = tuple(x for x in self.txq if x is not None)

    def _drop(self, queue: _Queue, rx: bool) -> None:
        """Stop a queue (after any DMA of the current step): its ENABLE then reads 0."""
        index = queue.index
        (self.rxq if rx else self.txq)[index] = None
        queue.release()
        self._set_enabled(index, rx, False)

    def _latch(self, q: int, *, rx: bool) -> _Queue | None:
        r = self.regs
        if rx:
            bal, bah, dlen = regs.RDBAL(q), regs.RDBAH(q), regs.RDLEN(q)
        else:
            bal, bah, dlen = regs.TDBAL(q), regs.TDBAH(q), regs.TDLEN(q)
        base = r[bal >> 2] | (r[bah >> 2] << 32)
        length = r[dlen >> 2]
        if base % 128 or length == 0 or length % 128:
            self.faults[Fault.BAD_RING] += 1
            return None
        where = self.window.locate(base, length)
        if where is None:
            registry, reason = self.window.why(base, length)
            what = "rx ring" if rx else "tx ring"
            self.dma_violations.append(DmaViolation(what, q, base, length, registry, reason))
            self.faults[Fault.BAD_RING] += 1
            return None
        i_tail = self._i_rdt[q] if rx else self._i_tdt[q]
        queue = _Queue(q, length // regs.DESC_SIZE, where[0], where[1], base, i_tail)
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
        queue.tail = queue.head  # nothing fetched yet: the next look at the tail fetches
        return queue

    def _stop(self, queue: _Queue, rx: bool, fault: int) -> None:
        """The device drops a queue on an error (its ENABLE reads 0)."""
        self.faults[fault] += 1
        self._drop(queue, rx)

    def _fetch(self, q: _Queue, rx: bool) -> bool:
        """The tail moved: fetch the descriptors it gave (False: torn, queue stopped)."""
        tail = self.regs[q.i_tail]
        if tail >= q.size:
            self._stop(q, rx, Fault.TORN_DOORBELL)
            return False
        q.fetch(tail)
        return True

    def _dma_fault(self, q: _Queue, rx: bool, what: str, phys: int, length: int) -> None:
        """A refused access: record it, count it, stop the queue."""
        registry, reason = self.window.why(phys, length)
        self.dma_violations.append(DmaViolation(what, q.index, phys, length, registry, reason))
        self._stop(q, rx, Fault.DMA_VIOLATION if registry else Fault.BAD_DMA)

    def _revalidate(self) -> None:
        """The driver's DMA registrations changed: its enables first (a queue disabled
        before its memory was freed is fine), then every ring still enabled."""
        self._dma_gen = int(self.control.words[ctl.W_DMA_GEN])
        self._ctl_seen = None
        self._queue_walk()
        for rx, queues in ((True, self.rxq), (False, self.txq)):
            for q in queues:
                if q is not None and self.window.locate(q.phys, q.nbytes) is None:
                    self._dma_fault(q, rx, "rx ring" if rx else "tx ring", q.phys, q.nbytes)

    # ------------------------------------------------------------------ TX engine (2.5)
    def _transmit(self, q: _Queue) -> int:
        r = self.regs
        if q.held:  # fetched in an earlier step: has the driver touched them since?
            q.held = False
            late = q.late_slots()
            if late:
                self.faults[Fault.LATE_DESCRIPTOR] += len(late)
        s32, s64 = q.s32, q.s64  # what the device fetched
        d32, d64 = q.d32, q.d64  # the ring in host memory (write-back)
        locate = self.window.locate
        head = q.head
        tail = q.tail
        size = q.size
        pad = r[regs.HLREG0 >> 2] & regs.HLREG0_TXPADEN
        wire_send = self.wire.send
        tap = self.on_transmit
        frames = 0
        octets = 0
        partial = q.partial
        while head != tail:
            cmd = s32[4 * head + 2]
            dtyp = cmd & regs.TX_DTYP_MASK
            if dtyp == regs.TX_DTYP_DATA and cmd & regs.TX_CMD_DEXT:
                length = cmd & 0xFFFF
                address = s64[2 * head]
                where = locate(address, length)
                if where is None:
                    q.head = head
                    self._dma_fault(q, False, "tx buffer", address, length)
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
                # advanced write-back: bytes 0-7 reserved and 8-11 NXTSEQ_SEED zeroed,
                # then the status dword with DD (the last store)
                d64[2 * head] = 0
                d32[4 * head + 2] = 0
                d32[4 * head + 3] = regs.TX_STATUS_DD
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
            frame = self._accept(inbox.popleft())
            if frame is None:
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

    def _accept(self, frame: bytes) -> bytes | None:
        """RXEN, CRC-strip agreement, address filter, MAC errors: the frame to write
        (an :class:`_RxeFrame` for one with an error that FCTRL.SBP keeps), or None."""
        r = self.regs
        if not (self.link_up and r[_I_RXCTRL] & _RXEN):
            self.faults[Fault.RX_NO_LINK] += 1
            return None
        hlreg0 = r[_I_HLREG0]
        if (hlreg0 ^ r[_I_RDRXCTL]) & _STRIP_BIT:
            # the datasheet requires RDRXCTL.CRCSTRIP == HLREG0.RXCRCSTRP: refuse RX
            self.faults[Fault.CRC_STRIP_MISMATCH] += 1
            return None
        fctrl = r[_I_FCTRL]
        dst = frame[:6]
        if dst == _BROADCAST:
            ok = fctrl & _BAM
        elif dst[0] & 1:
            ok = fctrl & _MPE
        else:
            ok = fctrl & _UPE or dst == self._station_address()
        if not ok:
            self.faults[Fault.RX_FILTERED] += 1
            return None
        size = len(frame) + 4  # with the FCS
        limit = r[_I_MAXFRS] >> 16 if hlreg0 & _JUMBOEN else _MAX_STD_FRAME
        if size > limit or size < 64 or frame.__class__ is not bytes:
            return self._mac_error(frame, size, limit, fctrl)
        return frame

    def _mac_error(self, frame: bytes, size: int, limit: int, fctrl: int) -> bytes | None:
        """The slow part of :meth:`_accept`: FCS, oversize (VLAN +4), runts; SBP."""
        bad_crc = frame.__class__ is _BadCrcFrame
        c = self.counters
        if bad_crc:
            c[S_CRCERRS] += 1
        elif size > limit:
            if size <= limit + 4 and frame[12:14] == _VLAN_TPID:
                return bytes(frame)  # a VLAN tag may add 4 bytes to the maximum
            c[S_ROC] += 1
        elif size < 64:  # under 64 bytes with the FCS: a runt
            c[S_RUC] += 1
        else:
            return bytes(frame)
        if not fctrl & _FCTRL_SBP:
            return None  # the MAC drops bad frames unless asked to store them
        posted = _RxeFrame(frame)
        posted.bad_crc = bad_crc
        return posted

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
        DMA fault (the queue stops). The common case (a good frame, CRC stripped, one
        buffer) is straight-line code; everything else takes :meth:`_deliver_slow`."""
        q = self.rxq[0]
        if q is None:
            return 0
        r = self.regs
        if r[q.i_tail] != q.tail and not self._fetch(q, True):
            return 0
        n = len(frame)
        if n > q.bsize or frame.__class__ is not bytes or not r[_I_RDRXCTL] & regs.RDRXCTL_CRCSTRIP:
            return self._deliver_slow(q, frame)
        head = q.head
        if head == q.tail:
            return 0  # no free descriptor
        i = 2 * head
        s64, d64 = q.s64, q.d64
        address = s64[i]  # the buffer address the device fetched
        if d64[i] != address or d64[i + 1] != s64[i + 1]:
            # the driver rewrote a descriptor it had already given away
            self.faults[Fault.LATE_DESCRIPTOR] += 1
        where = self.window.locate(address, n)
        if where is None:
            self._dma_fault(q, True, "rx buffer", address, n)
            return -1
        mem, off = where
        mem[off : off + n] = frame
        # store order (spec 2.2): data, then length and lower words, then status
        d32 = q.d32
        d32[4 * head + 3] = n  # length (VLAN tag 0)
        d64[i] = 0
        d32[4 * head + 2] = _DD_EOP
        head += 1
        if head == q.size:
            head = 0
        q.head = head
        r[self._i_rdh[0]] = head
        c = self.counters
        c[S_GPRC] += 1
        c[_SLOT_GORC] += n + 4
        c[_S_QPRC0] += 1
        return 1

    def _deliver_slow(self, q: _Queue, frame: bytes) -> int:
        """:meth:`_deliver` for frames with an error (RXE), with the CRC kept, or longer
        than one buffer (split over descriptors, EOP on the last)."""
        r = self.regs
        error = 0
        data = frame
        if frame.__class__ is _RxeFrame:
            error = regs.RX_ERROR_RXE
        if not r[_I_RDRXCTL] & regs.RDRXCTL_CRCSTRIP:
            fcs = zlib.crc32(frame) ^ (0xFFFFFFFF if getattr(frame, "bad_crc", False) else 0)
            data = frame + fcs.to_bytes(4, "little")
        if (q.tail - q.head) % q.size < -(-len(data) // q.bsize):
            return 0
        d32, d64, s64 = q.d32, q.d64, q.s64
        locate = self.window.locate
        head = q.head
        size = q.size
        bsize = q.bsize
        pos = 0
        total = len(data)
        late = 0
        while pos < total:
            chunk = min(bsize, total - pos)
            i = 2 * head
            address = s64[i]  # the buffer address the device fetched
            if d64[i] != address or d64[i + 1] != s64[i + 1]:
                late += 1  # the driver rewrote a descriptor it had already given away
            where = locate(address, chunk)
            if where is None:
                q.head = head
                self._dma_fault(q, True, "rx buffer", address, chunk)
                return -1
            mem, off = where
            mem[off : off + chunk] = data if chunk == total else data[pos : pos + chunk]
            pos += chunk
            # store order (spec 2.2): data, then length and lower words, then status
            d32[4 * head + 3] = chunk  # length (VLAN tag 0)
            d64[i] = 0
            if pos >= total:
                d32[4 * head + 2] = _DD_EOP | error
            else:
                d32[4 * head + 2] = regs.RX_STATUS_DD
            head = (head + 1) % size
        q.head = head
        r[self._i_rdh[0]] = head
        c = self.counters
        if late:
            self.faults[Fault.LATE_DESCRIPTOR] += late
        if error:
            self.faults[Fault.RX_ERRORS] += 1
        else:
            c[S_GPRC] += 1
            c[_SLOT_GORC] += len(frame) + 4
        c[_S_QPRC0] += 1
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
        self._rx_live = self._tx_live = ()
        self.control.words[ctl.W_STATE] = ctl.STATE_STOPPED
        self.control.words[ctl.W_LINK_UP] = 0
        if self._poke_driver_fd >= 0:
            os.close(self._poke_driver_fd)
            self._poke_driver_fd = -1
        self.regs.release()
        self.bar.release()
        self._bar_mm.close()
