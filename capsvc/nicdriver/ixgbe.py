"""The 82599 (ixgbe) user-space driver: open, reset and init, queues, link, statistics.

Theory of operation
-------------------
:meth:`IxgbeDevice.open` finds the PCI function through sysfs (:mod:`~capsvc.nicdriver.pci`;
allow-list, unbind, bus mastering, BAR0 mmap), then chooses the two remaining seams of spec
nicdriver.md 2.1 from what it found: a real device gets the plain :class:`~.mmio.Bar` and
huge-page DMA (:class:`~.dma.HugepageDma`); a software model (its sysfs directory carries
an ``ixgbe-model`` marker) gets :class:`~.mmio.ModelBar` and the model's DMA backend (its
shared-memory arena, or huge pages when the model runs with ``--dma hugepage``); a
co-located model port (marker ``mode=colocated``) gets
:class:`~.colocated.ColocatedBar`, which runs the port's model inside this process. Nothing
after ``open`` knows which it faces: :meth:`reset_and_init` and the RX/TX paths of
:mod:`~capsvc.nicdriver.rings` are the same code for both.

:meth:`reset_and_init` is ixy's ``reset_and_init``, spec 1.4, step by step (datasheet
sections in brackets in the step comments). Waits poll with a timeout instead of forever,
and a timeout names the register and value it waited for.

Per RX queue a mempool of max(4096, rx_ring + tx_ring) buffers is allocated (ixy's sizing);
the transport and the benchmarks allocate their TX buffers from these pools or their own.

Statistics (spec 1.8) are clear-on-read on the device: :meth:`read_stats` reads every
counter once and adds the values to running totals in :attr:`stats`.

A device object is single-threaded (like ixy's): one thread or task drives it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from capsvc.nicdriver import regs
from capsvc.nicdriver.colocated import ColocatedBar, peer_directory
from capsvc.nicdriver.dma import DmaBackend, HugepageDma, ShmDma
from capsvc.nicdriver.errors import DeviceBusy, LinkDown, NicError
from capsvc.nicdriver.mempool import BUFFERS, BufferSpace, Mempool
from capsvc.nicdriver.mmio import Bar, ModelBar
from capsvc.nicdriver.pci import PciFunction, open_function
from capsvc.nicdriver.rings import RxQueue, TxQueue

__all__ = ["DeviceStats", "IxgbeDevice", "read_marker"]

log = logging.getLogger("capsvc.nic")

MAX_QUEUES = 64
DEFAULT_RING = 512


@dataclass
class DeviceStats:
    """Running totals of the device's statistics counters (spec 1.8)."""

    rx_packets: int = 0
    tx_packets: int = 0
    rx_bytes: int = 0  # good octets: destination MAC through FCS
    tx_bytes: int = 0
    rx_missed: int = 0  # MPC: no room in the packet buffer
    rx_no_buffer: int = 0  # RNBC: no descriptor
    rx_dropped: int = 0  # QPRDC: DROP_EN drops
    rx_oversize: int = 0  # ROC
    rx_crc_errors: int = 0
    per_queue_rx: list[int] = field(default_factory=list)
    per_queue_tx: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}


def read_marker(path: Path) -> dict[str, str]:
    """The ``key=value`` lines of a model marker file."""
    entries = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            entries[key.strip()] = value.strip()
    return entries


