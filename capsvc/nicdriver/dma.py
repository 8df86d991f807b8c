"""DMA memory: regions with known physical addresses, from huge pages or a model's arena.

Theory of operation
-------------------
Spec nicdriver.md 1.2 and 2.1 seam 3. The device reads and writes host memory by
*physical* address, so every region the driver hands it (descriptor rings, packet buffers)
needs a virtual-to-physical translation. Physical contiguity is only guaranteed within one
2 MiB huge page, so a :class:`DmaRegion` keeps one physical address per 2 MiB page
(``page_phys``) and :meth:`DmaRegion.phys` adds the offset within the page. A ring must fit
in one page (checked by ``allocate(..., contiguous=True)``), and a mempool whose entry size
divides 2 MiB never has an entry that straddles two pages. No code assumes that two huge
pages are physically adjacent (the ixy.py bug the spec warns about).

Two driver-side backends give regions, chosen when the device is opened:

- :class:`HugepageDma` (real hardware): a new uniquely named file on a hugetlbfs mount per
  allocation, ftruncate to a 2 MiB multiple, ``mmap`` shared with ``MAP_POPULATE`` (the
  kernel reserves the pages at mmap time, so running out fails cleanly instead of with
  SIGBUS later), ``mlock``, then close and unlink (the memory goes away with the process).
  The physical address of each page is the PFN of its 8-byte entry in
  ``/proc/self/pagemap`` (bits 0..54, bit 63 = present) times 4096; PFNs are reported
  only with CAP_SYS_ADMIN, and an untouched page reads as absent, so pages are touched
  first.
- :class:`ShmDma` (software model, portable): the model's DMA arena, a sparse file in
  ``/dev/shm`` made of 2 MiB pages whose fake physical addresses (above 4 GiB, pages in a
  deliberately scattered order) are in the model's control file. Allocations take whole
  pages in order, so regions are virtually contiguous but physically scattered, exactly
  like huge pages.

On the model side, a *window* (:class:`ShmWindow`, :class:`HugepageWindow`) answers
"which bytes are at physical address P, for L bytes?" with a memoryview and an offset,
or None for an address outside every known page (the model then counts a fault and stops
the queue, spec 2.4). :class:`HugepageWindow` finds the driver's huge pages itself, from
``/proc/<pid>/maps`` (hugetlbfs mappings), ``/proc/<pid>/map_files`` (which opens them
even after the driver unlinked the files) and ``/proc/<pid>/pagemap``; it rescans when it
meets an unknown address.

Registered memory (issue 14, point 9). The device may only touch memory the driver has
*currently* handed to its DMA backend. With the model's arena this is checked: when
:class:`ShmDma` finds the port's control file beside the arena (``<port>/control``, or
``control=`` given), it records in the control file's ``PAGE_VALID`` table how many bytes
of each arena page are registered: an allocation of ``size`` bytes registers exactly
``size`` bytes (not the rounded-up pages), :meth:`DmaBackend.free` and :meth:`close`
unregister (the pages are never handed out again by that backend, so a late device write
cannot land in someone else's new buffer), and a new backend on the arena starts from an
empty table. Every change bumps ``DMA_GEN``. :meth:`ShmWindow.locate` then refuses any
range that is not inside registered bytes of one page, and :meth:`DmaWindow.why` says why
(the model records it as a ``dma_violation`` with the address; an address in no page at
all stays a ``bad_dma``). Huge pages (:class:`HugepageDma`) have no such table: the model
can only tell mapped from unmapped there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import logging
import mmap
import os
import random
import struct
from abc import ABC, abstractmethod
from pathlib import Path

from capsvc.nicdriver import control as ctl
from capsvc.nicdriver.control import Control
from capsvc.nicdriver.errors import (
    HUGEPAGE_HOWTO,
    DmaError,
    HugepagesUnavailable,
    PagemapUnavailable,
)

__all__ = [
    "HUGE_PAGE",
    "DmaBackend",
    "DmaRegion",
    "HugepageDma",
    "HugepageWindow",
    "ShmDma",
    "ShmWindow",
    "hugepage_status",
    "scattered_page_table",
]

log = logging.getLogger("capsvc.nic")

HUGE_PAGE = 2 * 1024 * 1024
PAGE_SHIFT = 21
PAGE_MASK = HUGE_PAGE - 1
SMALL_PAGE = 4096
PAGEMAP_PFN_MASK = (1 << 55) - 1
PAGEMAP_PRESENT = 1 << 63
FAKE_PHYS_BASE = 1 << 33  # 8 GiB: above 4 GiB so that the high address registers matter
HUGEPAGES_SYSFS = Path("/sys/kernel/mm/hugepages/hugepages-2048kB")


def _pages(size: int) -> int:
    return max(1, -(-size // HUGE_PAGE))


class DmaRegion:
    """Memory the device may access: ``mem`` (bytes) plus a physical address per 2 MiB page."""

    def __init__(self, mem: memoryview, page_phys: list[int], keep: object = None) -> None:
        self.mem = mem
        self.size = len(mem)
        self.page_phys = page_phys
        self._keep = keep  # the mmap (hugepage backend) the view points into

    def phys(self, offset: int) -> int:
        """Physical address of byte ``offset`` of the region."""
        if not 0 <= offset < self.size:
            raise ValueError(f"offset {offset} outside a DMA region of {self.size} bytes")
        return self.page_phys[offset >> PAGE_SHIFT] + (offset & PAGE_MASK)

    def fill(self, byte: int) -> None:
        """Set every byte (rings are filled with 0xFF before the device sees them, spec 1.2)."""
        self.mem[:] = bytes([byte]) * self.size

    def release(self) -> None:
        self.mem.release()
        if isinstance(self._keep, mmap.mmap):
            self._keep.close()


class DmaBackend(ABC):
    """Where the driver's DMA memory comes from."""

    name = "dma"

    @abstractmethod
    def allocate(self, size: int, *, contiguous: bool = False) -> DmaRegion:
        """A zeroed region of at least ``size`` bytes (rounded up to 2 MiB pages).

        ``contiguous``: the region must be physically contiguous (at most one page).
        """

    def free(self, region: DmaRegion) -> None:
        """The device may no longer access ``region`` (it stays mapped on our side until
        :meth:`close`). Call it only once the device has stopped using the region (queue
        disabled and its ENABLE bit read back 0). Backends without a registry ignore it."""
        return None

    def close(self) -> None:
        """Release everything allocated (regions become invalid)."""
        return None


