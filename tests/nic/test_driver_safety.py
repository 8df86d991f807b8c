"""Driver safety (issue 14, driver part): stopping DMA before memory is freed, on close, on
error paths, at exit and on signals; RX buffers that hold what the NIC may write; the board
allow-list; and the smaller datasheet handshakes of the init sequence.

Register order is checked with a *recording* accessor: the device's ``read32``/``write32``
are wrapped (instance attributes, so ``set_flags``, ``clear_flags`` and the waits go
through them too) and every access is logged with its value and time. The model runs in a
thread of this process (``host.start_thread``) wherever the driver waits for it; the
waits return as soon as the register changes, and their limits only bound a hang. The
signal and exit tests run the driver in a subprocess and look at the model's registers and
the port's PCI config file afterwards.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from capsvc.nicdriver import ixgbe, regs
from capsvc.nicdriver.address import parse_nic_spec
from capsvc.nicdriver.dma import HUGE_PAGE, DmaBackend, DmaRegion
from capsvc.nicdriver.errors import DeviceNotAllowed, DmaError, HugepagesUnavailable, NicError
from capsvc.nicdriver.ixgbe import IxgbeDevice
from capsvc.nicdriver.mempool import BufferSpace, Mempool
from capsvc.nicdriver.modelhost import ModelHost, PortFiles, start_pair
from tests.nic.conftest import ROOT, Pair, env, open_port
from tests.nic.test_pci import X520, command_register, fake_function, real_sysfs  # noqa: F401

FRAME_TYPE = b"\x88\xb5"


# ----------------------------------------------------------------------------- helpers
@dataclass
class Access:
    kind: str  # "r", "w", or an event name ("free")
    offset: int = -1
    value: int = 0
    at: float = 0.0
    note: object = None


@dataclass
class Recorder:
    """Every register access of one device, in order."""

    log: list[Access] = field(default_factory=list)

    def attach(self, device: IxgbeDevice) -> None:
        read, write = device.bar.read32, device.bar.write32

        def recording_read32(offset: int) -> int:
            value = read(offset)
            self.log.append(Access("r", offset, value, time.monotonic()))
            return value

        def recording_write32(offset: int, value: int) -> None:
            self.log.append(Access("w", offset, value, time.monotonic()))
            write(offset, value)

        device.bar.read32 = recording_read32  # type: ignore[method-assign]
        device.bar.write32 = recording_write32  # type: ignore[method-assign]

    def event(self, name: str, note: object = None) -> None:
        self.log.append(Access(name, at=time.monotonic(), note=note))

    def index(
        self,
        kind: str,
        offset: int = -1,
        test: Callable[[int], object] | None = None,
        start: int = 0,
    ) -> int:
        """The first access at or after ``start`` of ``kind`` (to ``offset``) whose value
        satisfies ``test``, or -1."""
        for i in range(max(start, 0), len(self.log)):
            a = self.log[i]
            if a.kind == kind and (offset < 0 or a.offset == offset):
                if test is None or test(a.value):
                    return i
        return -1

    def writes(self, offset: int) -> list[tuple[int, int]]:
        return [
            (i, a.value) for i, a in enumerate(self.log) if a.kind == "w" and a.offset == offset
        ]


def bus_master(port: PortFiles) -> bool:
    return bool(command_register(port.pci_dir / "config") & regs.PCI_COMMAND_MASTER)


def model_register(host: ModelHost, index: int, offset: int) -> int:
    return int(host.models[index].regs[offset >> 2])


def resets(host: ModelHost, index: int) -> int:
    return host.models[index].fault_counts()["resets"]


@pytest.fixture
def running(rundir: Path) -> Iterator[ModelHost]:
    """A model pair ("s") whose models run in a thread for the whole test."""
    host = start_pair("s", rundir=rundir, spin=0)
    host.start_thread()
    try:
        yield host
    finally:
        host.stop()
        host.close()


@pytest.fixture
def recorded(running: ModelHost, rundir: Path) -> Iterator[tuple[IxgbeDevice, Recorder]]:
    """Port s.0 opened with a recording accessor and initialised."""
    device = open_port(rundir, "s.0", rx_ring_size=64, tx_ring_size=64)
    recorder = Recorder()
    recorder.attach(device)
    try:
        device.reset_and_init(link_timeout=5)  # real time: the model thread raises it
        yield device, recorder
    finally:
        device.close()


# ------------------------------------------- point 1: stop DMA before memory is freed
def test_close_stops_rx_drains_tx_resets_and_clears_bus_master_before_freeing(
    recorded: tuple[IxgbeDevice, Recorder], running: ModelHost, rundir: Path
) -> None:
    device, rec = recorded
    port = PortFiles(rundir / "s.0")
    # a frame in flight, so that the drain has something to wait for
    pool = device.pools[0]
    buf = pool.alloc()
    frame = bytes(6) + device.mac + FRAME_TYPE + bytes(100)
    assert device.tx_batch(0, [buf], [pool.write(buf, frame)]) == 1
    resets_before = resets(running, 0)
    freed: list[tuple[str, bool]] = []

    def record_free(name: str, original: Callable[[], None]) -> Callable[[], None]:
        def wrapper() -> None:
            rec.event("free", name)
            freed.append((name, bus_master(port)))
            original()

        return wrapper

    device.dma.close = record_free("dma", device.dma.close)  # type: ignore[method-assign]
    for p in device.pools:
        p.close = record_free("pool", p.close)  # type: ignore[method-assign]
    for ring in (*device.rx_queues, *device.tx_queues):
        ring.release = record_free("ring", ring.release)  # type: ignore[method-assign]
    start = len(rec.log)
    device.close()

    rxen_off = rec.index("w", regs.RXCTRL, lambda v: not v & regs.RXCTRL_RXEN, start)
    rxdctl_off = rec.index("w", regs.RXDCTL(0), lambda v: not v & regs.RXDCTL_ENABLE, start)
    rxdctl_polled = rec.index("r", regs.RXDCTL(0), lambda v: not v & regs.RXDCTL_ENABLE, rxdctl_off)
    tdh_read = rec.index("r", regs.TDH(0), None, rxdctl_polled)
    txdctl_off = rec.index("w", regs.TXDCTL(0), lambda v: not v & regs.TXDCTL_ENABLE, start)
    master_off = rec.index("w", regs.CTRL, lambda v: v & regs.CTRL_GIO_MASTER_DISABLE, start)
    reset = rec.index("w", regs.CTRL, lambda v: v & regs.CTRL_RST, start)
    reset_done = rec.index("r", regs.CTRL, lambda v: not v & regs.CTRL_RST_MASK, reset)
    first_free = rec.index("free", start=start)
    order = [rxen_off, rxdctl_off, rxdctl_polled, tdh_read, txdctl_off, master_off, reset]
    assert all(i >= 0 for i in order), order
    assert order == sorted(order), order
    assert reset < reset_done < first_free
    # the drain saw the frame go: TDH reached TDT before TXDCTL.ENABLE was cleared
    drained = [a for a in rec.log[tdh_read:txdctl_off] if a.kind == "r"]
    tdh = [a.value for a in drained if a.offset == regs.TDH(0)]
    tdt = [a.value for a in drained if a.offset == regs.TDT(0)]
    assert tdh
    assert tdh[-1] == tdt[-1] == 1
    # nothing was freed while bus mastering was on, and everything was freed
    assert {name for name, _ in freed} == {"dma", "pool", "ring"}
    assert not any(master for _, master in freed)
    assert not bus_master(port)
    assert resets(running, 0) > resets_before


def test_a_failed_init_stops_the_device(running: ModelHost, rundir: Path) -> None:
    port = PortFiles(rundir / "s.0")
    device = open_port(rundir, "s.0", rx_ring_size=64, tx_ring_size=64)
    try:
        assert bus_master(port)
        allocate = device.dma.allocate
        calls = []

        def failing_allocate(size: int, *, contiguous: bool = False) -> DmaRegion:
            calls.append(size)
            if len(calls) == 2:  # the first RX queue's ring is allocated, its pool fails
                raise DmaError("injected: no memory for the mempool")
            return allocate(size, contiguous=contiguous)

        device.dma.allocate = failing_allocate  # type: ignore[method-assign]
        before = resets(running, 0)
        with pytest.raises(DmaError, match="injected"):
            device.reset_and_init(link_timeout=5)
        assert not bus_master(port)
        assert resets(running, 0) >= before + 2  # the init's reset and the stop's
        assert not model_register(running, 0, regs.RXCTRL) & regs.RXCTRL_RXEN
        with pytest.raises(NicError, match="stopped after a failed init"):
            device.reset_and_init(link_timeout=5)
    finally:
        device.close()
    open_port(rundir, "s.0").close()  # the lock was released


def test_a_failed_open_after_the_unbind_stops_the_device(
    running: ModelHost, rundir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E.g. missing huge pages: found only after open_function unbound the function and
    turned bus mastering on; the device must not stay bus master."""
    port = PortFiles(rundir / "s.0")

    def no_memory(*args: object, **kwargs: object) -> DmaBackend:
        raise HugepagesUnavailable("injected: no free huge pages")

    monkeypatch.setattr(ixgbe, "ShmDma", no_memory)
    before = resets(running, 0)
    with pytest.raises(HugepagesUnavailable, match="injected"):
        open_port(rundir, "s.0")
    assert not bus_master(port)
    assert command_register(port.pci_dir / "config") & regs.PCI_COMMAND_MEMORY
    assert resets(running, 0) > before
    monkeypatch.undo()
    open_port(rundir, "s.0").close()  # the lock was released


