"""The strict software 82599 (issue 14): device behaviour a driver's correctness depends on.

One test (or a few) per point, driving the model directly through the register accessor,
the rings and ``inject``, or through the driver where it already behaves correctly:

1. queue-enable bits latch only a valid ring, and only through the device;
2. descriptors are fetched when the tail moves: later writes are not seen (and counted);
3. TX completion writes back bytes 0-11 of the descriptor, not only DD;
4. bad-CRC (and other MAC-error) frames: dropped and counted, or with FCTRL.SBP written
   with RXE so that the driver's drop path runs;
5. HLREG0.RXCRCSTRP and RDRXCTL.CRCSTRIP must agree;
6. MAXFRS.MFS applies only with HLREG0.JUMBOEN (else 1518, 1522 with a VLAN tag);
7. reset, EEPROM auto-read and DMA init take time;
8. a clear-on-read counter read by any reader is cleared for all;
9. DMA only inside the memory the driver has registered.

The tests named ``test_driver_*`` check the *driver's* side of these points (its close
waits for the device before freeing memory; its RX buffers hold what SRRCTL lets the
device write): they fail on a driver that gets it wrong, by design.

Timing: tests with ``pair.step()`` are deterministic (the model runs only when stepped).
The reset tests use real time on purpose (the reset *takes* time); their delays are set
far apart so that only a stall of a large fraction of a second could blur them. The
``test_driver_close_*`` tests run the model in a thread, hold it in the middle of a DMA
with events and release it when the driver has either freed its memory or started to wait
for the device; their timeouts only bound a hang.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from capsvc.nicdriver import control as ctl
from capsvc.nicdriver import regs
from capsvc.nicdriver.errors import DriverTimeout
from capsvc.nicdriver.mmio import ModelBar
from capsvc.nicdriver.model import IxgbeModel
from capsvc.nicdriver.modelhost import mac_for
from tests.nic.conftest import Pair, open_port

ETHERTYPE = b"\x88\xb5"
FCTRL_SBP = 1 << 1  # store bad packets (ixgbe_type.h IXGBE_FCTRL_SBP)
ENABLE = regs.RXDCTL_ENABLE


def frame(pair: Pair, size: int, seq: int = 0, *, vlan: bool = False) -> bytes:
    """A frame from a to b of ``size`` bytes (without FCS)."""
    head = pair.b.mac + pair.a.mac
    if vlan:
        head += b"\x81\x00\x00\x05"  # 802.1Q tag, VLAN 5
    head += ETHERTYPE + struct.pack("<I", seq)
    return head + bytes((seq + i) & 0xFF for i in range(size - len(head)))


def receive(pair: Pair, max_packets: int = 64) -> list[bytes]:
    pool = pair.b.pools[0]
    bufs, lens = pair.b.rx_batch(0, max_packets)
    got = [pool.read(buf, n) for buf, n in zip(bufs, lens, strict=True)]
    pool.free_batch(bufs)
    return got


def send(pair: Pair, frames: list[bytes]) -> None:
    pool = pair.a.pools[0]
    bufs = pool.alloc_batch(len(frames))
    lens = [pool.write(buf, f) for buf, f in zip(bufs, frames, strict=True)]
    assert pair.a.tx_batch(0, bufs, lens) == len(frames)


def raw(model: IxgbeModel, offset: int) -> int:
    """A register word as stored in the BAR file (what the driver wrote, for RXDCTL)."""
    return int(model.regs[offset >> 2])


def rearm_head(pair: Pair, phys: int) -> int:
    """Point the RX descriptor at the device's head to ``phys``, with the queue disabled
    while the descriptor changes (so it is fetched anew on enable); returns the slot."""
    bar = pair.b.bar
    bar.clear_flags(regs.RXDCTL(0), ENABLE)
    pair.step()
    assert not bar.read32(regs.RXDCTL(0)) & ENABLE
    slot = bar.read32(regs.RDH(0))
    rxq = pair.b.rx_queues[0]
    assert slot == rxq.rx_index
    rxq.d64[2 * slot] = phys
    rxq.d64[2 * slot + 1] = 0
    bar.set_flags(regs.RXDCTL(0), ENABLE)
    pair.step()
    assert bar.read32(regs.RXDCTL(0)) & ENABLE
    return slot


# ------------------------------------------------------------------ 1. queue enables
def test_queue_enable_is_a_request_the_device_latches(pair: Pair) -> None:
    bar, model = pair.b.bar, pair.mb
    pair.step()
    bar.clear_flags(regs.RXDCTL(0), ENABLE)
    pair.step()
    assert not bar.read32(regs.RXDCTL(0)) & ENABLE
    bar.set_flags(regs.RXDCTL(0), ENABLE)
    assert raw(model, regs.RXDCTL(0)) & ENABLE  # the request is stored ...
    assert not bar.read32(regs.RXDCTL(0)) & ENABLE  # ... but the device has not latched
    pair.step()
    assert bar.read32(regs.RXDCTL(0)) & ENABLE
    assert model.rxq[0] is not None
    # other bits of the register read back as written
    assert bar.read32(regs.TXDCTL(0)) & 0x7F == regs.TXDCTL_PTHRESH


def test_queue_enable_with_an_invalid_ring_stays_zero_and_the_wait_names_it(pair: Pair) -> None:
    bar, model = pair.b.bar, pair.mb
    pair.step()
    bar.clear_flags(regs.RXDCTL(0), ENABLE)
    pair.step()
    faults = model.fault_counts()["bad_ring"]
    good_length = bar.read32(regs.RDLEN(0))
    bar.write32(regs.RDLEN(0), 100)  # not a multiple of 128
    bar.set_flags(regs.RXDCTL(0), ENABLE)
    pair.step()
    assert raw(model, regs.RXDCTL(0)) & ENABLE
    assert not bar.read32(regs.RXDCTL(0)) & ENABLE
    assert model.fault_counts()["bad_ring"] == faults + 1
    with pytest.raises(DriverTimeout, match=r"RXDCTL\(0\)\.ENABLE.*0x01028"):
        bar.wait_set(regs.RXDCTL(0), ENABLE, "RXDCTL(0).ENABLE", timeout=0.02)
    pair.step(3)  # a standing request is not retried (no fault storm)
    assert model.fault_counts()["bad_ring"] == faults + 1
    # fixed ring, ENABLE written again: the stored word does not change (it already holds
    # ENABLE), the write itself is the new request
    bar.write32(regs.RDLEN(0), good_length)
    bar.set_flags(regs.RXDCTL(0), ENABLE)
    pair.step()
    assert bar.read32(regs.RXDCTL(0)) & ENABLE


def test_queue_beyond_the_model_never_enables(pair: Pair) -> None:
    bar = pair.b.bar
    bar.set_flags(regs.TXDCTL(9), ENABLE)  # the model implements 4 queues
    pair.step()
    assert not bar.read32(regs.TXDCTL(9)) & ENABLE


def test_queue_disable_reads_one_until_the_device_stopped(pair: Pair) -> None:
    bar = pair.b.bar
    pair.step()
    bar.clear_flags(regs.RXDCTL(0), ENABLE)
    assert bar.read32(regs.RXDCTL(0)) & ENABLE  # the device has not seen it yet
    pair.step()
    assert not bar.read32(regs.RXDCTL(0)) & ENABLE
    assert pair.mb.rxq[0] is None


class DmaHold:
    """Hold a model's next DMA (its window's next ``locate``) until released."""

    def __init__(self, model: IxgbeModel) -> None:
        self.window = model.window
        self.entered = threading.Event()
        self.go = threading.Event()
        self.after: list[tuple[int, int]] = []  # (phys, length) located once released
        original = self.window.locate

        def locate(phys: int, length: int) -> tuple[memoryview, int] | None:
            if not self.entered.is_set():
                self.entered.set()
                self.go.wait(10)  # real time: only bounds a test that forgot to release
            self.after.append((phys, length))
            return original(phys, length)

        self.window.locate = locate  # type: ignore[method-assign]

    def release(self) -> None:
        self.go.set()

    def restore(self) -> None:
        self.go.set()
        del self.window.locate


@contextmanager
def held(model: IxgbeModel) -> Iterator[DmaHold]:
    hold = DmaHold(model)
    try:
        yield hold
    finally:
        hold.restore()


def test_queue_disable_waits_for_the_dma_in_progress(pair: Pair) -> None:
    # datasheet 4.6.7.1.2: ENABLE clears only after pending memory accesses. The model is
    # held in the middle of storing a frame; the driver's disable must not read 0 until the
    # frame is in memory.
    bar = pair.b.bar
    rxq = pair.b.rx_queues[0]
    pair.step()
    slot = rxq.rx_index
    buf = rxq.table[slot]
    data = frame(pair, 200, 7)
    with held(pair.mb) as hold:
        pair.host.start_thread()
        try:
            pair.mb.inject(data)
            assert hold.entered.wait(10)
            bar.clear_flags(regs.RXDCTL(0), ENABLE)
            time.sleep(0.05)  # real time: the model is held, whatever the delay
            assert bar.read32(regs.RXDCTL(0)) & ENABLE  # DMA in progress
            hold.release()
            bar.wait_clear(regs.RXDCTL(0), ENABLE, "RXDCTL(0).ENABLE", timeout=10)
            # the moment it reads 0, the frame is complete in memory
            assert rxq.pool.read(buf, len(data)) == data
            assert rxq.d8[16 * slot + 8] & regs.RX_STATUS_DD
        finally:
            pair.host.stop()


def test_a_queue_the_device_dropped_reads_zero_and_can_be_enabled_again(pair: Pair) -> None:
    bar = pair.a.bar
    txq = pair.a.tx_queues[0]
    slot = txq.tx_index
    data = frame(pair, 64)
    send(pair, [data])
    good = txq.d64[2 * slot]
    txq.d64[2 * slot] = 0xFFFF_FFFF_FFFF_FFFF  # before the device fetched it
    pair.step()
    assert pair.ma.fault_counts()["bad_dma"] == 1
    (violation,) = pair.ma.dma_violations
    assert (violation.what, violation.phys, violation.registry) == ("tx buffer", 2**64 - 1, False)
    assert raw(pair.ma, regs.TXDCTL(0)) & ENABLE  # the driver's request still stands
    assert not bar.read32(regs.TXDCTL(0)) & ENABLE
    txq.d64[2 * slot] = good  # repaired while the queue is off: fetched anew on enable
    bar.set_flags(regs.TXDCTL(0), ENABLE)  # the same stored value: a new request
    pair.step()
    assert bar.read32(regs.TXDCTL(0)) & ENABLE
    pair.step()
    assert receive(pair) == [data]


# --------------------------------------------------------------- 2. descriptor fetch
def test_rx_descriptor_rewritten_after_the_doorbell_is_not_seen(pair: Pair) -> None:
    rxq = pair.b.rx_queues[0]
    pool = rxq.pool
    pair.step()  # the device fetches what the driver's RDT gave it
    slot = rxq.rx_index
    given = rxq.table[slot]
    other = pool.alloc()
    before = pool.read(other, 300)
    rxq.d64[2 * slot] = pool.space.phys[other]  # too late: the device has its copy
    data = frame(pair, 300, 1)
    pair.mb.inject(data)
    pair.step()
    assert pool.read(given, 300) == data  # written where the fetched descriptor pointed
    assert pool.read(other, 300) == before
    assert pair.mb.fault_counts()["late_descriptor"] == 1
    assert receive(pair) == [data]  # the driver's slot table names the right buffer
    pool.free(other)


def test_tx_descriptor_rewritten_after_the_doorbell_is_not_seen(pair: Pair) -> None:
    bar = pair.a.bar
    txq = pair.a.tx_queues[0]
    pool = pair.a.pools[0]
    first, second = frame(pair, 100, 1), frame(pair, 100, 2)
    bar.clear_flags(regs.DMATXCTL, regs.DMATXCTL_TE)  # the device fetches but waits
    slot = txq.tx_index
    send(pair, [first])
    pair.step()
    spare = pool.alloc()
    pool.write(spare, second)
    txq.d64[2 * slot] = pool.space.phys[spare]  # too late: the device has its copy
    bar.set_flags(regs.DMATXCTL, regs.DMATXCTL_TE)
    pair.step(2)
    assert receive(pair) == [first]
    assert pair.ma.fault_counts()["late_descriptor"] == 1
    pool.free(spare)


def test_descriptors_written_before_the_doorbell_are_seen(pair: Pair) -> None:
    frames = [frame(pair, 80 + i, i) for i in range(40)]
    send(pair, frames)
    pair.step(2)
    assert receive(pair) == frames
    assert pair.ma.fault_counts()["late_descriptor"] == 0
    assert pair.mb.fault_counts()["late_descriptor"] == 0


# ------------------------------------------------------------------ 3. TX write-back
def test_tx_write_back_overwrites_bytes_0_to_11(pair: Pair) -> None:
    txq = pair.a.tx_queues[0]
    slot = txq.tx_index
    send(pair, [frame(pair, 100)])
    assert txq.d64[2 * slot] != 0  # the buffer address, as the driver wrote it
    pair.step()
    assert bytes(txq.d8[16 * slot : 16 * slot + 12]) == bytes(12)
    assert txq.d32[4 * slot + 3] == regs.TX_STATUS_DD


# -------------------------------------------------------------- 4. RX error descriptors
def test_bad_crc_frames_are_dropped_by_the_mac_and_counted(pair: Pair) -> None:
    rxq = pair.b.rx_queues[0]
    pair.step()
    head = pair.b.bar.read32(regs.RDH(0))
    pair.mb.inject(frame(pair, 100), bad_crc=True)
    pair.step()
    assert receive(pair) == []
    assert pair.b.bar.read32(regs.RDH(0)) == head  # no descriptor used
    assert not rxq.d8[16 * rxq.rx_index + 8] & regs.RX_STATUS_DD
    stats = pair.b.read_stats()
    assert stats.rx_crc_errors == 1
    assert stats.rx_packets == 0


def test_with_sbp_bad_frames_carry_rxe_and_the_driver_drops_them(pair: Pair) -> None:
    pair.b.bar.set_flags(regs.FCTRL, FCTRL_SBP)
    rxq = pair.b.rx_queues[0]
    pair.step()
    good = [frame(pair, 100, i) for i in range(3)]
    start = rxq.rx_index
    pair.mb.inject(good[0])
    pair.mb.inject(frame(pair, 100, 9), bad_crc=True)
    pair.mb.inject(good[1])
    pair.mb.inject(frame(pair, 1600, 10))  # oversize (1604 > 1518 with FCS)
    pair.mb.inject(pair.b.mac + pair.a.mac + ETHERTYPE + b"runt")  # 18 bytes
    pair.mb.inject(good[2])
    pair.step()
    status = [rxq.d32[4 * ((start + k) & rxq.mask) + 2] for k in range(6)]
    rxe = [bool(s & regs.RX_ERROR_RXE) for s in status]
    assert rxe == [False, True, False, True, True, False]
    assert all(s & (regs.RX_STATUS_DD | regs.RX_STATUS_EOP) == 3 for s in status)
    assert receive(pair) == good
    assert rxq.dropped == 3
    stats = pair.b.read_stats()
    assert (stats.rx_crc_errors, stats.rx_oversize, stats.rx_packets) == (1, 1, 3)
    assert pair.mb.counter(regs.RUC) == 1
    assert pair.mb.fault_counts()["rx_errors"] == 3


# ------------------------------------------------------------- 5. CRC strip agreement
def test_crc_strip_disagreement_refuses_rx(pair: Pair) -> None:
    bar = pair.b.bar
    data = frame(pair, 100)
    bar.clear_flags(regs.HLREG0, regs.HLREG0_RXCRCSTRP)  # RDRXCTL.CRCSTRIP still set
    pair.mb.inject(data)
    pair.step()
    assert receive(pair) == []
    assert pair.mb.fault_counts()["crc_strip_mismatch"] == 1
    # both off agree: the frame arrives with its FCS
    bar.clear_flags(regs.RDRXCTL, regs.RDRXCTL_CRCSTRIP)
    pair.mb.inject(data)
    pair.step()
    assert receive(pair) == [data + zlib.crc32(data).to_bytes(4, "little")]
    # both on again: stripped
    bar.set_flags(regs.HLREG0, regs.HLREG0_RXCRCSTRP)
    bar.set_flags(regs.RDRXCTL, regs.RDRXCTL_CRCSTRIP)
    pair.mb.inject(data)
    pair.step()
    assert receive(pair) == [data]
    assert pair.mb.fault_counts()["crc_strip_mismatch"] == 1


# ------------------------------------------------------------------ 6. JUMBOEN, MAXFRS
@pytest.mark.parametrize(
    ("jumbo", "mfs", "size", "vlan", "accepted"),
    [
        (False, 9018, 1514, False, True),  # 1518 with FCS: the standard maximum
        (False, 9018, 1515, False, False),  # MAXFRS does not apply without JUMBOEN
        (False, 1518, 1518, True, True),  # a VLAN tag adds 4: 1522
        (False, 1518, 1519, True, False),
        (True, 1518, 1515, False, False),  # JUMBOEN with the default MFS
        (True, 1700, 1696, False, True),  # 1700 with FCS
        (True, 1700, 1697, False, False),
        (True, 1700, 1700, True, True),  # MFS + 4 with a VLAN tag
        (True, 1700, 1701, True, False),
    ],
)
def test_maxfrs_applies_only_with_jumboen(
    pair: Pair, jumbo: bool, mfs: int, size: int, vlan: bool, accepted: bool
) -> None:
    bar = pair.b.bar
    if jumbo:
        bar.set_flags(regs.HLREG0, regs.HLREG0_JUMBOEN)
    bar.write32(regs.MAXFRS, mfs << 16)
    data = frame(pair, size, vlan=vlan)
    pair.mb.inject(data)
    pair.step()
    assert receive(pair) == ([data] if accepted else [])
    assert pair.b.read_stats().rx_oversize == (0 if accepted else 1)


# --------------------------------------------------------------------- 7. reset timing
def test_reset_eeprom_auto_read_and_dma_init_take_time(pair: Pair) -> None:
    # Real time, on purpose: the reset takes time. The delays are far apart (0.1 s
    # steps) so that only a stall of that order between two lines could blur them.
    model, bar = pair.ma, pair.a.bar
    model.reset_delay, model.eeprom_delay, model.dma_init_delay = 0.1, 0.2, 0.3
    began = time.monotonic()
    bar.write32(regs.CTRL, regs.CTRL_RST_MASK)
    model.step()
    assert bar.read32(regs.CTRL) & regs.CTRL_RST_MASK  # still resetting
    assert not bar.read32(regs.EEC) & regs.EEC_ARD
    assert not bar.read32(regs.RDRXCTL) & regs.RDRXCTL_DMAIDONE
    assert bar.read32(regs.RAH0) == 0  # the MAC comes with the EEPROM auto-read
    assert not bar.read32(regs.RXDCTL(0)) & ENABLE  # queues dropped at once
    seen: dict[str, float] = {}
    deadline = began + 10
    while len(seen) < 3 and time.monotonic() < deadline:
        model.step()
        now = time.monotonic() - began
        if "rst" not in seen and not bar.read32(regs.CTRL) & regs.CTRL_RST_MASK:
            seen["rst"] = now
            assert not bar.read32(regs.EEC) & regs.EEC_ARD  # read too early: 0
            assert not bar.read32(regs.RDRXCTL) & regs.RDRXCTL_DMAIDONE
        if "ard" not in seen and bar.read32(regs.EEC) & regs.EEC_ARD:
            seen["ard"] = now
            assert bar.read32(regs.RAH0) & regs.RAH_AV
        if "dma" not in seen and bar.read32(regs.RDRXCTL) & regs.RDRXCTL_DMAIDONE:
            seen["dma"] = now
        time.sleep(0.002)
    assert 0.1 <= seen["rst"] < seen["ard"] < seen["dma"]
    # each observed up to one poll after it happened: allow that much
    assert seen["ard"] - seen["rst"] >= 0.19
    assert seen["dma"] - seen["rst"] >= 0.29


def test_driver_init_waits_for_a_slow_reset(pair: Pair) -> None:
    # the delays exceed the 10 ms the driver sleeps after the reset: its waits for
    # CTRL.RST, EEC.ARD and RDRXCTL.DMAIDONE are what make init succeed
    model = pair.ma
    model.reset_delay, model.eeprom_delay, model.dma_init_delay = 0.03, 0.05, 0.08
    pair.host.start_thread()
    try:
        pair.a.close()
        device = open_port(pair.rundir, "p.0", rx_ring_size=64, tx_ring_size=64)
        try:
            device.reset_and_init(link_timeout=5)  # real time: the model thread raises it
            assert device.mac == mac_for("p.0")
            assert device.bar.read32(regs.RXDCTL(0)) & ENABLE
        finally:
            device.close()
    finally:
        pair.host.stop()


# ---------------------------------------------------------------- 8. clear-on-read
def test_a_counter_read_clears_it_for_every_reader(pair: Pair) -> None:
    send(pair, [frame(pair, 100, i) for i in range(3)])
    pair.step(2)
    receive(pair)
    port = pair.rundir / "p.1"
    fd = os.open(port / "bar", os.O_RDWR)
    try:
        mm = mmap.mmap(fd, regs.BAR0_SIZE, mmap.MAP_SHARED)
    finally:
        os.close(fd)
    other = ModelBar(mm, port, name="second reader")
    try:
        assert other.read32(regs.GPRC) == 3
        assert pair.b.bar.read32(regs.GPRC) == 0  # the other reader cleared it
        assert other.read32(regs.GORCL) == 3 * 104
        assert other.read32(regs.GORCH) == 0
        assert pair.b.bar.read32(regs.GORCL) == 0
        assert pair.b.bar.read32(regs.GORCH) == 0
        send(pair, [frame(pair, 100, 5)])
        pair.step(2)
        receive(pair)
        assert pair.b.bar.read32(regs.GPRC) == 1
        assert other.read32(regs.GPRC) == 0
        # a low/high pair clears when its high half is read, by whichever reader; a high
        # read that comes later never brings the counter back
        assert other.read32(regs.GORCL) == 104
        assert pair.b.bar.read32(regs.GORCL) == 104
        assert pair.b.bar.read32(regs.GORCH) == 0
        assert other.read32(regs.GORCH) == 0
        assert pair.b.bar.read32(regs.GORCL) == 0
        assert other.read32(regs.GORCL) == 0
        assert pair.mb.counter(regs.GPRC) == 4  # the model's own totals stay monotonic
    finally:
        other.close()
        pair.mb.control.words[ctl.W_DRIVER_PID] = os.getpid()  # the driver's, still


# --------------------------------------------------------------- 9. registered memory
def test_dma_into_freed_memory_is_a_recorded_violation(pair: Pair) -> None:
    rxq = pair.b.rx_queues[0]
    pool = rxq.pool
    pair.step()
    slot = rxq.rx_index
    buf = rxq.table[slot]
    before = pool.read(buf, 200)
    pair.b.dma.free(pool.region)  # the device may no longer touch the pool
    pair.mb.inject(frame(pair, 200))
    pair.step()
    assert pool.read(buf, 200) == before  # the write did not happen
    (violation,) = pair.mb.dma_violations
    assert (violation.what, violation.queue, violation.registry) == ("rx buffer", 0, True)
    assert violation.phys == pool.space.phys[buf]
    assert "not registered" in violation.reason
    assert pair.mb.fault_counts()["dma_violation"] == 1
    assert not pair.b.bar.read32(regs.RXDCTL(0)) & ENABLE  # the queue stopped


def test_dma_past_the_registered_end_is_a_recorded_violation(pair: Pair) -> None:
    region = pair.b.dma.allocate(4096)  # registers exactly 4096 bytes
    phys = region.phys(4096 - 1000)
    rearm_head(pair, phys)
    pair.mb.inject(frame(pair, 1400))
    pair.step()
    (violation,) = pair.mb.dma_violations
    assert (violation.what, violation.phys, violation.length) == ("rx buffer", phys, 1400)
    assert "400 bytes past the registered end" in violation.reason
    assert bytes(region.mem[3096:4096]) == bytes(1000)
    assert pair.mb.fault_counts()["dma_violation"] == 1


def test_a_freed_ring_of_an_enabled_queue_is_a_violation(pair: Pair) -> None:
    rxq = pair.b.rx_queues[0]
    pair.b.dma.free(rxq.region)
    pair.step()
    (violation,) = pair.mb.dma_violations
    assert (violation.what, violation.phys) == ("rx ring", rxq.phys)
    assert not pair.b.bar.read32(regs.RXDCTL(0)) & ENABLE


def test_a_ring_freed_after_its_queue_stopped_is_fine(pair: Pair) -> None:
    bar = pair.b.bar
    bar.clear_flags(regs.RXDCTL(0), ENABLE)
    pair.step()
    assert not bar.read32(regs.RXDCTL(0)) & ENABLE
    pair.b.dma.free(pair.b.rx_queues[0].region)
    pair.mb.inject(frame(pair, 100))
    pair.step(2)
    assert not pair.mb.dma_violations
    assert pair.mb.fault_counts()["dma_violation"] == 0


def test_tx_from_freed_memory_is_a_violation(pair: Pair) -> None:
    pool = pair.a.pools[0]
    send(pair, [frame(pair, 100)])
    pair.a.dma.free(pool.region)
    pair.step(2)
    (violation,) = pair.ma.dma_violations
    assert (violation.what, violation.registry) == ("tx buffer", True)
    assert receive(pair) == []


# ------------------------------------------------ handshakes of the stop and init paths
def test_master_disable_stops_dma_and_clears_gio_master_enable(pair: Pair) -> None:
    gio_master_disable, status_gio_master_enable = 1 << 2, 1 << 19
    bar = pair.b.bar
    assert bar.read32(0x00008) & status_gio_master_enable
    bar.set_flags(regs.CTRL, gio_master_disable)
    pair.step()
    assert not bar.read32(0x00008) & status_gio_master_enable
    pair.mb.inject(frame(pair, 100))
    pair.step(2)
    assert receive(pair) == []  # no DMA while master disable is set
    bar.clear_flags(regs.RXDCTL(0), ENABLE)  # queues still stop (and start): no DMA needed
    pair.step()
    assert not bar.read32(regs.RXDCTL(0)) & ENABLE
    bar.set_flags(regs.RXDCTL(0), ENABLE)
    pair.step()
    assert bar.read32(regs.RXDCTL(0)) & ENABLE
    bar.clear_flags(regs.CTRL, gio_master_disable)
    pair.step()
    assert bar.read32(0x00008) & status_gio_master_enable
    assert receive(pair) == [frame(pair, 100)]  # the held frame arrives now


def test_secrx_ready_follows_rx_disable(pair: Pair) -> None:
    secrxctrl, rx_dis, secrxstat, secrx_rdy = 0x08D00, 1 << 1, 0x08D04, 1 << 0
    bar = pair.b.bar
    pair.step()
    assert not bar.read32(secrxstat) & secrx_rdy
    bar.set_flags(secrxctrl, rx_dis)
    pair.step()
    assert bar.read32(secrxstat) & secrx_rdy
    bar.clear_flags(secrxctrl, rx_dis)
    pair.step()
    assert not bar.read32(secrxstat) & secrx_rdy


# ------------------------------------------------------ the driver's side of 1 and 9
class WaitWatch:
    """Tells whether the driver, while closing, starts *waiting for the device* (reads a
    queue register again after asking the queue to stop) or frees its DMA memory first."""

    def __init__(self, pair: Pair, device_is_a: bool, offsets: set[int]) -> None:
        device = pair.a if device_is_a else pair.b
        self.model = pair.ma if device_is_a else pair.mb
        self.offsets = offsets
        self.waiting = threading.Event()
        self.gen = int(self.model.control.words[ctl.W_DMA_GEN])
        bar = device.bar
        original = bar.read32

        def read32(offset: int) -> int:
            if offset in self.offsets and self._stop_requested(offset):
                self.waiting.set()
            return original(offset)

        bar.read32 = read32  # type: ignore[method-assign]

    def _stop_requested(self, offset: int) -> bool:
        if offset in (regs.RXDCTL(0), regs.TXDCTL(0)):
            return not raw(self.model, offset) & ENABLE  # read after writing 0
        return True  # TDH/TDT: only a draining driver reads them at close

    def freed(self) -> bool:
        return int(self.model.control.words[ctl.W_DMA_GEN]) != self.gen

    def wait(self, seconds: float = 10.0) -> str:
        """Until the driver waits for the device or frees memory (real time: bounds a
        hang only)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.freed():
                return "freed"
            if self.waiting.is_set():
                return "waiting"
            time.sleep(0.0005)
        return "neither"


