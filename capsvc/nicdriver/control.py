"""The model's control file: the small shared block beside the register file.

Theory of operation
-------------------
Spec nicdriver.md 2.2: besides the BAR file, a model port has a control file that both the
model and the model-flavoured driver seams read. It is an array of little-endian 64-bit
words (a ``memoryview.cast('Q')`` over a shared mmap, so every access is one aligned
8-byte load or store). It holds:

- identity and liveness: magic, layout version, model pid, run state, a heartbeat the model
  bumps while it runs (``capsvc nic status`` uses it to tell a live model from a stale port);
- sleep flags for the wake-up hints: the model sets ``MODEL_SLEEPING`` before it blocks,
  the driver's register accessor then pokes the model's FIFO after a register write; the
  driver's poll loop sets ``DRIVER_SLEEPING`` and the model pokes the driver's FIFO after
  an RX write-back. Both are hints only: sleepers always use a timeout, so a lost hint
  costs latency, never correctness;
- wire state (carrier, link) and the fault-injection rates (loss, duplication, reordering
  in parts per million), which tests and ``capsvc nic faults`` change while it runs;
- fault counters (bad DMA addresses, torn doorbells, ...);
- the statistics as monotonic 64-bit totals, one slot per counter of
  :data:`capsvc.nicdriver.regs.COUNTER_SLOT`, plus the totals at the last device reset
  (model-written) and the totals at the last read by *any* reader (``COUNTER_TAKEN``,
  written by the readers): a register read returns "total minus the later of the two" and
  takes it, so a read clears the counter for every reader, as on hardware (the
  clear-on-read shim of :class:`capsvc.nicdriver.mmio.ModelBar`). Each word has one writer
  (the model writes totals and bases, readers write ``COUNTER_TAKEN``), so no update is lost
  across processes; two readers racing on the *same* counter at the same instant may both
  see the same delta (a real device has one reader, the driver);
- the queue-enable state (spec 2.3, datasheet 4.6.7.1): ``RXQ_ENABLED``/``TXQ_ENABLED``
  are bitmasks, one bit per queue, written only by the model: bit n is the *device's*
  RXDCTL(n)/TXDCTL(n).ENABLE. The BAR word itself holds what the driver wrote (its
  request); the model-side accessors return the request's other bits with ENABLE taken from
  here. ``QCTL_WRITES`` counts the driver's writes of any RXDCTL/TXDCTL through an accessor
  and ``QGEN_RX + n``/``QGEN_TX + n`` the writes of one queue's register (written only by
  the accessor), so the model notices a request even when it rewrites the value the BAR
  word already holds (enable again after the device dropped the queue);
- the DMA page table of the portable shared-memory backend (spec 2.1 seam 3b): page k of
  the DMA arena file has fake physical address ``PAGE_TABLE[k]``, and ``PAGE_VALID[k]``
  bytes of it (from its start) are currently registered by the driver
  (:class:`capsvc.nicdriver.dma.ShmDma` writes them on allocate/free/close and bumps
  ``DMA_GEN``); the model accepts DMA only inside registered bytes.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from capsvc.nicdriver.regs import NUM_COUNTER_SLOTS

__all__ = ["CONTROL_SIZE", "Control", "Fault"]

MAGIC = int.from_bytes(b"capsvcNM", "little")
VERSION = 2
CONTROL_SIZE = 32768
MAX_DMA_PAGES = 1024

# word indexes
W_MAGIC = 0
W_VERSION = 1
W_MODEL_PID = 2
W_STATE = 3
W_HEARTBEAT = 4
W_MODEL_SLEEPING = 5
W_DRIVER_SLEEPING = 6
W_DRIVER_PID = 7
W_CARRIER = 8
W_LINK_UP = 9
W_LOSS_PPM = 11
W_DUP_PPM = 12
W_REORDER_PPM = 13
W_FAULT_SEED = 14
W_MAC = 15
W_FAULTS = 16  # 32 words of fault counters
W_COUNTERS = 64
W_COUNTER_BASE = W_COUNTERS + NUM_COUNTER_SLOTS
W_COUNTER_TAKEN = W_COUNTER_BASE + NUM_COUNTER_SLOTS
W_RXQ_ENABLED = 288  # bit n: the device's RXDCTL(n).ENABLE (model-written)
W_TXQ_ENABLED = 289  # bit n: the device's TXDCTL(n).ENABLE (model-written)
W_QCTL_WRITES = 290  # accessor writes of any RXDCTL/TXDCTL (accessor-written)
W_DMA_GEN = 291  # bumped by the driver's DMA backend on every (un)registration
W_QGEN_RX = 320  # 64 words: accessor writes of RXDCTL(n)
W_QGEN_TX = 384  # 64 words: accessor writes of TXDCTL(n)
W_DMA_MODE = 512
W_DMA_PAGES = 513
W_PAGE_TABLE = 1024
W_PAGE_VALID = W_PAGE_TABLE + MAX_DMA_PAGES
assert W_COUNTER_TAKEN + NUM_COUNTER_SLOTS <= W_RXQ_ENABLED
assert W_QGEN_TX + 64 <= W_DMA_MODE
assert (W_PAGE_VALID + MAX_DMA_PAGES) * 8 <= CONTROL_SIZE

STATE_STOPPED = 0
STATE_RUNNING = 1
STATE_PAUSED = 2

DMA_SHM = 0
DMA_HUGEPAGE = 1


class Fault:
    """Indexes of the fault counters (``Control.faults[...]``)."""

    BAD_DMA = 0  # a descriptor pointed outside every known DMA page: queue stopped
    BAD_RING = 1  # ring base/length not aligned, not a multiple of 128, or crosses a page
    TORN_DOORBELL = 2  # a tail register held a value outside the ring
    BAD_DESCRIPTOR = 3  # unsupported descriptor type (legacy RX, TX without DEXT)
    RX_NO_LINK = 4  # frames that arrived while the link was down or RX disabled
    RX_FILTERED = 5  # frames the address filter dropped
    WIRE_TX = 6  # frames handed to the wire
    WIRE_RX = 7  # frames taken from the wire
    INJECTED_LOSS = 8
    INJECTED_DUP = 9
    INJECTED_REORDER = 10
    RESETS = 11
    TX_NO_CARRIER = 12  # frames dropped at the wire for lack of a peer
    LATE_DESCRIPTOR = 13  # a descriptor changed after the tail gave it to the device
    CRC_STRIP_MISMATCH = 14  # frames dropped: HLREG0.RXCRCSTRP != RDRXCTL.CRCSTRIP
    DMA_VIOLATION = 15  # DMA outside the memory the driver has registered (or freed)
    RX_ERRORS = 16  # frames written back with RXE (bad CRC, length; FCTRL.SBP set)
    NAMES = (
        "bad_dma",
        "bad_ring",
        "torn_doorbell",
        "bad_descriptor",
        "rx_no_link",
        "rx_filtered",
        "wire_tx",
        "wire_rx",
        "injected_loss",
        "injected_dup",
        "injected_reorder",
        "resets",
        "tx_no_carrier",
        "late_descriptor",
        "crc_strip_mismatch",
        "dma_violation",
        "rx_errors",
    )


class Control:
    """A mapped control file. ``words`` is the raw 64-bit view."""

    def __init__(self, path: str | os.PathLike[str], *, create: bool = False) -> None:
        self.path = Path(path)
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, CONTROL_SIZE)
            elif os.fstat(fd).st_size < CONTROL_SIZE:
                raise ValueError(f"{self.path} is not a model control file (too small)")
            self._mm = mmap.mmap(fd, CONTROL_SIZE, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.words = memoryview(self._mm).cast("Q")
        self.faults = self.words[W_FAULTS : W_FAULTS + 32]
        self.counters = self.words[W_COUNTERS : W_COUNTERS + NUM_COUNTER_SLOTS]
        self.counter_base = self.words[W_COUNTER_BASE : W_COUNTER_BASE + NUM_COUNTER_SLOTS]
        self.counter_taken = self.words[W_COUNTER_TAKEN : W_COUNTER_TAKEN + NUM_COUNTER_SLOTS]
        self.page_valid = self.words[W_PAGE_VALID : W_PAGE_VALID + MAX_DMA_PAGES]
        if create:
            self.words[W_VERSION] = VERSION
            self.words[W_MAGIC] = MAGIC
        elif self.words[W_MAGIC] != MAGIC or self.words[W_VERSION] != VERSION:
            self.close()
            raise ValueError(f"{self.path} is not a model control file of version {VERSION}")

    # ------------------------------------------------------------------ convenience
    @property
    def model_pid(self) -> int:
        return int(self.words[W_MODEL_PID])

    @property
    def state(self) -> int:
        return int(self.words[W_STATE])

    @property
    def mac(self) -> bytes:
        return int(self.words[W_MAC]).to_bytes(8, "big")[2:]

    def fault_rates(self) -> tuple[float, float, float]:
        """(loss, duplication, reordering) probabilities per frame."""
        w = self.words
        return (w[W_LOSS_PPM] / 1e6, w[W_DUP_PPM] / 1e6, w[W_REORDER_PPM] / 1e6)

    def faultless(self) -> bool:
        """No fault injection configured (cheaper than :meth:`fault_rates` per frame)."""
        w = self.words
        return not (w[W_LOSS_PPM] or w[W_DUP_PPM] or w[W_REORDER_PPM])

    def set_fault_rates(self, loss: float = 0.0, dup: float = 0.0, reorder: float = 0.0) -> None:
        for word, rate in ((W_LOSS_PPM, loss), (W_DUP_PPM, dup), (W_REORDER_PPM, reorder)):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"a fault rate must be within 0..1, got {rate}")
            self.words[word] = round(rate * 1e6)

    def fault_dict(self) -> dict[str, int]:
        return {name: int(self.faults[i]) for i, name in enumerate(Fault.NAMES)}

    def page_table(self) -> list[int]:
        n = int(self.words[W_DMA_PAGES])
        return list(self.words[W_PAGE_TABLE : W_PAGE_TABLE + n])

    def model_alive(self) -> bool:
        """True if the model process recorded here exists and says it runs."""
        pid = self.model_pid
        if pid <= 0 or self.state == STATE_STOPPED:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def close(self) -> None:
        views = (self.faults, self.counters, self.counter_base, self.counter_taken)
        for view in (*views, self.page_valid, self.words):
            view.release()
        self._mm.close()