class IxgbeDevice:
    """One opened 82599 port (real or modelled). Use :meth:`open`, then
    :meth:`reset_and_init`; close with :meth:`close`."""

    def __init__(
        self,
        function: PciFunction,
        bar: Bar,
        dma: DmaBackend,
        *,
        num_rx_queues: int = 1,
        num_tx_queues: int = 1,
        rx_ring_size: int = DEFAULT_RING,
        tx_ring_size: int = DEFAULT_RING,
        space: BufferSpace = BUFFERS,
        lock_fd: int = -1,
    ) -> None:
        if not (1 <= num_rx_queues <= MAX_QUEUES and 1 <= num_tx_queues <= MAX_QUEUES):
            raise ValueError(f"queue counts must be within 1..{MAX_QUEUES}")
        self.function = function
        self.address = function.address
        self.bar = bar
        self.dma = dma
        self.space = space
        self.num_rx_queues = num_rx_queues
        self.num_tx_queues = num_tx_queues
        self.rx_ring_size = rx_ring_size
        self.tx_ring_size = tx_ring_size
        self.rx_queues: list[RxQueue] = []
        self.tx_queues: list[TxQueue] = []
        self.pools: list[Mempool] = []
        self.stats = DeviceStats(
            per_queue_rx=[0] * min(num_rx_queues, 16), per_queue_tx=[0] * min(num_tx_queues, 16)
        )
        self.mac = b"\0" * 6
        self._lock_fd = lock_fd
        self._closed = False

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        address: str,
        *,
        sysfs_root: str | os.PathLike[str] = "/sys",
        dma: DmaBackend | None = None,
        unbind: bool = True,
        num_rx_queues: int = 1,
        num_tx_queues: int = 1,
        rx_ring_size: int = DEFAULT_RING,
        tx_ring_size: int = DEFAULT_RING,
    ) -> IxgbeDevice:
        """Open the device at ``address`` under ``sysfs_root`` (not yet initialised).

        ``dma`` overrides the DMA backend the device would get.
        """
        function, mm = open_function(address, sysfs_root, unbind=unbind)
        lock_fd = -1
        try:
            if function.model_marker is not None:
                marker = read_marker(function.model_marker)
                port_dir = Path(marker.get("port", ""))
                lock_fd = _lock_port(port_dir)
                peer_dir = peer_directory(marker)
                bar: Bar
                if peer_dir is not None:
                    bar = ColocatedBar(mm, port_dir, peer_dir, name=f"model {port_dir.name}")
                else:
                    bar = ModelBar(mm, port_dir, name=f"model {port_dir.name}")
                if dma is None:
                    if marker.get("dma", "shm") == "hugepage":
                        dma = HugepageDma()
                    else:
                        assert isinstance(bar, ModelBar)
                        dma = ShmDma(port_dir / "dma", bar.control.page_table())
            else:
                if platform.machine().lower() not in ("x86_64", "amd64"):
                    raise NicError(
                        "the Python driver relies on x86-64 store/load ordering (spec 4.3); "
                        f"this machine is {platform.machine()}"
                    )
                bar = Bar(mm, name=function.address)
                if dma is None:
                    dma = HugepageDma()
        except BaseException:
            mm.close()
            if lock_fd >= 0:
                os.close(lock_fd)
            raise
        return cls(
            function,
            bar,
            dma,
            num_rx_queues=num_rx_queues,
            num_tx_queues=num_tx_queues,
            rx_ring_size=rx_ring_size,
            tx_ring_size=tx_ring_size,
            lock_fd=lock_fd,
        )

    @property
    def is_model(self) -> bool:
        return isinstance(self.bar, ModelBar)

    # ------------------------------------------------------------------ init (spec 1.4)
    def reset_and_init(self, *, wait_for_link: bool = True, link_timeout: float = 10.0) -> None:
        """The full init sequence; afterwards the queues run and the port is promiscuous."""
        bar = self.bar
        log.debug("resetting %s", self.address)
        # 1. disable interrupts [4.6.3.1]
        self._disable_interrupts()
        # 2. global reset [4.6.3.2]: RST | LNK_RST, wait until both read 0, then 10 ms
        bar.write32(regs.CTRL, regs.CTRL_RST_MASK)
        bar.wait_clear(regs.CTRL, regs.CTRL_RST_MASK, "CTRL.RST to self-clear (device reset)")
        time.sleep(0.01)
        self._disable_interrupts()
        # 4. EEPROM auto-read done [4.6.3]
        bar.wait_set(regs.EEC, regs.EEC_ARD, "EEC.ARD (EEPROM auto-read done)")
        # 3. the MAC address, from RAL(0)/RAH(0). The auto-read of step 4 is what loads
        # them from the EEPROM, so they are read once it is done (ixy reads them before;
        # the spec's step 3 notes that after step 4 is safer)
        self.mac = self._read_mac()
        # 5. DMA init done
        bar.wait_set(regs.RDRXCTL, regs.RDRXCTL_DMAIDONE, "RDRXCTL.DMAIDONE (DMA init done)")
        # 6. link [4.6.4]: 10G serial, XAUI PMA/PMD, restart auto-negotiation; no wait here
        autoc = bar.read32(regs.AUTOC)
        autoc = (autoc & ~regs.AUTOC_LMS_MASK) | regs.AUTOC_LMS_10G_SERIAL
        autoc = (autoc & ~regs.AUTOC_10G_PMA_PMD_MASK) | regs.AUTOC_10G_XAUI
        bar.write32(regs.AUTOC, autoc)
        bar.set_flags(regs.AUTOC, regs.AUTOC_AN_RESTART)  # then restart, on the new mode
        # 7. statistics [4.6.5]: read the clear-on-read counters once to zero them
        self.read_stats()
        self.stats = DeviceStats(
            per_queue_rx=[0] * len(self.stats.per_queue_rx),
            per_queue_tx=[0] * len(self.stats.per_queue_tx),
        )
        # 8. receive [4.6.7]
        self._init_rx()
        # 9. transmit [4.6.8]
        self._init_tx()
        # 10./11. start the queues
        for rxq in self.rx_queues:
            self._start_rx_queue(rxq)
        for txq in self.tx_queues:
            self._start_tx_queue(txq)
        # 12. interrupts: VFIO only; this driver polls.
        # 13. promiscuous mode: unicast and multicast
        bar.set_flags(regs.FCTRL, regs.FCTRL_UPE | regs.FCTRL_MPE)
        # 14. link
        if wait_for_link:
            self.wait_for_link(link_timeout)

    def _disable_interrupts(self) -> None:
        self.bar.write32(regs.EIMS, 0)
        self.bar.write32(regs.EIMC, 0xFFFFFFFF)
        self.bar.read32(regs.EICR)  # clears pending causes

    def _read_mac(self) -> bytes:
        low = self.bar.read32(regs.RAL0)
        high = self.bar.read32(regs.RAH0)
        return low.to_bytes(4, "little") + (high & 0xFFFF).to_bytes(2, "little")

    def _init_rx(self) -> None:
        bar = self.bar
        # disable RX while configuring
        bar.clear_flags(regs.RXCTRL, regs.RXCTRL_RXEN)
        # one 128 KiB packet buffer; the other seven traffic classes get none
        bar.write32(regs.RXPBSIZE(0), regs.RXPBSIZE_128KB)
        for i in range(1, 8):
            bar.write32(regs.RXPBSIZE(i), 0)
        # CRC stripping: HLREG0 and RDRXCTL must agree
        bar.set_flags(regs.HLREG0, regs.HLREG0_RXCRCSTRP)
        bar.set_flags(regs.RDRXCTL, regs.RDRXCTL_CRCSTRIP)
        # accept broadcast
        bar.set_flags(regs.FCTRL, regs.FCTRL_BAM)
        pool_size = max(4096, self.rx_ring_size + self.tx_ring_size)
        for i in range(self.num_rx_queues):
            # advanced one-buffer descriptors; drop when out of descriptors
            srrctl = bar.read32(regs.SRRCTL(i)) & ~regs.SRRCTL_DESCTYPE_MASK
            bar.write32(
                regs.SRRCTL(i), srrctl | regs.SRRCTL_DESCTYPE_ADV_ONEBUF | regs.SRRCTL_DROP_EN
            )
            ring = self.dma.allocate(self.rx_ring_size * regs.DESC_SIZE, contiguous=True)
            ring.fill(0xFF)  # a premature DMA hits an invalid address (spec 1.2)
            phys = ring.phys(0)
            bar.write32(regs.RDBAL(i), phys & 0xFFFFFFFF)
            bar.write32(regs.RDBAH(i), phys >> 32)
            bar.write32(regs.RDLEN(i), self.rx_ring_size * regs.DESC_SIZE)
            bar.write32(regs.RDH(i), 0)
            bar.write32(regs.RDT(i), 0)
            pool = Mempool(self.dma, pool_size, 2048, self.space)
            self.pools.append(pool)
            self.rx_queues.append(RxQueue(bar, i, ring, self.rx_ring_size, pool))
        # no-snoop disable; clear the undocumented DCA_RXCTRL bit 12 of every queue
        bar.set_flags(regs.CTRL_EXT, regs.CTRL_EXT_NS_DIS)
        for i in range(self.num_rx_queues):
            bar.clear_flags(regs.DCA_RXCTRL(i), regs.DCA_RXCTRL_BIT12)
        bar.set_flags(regs.RXCTRL, regs.RXCTRL_RXEN)

    def _init_tx(self) -> None:
        bar = self.bar
        # CRC offload and small-packet padding
        bar.set_flags(regs.HLREG0, regs.HLREG0_TXCRCEN | regs.HLREG0_TXPADEN)
        bar.write32(regs.TXPBSIZE(0), regs.TXPBSIZE_40KB)
        for i in range(1, 8):
            bar.write32(regs.TXPBSIZE(i), 0)
        bar.write32(regs.DTXMXSZRQ, 0xFFFF)
        bar.clear_flags(regs.RTTDCS, regs.RTTDCS_ARBDIS)
        for i in range(self.num_tx_queues):
            ring = self.dma.allocate(self.tx_ring_size * regs.DESC_SIZE, contiguous=True)
            ring.fill(0xFF)
            phys = ring.phys(0)
            bar.write32(regs.TDBAL(i), phys & 0xFFFFFFFF)
            bar.write32(regs.TDBAH(i), phys >> 32)
            bar.write32(regs.TDLEN(i), self.tx_ring_size * regs.DESC_SIZE)
            # DPDK's thresholds, 7-bit fields (ixy HEAD)
            txdctl = bar.read32(regs.TXDCTL(i)) & ~regs.TXDCTL_THRESH_MASK
            txdctl |= regs.TXDCTL_PTHRESH | regs.TXDCTL_HTHRESH | regs.TXDCTL_WTHRESH
            bar.write32(regs.TXDCTL(i), txdctl)
            self.tx_queues.append(TxQueue(bar, i, ring, self.tx_ring_size, self.space))
        bar.write32(regs.DMATXCTL, regs.DMATXCTL_TE)

    def _start_rx_queue(self, rxq: RxQueue) -> None:
        i = rxq.index
        rxq.fill()
        self.bar.set_flags(regs.RXDCTL(i), regs.RXDCTL_ENABLE)
        self.bar.wait_set(regs.RXDCTL(i), regs.RXDCTL_ENABLE, f"RXDCTL({i}).ENABLE")
        self.bar.write32(regs.RDH(i), 0)
        # all descriptors but one are the device's
        self.bar.write32(regs.RDT(i), rxq.size - 1)

    def _start_tx_queue(self, txq: TxQueue) -> None:
        i = txq.index
        self.bar.write32(regs.TDH(i), 0)
        self.bar.write32(regs.TDT(i), 0)
        self.bar.set_flags(regs.TXDCTL(i), regs.TXDCTL_ENABLE)
        self.bar.wait_set(regs.TXDCTL(i), regs.TXDCTL_ENABLE, f"TXDCTL({i}).ENABLE")

    # ------------------------------------------------------------------ link
    def link_speed(self) -> int:
        """Link speed in Mbit/s, 0 when the link is down."""
        links = self.bar.read32(regs.LINKS)
        if not links & regs.LINKS_UP:
            return 0
        return regs.LINK_SPEEDS_MBIT.get(links & regs.LINKS_SPEED_MASK, 0)

    def wait_for_link(self, timeout: float = 10.0) -> int:
        """Poll LINKS until the link is up (spec 1.4 step 14); returns the speed."""
        deadline = time.monotonic() + timeout
        while (speed := self.link_speed()) == 0:
            if time.monotonic() > deadline:
                raise LinkDown(
                    f"{self.address}: no link after {timeout:g} s "
                    "(is a cable or the peer model connected? `capsvc nic status` shows it)"
                )
            time.sleep(0.01)
        log.debug("%s: link up at %d Mbit/s", self.address, speed)
        return speed

    # ------------------------------------------------------------------ statistics
    def read_stats(self) -> DeviceStats:
        """Read every counter once (they clear on read) and add to :attr:`stats`."""
        r = self.bar.read32
        s = self.stats
        s.rx_packets += r(regs.GPRC)
        s.tx_packets += r(regs.GPTC)
        s.rx_bytes += r(regs.GORCL) + (r(regs.GORCH) << 32)
        s.tx_bytes += r(regs.GOTCL) + (r(regs.GOTCH) << 32)
        s.rx_missed += sum(r(regs.MPC(i)) for i in range(8))
        s.rx_no_buffer += sum(r(regs.RNBC(i)) for i in range(8))
        s.rx_oversize += r(regs.ROC)
        s.rx_crc_errors += r(regs.CRCERRS)
        for i in range(len(s.per_queue_rx)):
            s.per_queue_rx[i] += r(regs.QPRC(i))
            s.rx_dropped += r(regs.QPRDC(i))
        for i in range(len(s.per_queue_tx)):
            s.per_queue_tx[i] += r(regs.QPTC(i))
        return s

    # ------------------------------------------------------------------ shortcuts
    def rx_batch(self, queue: int, max_packets: int) -> tuple[list[int], list[int]]:
        return self.rx_queues[queue].rx_batch(max_packets)

    def tx_batch(self, queue: int, bufs: list[int], lens: list[int]) -> int:
        return self.tx_queues[queue].tx_batch(bufs, lens)

    def idle_fd(self) -> int | None:
        """See :meth:`capsvc.nicdriver.mmio.Bar.idle_fd`."""
        return self.bar.idle_fd()

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Stop the queues and release DMA memory and the BAR mapping."""
        if self._closed:
            return
        self._closed = True
        bar = self.bar
        try:
            bar.clear_flags(regs.RXCTRL, regs.RXCTRL_RXEN)
            for rxq in self.rx_queues:
                bar.clear_flags(regs.RXDCTL(rxq.index), regs.RXDCTL_ENABLE)
            for txq in self.tx_queues:
                bar.clear_flags(regs.TXDCTL(txq.index), regs.TXDCTL_ENABLE)
        finally:
            for ring in (*self.rx_queues, *self.tx_queues):
                ring.release()
            for pool in self.pools:
                pool.close()
            self.dma.close()
            bar.close()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    def __enter__(self) -> IxgbeDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "model" if self.is_model else "pci"
        return f"<IxgbeDevice {self.address} {kind} mac={self.mac.hex(':')}>"


def _lock_port(port_dir: Path) -> int:
    """Lock a model port for this process (a device has one driver at a time)."""
    try:
        fd = os.open(port_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as error:
        raise NicError(f"cannot open the model port {port_dir}: {error}") from error
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise DeviceBusy(
            f"the model port {port_dir.name} is driven by pid {holder}; one driver per device"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