def test_driver_close_waits_for_rx_dma_before_freeing(pair: Pair) -> None:
    # A frame is being stored when the driver closes. The device clears RXDCTL.ENABLE only
    # after that DMA (4.6.7.1.2); a driver that frees its rings and pools before it reads 0
    # has the frame written into freed memory (recorded as a dma_violation).
    watch = WaitWatch(pair, False, {regs.RXDCTL(0)})
    with held(pair.mb) as hold:
        pair.host.start_thread()
        closer = threading.Thread(target=pair.b.close)
        try:
            pair.mb.inject(frame(pair, 300))
            assert hold.entered.wait(10)
            closer.start()
            outcome = watch.wait()
            hold.release()
            closer.join(10)
            assert not closer.is_alive()
        finally:
            hold.release()
            if closer.is_alive():
                closer.join(10)
            pair.host.stop()
    assert list(pair.mb.dma_violations) == [], f"the driver {outcome} before the DMA ended"
    assert outcome == "waiting"
    assert pair.mb.fault_counts()["dma_violation"] == 0
    words = pair.mb.control.words
    assert words[ctl.W_RXQ_ENABLED] == words[ctl.W_TXQ_ENABLED] == 0


def test_driver_close_drains_tx_before_freeing(pair: Pair) -> None:
    # Frames are queued for sending when the driver closes; the device is in the middle of
    # reading the first buffer. A driver that frees without draining TX (TDH == TDT) and
    # without waiting for TXDCTL.ENABLE to read 0 has the device read freed memory.
    frames = [frame(pair, 100, i) for i in range(5)]
    watch = WaitWatch(pair, True, {regs.TXDCTL(0), regs.TDH(0), regs.TDT(0)})
    with held(pair.ma) as hold:
        pair.host.start_thread()
        closer = threading.Thread(target=pair.a.close)
        try:
            send(pair, frames)
            assert hold.entered.wait(10)
            closer.start()
            outcome = watch.wait()
            hold.release()
            closer.join(10)
            assert not closer.is_alive()
        finally:
            hold.release()
            if closer.is_alive():
                closer.join(10)
            pair.host.stop()
    assert list(pair.ma.dma_violations) == [], f"the driver {outcome} before TX drained"
    assert outcome == "waiting"
    pair.step(2)
    assert receive(pair) == frames  # the queued frames went out before the stop