# Opens the ports named on the command line, initialises them and says "ready"; then
# sleeps ("sleep") or waits for a line on stdin and raises ("crash").
DRIVER = """
import sys, time
from pathlib import Path
from capsvc.nicdriver.ixgbe import IxgbeDevice
rundir, mode, names = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
devices = [
    IxgbeDevice.open("0000:00:10.0", sysfs_root=rundir / name / "sysfs",
                     rx_ring_size=64, tx_ring_size=64)
    for name in names
]
for device in devices:
    device.reset_and_init(link_timeout=5)
print("ready", flush=True)
if mode == "crash":
    sys.stdin.readline()
    raise RuntimeError("crash after init, nothing closed")
time.sleep(60)
"""


def run_driver(rundir: Path, mode: str, names: list[str]) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(rundir), mode, *names],
        cwd=ROOT,
        env=env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"the driver process did not start: {line!r}\n{err}")
    return process


def finish(process: subprocess.Popen[str]) -> str:
    try:
        _, err = process.communicate(timeout=30)  # real time: bounds a hang only
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"the driver process did not exit:\n{err}") from None
    return err


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "crash"])
def test_a_dying_driver_process_stops_its_devices(
    running: ModelHost, rundir: Path, how: str
) -> None:
    """SIGTERM (default action: dies without atexit), SIGINT (KeyboardInterrupt, still
    raised and uncaught) and an uncaught exception: every device the process had open is
    stopped (reset seen by the model, bus mastering off) before it is gone."""
    ports = [PortFiles(rundir / name) for name in ("s.0", "s.1")]
    process = run_driver(rundir, "crash" if how == "crash" else "sleep", ["s.0", "s.1"])
    try:
        before = [resets(running, i) for i in range(2)]
        for i, port in enumerate(ports):
            assert bus_master(port)
            assert model_register(running, i, regs.RXCTRL) & regs.RXCTRL_RXEN
        if how == "crash":
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        else:
            process.send_signal(getattr(signal, how))
        err = finish(process)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if how == "crash":
        assert process.returncode == 1
        assert "crash after init" in err
    else:
        assert process.returncode == -getattr(signal, how), err
    if how == "SIGINT":
        assert "KeyboardInterrupt" in err  # its meaning was kept: raised, uncaught
    for i, port in enumerate(ports):
        assert resets(running, i) > before[i], err
        assert not bus_master(port), err
        assert not model_register(running, i, regs.RXCTRL) & regs.RXCTRL_RXEN
        assert not model_register(running, i, regs.RXDCTL(0)) & regs.RXDCTL_ENABLE


