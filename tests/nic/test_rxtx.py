"""Batched RX and TX against the model: content, wrap-around, full rings, faults."""

from __future__ import annotations

import itertools
import random
import struct

import pytest

from capsvc.nicdriver import regs
from capsvc.nicdriver.rings import TX_CLEAN_BATCH
from tests.nic.conftest import Pair

ETHERTYPE = b"\x88\xb5"


def frame_for(pair: Pair, seq: int, size: int) -> bytes:
    """A frame from a to b whose payload encodes ``seq`` and its own length."""
    head = pair.b.mac + pair.a.mac + ETHERTYPE + struct.pack("<II", seq, size)
    body = bytes((seq + i) & 0xFF for i in range(size - len(head)))
    return head + body


def send(pair: Pair, frames: list[bytes]) -> int:
    pool = pair.a.pools[0]
    bufs = pool.alloc_batch(len(frames))
    assert len(bufs) == len(frames)
    lens = [pool.write(buf, frame) for buf, frame in zip(bufs, frames, strict=True)]
    sent = pair.a.tx_batch(0, bufs, lens)
    pool.free_batch(bufs[sent:])
    return sent


def receive(pair: Pair, max_packets: int = 512) -> list[bytes]:
    pool = pair.b.pools[0]
    bufs, lens = pair.b.rx_batch(0, max_packets)
    frames = [pool.read(buf, n) for buf, n in zip(bufs, lens, strict=True)]
    pool.free_batch(bufs)
    return frames


@pytest.mark.parametrize("batch", [1, 7, 32, 100])
def test_batches_arrive_intact_and_in_order(pair: Pair, batch: int) -> None:
    rng = random.Random(batch)
    expected = [frame_for(pair, i, rng.randint(60, 1514)) for i in range(batch)]
    assert send(pair, expected) == batch
    pair.step(2)
    assert receive(pair) == expected
    stats_a, stats_b = pair.a.read_stats(), pair.b.read_stats()
    assert stats_a.tx_packets == stats_b.rx_packets == batch
    assert stats_a.tx_bytes == stats_b.rx_bytes == sum(len(f) + 4 for f in expected)


def test_short_frames_are_padded_to_60_bytes(pair: Pair) -> None:
    short = pair.b.mac + pair.a.mac + ETHERTYPE + b"hi"
    assert send(pair, [short]) == 1
    pair.step(2)
    (got,) = receive(pair)
    assert got == short + bytes(60 - len(short))


def test_rings_wrap_around_many_times(pair: Pair) -> None:
    """256-slot rings, ~40 laps, odd batch sizes so the wrap falls mid-batch."""
    rng = random.Random(1)
    sent_total = 0
    received: list[bytes] = []
    expected: list[bytes] = []
    while sent_total < 256 * 40:
        batch = rng.choice([1, 3, 31, 32, 33, 64, 97, 200])
        frames = [frame_for(pair, sent_total + i, rng.randint(60, 300)) for i in range(batch)]
        sent = send(pair, frames)
        expected += frames[:sent]
        sent_total += sent
        pair.step(2)
        chunk = rng.choice([1, 16, 64, 512])
        while got := receive(pair, chunk):
            received += got
    assert received == expected
    assert pair.b.read_stats().rx_dropped == 0
    # buffers all came back: RX ring holds 256, the TX ring keeps < 32 + one batch
    txq = pair.a.tx_queues[0]
    txq.clean()
    assert txq.in_flight < TX_CLEAN_BATCH
    pool_a = pair.a.pools[0]
    pool_a.check()
    assert pool_a.available == pool_a.size - 256 - txq.in_flight
    pair.b.pools[0].check()
    faults = pair.ma.fault_counts()
    assert faults["bad_dma"] == faults["torn_doorbell"] == 0


def test_tx_ring_full_returns_a_partial_count(pair: Pair) -> None:
    frames = [frame_for(pair, i, 64) for i in range(300)]
    assert send(pair, frames) == 255  # 256 slots, one always empty
    assert send(pair, frames[:10]) == 0  # nothing completed yet: still full
    pair.step()  # the model transmits everything and writes DD
    assert send(pair, frames[:10]) == 10  # clean freed completed batches of 32
    assert pair.a.tx_queues[0].in_flight == 255 - 224 + 10


