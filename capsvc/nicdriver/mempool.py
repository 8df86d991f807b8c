"""Packet-buffer mempools: fixed-size DMA buffers named by integers.

Theory of operation
-------------------
Spec nicdriver.md 1.3 and 4.1. A :class:`Mempool` carves one DMA region into ``n`` entries
of ``entry_size`` bytes (2048 by default; it must divide 2 MiB, so no entry straddles two
physically unrelated huge pages). The packet data starts ``headroom`` bytes into the entry
(:data:`HEADROOM`, 0 by default) and the NIC is given ``entry_phys + headroom``; the data
area of every buffer (:attr:`Mempool.capacity`) is ``entry_size - headroom`` bytes.

Why no headroom (ixy keeps a 64-byte header in front of the data): the NIC writes a
received frame of up to SRRCTL.BSIZEPACKET bytes, a whole number of KiB, at the address
it was given, and frames it cannot fit in one buffer span descriptors, which the RX path
drops. With 64 bytes of headroom a 2 KiB entry has 1,984 data bytes, so 2 KiB buffers
would let the device write 64 bytes into the next entry, and past the end of the region
(or into a physically unrelated page) for the last entry of each huge page; 1 KiB buffers
would split every frame above 1 KiB. This driver keeps all per-buffer metadata in flat
arrays (below), so the header has nothing to hold: the whole entry is data, 2,048 bytes,
exactly the 2 KiB the driver programs into BSIZEPACKET. :meth:`Mempool.check_dma_room`
verifies that for every buffer before a pool is given to an RX ring.

A buffer is a plain ``int`` (its *id*): no per-packet Python objects. Ids are unique across
all pools of a :class:`BufferSpace` (one per process by default, :data:`BUFFERS`), which
keeps the per-id metadata in flat arrays that the batch paths index directly:

- ``space.phys[id]``: the physical address the NIC gets (data, i.e. entry + headroom);
- ``space.pool_of[id]``: the owning pool (a buffer received on one device and sent on
  another goes back to its own pool when the TX ring releases it).

The free list is a LIFO stack of ids (hot buffers stay in cache); ``alloc_batch`` pops up to
``n`` with one slice, ``free_batch`` pushes a whole batch with one ``extend`` when the ids
belong to one pool (the common case, checked with ``min``/``max``). Like ixy's, a pool is
single-threaded. Freeing does not clear data. Packet sizes are not stored per buffer: the
RX path returns them beside the ids and the TX path takes them the same way.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from capsvc.nicdriver.dma import HUGE_PAGE, PAGE_SHIFT, DmaBackend, DmaRegion
from capsvc.nicdriver.errors import DmaError

__all__ = ["BUFFERS", "HEADROOM", "BufferSpace", "Mempool"]

HEADROOM = 0  # bytes before the packet data in each entry (see above)


class BufferSpace:
    """Buffer ids and their metadata across pools."""

    def __init__(self) -> None:
        self.phys = array("Q")
        self.pool_of: list[Mempool | None] = []

    def register(self, pool: Mempool, phys: Sequence[int]) -> int:
        """Give ``pool`` a fresh range of ids; returns the first."""
        base = len(self.pool_of)
        self.phys.extend(phys)
        self.pool_of.extend([pool] * len(phys))
        return base

    def unregister(self, pool: Mempool) -> None:
        for i in range(pool.base, pool.base + pool.size):
            self.pool_of[i] = None
            self.phys[i] = 0

    def free_batch(self, ids: list[int]) -> None:
        """Return buffers to their pools (one ``extend`` if they share a pool)."""
        if not ids:
            return
        pool = self.pool_of[min(ids)]
        if pool is not None and max(ids) < pool.base + pool.size:
            pool.free_ids.extend(ids)
            return
        for buf in ids:
            owner = self.pool_of[buf]
            if owner is not None:
                owner.free_ids.append(buf)

    def pool(self, buf: int) -> Mempool:
        owner = self.pool_of[buf]
        if owner is None:
            raise ValueError(f"buffer {buf} belongs to no open pool")
        return owner


BUFFERS = BufferSpace()


class Mempool:
    """``size`` DMA buffers of ``entry_size`` bytes (spec 1.3)."""

    def __init__(
        self,
        dma: DmaBackend,
        size: int = 4096,
        entry_size: int = 2048,
        space: BufferSpace = BUFFERS,
        *,
        headroom: int = HEADROOM,
    ) -> None:
        if entry_size < 128 or HUGE_PAGE % entry_size:
            raise ValueError(f"entry size {entry_size} must divide 2 MiB and be at least 128")
        if not 0 <= headroom <= entry_size - 64 or headroom % 64:
            raise ValueError(f"headroom {headroom} must be a multiple of 64 below the entry size")
        if size < 1:
            raise ValueError("a mempool needs at least one entry")
        self.size = size
        self.entry_size = entry_size
        self.headroom = headroom
        self.capacity = entry_size - headroom  # data bytes per buffer
        self.space = space
        self.region: DmaRegion = dma.allocate(size * entry_size)
        self.mem = self.region.mem
        phys = [self.region.phys(i * entry_size) + headroom for i in range(size)]
        self.base = space.register(self, phys)
        # LIFO: the end of the list is the top of the stack; the lowest ids come out first
        self.free_ids: list[int] = list(range(self.base + size - 1, self.base - 1, -1))

    # ------------------------------------------------------------------ allocation
    def alloc(self) -> int:
        """One buffer id, or -1 if the pool is empty."""
        free = self.free_ids
        return free.pop() if free else -1

    def alloc_batch(self, n: int) -> list[int]:
        """Up to ``n`` buffer ids (fewer if the pool runs short)."""
        free = self.free_ids
        k = min(n, len(free))
        if k <= 0:
            return []
        out = free[-k:]
        del free[-k:]
        return out

    def free(self, buf: int) -> None:
        self.free_ids.append(buf)

    def free_batch(self, ids: list[int]) -> None:
        self.free_ids.extend(ids)

    @property
    def available(self) -> int:
        return len(self.free_ids)

    # ------------------------------------------------------------------ data access
    def offset(self, buf: int) -> int:
        """Offset of the buffer's data in ``mem``."""
        return (buf - self.base) * self.entry_size + self.headroom

    def owns(self, buf: int) -> bool:
        return self.base <= buf < self.base + self.size

    def write(self, buf: int, data: bytes | bytearray | memoryview) -> int:
        """Copy ``data`` into the buffer; returns its length."""
        n = len(data)
        if n > self.capacity:
            raise ValueError(f"{n} bytes do not fit a {self.capacity}-byte buffer")
        off = (buf - self.base) * self.entry_size + self.headroom
        self.mem[off : off + n] = data
        return n

    def read(self, buf: int, length: int) -> bytes:
        off = (buf - self.base) * self.entry_size + self.headroom
        return bytes(self.mem[off : off + length])

    def view(self, buf: int, length: int) -> memoryview:
        off = (buf - self.base) * self.entry_size + self.headroom
        return self.mem[off : off + length]

    def check_dma_room(self, nbytes: int) -> None:
        """Raise :class:`DmaError` unless the device may write ``nbytes`` at every buffer's
        address: the range must lie inside the buffer's own entry, inside the region and
        inside one 2 MiB page (the only physically contiguous unit)."""
        if nbytes > self.capacity:
            raise DmaError(
                f"the device may write {nbytes} bytes per buffer but a buffer holds "
                f"{self.capacity} ({self.entry_size}-byte entries, {self.headroom} headroom)"
            )
        for i in range(self.size):  # every entry has the same layout; check them all anyway
            start = i * self.entry_size + self.headroom
            end = start + nbytes
            if end > (i + 1) * self.entry_size or end > self.region.size:
                raise DmaError(f"buffer {self.base + i} would overflow its entry")
            if start >> PAGE_SHIFT != (end - 1) >> PAGE_SHIFT:
                raise DmaError(f"buffer {self.base + i} would straddle two huge pages")

    def check(self) -> None:
        """Consistency check for tests: no id twice on the free list, all ids ours."""
        ids = self.free_ids
        if len(set(ids)) != len(ids):
            raise AssertionError("a buffer is on the free list twice (double free)")
        if ids and not (self.owns(min(ids)) and self.owns(max(ids))):
            raise AssertionError("a foreign buffer is on the free list")

    def close(self) -> None:
        self.space.unregister(self)
        self.free_ids = []