def test_driver_rx_buffers_hold_what_srrctl_lets_the_device_write(pair: Pair) -> None:
    # SRRCTL.BSIZEPACKET is how much the device writes into one buffer; the driver's
    # buffers must hold it, including the pool's last one (nothing registered after it).
    bar = pair.b.bar
    rxq = pair.b.rx_queues[0]
    pool = rxq.pool
    bsize = (bar.read32(regs.SRRCTL(0)) & regs.SRRCTL_BSIZEPACKET_MASK) * 1024
    assert bsize <= pool.capacity, f"BSIZEPACKET {bsize} > {pool.capacity}-byte buffers"
    pair.step()
    last = pool.base + pool.size - 1
    slot = rxq.rx_index
    pool.free_ids.remove(last)
    pool.free_ids.append(rxq.table[slot])
    rxq.table[slot] = last
    rearm_head(pair, pool.space.phys[last])
    bar.set_flags(regs.HLREG0, regs.HLREG0_JUMBOEN)
    bar.write32(regs.MAXFRS, (bsize + 4) << 16)  # a frame that fills the whole buffer
    data = frame(pair, bsize)
    pair.mb.inject(data)
    pair.step()
    assert list(pair.mb.dma_violations) == []
    bufs, lens = pair.b.rx_batch(0, 8)
    assert (bufs, lens) == ([last], [bsize])
    assert pool.read(last, bsize) == data
    pool.free_batch(bufs)