def test_rx_ring_exhaustion_drops_with_drop_en(pair: Pair) -> None:
    frames = [frame_for(pair, i, 64) for i in range(300)]
    assert send(pair, frames[:255]) == 255
    pair.step()
    pair.step()
    assert send(pair, frames[255:]) == 45
    pair.step(2)
    got = receive(pair)
    assert got == frames[:255]  # one RX slot is always held back
    stats = pair.b.read_stats()
    assert stats.rx_dropped == 45
    assert stats.rx_no_buffer == 45
    # after receiving, the ring has room again
    assert send(pair, frames[:5]) == 5
    pair.step(2)
    assert receive(pair) == frames[:5]


def test_without_drop_en_the_packet_buffer_holds_frames(pair: Pair) -> None:
    pair.b.bar.clear_flags(regs.SRRCTL(0), regs.SRRCTL_DROP_EN)
    frames = [frame_for(pair, i, 1000) for i in range(300)]
    for chunk in range(0, 300, 100):
        send(pair, frames[chunk : chunk + 100])
        pair.step(2)
    got = receive(pair)
    assert len(got) == 255
    pair.step(2)  # the held frames now find descriptors
    got += receive(pair)
    pair.step(2)
    got += receive(pair)
    assert got[:255] == frames[:255]
    held = got[255:]
    assert held == frames[255 : 255 + len(held)]
    stats = pair.b.read_stats()
    # 128 KiB of packet buffer (RXPBSIZE(0) as the driver set it) hold the other 45
    assert len(held) == 45
    assert stats.rx_missed == 0


def test_oversize_frames_count_roc_and_filter_drops(pair: Pair) -> None:
    big = frame_for(pair, 0, 1515)  # 1519 with FCS > MAXFRS 1518
    assert send(pair, [big]) == 1
    pair.step(2)
    assert receive(pair) == []
    assert pair.b.read_stats().rx_oversize == 1
    # without promiscuous mode, a frame for another MAC is filtered
    pair.b.bar.clear_flags(regs.FCTRL, regs.FCTRL_UPE)
    other = b"\x02\0\0\0\0\x01" + frame_for(pair, 1, 80)[6:]
    assert send(pair, [other, frame_for(pair, 2, 80)]) == 2
    pair.step(2)
    assert receive(pair) == [frame_for(pair, 2, 80)]
    assert pair.mb.fault_counts()["rx_filtered"] == 1


def test_unicast_filter_reads_ral_rah(pair: Pair) -> None:
    # spec 2.3/2.4: the RX engine matches unicast against RAL(0)/RAH(0) (with Address
    # Valid), not against the address the model was born with
    bar = pair.b.bar
    bar.clear_flags(regs.FCTRL, regs.FCTRL_UPE)
    new_mac = b"\x02\xaa\xbb\xcc\xdd\xee"
    bar.write32(regs.RAL0, int.from_bytes(new_mac[:4], "little"))
    bar.write32(regs.RAH0, int.from_bytes(new_mac[4:], "little") | regs.RAH_AV)
    to_new = new_mac + frame_for(pair, 1, 80)[6:]
    to_old = frame_for(pair, 2, 80)
    assert send(pair, [to_new, to_old]) == 2
    pair.step(2)
    assert receive(pair) == [to_new]
    bar.write32(regs.RAH0, int.from_bytes(new_mac[4:], "little"))  # Address Valid off
    assert send(pair, [to_new]) == 1
    pair.step(2)
    assert receive(pair) == []
    assert pair.mb.fault_counts()["rx_filtered"] == 2


def test_frames_spanning_buffers_are_dropped_by_the_driver(pair: Pair) -> None:
    """A 1 KiB buffer size makes the model split a 1500-byte frame over two descriptors;
    the driver (one buffer per frame) drops it and keeps going."""
    srrctl = pair.b.bar.read32(regs.SRRCTL(0))
    pair.b.bar.write32(regs.SRRCTL(0), (srrctl & ~regs.SRRCTL_BSIZEPACKET_MASK) | 1)
    pair.b.bar.clear_flags(regs.RXDCTL(0), regs.RXDCTL_ENABLE)
    pair.step()
    pair.b.bar.set_flags(regs.RXDCTL(0), regs.RXDCTL_ENABLE)
    pair.step()
    small, large = frame_for(pair, 1, 500), frame_for(pair, 2, 1500)
    assert send(pair, [small, large, small]) == 3
    pair.step(2)
    assert receive(pair) == [small, small]
    assert pair.b.rx_queues[0].dropped == 1


