"""DMA backends: the model's scattered arena, and real huge pages with pagemap translation.

The huge-page test needs root. When no hugetlbfs is mounted or no page is free, it reserves
16 pages and mounts a private hugetlbfs for its own duration (undoing both afterwards);
set CAPSVC_NIC_HUGEPAGES=0 to forbid that, and it skips saying what is missing.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from capsvc.nicdriver.dma import (
    HUGE_PAGE,
    HUGEPAGES_SYSFS,
    HugepageDma,
    ShmDma,
    hugepage_status,
    scattered_page_table,
)
from capsvc.nicdriver.errors import DmaError, HugepagesUnavailable
from capsvc.nicdriver.modelhost import start_pair
from tests.nic.conftest import open_port

PAGES = 16


def test_scattered_page_table_is_never_contiguous() -> None:
    for seed in range(20):
        table = scattered_page_table(32, seed)
        assert len(set(table)) == 32
        assert all(p >= 1 << 32 and p % HUGE_PAGE == 0 for p in table)
        assert all(b != a + HUGE_PAGE for a, b in itertools.pairwise(table))


def test_shm_dma_regions(tmp_path: Path) -> None:
    arena = tmp_path / "dma"
    arena.write_bytes(b"")
    os.truncate(arena, 4 * HUGE_PAGE)
    table = scattered_page_table(4, 7)
    dma = ShmDma(arena, table)
    try:
        ring = dma.allocate(4096, contiguous=True)
        assert ring.phys(0) == table[0]
        assert ring.phys(100) == table[0] + 100
        big = dma.allocate(2 * HUGE_PAGE + 1)  # three pages
        assert big.page_phys == table[1:4]
        assert big.phys(HUGE_PAGE + 5) == table[2] + 5
        with pytest.raises(DmaError, match="contiguous"):
            dma.allocate(HUGE_PAGE + 1, contiguous=True)
        with pytest.raises(DmaError, match="free 2 MiB pages"):
            dma.allocate(1)
    finally:
        dma.close()


def _sysctl_pages() -> int:
    return int((HUGEPAGES_SYSFS / "nr_hugepages").read_text())


@pytest.fixture
def hugepages() -> Iterator[None]:
    status = hugepage_status()
    free = status.get("free_hugepages")
    if status["mounts"] and isinstance(free, int) and free >= PAGES:
        yield
        return
    if os.environ.get("CAPSVC_NIC_HUGEPAGES") == "0" or os.geteuid() != 0:
        pytest.skip(
            f"needs {PAGES} free 2 MiB huge pages and a hugetlbfs mount (have {free} free, "
            f"mounts {status['mounts']}); as root: echo 512 > {HUGEPAGES_SYSFS}/nr_hugepages "
            "&& mount -t hugetlbfs nodev /mnt/huge"
        )
    before = _sysctl_pages()
    (HUGEPAGES_SYSFS / "nr_hugepages").write_text(str(before + PAGES))
    mount = tempfile.mkdtemp(prefix="capsvc-huge-")
    mounted = False
    try:
        if _sysctl_pages() < before + PAGES:
            pytest.skip("the kernel could not reserve huge pages (memory fragmented)")
        subprocess.run(
            ["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "nodev", mount], check=True
        )
        mounted = True
        yield
    finally:
        if mounted:
            subprocess.run(["umount", mount], check=False)
        os.rmdir(mount)
        now = _sysctl_pages()
        (HUGEPAGES_SYSFS / "nr_hugepages").write_text(str(max(0, now - PAGES)))


@pytest.mark.usefixtures("hugepages")
def test_hugepage_dma_translates_through_pagemap() -> None:
    dma = HugepageDma()
    try:
        region = dma.allocate(3 * HUGE_PAGE // 2)
        assert len(region.page_phys) == 2  # 1.5 pages' worth takes two whole huge pages
        for phys in region.page_phys:
            assert phys % HUGE_PAGE == 0
            assert phys > 0
        region.mem[:4] = b"ping"
        with pytest.raises(DmaError):
            dma.allocate(HUGE_PAGE * 2, contiguous=True)
    finally:
        dma.close()


@pytest.mark.usefixtures("hugepages")
def test_model_finds_the_drivers_huge_pages(rundir: Path) -> None:
    """Spec 2.1 seam 3a: the model maps the driver's hugetlbfs pages through
    /proc/PID/map_files and indexes them by PFN from /proc/PID/pagemap."""
    host = start_pair("h", rundir=rundir, spin=0, dma="hugepage")
    host.start_thread()
    devices = []
    try:
        for name in ("h.0", "h.1"):
            device = open_port(rundir, name, rx_ring_size=64, tx_ring_size=64)
            devices.append(device)
            device.reset_and_init(link_timeout=5)  # real time: the model thread raises it
        a, b = devices
        assert isinstance(a.dma, HugepageDma)
        pool = a.pools[0]
        bufs = pool.alloc_batch(5)
        frames = [b.mac + a.mac + b"\x88\xb5" + bytes([i]) * (100 + i) for i in range(5)]
        lens = [pool.write(buf, f) for buf, f in zip(bufs, frames, strict=True)]
        assert a.tx_batch(0, bufs, lens) == 5
        got: list[bytes] = []
        # Real time: the model runs in its own thread (host.start_thread) and moves the
        # frames whenever the OS schedules it; the deadline only bounds a hang.
        deadline = time.monotonic() + 10
        while len(got) < 5 and time.monotonic() < deadline:
            rx, rx_lens = b.rx_batch(0, 8)
            got += [b.pools[0].read(x, n) for x, n in zip(rx, rx_lens, strict=True)]
            b.pools[0].free_batch(rx)
            time.sleep(0.001)
        assert got == frames
        assert host.models[0].fault_counts()["bad_dma"] == 0
    finally:
        host.stop()
        for device in devices:
            device.close()
        host.close()


def test_missing_hugepages_say_how_to_get_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("capsvc.nicdriver.dma.hugetlbfs_mounts", lambda: [])
    with pytest.raises(HugepagesUnavailable, match="nr_hugepages") as info:
        HugepageDma()
    assert "mount -t hugetlbfs" in str(info.value)
