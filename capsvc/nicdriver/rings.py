"""RX and TX descriptor rings with batched receive, send and recycling.

Theory of operation
-------------------
Spec nicdriver.md 1.5-1.7 and 4.1. A ring is a power-of-two number of 16-byte advanced
descriptors in one physically contiguous DMA region. The batch paths never loop over
descriptor fields in Python: they read and write whole columns of the ring with *strided
memoryview slices*, one C-level copy each:

- ``d8[16*a+8 : 16*b : 16]``  the low status byte (DD, EOP) of slots a..b-1,
- ``d16[8*a+6 : 8*b : 8]``    the RX write-back length field of those slots,
- ``d64[2*a : 2*b : 2]``      the buffer-address qword of those slots (read format),
- ``d64[2*a+1 : 2*b+1 : 2]``  the second qword (RX: header address 0; TX: cmd_type_len
  in the low dword and olinfo_status in the high dword).

Per packet, only two list comprehensions remain (the physical address of each buffer, the
TX command word of each length); a batch costs a fixed two dozen C calls plus ~50 ns a
packet. That fixed cost dominates a batch of one, which is what request/response traffic
sends and receives: :meth:`TxQueue.tx_one` and the lone-frame case of
:meth:`RxQueue.rx_batch` (the next slot has DD|EOP and no error, the one after has no DD)
use a few scalar loads and stores instead, with the same store order and tail rules.
Descriptor stores for a batch precede the single tail store (the doorbell) for the
batch; on x86-64 stores stay in program order (spec 4.3), and the device does not own the
slots until the tail moves, so the order of stores *within* the batch is irrelevant.

RX (spec 1.6): the first slot without DD ends the batch (the device writes back in order,
so DD slots are a prefix); ``bytes.translate`` + ``find`` locate that end in C. Slots with
DD but not EOP (a frame spanning buffers, unsupported) or with the RXE error bit take a
slow path that drops them and re-arms their buffers in place; a frame whose first slots
arrived in one batch and the rest in a later one is dropped across batches (``_dropping``).
Spanning does not happen with the driver's settings: each buffer holds SRRCTL.BSIZEPACKET
= 2 KiB (the whole mempool entry, see :mod:`~capsvc.nicdriver.mempool`), and with
HLREG0.JUMBOEN off the MAC accepts frames of at most 1,518 bytes (1,522 with a VLAN
tag), FCS included, which is stripped. The device never writes more than BSIZEPACKET
bytes into one buffer, so a length read back never exceeds the buffer. Each
received buffer is replaced by a fresh one from the pool; the tail register gets the *last*
re-armed slot, not the next index, so one slot stays unused and the hardware head can never
meet the tail ("no free descriptors"). The driver never reads RDH.

TX (spec 1.7): first *clean*: while at least 32 slots are in flight, look only at DD of the
last slot of the oldest 32-slot batch; if set, free all 32 buffers (one ``extend`` when they
share a pool) and advance ``clean_index``. Every descriptor carries RS, and completion is in
order, so this is exact. Then *send*: as many buffers as fit before ``clean_index`` (one
slot always stays empty), one doorbell for the batch. The caller keeps ownership of the
buffers that did not fit (the returned count says how many went). A length outside
1..16,383 bytes raises ``ValueError`` naming its index before any descriptor is written (a
zero-length data descriptor is not valid).
"""

from __future__ import annotations

from array import array

from capsvc.nicdriver import regs
from capsvc.nicdriver.dma import DmaRegion
from capsvc.nicdriver.errors import DmaError
from capsvc.nicdriver.mempool import BufferSpace, Mempool
from capsvc.nicdriver.mmio import Bar

__all__ = ["TX_CLEAN_BATCH", "RxQueue", "TxQueue"]

TX_CLEAN_BATCH = 32
MAX_TX_LENGTH = 0x3FFF  # buffers are at most 16 KiB; DTALEN is 16 bits, PAYLEN 18

# byte -> 1 when the DD bit is set: ``lows.translate(_DD).find(0)`` is the DD prefix length
_DD = bytes(1 if b & regs.RX_STATUS_DD else 0 for b in range(256))
# byte -> 1 when both DD and EOP are set (a complete one-buffer frame)
_DD_EOP = bytes(1 if b & 3 == 3 else 0 for b in range(256))
# byte 11 of a write-back (status bits 31:24) -> 1 when RXE (bit 29) is set
_RXE = bytes(1 if b & (regs.RX_ERROR_RXE >> 24) else 0 for b in range(256))
_RXE_BYTE = regs.RX_ERROR_RXE >> 24


def _bad_length(lens: list[int]) -> str:
    """The error for the first TX length outside 1..MAX_TX_LENGTH (nothing was queued)."""
    for i, n in enumerate(lens):
        if n < 1:
            return (
                f"TX length {n} at index {i}: a data descriptor needs at least one byte "
                "(DTALEN 0 is not a valid descriptor); nothing was queued"
            )
        if n > MAX_TX_LENGTH:
            return (
                f"TX length {n} at index {i} exceeds the {MAX_TX_LENGTH}-byte limit of a "
                "buffer; nothing was queued"
            )
    raise AssertionError("no bad length")  # pragma: no cover