def test_bad_dma_address_stops_the_queue(pair: Pair) -> None:
    txq = pair.a.tx_queues[0]
    slot = txq.tx_index
    assert send(pair, [frame_for(pair, 0, 64)]) == 1
    txq.d64[2 * slot] = 0xFFFF_FFFF_FFFF_FFFF  # the 0xFF fill pattern: never a valid page
    pair.step()
    assert pair.ma.fault_counts()["bad_dma"] == 1
    assert not pair.a.bar.read32(regs.TXDCTL(0)) & regs.TXDCTL_ENABLE


def test_torn_doorbell_is_detected(pair: Pair) -> None:
    pair.a.bar.write32(regs.TDT(0), 0x12345)  # outside the 256-entry ring
    pair.step()
    assert pair.ma.fault_counts()["torn_doorbell"] == 1


def test_rings_are_filled_with_ff_before_use(pair: Pair) -> None:
    txq = pair.a.tx_queues[0]
    assert bytes(txq.d8[: 16 * 4]) == b"\xff" * 64  # never written yet


def test_mempools_never_assume_contiguous_pages(pair: Pair) -> None:
    pool = pair.a.pools[0]
    pages = pool.region.page_phys
    assert len(pages) == 4
    assert all(b != a + (2 << 20) for a, b in itertools.pairwise(pages))
    phys = pool.space.phys
    for buf in (pool.base, pool.base + 1023, pool.base + 1024, pool.base + 4095):
        index = buf - pool.base
        assert phys[buf] == pages[index * 2048 >> 21] + (index * 2048 & 0x1FFFFF)


def test_runts_count_ruc(pair: Pair) -> None:
    pair.mb.inject(pair.b.mac + pair.a.mac + ETHERTYPE + b"tiny")  # 18 bytes, no padding
    pair.step()
    assert receive(pair) == []
    assert pair.mb.counter(regs.RUC) == 1


def test_lone_frames_take_the_scalar_paths_through_many_wraps(pair: Pair) -> None:
    # Request/response traffic moves one frame at a time: TxQueue.tx_one and the lone-frame
    # path of RxQueue.rx_batch. Three times around the 256-slot rings, content, the RX
    # tail (the last re-armed slot, spec 1.6) and the pools' balance must all hold.
    pool_a, pool_b = pair.a.pools[0], pair.b.pools[0]
    txq, rxq = pair.a.tx_queues[0], pair.b.rx_queues[0]
    free_a, free_b = pool_a.available, pool_b.available
    for i in range(3 * 256 + 5):
        frame = frame_for(pair, i, 60 + i % 700)
        buf = pool_a.alloc()
        assert txq.tx_one(buf, pool_a.write(buf, frame))
        pair.step(2)
        slot = rxq.rx_index
        bufs, lens = rxq.rx_batch(64)
        assert len(bufs) == 1
        assert pool_b.read(bufs[0], lens[0]) == frame
        assert pair.b.bar.read32(regs.RDT(0)) == slot
        pool_b.free_batch(bufs)
        assert rxq.rx_batch(64) == ([], [])
    # TX buffers come back in batches of 32 (spec 1.7): at most a batch is still out
    assert free_a - TX_CLEAN_BATCH <= pool_a.available + txq.in_flight <= free_a
    assert pool_b.available == free_b
    pool_a.check()
    pool_b.check()
    assert pair.b.read_stats().rx_packets == 3 * 256 + 5


def test_tx_one_reports_a_full_ring(pair: Pair) -> None:
    pool = pair.a.pools[0]
    txq = pair.a.tx_queues[0]
    frame = frame_for(pair, 0, 60)
    taken = 0
    for _ in range(txq.size + 10):
        buf = pool.alloc()
        if not txq.tx_one(buf, pool.write(buf, frame)):
            pool.free(buf)
            break
        taken += 1
    assert taken == txq.size - 1  # one slot always stays empty
    pair.step(2)
    assert len(receive(pair)) == taken


def test_queue_enable_edges_are_seen_between_steps(pair: Pair) -> None:
    # The model compares all RXDCTL/TXDCTL words at once and walks the queues only on a
    # change: a queue switched off must stop, and switched on again must be re-latched.
    bar = pair.b.bar
    pair.step()  # the fixture's model thread may have stopped before it saw the enables
    assert pair.mb.rxq[0] is not None
    bar.clear_flags(regs.RXDCTL(0), regs.RXDCTL_ENABLE)
    pair.step()
    assert pair.mb.rxq[0] is None
    bar.set_flags(regs.RXDCTL(0), regs.RXDCTL_ENABLE)
    pair.step()
    assert pair.mb.rxq[0] is not None