# ------------------------------------------------------------------------ huge pages
def hugepage_status() -> dict[str, object]:
    """What the system offers: total and free 2 MiB pages, hugetlbfs mounts, pagemap access."""
    status: dict[str, object] = {"mounts": hugetlbfs_mounts()}
    for key in ("nr_hugepages", "free_hugepages"):
        try:
            status[key] = int((HUGEPAGES_SYSFS / key).read_text())
        except (OSError, ValueError):
            status[key] = None
    return status


def hugetlbfs_mounts() -> list[str]:
    """Mount points of hugetlbfs with 2 MiB pages, from /proc/mounts."""
    found = []
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "hugetlbfs":
            options = fields[3].split(",")
            if "pagesize=1G" in options or "pagesize=1024M" in options:
                continue
            found.append(fields[1].replace("\\040", " "))
    return found


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _address_of(mm: mmap.mmap) -> int:
    anchor = ctypes.c_char.from_buffer(mm)
    try:
        return int(ctypes.addressof(anchor))
    finally:
        del anchor


def virt_to_phys(vaddr: int, pagemap_fd: int) -> int:
    """Translate one virtual address of this process through /proc/self/pagemap (spec 1.2)."""
    raw = os.pread(pagemap_fd, 8, (vaddr // SMALL_PAGE) * 8)
    entry = int.from_bytes(raw, "little")
    pfn = entry & PAGEMAP_PFN_MASK
    if not entry & PAGEMAP_PRESENT or pfn == 0:
        raise PagemapUnavailable(
            "/proc/self/pagemap gives no page frame number for a locked, touched page: "
            "physical addresses are reported only to processes with CAP_SYS_ADMIN; run as root"
        )
    return pfn * SMALL_PAGE + vaddr % SMALL_PAGE


class HugepageDma(DmaBackend):
    """DMA memory from 2 MiB huge pages on hugetlbfs (real hardware, spec 1.2)."""

    name = "hugepage"
    _counter = itertools.count()

    def __init__(self, mount: str | None = None) -> None:
        mounts = hugetlbfs_mounts()
        if mount is None:
            if not mounts:
                raise HugepagesUnavailable(
                    "no hugetlbfs mount with 2 MiB pages in /proc/mounts; " + HUGEPAGE_HOWTO
                )
            mount = mounts[0]
        self.mount = mount
        self._regions: list[DmaRegion] = []
        try:
            self._pagemap = os.open("/proc/self/pagemap", os.O_RDONLY)
        except OSError as error:
            raise PagemapUnavailable(f"cannot open /proc/self/pagemap: {error}") from error

    def allocate(self, size: int, *, contiguous: bool = False) -> DmaRegion:
        pages = _pages(size)
        if contiguous and pages > 1:
            raise DmaError(f"{size} bytes cannot be physically contiguous (max 2 MiB)")
        free = hugepage_status().get("free_hugepages")
        if isinstance(free, int) and free < pages:
            raise HugepagesUnavailable(
                f"need {pages} free 2 MiB huge pages, {free} free "
                f"({HUGEPAGES_SYSFS}/free_hugepages); " + HUGEPAGE_HOWTO
            )
        path = os.path.join(self.mount, f"capsvc-{os.getpid()}-{next(self._counter)}")
        length = pages * HUGE_PAGE
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o600)
        except OSError as error:
            raise HugepagesUnavailable(
                f"cannot create {path}: {error}; {HUGEPAGE_HOWTO}"
            ) from error
        try:
            os.ftruncate(fd, length)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mm = mmap.mmap(fd, length, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as error:
            raise HugepagesUnavailable(
                f"cannot map {pages} huge pages from {self.mount}: {error}; " + HUGEPAGE_HOWTO
            ) from error
        finally:
            os.close(fd)
            os.unlink(path)
        base = _address_of(mm)
        if _libc().mlock(ctypes.c_void_p(base), ctypes.c_size_t(length)) != 0:
            log.warning("mlock of DMA memory failed (errno %d)", ctypes.get_errno())
        page_phys = []
        for k in range(pages):
            mm[k * HUGE_PAGE] = 0  # touch: an untouched page reads as absent
            page_phys.append(virt_to_phys(base + k * HUGE_PAGE, self._pagemap))
        region = DmaRegion(memoryview(mm), page_phys, keep=mm)
        self._regions.append(region)
        return region

    def close(self) -> None:
        for region in self._regions:
            region.release()
        self._regions.clear()
        if self._pagemap >= 0:
            os.close(self._pagemap)
            self._pagemap = -1


# ----------------------------------------------------------------------- model arena
def scattered_page_table(pages: int, seed: int) -> list[int]:
    """Fake physical addresses for ``pages`` arena pages: above 4 GiB, in scattered order.

    Consecutive arena pages are never physically adjacent, so any code that assumes
    contiguity across pages fails loudly (spec 2.1 seam 3b).
    """
    slots = list(range(pages * 2))  # leave holes between pages too
    random.Random(seed).shuffle(slots)
    table = [FAKE_PHYS_BASE + slot * HUGE_PAGE for slot in slots[:pages]]
    for a, b in itertools.pairwise(table):
        if b == a + HUGE_PAGE:  # pragma: no cover (rare; keep the promise anyway)
            return scattered_page_table(pages, seed + 1)
    return table


class ShmDma(DmaBackend):
    """The driver's side of a model's shared-memory DMA arena (spec 2.1 seam 3b).

    ``control``: the port's control file, where allocations are registered for the model's
    checks; by default ``control`` beside the arena when it is one (a model port), else
    none (no registry: the model then accepts any address inside the arena's pages).
    """

    name = "shm"

    def __init__(self, arena: Path, page_table: list[int], *, control: Path | None = None) -> None:
        self.path = arena
        self.page_table = page_table
        fd = os.open(arena, os.O_RDWR)
        try:
            length = os.fstat(fd).st_size
            if length < len(page_table) * HUGE_PAGE:
                raise DmaError(f"{arena} is smaller than its page table says")
            self._mm = mmap.mmap(fd, len(page_table) * HUGE_PAGE, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self._view = memoryview(self._mm)
        self._next = 0
        self._regions: list[DmaRegion] = []
        self._pages_of: dict[int, tuple[int, int]] = {}  # id(region) -> (first, count)
        self._control = _open_registry(control, arena)
        if self._control is not None:
            valid = self._control.page_valid
            valid[: len(page_table)] = memoryview(bytes(8 * len(page_table))).cast("Q")
            self._bump()

    def _bump(self) -> None:
        assert self._control is not None
        self._control.words[ctl.W_DMA_GEN] += 1

    def _register(self, first: int, pages: int, size: int) -> None:
        if self._control is None:
            return
        valid = self._control.page_valid
        for k in range(pages):
            valid[first + k] = min(HUGE_PAGE, size - k * HUGE_PAGE)
        self._bump()

    def _unregister(self, first: int, pages: int) -> None:
        if self._control is None:
            return
        valid = self._control.page_valid
        for k in range(first, first + pages):
            valid[k] = 0
        self._bump()

    def allocate(self, size: int, *, contiguous: bool = False) -> DmaRegion:
        pages = _pages(size)
        if contiguous and pages > 1:
            raise DmaError(f"{size} bytes cannot be physically contiguous (max 2 MiB)")
        if self._next + pages > len(self.page_table):
            raise DmaError(
                f"the model's DMA arena {self.path} has {len(self.page_table) - self._next} "
                f"free 2 MiB pages, {pages} needed (start the model with more --dma-pages)"
            )
        first = self._next
        self._next += pages
        mem = self._view[first * HUGE_PAGE : (first + pages) * HUGE_PAGE]
        mem[:] = bytes(len(mem))
        region = DmaRegion(mem, self.page_table[first : first + pages])
        self._regions.append(region)
        self._pages_of[id(region)] = (first, pages)
        self._register(first, pages, size)
        return region

    def free(self, region: DmaRegion) -> None:
        where = self._pages_of.pop(id(region), None)
        if where is not None:
            self._unregister(*where)

    def close(self) -> None:
        if self._control is not None:
            if self._next:
                self._unregister(0, self._next)
            self._control.close()
            self._control = None
        self._pages_of.clear()
        for region in self._regions:
            region.release()
        self._regions.clear()
        self._view.release()
        self._mm.close()


def _open_registry(control: Path | None, arena: Path) -> Control | None:
    """The control file that registers ``arena``'s allocations, if there is one."""
    path = control if control is not None else arena.parent / "control"
    if control is None and not path.exists():
        return None
    try:
        registry = Control(path)
    except (OSError, ValueError):
        if control is not None:
            raise
        return None
    if registry.words[ctl.W_DMA_MODE] != ctl.DMA_SHM:
        registry.close()
        return None
    return registry


# ------------------------------------------------------------------ model-side windows
class DmaWindow(ABC):
    """The model's view of host memory by physical address."""

    @abstractmethod
    def locate(self, phys: int, length: int) -> tuple[memoryview, int] | None:
        """(memory, offset) such that ``memory[offset:offset+length]`` is the host memory at
        ``phys``; None if the range is not inside one known page (or, with a registry, not
        inside registered bytes)."""

    def why(self, phys: int, length: int) -> tuple[bool, str]:
        """For a range :meth:`locate` refused: (is it a registry violation, i.e. inside a
        known page but not in registered memory; a description). Slow path only."""
        return False, "not inside one known DMA page"

    def close(self) -> None:
        """Unmap what the window mapped."""
        return None


class ShmWindow(DmaWindow):
    """The model's view of its own arena (fake physical addresses from the page table).

    ``control``: the port's control file; its ``PAGE_VALID`` table (what the driver has
    registered, see :class:`ShmDma`) then bounds every access. Without it any byte of a
    known page is accepted.
    """

    def __init__(self, arena: Path, page_table: list[int], control: Control | None = None) -> None:
        fd = os.open(arena, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, len(page_table) * HUGE_PAGE, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.mem = memoryview(self._mm)
        self._page_of = {phys >> PAGE_SHIFT: k for k, phys in enumerate(page_table)}
        # the control file's own view (released by Control.close, not here)
        self._valid = control.page_valid if control is not None else None

    def locate(self, phys: int, length: int) -> tuple[memoryview, int] | None:
        page = self._page_of.get(phys >> PAGE_SHIFT)
        within = phys & PAGE_MASK
        if page is None:
            return None
        valid = self._valid
        if within + length > (HUGE_PAGE if valid is None else valid[page]):
            return None
        return self.mem, (page << PAGE_SHIFT) + within

    def why(self, phys: int, length: int) -> tuple[bool, str]:
        page = self._page_of.get(phys >> PAGE_SHIFT)
        within = phys & PAGE_MASK
        if page is None:
            return False, "not inside any page of the DMA arena"
        if self._valid is None:
            return False, "crosses the end of a 2 MiB page (pages are not contiguous)"
        valid = int(self._valid[page])
        if valid == 0:
            return True, f"arena page {page} is not registered (never allocated, or freed)"
        return True, (
            f"ends {within + length - valid} bytes past the registered end of arena page "
            f"{page} ({valid} bytes registered)"
        )

    def close(self) -> None:
        self.mem.release()
        self._mm.close()


class HugepageWindow(DmaWindow):
    """The model's view of a driver process's huge pages (spec 2.1 seam 3a; needs root)."""

    def __init__(self) -> None:
        self.pid = 0
        self._page_of: dict[int, tuple[memoryview, int]] = {}
        self._maps: dict[tuple[int, int], tuple[mmap.mmap, memoryview]] = {}

    def attach(self, pid: int) -> None:
        """Follow process ``pid`` (forgetting the previous one's pages)."""
        if pid != self.pid:
            self.close()
            self.pid = pid

    def locate(self, phys: int, length: int) -> tuple[memoryview, int] | None:
        within = phys & PAGE_MASK
        if within + length > HUGE_PAGE:
            return None
        hit = self._page_of.get(phys >> PAGE_SHIFT)
        if hit is None and self.pid:
            self.rescan()
            hit = self._page_of.get(phys >> PAGE_SHIFT)
        if hit is None:
            return None
        return hit[0], hit[1] + within

    def rescan(self) -> None:
        """Map every hugetlbfs mapping of the driver process and index its pages by PFN."""
        proc = Path(f"/proc/{self.pid}")
        try:
            lines = (proc / "maps").read_text().splitlines()
            pagemap = os.open(proc / "pagemap", os.O_RDONLY)
        except OSError:
            return
        mounts = [mount.rstrip("/") + "/" for mount in hugetlbfs_mounts()]
        try:
            for line in lines:
                fields = line.split()
                if len(fields) < 6 or not fields[5].startswith(tuple(mounts)):
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if (start, end) in self._maps:
                    continue
                try:
                    fd = os.open(proc / "map_files" / fields[0], os.O_RDWR)
                except OSError:
                    continue
                try:
                    offset = int(fields[2], 16)
                    mm = mmap.mmap(fd, end - start, mmap.MAP_SHARED, offset=offset)
                finally:
                    os.close(fd)
                view = memoryview(mm)
                self._maps[(start, end)] = (mm, view)
                for page_start in range(start, end, HUGE_PAGE):
                    raw = os.pread(pagemap, 8, (page_start // SMALL_PAGE) * 8)
                    (entry,) = struct.unpack("<Q", raw)
                    if entry & PAGEMAP_PRESENT and entry & PAGEMAP_PFN_MASK:
                        phys = (entry & PAGEMAP_PFN_MASK) * SMALL_PAGE
                        self._page_of[phys >> PAGE_SHIFT] = (view, page_start - start)
        finally:
            os.close(pagemap)

    def close(self) -> None:
        self._page_of.clear()
        for mm, view in self._maps.values():
            view.release()
            mm.close()
        self._maps.clear()
