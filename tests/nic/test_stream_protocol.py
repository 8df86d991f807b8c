"""The reliable stream protocol, frame by frame on a simulated lossy wire (sans-I/O)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsvc.nicdriver import segment
from capsvc.nicdriver.stream import BROADCAST, Channel, StreamConfig, unwrap
from tests.nic.netsim import MAC_A, MAC_B, Net


def establish(net: Net) -> tuple[Channel, Channel]:
    net.b.listening = True
    client = net.a.connect(net.now)
    net.run(lambda: client.established and bool(net.b.accept_queue))
    server = net.b.accept_queue.popleft()
    return client, server


def transfer(
    net: Net, sender: Channel, receiver: Channel, data: bytes, read_sizes: list[int]
) -> bytes:
    """Send ``data`` then EOF; the receiver reads with the given chunk sizes (cycled)."""
    got = bytearray()
    sent = 0
    reads = 0
    if not data:
        sender.send_eof(net.now)

    def progress() -> bool:
        nonlocal sent, reads
        if sent < len(data):
            sent += sender.send(memoryview(data)[sent:], net.now)
            if sent == len(data):
                sender.send_eof(net.now)
        while receiver.rcv_buf:
            got.extend(receiver.receive(read_sizes[reads % len(read_sizes)], net.now))
            reads += 1
        return receiver.eof and not receiver.rcv_buf

    net.run(progress, limit=600)
    return bytes(got)


# -- wire format -------------------------------------------------------------------------


def test_segment_round_trip_and_crc() -> None:
    frame = segment.encode(MAC_B, MAC_A, segment.ACK | segment.FIN, 7, 9, 11, 0b101, 33, b"xyz")
    seg = segment.decode(frame)
    assert seg is not None
    assert (seg.dst, seg.src, seg.flags, seg.conn, seg.seq, seg.ack) == (
        MAC_B,
        MAC_A,
        segment.ACK | segment.FIN,
        7,
        9,
        11,
    )
    assert (seg.sack, seg.window, seg.payload) == (0b101, 33, b"xyz")
    assert "FIN" in seg.describe()
    padded = frame + bytes(60)  # NIC padding is ignored
    assert segment.decode(padded) == seg
    corrupt = bytearray(frame)
    corrupt[-1] ^= 1
    assert segment.decode(bytes(corrupt)) is None
    assert segment.decode(frame[:20]) is None
    assert segment.decode(frame[:12] + b"\x08\x00" + frame[14:]) is None  # IPv4


def test_unwrap_sequence_numbers() -> None:
    assert unwrap(5, 3) == 5
    assert unwrap(0xFFFFFFFF, 1 << 32) == (1 << 32) - 1
    assert unwrap(2, (1 << 32) - 3) == (1 << 32) + 2
    assert unwrap(0, 10) == 0


# -- connection management ---------------------------------------------------------------


def test_handshake_uses_broadcast_then_unicast() -> None:
    net = Net()
    net.b.listening = True
    client = net.a.connect(net.now)
    (syn,) = net.a.outbox
    decoded = segment.decode(syn)
    assert decoded is not None
    assert decoded.dst == BROADCAST
    assert decoded.flags == segment.SYN
    net.run(lambda: client.established)
    assert client.peer == MAC_B
    server = net.b.accept_queue[0]
    assert server.peer == MAC_A
    assert server.conn == client.conn


def test_connection_refused_without_listener() -> None:
    net = Net()
    client = net.a.connect(net.now)
    net.run(lambda: client.recv_error is not None)
    assert "refused" in client.recv_error  # type: ignore[operator]
    assert not client.established


def test_connect_times_out_when_nobody_answers() -> None:
    net = Net(loss=1.0)
    client = net.a.connect(net.now)
    net.run(lambda: client.recv_error is not None, limit=10)
    assert "no listener answered" in client.recv_error  # type: ignore[operator]
    assert 4.9 < net.now < 6


@pytest.mark.parametrize("seed", range(5))
def test_handshake_survives_heavy_loss(seed: int) -> None:
    net = Net(loss=0.5, seed=seed)
    client, server = establish(net)
    assert transfer(net, client, server, b"hello" * 1000, [4096]) == b"hello" * 1000


def test_segments_of_unknown_connections_get_rst() -> None:
    net = Net()
    frame = segment.encode(MAC_B, MAC_A, segment.ACK, 1234, 1, 1, 0, 10, b"stale")
    net.b.receive_frame(frame, 0.0)
    (reply,) = net.b.take_output()
    decoded = segment.decode(reply)
    assert decoded is not None
    assert decoded.flags & segment.RST
    assert decoded.conn == 1234
    # an RST is never answered (no RST storms)
    net.a.receive_frame(reply, 0.0)
    assert net.a.take_output() == []


# -- data transfer -----------------------------------------------------------------------


def test_bulk_transfer_both_ways_without_faults() -> None:
    net = Net()
    client, server = establish(net)
    data = random.Random(0).randbytes(1_000_000)
    assert transfer(net, client, server, data, [65536]) == data
    assert transfer(net, server, client, data[::-1], [1, 1000, 70000]) == data[::-1]
    assert client.retransmits == server.retransmits == 0


def test_sequence_numbers_wrap_around_32_bits() -> None:
    net = Net(reorder=0.2, seed=3)
    client, server = establish(net)
    start = (1 << 32) - 40
    for ch in (client, server):
        ch.snd_una = ch.snd_next = ch.peer_ack = ch.rcv_next = start
    data = random.Random(1).randbytes(200_000)  # ~140 segments across the wrap
    assert transfer(net, client, server, data, [5000]) == data
    assert server.rcv_next > 1 << 32


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    loss=st.sampled_from([0.0, 0.02, 0.1, 0.3]),
    dup=st.sampled_from([0.0, 0.05, 0.3]),
    reorder=st.sampled_from([0.0, 0.1, 0.5]),
    seed=st.integers(0, 2**16),
    size=st.integers(0, 120_000),
    reads=st.lists(st.integers(1, 70_000), min_size=1, max_size=4),
    window=st.sampled_from([1, 4, 64]),
)
def test_no_byte_lost_or_doubled_under_faults(
    loss: float,
    dup: float,
    reorder: float,
    seed: int,
    size: int,
    reads: list[int],
    window: int,
) -> None:
    net = Net(
        loss=loss, dup=dup, reorder=reorder, seed=seed, config=StreamConfig(max_window=window)
    )
    client, server = establish(net)
    data = random.Random(seed).randbytes(size)
    back = data[::-1][: size // 3]
    assert transfer(net, client, server, data, reads) == data
    assert transfer(net, server, client, back, reads[::-1]) == back
    # both FINs are acknowledged eventually and the channels go away once closed
    client.close(net.now)
    server.close(net.now)
    net.run(lambda: not net.a.channels and not net.b.channels, limit=120)


def test_fast_retransmit_repairs_a_single_loss_without_timeout() -> None:
    net = Net()
    client, server = establish(net)
    dropped = []
    original = net._send

    def drop_third(source: object) -> None:
        if source is net.a and not dropped and len(net.a.outbox) >= 3:
            dropped.append(net.a.outbox.pop(2))
        original(source)  # type: ignore[arg-type]

    net._send = drop_third  # type: ignore[method-assignment]
    data = bytes(segment.MSS * 20)
    before = net.now
    assert transfer(net, client, server, data, [1 << 20]) == data
    assert dropped
    assert client.retransmits == 1
    assert net.now - before < 0.01  # well below the 10 ms minimum RTO


# -- flow control and closing ------------------------------------------------------------


def test_zero_window_stalls_the_sender_until_the_reader_reads() -> None:
    config = StreamConfig(receive_buffer=10 * segment.MSS, send_buffer=40 * segment.MSS)
    net = Net(config=config)
    client, server = establish(net)
    data = bytes(range(256)) * 200  # 51200 bytes > receive buffer
    sent = client.send(data, net.now)
    assert sent == len(data)
    for _ in range(2000):
        if not net.step():
            break
    assert len(server.rcv_buf) <= config.receive_buffer
    assert client.unacked or client.snd_buf  # stalled
    got = bytearray()
    net.run(lambda: got.extend(server.receive(1 << 20, net.now)) or len(got) >= len(data))
    assert bytes(got) == data


def test_closed_reader_breaks_the_senders_sends() -> None:
    net = Net()
    client, server = establish(net)
    server.close(net.now)
    net.run(lambda: client.send_error is not None)
    assert client.send_error == "the peer closed the stream (it reads no more)"
    # Whatever send() now accepts must never reach the wire (NicStream raises instead).
    leaving: list[bytes] = []
    take_output = net.a.take_output

    def recording_take_output() -> list[bytes]:
        frames = take_output()
        leaving.extend(frames)
        return frames

    net.a.take_output = recording_take_output  # type: ignore[method-assign]
    client.send(b"more", net.now)
    # but the client still reads what the server sent before closing, then EOF
    net.run(lambda: client.eof)
    payloads = [decoded.payload for frame in leaving if (decoded := segment.decode(frame))]
    assert payloads == [b""] * len(payloads), payloads


def test_data_sent_before_close_is_delivered() -> None:
    net = Net(loss=0.2, seed=5)
    client, server = establish(net)
    data = random.Random(2).randbytes(300_000)
    assert client.send(data[:200_000], net.now) == 200_000
    client.close(net.now)  # lingers until everything is acknowledged
    got = bytearray()
    net.run(lambda: got.extend(server.receive(1 << 20, net.now)) or server.eof)
    assert bytes(got) == data[:200_000]
    net.run(lambda: not net.a.channels)


def test_abort_resets_both_directions() -> None:
    net = Net()
    client, server = establish(net)
    client.abort(net.now)
    net.run(lambda: server.recv_error is not None)
    assert "reset" in server.recv_error  # type: ignore[operator]
    assert server.send_error is not None


def test_keepalive_detects_a_vanished_peer() -> None:
    net = Net()
    _client, server = establish(net)
    net.down = True
    net.run(lambda: server.recv_error is not None, limit=30)
    assert "silent" in server.recv_error  # type: ignore[operator]
    assert net.now < 10


def test_small_writes_go_straight_out_but_obey_the_window() -> None:
    # Channel.send cuts a small write straight into a segment when nothing is queued and
    # the window is open; otherwise it must queue, and the window must still hold.
    config = StreamConfig(max_window=4)
    net = Net(config=config)
    client, server = establish(net)
    net.flush()
    for i in range(10):
        assert client.send(bytes([i]) * 10, net.now) == 10
    out = net.a.take_output()
    assert len(out) == 4  # the window: 4 segments in flight, the rest queued
    assert [segment.decode(f).payload for f in out] == [bytes([i]) * 10 for i in range(4)]
    assert client.snd_buf == b"".join(bytes([i]) * 10 for i in range(4, 10))
    for frame in out:
        net.b.receive_frame(frame, net.now)
    net.run(lambda: len(server.rcv_buf) == 100)
    assert bytes(server.rcv_buf) == b"".join(bytes([i]) * 10 for i in range(10))
    net.run(lambda: client.all_acked)
    assert client.unacked_bytes == 0


def test_poll_loop_timers_next_deadline_is_the_earliest() -> None:
    net = Net()
    client, _ = establish(net)
    client.rto_deadline = 9.0
    client.ack_deadline = 7.0
    client.persist_deadline = 8.0
    client.last_heard = 0.0
    assert client.next_deadline() == min(7.0, client.config.keepalive)
    client.last_heard = 100.0
    assert client.next_deadline() == 7.0
    client.ack_deadline = None
    assert client.next_deadline() == 8.0
