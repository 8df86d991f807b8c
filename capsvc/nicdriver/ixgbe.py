"""The 82599 (ixgbe) user-space driver: open, reset and init, queues, link, statistics, stop.

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

Supported boards. Only 82599 SFP+ boards are opened (:data:`~.regs.IXGBE_DEVICE_IDS`,
0x10FB and the other SFP+ variants). The link setup of spec 1.4 step 6 (AUTOC.LMS = 10G
serial without autonegotiation, then AN_RESTART) is right for them because their NVM sets
the serial PMA/PMD to SFI; backplane (KX4/KR), CX4, XAUI and 10GBASE-T boards and the X540
need link code this driver does not have, and :meth:`open` refuses them with
:class:`~.errors.DeviceNotAllowed` before touching them (:data:`~.regs.IXGBE_UNSUPPORTED_IDS`).

:meth:`reset_and_init` is ixy's ``reset_and_init``, spec 1.4, step by step (datasheet
sections in brackets in the step comments), with the datasheet's handshakes that ixy
leaves out: master disable before the reset [5.2.5.3.2] and a 1 ms pause before polling
CTRL.RST; RXCTRL.RXEN changed only while the RX security path is idle (SECRXCTRL.RX_DIS,
SECRXSTAT.SECRX_RDY) [4.6.7]; the TX arbiter disabled (RTTDCS.ARBDIS) while TX is
programmed [4.6.8]; DTXMXSZRQ within its 12-bit field; RDH written before the queue is
enabled. Waits poll with a timeout instead of forever, and a timeout names the register
and value it waited for. ``link_timeout`` bounds the last step, the wait for the link
(default :data:`DEFAULT_LINK_TIMEOUT`, 10 s; 0 returns without waiting); the ``nic:``
transport takes it from its address (``nic:DEVICE,link_timeout=SECONDS``).

Per RX queue a mempool of max(4096, rx_ring + tx_ring) buffers of 2 KiB is allocated (ixy's
sizing); SRRCTL.BSIZEPACKET is programmed to 2 KiB, and init checks that every buffer's
data area holds that much (the entries carry no headroom, see
:mod:`~capsvc.nicdriver.mempool`), so the device can never write past a buffer. The
transport and the benchmarks allocate their TX buffers from these pools or their own.

Statistics (spec 1.8) are clear-on-read on the device: :meth:`read_stats` reads every
counter once and adds the values to running totals in :attr:`stats`.

Stopping. The device writes received frames into host memory on its own, so its DMA must
end before that memory goes back to the kernel (which hands huge pages to the next user).
:meth:`IxgbeDevice.close` therefore first *stops* the device and only then frees rings and
pools. The stop (``_safe_stop``) never raises an error of its own (each step that fails
is logged and the next one still runs; an interrupt that arrives meanwhile is re-raised
after the last step):

1. RX: RXCTRL.RXEN off (with the security-path handshake), RXDCTL.ENABLE off per queue,
   then poll until the device clears it, which it does only after its pending memory
   accesses to the ring [4.6.7.1.2], bounded by :data:`~.quiesce.STOP_TIMEOUT` (logged when it runs
   out), then wait 100 us more;
2. TX: wait until TDH == TDT per queue (frames already queued still go out; bounded: with
   the link down nothing drains), TXDCTL.ENABLE off and polled;
3. master disable, then device reset: CTRL.RST | LNK_RST, 1 ms, poll for the self-clear;
4. Bus Master Enable off in the PCI Command register: from now on the function cannot
   reach memory at all.

Memory is freed only when step 3 or 4 was confirmed; otherwise it stays mapped until the
process exits (logged as an error). The same stop runs on every error path after the
kernel driver was unbound: a failure inside :meth:`open` (no huge pages, a model that
cannot be attached) or :meth:`reset_and_init` (a timeout, no DMA memory, no link) stops
the device before the error propagates, so the NIC is never left unbound with bus
mastering on and queues running. A device stopped by a failed init cannot be initialised
again: close it and open it anew.

Process exit and signals. Every device registers itself while it is open: an ``atexit``
handler stops the devices a process did not close (an uncaught exception, ``sys.exit``, an
uncaught ``KeyboardInterrupt``); handlers for SIGTERM and SIGINT (installed when a device
opens in the main thread, or by :func:`install_signal_handlers`, which may only be called
from the main thread; removed when the last device closes) chain to whatever handler was
there before. If that was a Python handler (SIGINT's ``KeyboardInterrupt`` above all) it
simply runs: the exception unwinds through ``close`` or reaches the ``atexit`` handler, so
``KeyboardInterrupt`` keeps its meaning. If it was the default action (SIGTERM), which
kills the process without running ``atexit`` handlers, every open device is stopped first
and the signal is then re-raised with the default action, so the exit status still says
"killed by SIGTERM". An ignored signal stays ignored. A program that handles the signals
itself (``capsvc serve`` drains on SIGTERM/SIGINT through trio's signal receiver, which
replaces these handlers while it runs) closes its devices on the way out; the ``nic:``
transport opens devices in a worker thread, where no handler can be installed.

SIGKILL (and a crash of the interpreter itself, or ``os._exit``) runs nothing. The device
then keeps its queues enabled and bus mastering on while the kernel reclaims the process's
huge pages, and the next frames received land in memory that belongs to someone else. The
operator must reset the function before anything reuses that memory, best by giving it
back to the kernel driver, whose probe resets it::

    echo 0000:03:00.0 > /sys/bus/pci/drivers/ixgbe/bind

``capsvc nic list`` and ``capsvc nic status ADDRESS`` show whether a function is bound
(``driver=-`` means unbound); no ``capsvc nic`` subcommand rebinds or resets a function.

A device object is single-threaded (like ixy's): one thread or task drives it.
"""

