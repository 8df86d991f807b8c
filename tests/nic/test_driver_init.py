"""Driver init against the software 82599 (spec nicdriver.md 1.4, 2.3).

Timing: the driver's waits (``link_timeout``, ``wait_for_link``, ``wait_clear``) are real
time against a model stepped by a thread (``start_thread``) that the OS schedules; they
return as soon as the register changes, so their generous limits only bound a hang. The
one short limit (``test_no_model_running_says_so``) is meant to run out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from capsvc.nicdriver import regs
from capsvc.nicdriver.errors import DeviceBusy, DriverTimeout
from capsvc.nicdriver.modelhost import PortFiles, mac_for, start_pair
from tests.nic.conftest import Pair, open_port


def test_init_programs_the_documented_registers(pair: Pair) -> None:
    for device in (pair.a, pair.b):
        r = device.bar.read32
        assert device.is_model
        # RX: descriptor type, DROP_EN, CRC strip agreement, broadcast, promiscuous, RXEN
        srrctl = r(regs.SRRCTL(0))
        assert srrctl & regs.SRRCTL_DESCTYPE_MASK == regs.SRRCTL_DESCTYPE_ADV_ONEBUF
        assert srrctl & regs.SRRCTL_DROP_EN
        assert srrctl & regs.SRRCTL_BSIZEPACKET_MASK == 2  # the model's reset value, kept
        assert r(regs.HLREG0) & regs.HLREG0_RXCRCSTRP
        assert r(regs.RDRXCTL) & regs.RDRXCTL_CRCSTRIP
        fctrl = r(regs.FCTRL)
        assert fctrl & (regs.FCTRL_BAM | regs.FCTRL_UPE | regs.FCTRL_MPE) == (
            regs.FCTRL_BAM | regs.FCTRL_UPE | regs.FCTRL_MPE
        )
        assert r(regs.RXCTRL) & regs.RXCTRL_RXEN
        assert r(regs.RXPBSIZE(0)) == regs.RXPBSIZE_128KB
        assert all(r(regs.RXPBSIZE(i)) == 0 for i in range(1, 8))
        # the undocumented DCA_RXCTRL bit 12 resets to 1 in the model and must be cleared
        assert not r(regs.DCA_RXCTRL(0)) & regs.DCA_RXCTRL_BIT12
        assert r(regs.DCA_RXCTRL(1)) & regs.DCA_RXCTRL_BIT12  # queue not used: untouched
        assert r(regs.CTRL_EXT) & regs.CTRL_EXT_NS_DIS
        # TX
        hl = r(regs.HLREG0)
        assert hl & regs.HLREG0_TXCRCEN
        assert hl & regs.HLREG0_TXPADEN
        assert r(regs.TXPBSIZE(0)) == regs.TXPBSIZE_40KB
        assert r(regs.DTXMXSZRQ) == 0xFFF  # DTXMXSZRQ.MAX_BYTES_NUM_REQ is a 12-bit field
        assert not r(regs.RTTDCS) & regs.RTTDCS_ARBDIS
        txdctl = r(regs.TXDCTL(0))
        assert txdctl & 0x7F == 36
        assert (txdctl >> 8) & 0x7F == 8
        assert (txdctl >> 16) & 0x7F == 4
        assert txdctl & regs.TXDCTL_ENABLE
        assert r(regs.DMATXCTL) & regs.DMATXCTL_TE
        # rings: physical base above 4 GiB (the model's fake map), lengths, tails
        rdbah, tdbah = r(regs.RDBAH(0)), r(regs.TDBAH(0))
        assert rdbah
        assert tdbah
        assert r(regs.RDLEN(0)) == 256 * 16
        assert r(regs.TDLEN(0)) == 256 * 16
        assert r(regs.RDT(0)) == 255
        assert r(regs.RXDCTL(0)) & regs.RXDCTL_ENABLE
        # link and autonegotiation (AN_RESTART self-cleared)
        autoc = r(regs.AUTOC)
        assert autoc & regs.AUTOC_LMS_MASK == regs.AUTOC_LMS_10G_SERIAL
        assert not autoc & regs.AUTOC_AN_RESTART
        assert device.link_speed() == 10000
        assert r(regs.EEC) & regs.EEC_ARD
        assert r(regs.RDRXCTL) & regs.RDRXCTL_DMAIDONE
    assert pair.a.mac == mac_for("p.0")
    assert pair.b.mac == mac_for("p.1")
    assert pair.ma.fault_counts()["bad_ring"] == 0


def test_reset_clears_queue_state_and_is_repeatable(pair: Pair) -> None:
    pair.host.start_thread()
    try:
        pair.a.close()
        reopened = open_port(pair.rundir, "p.0", rx_ring_size=128, tx_ring_size=64)
        try:
            reopened.reset_and_init(link_timeout=5)
            assert reopened.bar.read32(regs.RDLEN(0)) == 128 * 16
            assert pair.ma.fault_counts()["resets"] >= 3  # start, first init, this init
        finally:
            reopened.close()  # while the model runs: its stop sequence waits on the device
    finally:
        pair.host.stop()


def test_statistics_are_clear_on_read(pair: Pair) -> None:
    pool = pair.a.pools[0]
    bufs = pool.alloc_batch(3)
    lens = [pool.write(b, pair.b.mac + pair.a.mac + b"\x88\xb5" + bytes(100)) for b in bufs]
    assert pair.a.tx_batch(0, bufs, lens) == 3
    pair.step(2)
    got, got_lens = pair.b.rx_batch(0, 8)
    assert got_lens == [114] * 3
    pair.b.pools[0].free_batch(got)
    assert pair.a.bar.read32(regs.GPTC) == 3
    assert pair.a.bar.read32(regs.GPTC) == 0  # cleared by the read
    assert pair.b.bar.read32(regs.GORCL) == 3 * 118  # +4 FCS per frame
    assert pair.b.bar.read32(regs.GORCH) == 0
    assert pair.b.bar.read32(regs.GORCL) == 0
    stats = pair.b.read_stats()
    assert stats.rx_packets == 3
    assert stats.per_queue_rx[0] == 3


def test_a_port_has_one_driver(pair: Pair) -> None:
    with pytest.raises(DeviceBusy, match="one driver per device"):
        open_port(pair.rundir, "p.0")


def test_no_model_running_says_so(rundir: Path) -> None:
    PortFiles.create(rundir, "dead.0")
    device = open_port(rundir, "dead.0")
    try:
        device.bar.write32(regs.CTRL, regs.CTRL_RST)
        # Real time, and meant to run out: nobody serves this port.
        with pytest.raises(DriverTimeout, match="no model process serves"):
            device.bar.wait_clear(regs.CTRL, regs.CTRL_RST_MASK, "CTRL.RST", timeout=0.05)
    finally:
        device.close()


def test_link_waits_for_the_model(rundir: Path) -> None:
    host = start_pair("slow", rundir=rundir, spin=0)
    # Real time: the model raises the link 0.5 s after AN_RESTART, so the link is still down
    # when init returns unless this process stalls for half a second right then.
    host.models[0].link_delay = 0.5
    host.start_thread()
    try:
        device = open_port(rundir, "slow.0")
        try:
            device.reset_and_init(wait_for_link=False)
            assert device.link_speed() == 0
            assert device.wait_for_link(5) == 10000
        finally:
            device.close()
    finally:
        host.close()


def test_mac_after_eeprom_auto_read_and_link_mode_before_an_restart(rundir: Path) -> None:
    # spec 1.4 step 3: RAL(0)/RAH(0) are loaded by the EEPROM auto-read that step 4 waits
    # for, so the driver reads them only after EEC.ARD reads 1
    host = start_pair("ee", rundir=rundir, spin=0)
    host.start_thread()
    try:
        device = open_port(rundir, "ee.0")
        try:
            reads: list[tuple[int, int]] = []
            original = device.bar.read32

            def recording_read32(offset: int) -> int:
                value = original(offset)
                reads.append((offset, value))
                return value

            writes: list[tuple[int, int]] = []
            original_write = device.bar.write32

            def recording_write32(offset: int, value: int) -> None:
                writes.append((offset, value))
                original_write(offset, value)

            device.bar.read32 = recording_read32  # type: ignore[method-assign]
            device.bar.write32 = recording_write32  # type: ignore[method-assign]
            device.reset_and_init(link_timeout=5)
            # step 6: the link mode is written first, AN_RESTART set afterwards
            autoc = [value for off, value in writes if off == regs.AUTOC]
            assert len(autoc) == 2
            assert not autoc[0] & regs.AUTOC_AN_RESTART
            assert autoc[0] & regs.AUTOC_LMS_MASK == regs.AUTOC_LMS_10G_SERIAL
            assert autoc[1] == autoc[0] | regs.AUTOC_AN_RESTART
            ard_seen = next(
                i for i, (off, val) in enumerate(reads) if off == regs.EEC and val & regs.EEC_ARD
            )
            mac_reads = [i for i, (off, _) in enumerate(reads) if off in (regs.RAL0, regs.RAH0)]
            assert mac_reads
            assert min(mac_reads) > ard_seen
            assert device.mac == mac_for("ee.0")
        finally:
            device.close()
    finally:
        host.close()