def test_signal_handlers_chain_and_are_removed_with_the_last_device(
    running: ModelHost, rundir: Path
) -> None:
    calls: list[int] = []

    def previous(signum: int, frame: object) -> None:
        calls.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        a = open_port(rundir, "s.0")
        b = open_port(rundir, "s.1")
        handler = signal.getsignal(signal.SIGTERM)
        assert handler is not previous
        assert callable(handler)
        handler(signal.SIGTERM, None)  # a Python handler before ours: it runs, nothing stops
        assert calls == [signal.SIGTERM]
        assert bus_master(PortFiles(rundir / "s.0"))
        a.close()
        assert signal.getsignal(signal.SIGTERM) is handler  # one device still open
        b.close()
        if not ixgbe._LIVE:  # (a device another test left open would keep it installed)
            assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, old)


# --------------------------------------------- point 2: buffers hold what the NIC writes
def test_every_rx_buffer_holds_what_the_nic_may_write(pair: Pair) -> None:
    for device in (pair.a, pair.b):
        bsize = (device.bar.read32(regs.SRRCTL(0)) & regs.SRRCTL_BSIZEPACKET_MASK) * 1024
        assert bsize == 2048  # MTU-sized frames still fit one buffer
        for pool in device.pools:
            assert bsize <= pool.capacity
            phys = pool.space.phys
            ends = set()
            for buf in range(pool.base, pool.base + pool.size):
                start = pool.offset(buf)
                end = start + bsize  # what the device may write from the buffer's address
                assert end <= len(pool.mem)
                assert end <= (buf - pool.base + 1) * pool.entry_size  # not into the next
                assert start // HUGE_PAGE == (end - 1) // HUGE_PAGE  # one physical page
                page = pool.region.page_phys[start // HUGE_PAGE]
                assert phys[buf] == page + start % HUGE_PAGE
                ends.add(end)
            assert len(ends) == pool.size


class _MemoryDma(DmaBackend):
    """Plain memory with made-up physical addresses (for mempool layout checks)."""

    def allocate(self, size: int, *, contiguous: bool = False) -> DmaRegion:
        pages = -(-size // HUGE_PAGE)
        return DmaRegion(
            memoryview(bytearray(pages * HUGE_PAGE)), [(k + 7) * HUGE_PAGE for k in range(pages)]
        )


def test_a_pool_whose_buffers_are_too_small_is_refused() -> None:
    ok = Mempool(_MemoryDma(), 1024, 2048, BufferSpace())
    ok.check_dma_room(2048)
    with_headroom = Mempool(_MemoryDma(), 1024, 2048, BufferSpace(), headroom=64)
    with pytest.raises(DmaError, match="holds 1984"):
        with_headroom.check_dma_room(2048)


# --------------------------------------------------------- point 5: boards and the link
@pytest.mark.parametrize("device_id", [0x10F7, 0x1517, 0x10F8, 0x10F9, 0x10FC, 0x151C, 0x1528])
def test_boards_other_than_sfp_plus_are_refused_untouched(
    real_sysfs: Path,  # noqa: F811
    device_id: int,
) -> None:
    path = fake_function(real_sysfs, X520, 0x8086, device_id, 0x020000, driver="ixgbe")
    with pytest.raises(DeviceNotAllowed, match=r"only for 82599 SFP\+ boards.*10fb"):
        IxgbeDevice.open(X520, sysfs_root=real_sysfs)
    assert (real_sysfs / "bus/pci/drivers/ixgbe/unbind").read_text() == ""  # still bound
    assert command_register(path / "config") == 0
    assert device_id not in regs.IXGBE_DEVICE_IDS


def test_the_allow_list_is_the_sfp_plus_boards() -> None:
    assert set(regs.IXGBE_DEVICE_IDS) == {0x10FB, 0x1529, 0x1507, 0x154D, 0x154A, 0x1557}
    assert not set(regs.IXGBE_DEVICE_IDS) & set(regs.IXGBE_UNSUPPORTED_IDS)


def test_link_timeout_is_an_address_option(
    running: ModelHost, rundir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from capsvc.transport.nic import _open_device

    spec = parse_nic_spec(f"nic:model:s.0,rundir={rundir},link_timeout=2.5")
    assert spec.link_timeout == 2.5
    assert parse_nic_spec(str(spec)) == spec
    assert spec.key() == parse_nic_spec(f"nic:model:s.0,rundir={rundir}").key()
    assert parse_nic_spec("nic:model:x,link_timeout=0").link_timeout == 0
    with pytest.raises(ValueError, match="link_timeout=-1 is not a number of seconds"):
        parse_nic_spec("nic:model:x,link_timeout=-1")
    seen: list[dict[str, object]] = []
    init = IxgbeDevice.reset_and_init

    def recording(self: IxgbeDevice, **options: object) -> None:
        seen.append(options)
        init(self, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(IxgbeDevice, "reset_and_init", recording)
    _open_device(spec).close()
    _open_device(parse_nic_spec(f"nic:model:s.0,rundir={rundir}")).close()
    assert seen == [{"link_timeout": 2.5}, {}]


# ------------------------------------------------- point 6: datasheet handshakes of init
def test_reset_follows_master_disable_and_waits_before_polling(
    recorded: tuple[IxgbeDevice, Recorder],
) -> None:
    _, rec = recorded
    master_off = rec.index("w", regs.CTRL, lambda v: v & regs.CTRL_GIO_MASTER_DISABLE)
    reset = rec.index("w", regs.CTRL, lambda v: v & regs.CTRL_RST)
    assert 0 <= master_off < reset
    # waited until STATUS.GIO_MASTER_ENABLE read 0 (no master request pending)
    quiet = rec.index("r", regs.STATUS, lambda v: not v & regs.STATUS_GIO_MASTER_ENABLE, master_off)
    assert master_off < quiet < reset
    first_poll = rec.index("r", regs.CTRL, None, reset + 1)
    assert rec.log[first_poll].at - rec.log[reset].at >= 0.0009  # ~1 ms before polling


def test_rxen_changes_only_inside_the_security_path_handshake(
    recorded: tuple[IxgbeDevice, Recorder],
) -> None:
    _, rec = recorded
    rxctrl = rec.writes(regs.RXCTRL)
    assert len(rxctrl) >= 2  # off while configuring, on at the end
    assert rxctrl[-1][1] & regs.RXCTRL_RXEN
    secrxctrl = rec.writes(regs.SECRXCTRL)
    for i, _ in rxctrl:
        before = [(j, v) for j, v in secrxctrl if j < i]
        after = [(j, v) for j, v in secrxctrl if j > i]
        assert before
        assert before[-1][1] & regs.SECRXCTRL_RX_DIS
        ready = rec.index(
            "r", regs.SECRXSTAT, lambda v: v & regs.SECRXSTAT_SECRX_RDY, before[-1][0]
        )
        assert before[-1][0] < ready < i, "RXEN changed before SECRX_RDY read 1"
        assert after
        assert not after[0][1] & regs.SECRXCTRL_RX_DIS


def test_tx_is_programmed_with_the_arbiter_disabled(
    recorded: tuple[IxgbeDevice, Recorder],
) -> None:
    device, rec = recorded
    arbdis_on = rec.index("w", regs.RTTDCS, lambda v: v & regs.RTTDCS_ARBDIS)
    txpb = rec.index("w", regs.TXPBSIZE(0))
    ring = rec.index("w", regs.TDBAL(0))
    arbdis_off = rec.index("w", regs.RTTDCS, lambda v: not v & regs.RTTDCS_ARBDIS, arbdis_on)
    te = rec.index("w", regs.DMATXCTL, lambda v: v & regs.DMATXCTL_TE)
    assert 0 <= arbdis_on < txpb < ring < arbdis_off < te
    assert not device.bar.read32(regs.RTTDCS) & regs.RTTDCS_ARBDIS


def test_dtxmxszrq_stays_within_its_12_bit_field(recorded: tuple[IxgbeDevice, Recorder]) -> None:
    device, rec = recorded
    assert [v for _, v in rec.writes(regs.DTXMXSZRQ)] == [0xFFF]
    assert device.bar.read32(regs.DTXMXSZRQ) == 0xFFF


def test_rdh_is_written_only_before_the_queue_is_enabled(
    recorded: tuple[IxgbeDevice, Recorder],
) -> None:
    _, rec = recorded
    enable = rec.index("w", regs.RXDCTL(0), lambda v: v & regs.RXDCTL_ENABLE)
    rdh = [i for i, _ in rec.writes(regs.RDH(0))]
    assert rdh
    assert max(rdh) < enable
    rdt = [(i, v) for i, v in rec.writes(regs.RDT(0)) if i > enable]
    assert rdt == [(rdt[0][0], 63)]  # then only the tail gives the ring to the device


def test_zero_length_tx_is_refused_naming_its_index(pair: Pair) -> None:
    txq = pair.a.tx_queues[0]
    pool = pair.a.pools[0]
    bufs = pool.alloc_batch(3)
    tdt = pair.a.bar.read32(regs.TDT(0))
    with pytest.raises(ValueError, match="TX length 0 at index 1"):
        pair.a.tx_batch(0, bufs, [60, 0, 60])
    with pytest.raises(ValueError, match="at index 2"):
        pair.a.tx_batch(0, bufs, [60, 60, 0x4000])
    with pytest.raises(ValueError, match="TX length 0 at index 0"):
        txq.tx_one(bufs[0], 0)
    assert txq.tx_index == 0
    assert pair.a.bar.read32(regs.TDT(0)) == tdt
    assert bytes(txq.d8[:48]) == b"\xff" * 48  # no descriptor was written
    pool.free_batch(bufs)