from __future__ import annotations

import atexit
import logging
import os
import platform
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from capsvc.nicdriver import regs
from capsvc.nicdriver.colocated import ColocatedBar, peer_directory
from capsvc.nicdriver.dma import DmaBackend, HugepageDma, ShmDma
from capsvc.nicdriver.errors import DeviceNotAllowed, LinkDown, NicError
from capsvc.nicdriver.mempool import BUFFERS, BufferSpace, Mempool
from capsvc.nicdriver.mmio import Bar, ModelBar
from capsvc.nicdriver.pci import MODEL_MARKER, PciFunction, open_function, probe
from capsvc.nicdriver.quiesce import (
    RESET_SETTLE,
    _quiesce,
    _quiet,
    _reset,
    _set_rx_enable,
)
from capsvc.nicdriver.rings import RxQueue, TxQueue

__all__ = [
    "DEFAULT_LINK_TIMEOUT",
    "DeviceStats",
    "IxgbeDevice",
    "install_signal_handlers",
    "read_marker",
]

log = logging.getLogger("capsvc.nic")

MAX_QUEUES = 64
DEFAULT_RING = 512
DEFAULT_LINK_TIMEOUT = 10.0  # seconds (spec 1.4 step 14: ixy polls LINKS for up to 10 s)

# RX buffers: 2 KiB mempool entries, all of it data; SRRCTL.BSIZEPACKET in KiB
ENTRY_SIZE = 2048
RX_BUFFER_KIB = 2


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
    :meth:`reset_and_init`; close with :meth:`close` (which stops the device first)."""

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
    ) -> None:
        _check_queue_counts(num_rx_queues, num_tx_queues)
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
        self._closed = False
        self._stopped: dict[str, bool] = {}  # stop step -> confirmed (see _quiesce)
        _register(self)

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

        Raises:
            DeviceNotAllowed: not an 82599 SFP+ physical function (nothing was touched).
            DeviceBusy: another driver owns the device (nothing was touched).
            NicError: anything else; if it happens after the kernel driver was unbound,
                the device was stopped first (reset, bus mastering off).
        """
        _check_queue_counts(num_rx_queues, num_tx_queues)
        found = probe(address, sysfs_root)  # read-only
        _check_board(found)
        if found.model_marker is None and platform.machine().lower() not in ("x86_64", "amd64"):
            raise NicError(
                "the Python driver relies on x86-64 store/load ordering (spec 4.3); "
                f"this machine is {platform.machine()}"
            )
        # locks the device (DeviceBusy before any change), unbinds, bus mastering on
        function, mm = open_function(address, sysfs_root, unbind=unbind, lock_model=True)
        # From here on the kernel driver is unbound and bus mastering is on: every way
        # out but success stops the function first.
        bar: Bar | None = None
        try:
            if function.port_dir is not None:
                port_dir = function.port_dir
                marker = read_marker(function.path / MODEL_MARKER)
                peer_dir = peer_directory(marker)
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
                bar = Bar(mm, name=function.address)
                if dma is None:
                    dma = HugepageDma()
            return cls(
                function,
                bar,
                dma,
                num_rx_queues=num_rx_queues,
                num_tx_queues=num_tx_queues,
                rx_ring_size=rx_ring_size,
                tx_ring_size=tx_ring_size,
            )
        except BaseException:
            if bar is None:
                bar = Bar(mm, name=function.address)
            try:
                _quiesce(bar, function, (), (), {})
            finally:
                try:
                    bar.close()
                except Exception:  # pragma: no cover (a half-built accessor holds a view)
                    log.debug("closing the BAR of %s after a failed open", address, exc_info=True)
                function.release()
            raise

    @property
    def is_model(self) -> bool:
        return isinstance(self.bar, ModelBar)

    # ------------------------------------------------------------------ init (spec 1.4)
    def reset_and_init(
        self, *, wait_for_link: bool = True, link_timeout: float = DEFAULT_LINK_TIMEOUT
    ) -> None:
        """The full init sequence; afterwards the queues run and the port is promiscuous.

        ``link_timeout``: seconds to wait for the link at the end (spec 1.4 step 14);
        0, like ``wait_for_link=False``, returns without waiting (check
        :meth:`link_speed` or call :meth:`wait_for_link` later).

        Raises:
            DriverTimeout: the device did not reach a state the sequence waits for.
            DmaError, HugepagesUnavailable: no memory for the rings and buffers.
            LinkDown: no link within ``link_timeout``.
            NicError: the device was closed, or stopped by an earlier failed init.

        On any failure the device is stopped (see the module docstring) before the error
        propagates; close it (and open it again to retry).
        """
        if self._closed:
            raise NicError(f"{self.address}: the device is closed")
        if self._stopped:
            raise NicError(
                f"{self.address}: the device was stopped after a failed init; "
                "close it and open it again"
            )
        try:
            self._reset_and_init(wait_for_link and link_timeout > 0, link_timeout)
        except BaseException:
            self._safe_stop()
            raise

    def _reset_and_init(self, wait_for_link: bool, link_timeout: float) -> None:
        bar = self.bar
        log.debug("resetting %s", self.address)
        # 1. disable interrupts [4.6.3.1]
        self._disable_interrupts()
        # 2. global reset [4.6.3.2], after master disable [5.2.5.3.2]: RST | LNK_RST, wait
        # 1 ms, wait until both read 0, then 10 ms
        _reset(bar, strict=True)
        time.sleep(RESET_SETTLE)
        self._disable_interrupts()
        # 4. EEPROM auto-read done [4.6.3]
        bar.wait_set(regs.EEC, regs.EEC_ARD, "EEC.ARD (EEPROM auto-read done)")
        # 3. the MAC address, from RAL(0)/RAH(0). The auto-read of step 4 is what loads
        # them from the EEPROM, so they are read once it is done (ixy reads them before;
        # the spec's step 3 notes that after step 4 is safer)
        self.mac = self._read_mac()
        # 5. DMA init done
        bar.wait_set(regs.RDRXCTL, regs.RDRXCTL_DMAIDONE, "RDRXCTL.DMAIDONE (DMA init done)")
        # 6. link [4.6.4]
        self._setup_link()
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

    def _setup_link(self) -> None:
        """10G serial without autonegotiation, then restart it; no wait here.

        Right for the SFP+ boards :meth:`open` accepts: in serial mode the PMA/PMD is the
        one AUTOC2 selects, which the NVM of an SFP+ board sets to SFI. The parallel PMA
        field (10G_PMA_PMD, XAUI) is written as ixy does; serial mode does not use it.
        """
        bar = self.bar
        autoc = bar.read32(regs.AUTOC)
        autoc = (autoc & ~regs.AUTOC_LMS_MASK) | regs.AUTOC_LMS_10G_SERIAL
        autoc = (autoc & ~regs.AUTOC_10G_PMA_PMD_MASK) | regs.AUTOC_10G_XAUI
        bar.write32(regs.AUTOC, autoc)
        bar.set_flags(regs.AUTOC, regs.AUTOC_AN_RESTART)  # then restart, on the new mode

    def _init_rx(self) -> None:
        bar = self.bar
        # disable RX while configuring
        _set_rx_enable(bar, False)
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
            ring = self.dma.allocate(self.rx_ring_size * regs.DESC_SIZE, contiguous=True)
            ring.fill(0xFF)  # a premature DMA hits an invalid address (spec 1.2)
            pool = Mempool(self.dma, pool_size, ENTRY_SIZE, self.space)
            self.pools.append(pool)
            # advanced one-buffer descriptors, buffers of RX_BUFFER_KIB, drop when out of
            # descriptors
            srrctl = bar.read32(regs.SRRCTL(i))
            srrctl &= ~(regs.SRRCTL_DESCTYPE_MASK | regs.SRRCTL_BSIZEPACKET_MASK)
            srrctl |= RX_BUFFER_KIB | regs.SRRCTL_DESCTYPE_ADV_ONEBUF | regs.SRRCTL_DROP_EN
            bar.write32(regs.SRRCTL(i), srrctl)
            # every buffer must hold what the device may write into it
            written = bar.read32(regs.SRRCTL(i)) & regs.SRRCTL_BSIZEPACKET_MASK
            pool.check_dma_room(written * regs.SRRCTL_BSIZEPACKET_UNIT)
            phys = ring.phys(0)
            bar.write32(regs.RDBAL(i), phys & 0xFFFFFFFF)
            bar.write32(regs.RDBAH(i), phys >> 32)
            bar.write32(regs.RDLEN(i), self.rx_ring_size * regs.DESC_SIZE)
            bar.write32(regs.RDH(i), 0)
            bar.write32(regs.RDT(i), 0)
            self.rx_queues.append(RxQueue(bar, i, ring, self.rx_ring_size, pool))
        # no-snoop disable; clear the undocumented DCA_RXCTRL bit 12 of every queue
        bar.set_flags(regs.CTRL_EXT, regs.CTRL_EXT_NS_DIS)
        for i in range(self.num_rx_queues):
            bar.clear_flags(regs.DCA_RXCTRL(i), regs.DCA_RXCTRL_BIT12)
        _set_rx_enable(bar, True)

    def _init_tx(self) -> None:
        bar = self.bar
        # the descriptor arbiter stays off while TX is programmed [4.6.8]
        bar.set_flags(regs.RTTDCS, regs.RTTDCS_ARBDIS)
        # CRC offload and small-packet padding
        bar.set_flags(regs.HLREG0, regs.HLREG0_TXCRCEN | regs.HLREG0_TXPADEN)
        bar.write32(regs.TXPBSIZE(0), regs.TXPBSIZE_40KB)
        for i in range(1, 8):
            bar.write32(regs.TXPBSIZE(i), 0)
        # largest request size (no DCB): all ones in the 12-bit field, reserved bits 0
        bar.write32(regs.DTXMXSZRQ, regs.DTXMXSZRQ_MAX_BYTES_MASK)
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
        bar.clear_flags(regs.RTTDCS, regs.RTTDCS_ARBDIS)
        bar.set_flags(regs.DMATXCTL, regs.DMATXCTL_TE)

    def _start_rx_queue(self, rxq: RxQueue) -> None:
        i = rxq.index
        rxq.fill()
        # the head is the device's once the queue is enabled: set it before
        self.bar.write32(regs.RDH(i), 0)
        self.bar.set_flags(regs.RXDCTL(i), regs.RXDCTL_ENABLE)
        self.bar.wait_set(regs.RXDCTL(i), regs.RXDCTL_ENABLE, f"RXDCTL({i}).ENABLE")
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

    def wait_for_link(self, timeout: float = DEFAULT_LINK_TIMEOUT) -> int:
        """Poll LINKS until the link is up (spec 1.4 step 14); returns the speed."""
        deadline = time.monotonic() + timeout
        while (speed := self.link_speed()) == 0:
            if time.monotonic() > deadline:
                raise LinkDown(
                    f"{self.address}: no link after {timeout:g} s "
                    "(is a cable or the peer model connected? `capsvc nic status` shows it; "
                    "a slow link takes a larger link_timeout)"
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

    # ------------------------------------------------------------------ stopping, closing
    def _safe_stop(self) -> bool:
        """Stop the device's DMA (module docstring, "Stopping"); never raises an error of
        its own. Returns True when the device is known to access no memory any more (the
        reset completed or bus mastering is off). Steps already done are not repeated, so
        a signal handler or the ``atexit`` handler may finish a stop that was interrupted."""
        return _quiesce(
            self.bar,
            self.function,
            [q.index for q in self.rx_queues],
            [q.index for q in self.tx_queues],
            self._stopped,
        )

    def close(self) -> None:
        """Stop the device, then release DMA memory, the BAR mapping and the port lock."""
        if self._closed:
            return
        self._closed = True
        try:
            self._safe_stop()
        finally:
            _forget(self)
            self._release(_quiet(self._stopped))

    def _release(self, quiet: bool) -> None:
        try:
            self._release_memory(quiet)
        finally:
            try:
                self.bar.close()
            finally:
                self.function.release()  # the ownership lock, last

    def _release_memory(self, quiet: bool) -> None:
        for ring in (*self.rx_queues, *self.tx_queues):
            ring.release()
        for pool in self.pools:
            pool.close()
        if quiet:
            self.dma.close()
        else:
            log.error(
                "%s: could not confirm that the device stopped its DMA (no reset, bus "
                "mastering not cleared): its DMA memory stays mapped until this process "
                "exits; reset the function before reusing it: echo %s > "
                "/sys/bus/pci/drivers/ixgbe/bind",
                self.address,
                self.address,
            )
            _QUARANTINE.append(self.dma)

    def __enter__(self) -> IxgbeDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "model" if self.is_model else "pci"
        return f"<IxgbeDevice {self.address} {kind} mac={self.mac.hex(':')}>"


# ---------------------------------------------------------------------------- checks
def _check_queue_counts(num_rx_queues: int, num_tx_queues: int) -> None:
    if not (1 <= num_rx_queues <= MAX_QUEUES and 1 <= num_tx_queues <= MAX_QUEUES):
        raise ValueError(f"queue counts must be within 1..{MAX_QUEUES}")


def _check_board(function: PciFunction) -> None:
    """Refuse, before anything is touched, the ixgbe boards whose link this driver cannot
    set up (the general allow-list check is :func:`~.pci.open_function`'s)."""
    if function.vendor != regs.INTEL_VENDOR:
        return
    name = regs.IXGBE_UNSUPPORTED_IDS.get(function.device)
    if name is None:
        return
    supported = ", ".join(f"{d:04x}" for d in regs.IXGBE_DEVICE_IDS)
    raise DeviceNotAllowed(
        f"{function.address} is an Intel {name} (8086:{function.device:04x}): the driver's "
        "link setup (10G serial, SFI) is right only for 82599 SFP+ boards "
        f"(device IDs {supported}), so it does not open this one; it was left untouched"
    )


# ----------------------------------------------------------- process exit and signals
_LIVE: dict[int, IxgbeDevice] = {}  # id -> every device not yet closed
_QUARANTINE: list[DmaBackend] = []  # DMA memory of devices that could not be stopped
_PREVIOUS: dict[int, signal._HANDLER] = {}  # signal -> the handler ours chains to
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_registry_lock = threading.Lock()


def _register(device: IxgbeDevice) -> None:
    with _registry_lock:
        if not _LIVE:
            atexit.register(_stop_all_at_exit)
        _LIVE[id(device)] = device
    install_signal_handlers()


def _forget(device: IxgbeDevice) -> None:
    with _registry_lock:
        if _LIVE.pop(id(device), None) is None or _LIVE:
            return
        atexit.unregister(_stop_all_at_exit)
    _restore_signal_handlers()


def install_signal_handlers() -> bool:
    """Make SIGTERM and SIGINT stop every open device before the process dies of them.

    Chains to the handler that was installed before (see the module docstring). Signal
    handlers can only be installed from the main thread: from another thread this does
    nothing and returns False (devices opened there are still stopped by the ``atexit``
    handler; a program that opens them in a worker thread and wants SIGTERM covered calls
    this once from its main thread). Idempotent.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for signum in _STOP_SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal:
            continue
        if current is None:  # installed from C: it cannot be chained to
            log.debug("not handling signal %d: its handler was not installed by Python", signum)
            continue
        _PREVIOUS[signum] = current
        signal.signal(signum, _on_signal)
    return True


def _restore_signal_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # ours stays; with no device open it only chains
    for signum, previous in list(_PREVIOUS.items()):
        if signal.getsignal(signum) is _on_signal:  # else someone chained to us: keep it
            signal.signal(signum, previous)
            del _PREVIOUS[signum]


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    if callable(previous):
        # a Python handler (SIGINT's KeyboardInterrupt): it decides; the unwinding closes
        # the devices or the atexit handler stops them
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # The default action kills the process without atexit handlers: stop the devices
    # first, then die of the same signal.
    _stop_all(f"signal {signal.Signals(signum).name}")
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _stop_all(reason: str) -> None:
    # A device being closed is still here until its stop is complete: a signal that
    # interrupted close() finishes the stop (steps already done are skipped).
    for device in tuple(_LIVE.values()):
        log.info("%s: stopping the device (%s)", device.address, reason)
        device._safe_stop()


def _stop_all_at_exit() -> None:
    _stop_all("process exit without close")