def _check_ring_size(n: int) -> None:
    if n < 64 or n & (n - 1) or n > 4096:
        raise ValueError(f"ring size {n} must be a power of two within 64..4096")


class _Ring:
    def __init__(self, region: DmaRegion, size: int) -> None:
        _check_ring_size(size)
        if size * regs.DESC_SIZE > region.size:
            raise DmaError("ring region too small")
        self.size = size
        self.mask = size - 1
        self.region = region
        mem = region.mem[: size * regs.DESC_SIZE]
        self._mem = mem
        self.d8 = mem
        self.d16 = mem.cast("H")
        self.d32 = mem.cast("I")
        self.d64 = mem.cast("Q")
        self.table = [-1] * size  # slot -> buffer id (the device overwrites addresses)
        self._zeros = memoryview(array("Q", bytes(8 * size)))

    @property
    def phys(self) -> int:
        return self.region.phys(0)

    def release(self) -> None:
        for view in (self._zeros, self.d64, self.d32, self.d16, self._mem):
            view.release()


class RxQueue(_Ring):
    """One receive queue (spec 1.6)."""

    def __init__(self, bar: Bar, index: int, region: DmaRegion, size: int, pool: Mempool) -> None:
        super().__init__(region, size)
        self.index = index
        self.pool = pool
        self.rx_index = 0
        self.dropped = 0  # frames dropped by the slow path (multi-buffer or RXE)
        self._dropping = False  # inside a frame that spans buffers (being dropped)
        self._phys = pool.space.phys
        self._rdt = bar.doorbell(regs.RDT(index), urgent=False)

    def fill(self) -> None:
        """Give every descriptor a fresh buffer (spec 1.4 step 10, read format)."""
        bufs = self.pool.alloc_batch(self.size)
        if len(bufs) < self.size:
            self.pool.free_batch(bufs)
            raise DmaError(f"mempool too small to fill an RX ring of {self.size}")
        phys = self._phys
        self.d64[0 : 2 * self.size : 2] = array("Q", [phys[b] for b in bufs])
        self.d64[1 : 2 * self.size : 2] = self._zeros
        self.table[:] = bufs
        self.rx_index = 0

    def pending(self) -> bool:
        """Has the device written back the next slot (a frame is waiting)?"""
        return bool(self.d8[16 * self.rx_index + 8] & regs.RX_STATUS_DD)

    def rx_batch(self, max_packets: int) -> tuple[list[int], list[int]]:
        """Receive up to ``max_packets`` frames: (buffer ids, lengths).

        The buffers are the caller's: free them to their pool (or send them).
        """
        start = self.rx_index
        d8 = self.d8
        status = d8[16 * start + 8]
        if not status & regs.RX_STATUS_DD:
            return [], []  # nothing written back: the common idle poll
        if (
            status & 3 == 3  # DD and EOP: a whole one-buffer frame
            and not d8[16 * start + 11] & _RXE_BYTE
            and not d8[16 * ((start + 1) & self.mask) + 8] & regs.RX_STATUS_DD
            and not self._dropping
            and max_packets > 0
        ):
            return self._take_one(start)
        first = min(max_packets, self.size - start)
        bufs, lens = self._take(start, first)
        if len(bufs) == first and first < max_packets and self.rx_index == 0:
            more, more_lens = self._take(0, min(max_packets - first, start))
            if more:
                bufs += more
                lens += more_lens
        if bufs or self.rx_index != start:
            self._rdt((self.rx_index - 1) & self.mask)
        return bufs, lens

    def _take_one(self, start: int) -> tuple[list[int], list[int]]:
        """A lone frame (request/response traffic): scalar stores beat column copies."""
        new = self.pool.alloc()
        if new < 0:
            return [], []
        table = self.table
        buf = table[start]
        length = self.d16[8 * start + 6]
        self.d64[2 * start] = self._phys[new]
        self.d64[2 * start + 1] = 0  # header address 0; also clears DD (spec 1.5)
        table[start] = new
        self.rx_index = (start + 1) & self.mask
        self._rdt(start)  # the last re-armed slot (spec 1.6)
        return [buf], [length]

    def _take(self, start: int, count: int) -> tuple[list[int], list[int]]:
        if count <= 0:
            return [], []
        end = start + count
        lows = bytes(self.d8[16 * start + 8 : 16 * end : 16])
        k = lows.translate(_DD).find(0)
        if k < 0:
            k = count
        if k == 0:
            return [], []
        end = start + k
        if (
            self._dropping
            or lows[:k].translate(_DD_EOP).find(0) >= 0
            or bytes(self.d8[16 * start + 11 : 16 * end : 16]).translate(_RXE).find(1) >= 0
        ):
            return self._take_slow(start, k)
        new = self.pool.alloc_batch(k)
        if len(new) < k:
            if not new:
                return [], []
            k = len(new)
            end = start + k
        table = self.table
        bufs = table[start:end]
        lens = self.d16[8 * start + 6 : 8 * end : 8].tolist()
        phys = self._phys
        d64 = self.d64
        d64[2 * start : 2 * end : 2] = array("Q", [phys[b] for b in new])
        d64[2 * start + 1 : 2 * end : 2] = self._zeros[:k]
        table[start:end] = new
        self.rx_index = end & self.mask
        return bufs, lens

    def _take_slow(self, start: int, count: int) -> tuple[list[int], list[int]]:
        """Descriptor by descriptor: drop frames spanning buffers or flagged RXE."""
        bufs: list[int] = []
        lens: list[int] = []
        d32, d64, table, phys = self.d32, self.d64, self.table, self._phys
        dropping = self._dropping
        slot = start
        for slot in range(start, start + count):
            status = d32[4 * slot + 2]
            complete = status & regs.RX_STATUS_EOP
            bad = dropping or not complete or status & regs.RX_ERROR_RXE
            if bad:
                # re-arm the slot with the same buffer
                d64[2 * slot] = phys[table[slot]]
                d64[2 * slot + 1] = 0
                if complete:
                    self.dropped += 1
                dropping = not complete
                continue
            new = self.pool.alloc()
            if new < 0:
                slot -= 1
                break
            bufs.append(table[slot])
            lens.append(d32[4 * slot + 3] & 0xFFFF)
            d64[2 * slot] = phys[new]
            d64[2 * slot + 1] = 0
            table[slot] = new
        self._dropping = dropping
        self.rx_index = (slot + 1) & self.mask
        return bufs, lens


class TxQueue(_Ring):
    """One transmit queue (spec 1.7)."""

    def __init__(self, bar: Bar, index: int, region: DmaRegion, size: int, space: BufferSpace):
        super().__init__(region, size)
        self.index = index
        self.space = space
        self.tx_index = 0
        self.clean_index = 0
        self._phys = space.phys
        self._tdt = bar.doorbell(regs.TDT(index))

    @property
    def in_flight(self) -> int:
        """Slots given to the device and not yet cleaned."""
        return (self.tx_index - self.clean_index) & self.mask

    def clean(self) -> int:
        """Free the buffers of completed 32-slot batches; returns how many were freed."""
        clean = self.clean_index
        tx = self.tx_index
        mask = self.mask
        d32 = self.d32
        freed = 0
        while (tx - clean) & mask >= TX_CLEAN_BATCH:
            last = clean + TX_CLEAN_BATCH - 1  # clean is a multiple of 32: no wrap inside
            if not d32[4 * last + 3] & regs.TX_STATUS_DD:
                break
            self.space.free_batch(self.table[clean : clean + TX_CLEAN_BATCH])
            clean = (clean + TX_CLEAN_BATCH) & mask
            freed += TX_CLEAN_BATCH
        self.clean_index = clean
        return freed

    def tx_batch(self, bufs: list[int], lens: list[int]) -> int:
        """Queue ``bufs`` (with their lengths) for sending; returns how many were taken.

        Taken buffers belong to the device until a later clean frees them to their pool.
        """
        self.clean()
        tx = self.tx_index
        k = min(len(bufs), (self.clean_index - tx - 1) & self.mask)
        if k <= 0:
            return 0
        taken = lens[:k]
        if min(taken) < 1 or max(taken) > MAX_TX_LENGTH:
            raise ValueError(_bad_length(taken))
        first = min(k, self.size - tx)
        self._write(tx, bufs, lens, 0, first)
        if first < k:
            self._write(0, bufs, lens, first, k)
        self.tx_index = (tx + k) & self.mask
        self._tdt(self.tx_index)
        return k

    def tx_one(self, buf: int, length: int) -> bool:
        """:meth:`tx_batch` for a single buffer (scalar stores); False if the ring is full."""
        self.clean()
        tx = self.tx_index
        if not (self.clean_index - tx - 1) & self.mask:
            return False
        if not 0 < length <= MAX_TX_LENGTH:
            raise ValueError(_bad_length([length]))
        self.d64[2 * tx] = self._phys[buf]
        self.d64[2 * tx + 1] = (length << 46) | regs.TX_CMD_TYPE_DATA | length
        self.table[tx] = buf
        self.tx_index = (tx + 1) & self.mask
        self._tdt(self.tx_index)
        return True

    def _write(self, slot: int, bufs: list[int], lens: list[int], a: int, b: int) -> None:
        end = slot + b - a
        sub = bufs[a:b]
        phys = self._phys
        cmd = regs.TX_CMD_TYPE_DATA
        self.d64[2 * slot : 2 * end : 2] = array("Q", [phys[x] for x in sub])
        # low dword cmd_type_len = 0x2B300000 | len; high dword olinfo_status = len << 14
        self.d64[2 * slot + 1 : 2 * end : 2] = array("Q", [(n << 46) | cmd | n for n in lens[a:b]])
        self.table[slot:end] = sub
