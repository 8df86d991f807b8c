"""Limits and timeouts (issue 11): every resource a peer can make a connection hold is bounded.

In-process tests run two capsvc Connections over in-memory streams on trio's jumping
clock (autojump_clock), so flow control and timeouts are checked at exact virtual times;
the tests at the end run ``capsvc serve`` as a real process on 127.0.0.1 with raw sockets
as the hostile peer, and use real time only where a kernel carries the bytes.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import capsvc
from capsvc.connection import Connection
from capsvc.errors import ExceptionType
from capsvc.framing import FrameDecoder, encode_message
from capsvc.limits import Limits, parse_limit
from capsvc.rpc import wire
from capsvc.rpc.session import RpcSession
from capsvc.transport.memory import memory_stream_pair
from tests.support.checks import both_running
from tests.support.tester import CallbackImpl, CounterImpl, Tester
from tests.test_cli import run, running

# ---------------------------------------------------------------------------- helpers


class SlowTester(capsvc.Server, interface=Tester):
    """slow() sleeps on the server's clock and records how many run at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0

    async def slow(self, params: Any, results: Any) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await trio.sleep(params.ms / 1000)
        finally:
            self.running -= 1
        results.done = True

    async def echo(self, params: Any, results: Any) -> None:
        results.reply = params.msg

    async def newCounter(self, params: Any, results: Any) -> None:
        results.counter = CounterImpl(params.start)

    async def callBack(self, params: Any, results: Any) -> None:
        reply = await params.cb.notify(value=params.value)
        results.ack = reply.ack


@asynccontextmanager
async def pair(
    *,
    server_limits: Limits | None = None,
    client_limits: Limits | None = None,
    server: capsvc.Server | None = None,
) -> AsyncIterator[tuple[Connection, Connection]]:
    left, right = memory_stream_pair()
    server_conn = Connection(
        left, (server or SlowTester())._new_hook(), limits=server_limits, served=True
    )
    client_conn = Connection(right, limits=client_limits)
    async with both_running(client_conn, server_conn):
        yield client_conn, server_conn


def bootstrap_frame(question_id: int) -> bytes:
    message = wire.Message.new_message()
    message.init("bootstrap").questionId = question_id
    return encode_message(message.to_segments())


def aborts_in(data: bytes) -> list[tuple[int, str]]:
    """The (type, reason) of every Abort among the frames in ``data``."""
    decoder = FrameDecoder()
    decoder.feed(data)
    found = []
    while (segments := decoder.next_message()) is not None:
        if wire.message_tag(segments) == wire.ABORT:
            reader = wire.read_message(segments, traversal_limit_words=1 << 20, nesting_limit=64)
            found.append((int(reader.abort.type.raw), reader.abort.reason))
    return found


# ---------------------------------------------------------------------------- the value


def test_limits_reject_bad_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"Limits\.max_answers must be a positive int, got 0"):
        Limits(max_answers=0)
    with pytest.raises(ValueError, match=r"Limits\.max_imports must be a positive int"):
        Limits(max_imports=True)  # a bool is not a count
    with pytest.raises(ValueError, match=r"Limits\.idle_timeout must be a positive number"):
        Limits(idle_timeout=-1)
    assert Limits(idle_timeout=None).idle_timeout is None
    assert Limits().replace(max_answers=7).max_answers == 7
    assert capsvc.FramingLimits is capsvc.Limits  # the old name still works


def test_parse_limit() -> None:
    assert parse_limit("max_answers=1_000") == ("max_answers", 1000)
    assert parse_limit("max-queued-bytes=0x100") == ("max_queued_bytes", 256)
    assert parse_limit("idle_timeout=2.5") == ("idle_timeout", 2.5)
    assert parse_limit("frame_timeout=none") == ("frame_timeout", None)
    with pytest.raises(ValueError, match="NAME one of max_segments"):
        parse_limit("max_pancakes=3")
    with pytest.raises(ValueError, match="not an integer"):
        parse_limit("max_answers=lots")


# ---------------------------------------------------------------------------- hard limits


def test_too_many_answers_aborts_with_overloaded_naming_the_limit() -> None:
    hook = SlowTester()._new_hook()
    session = RpcSession(hook, limits=Limits(max_answers=3))
    decoder = FrameDecoder()
    for question in range(4):
        decoder.feed(bootstrap_frame(question))
        segments = decoder.next_message()
        assert segments is not None
        session.receive(segments)
    output = b"".join(session.take_output())
    assert aborts_in(output) == [
        (
            int(ExceptionType.OVERLOADED),
            "the peer would hold 4 unfinished calls, over the limit of 3 (Limits.max_answers)",
        )
    ]
    assert session.closed is not None
    assert session.tables_empty()


def test_too_many_imports_aborts() -> None:
    session = RpcSession(SlowTester()._new_hook(), limits=Limits(max_imports=2))
    message = wire.Message.new_message()
    call = message.init("call")
    call.questionId = 0
    call.target.init("promisedAnswer").questionId = 0
    call.interfaceId = Tester.schema.node.id
    call.methodId = 3  # holdCaps
    table = call.init("params").init("capTable", 3)
    for index in range(3):
        table[index].senderHosted = index
    decoder = FrameDecoder()
    decoder.feed(encode_message(message.to_segments()))
    segments = decoder.next_message()
    assert segments is not None
    session.receive(segments)
    (abort,) = aborts_in(b"".join(session.take_output()))
    assert abort[0] == int(ExceptionType.OVERLOADED)
    assert "over the limit of 2 (Limits.max_imports)" in abort[1]
    assert session.tables_empty()


async def test_a_peer_hoarding_our_capabilities_is_aborted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with pair(server_limits=Limits(max_exports=3)) as (client, server):
        tester = client.bootstrap(Tester)  # the bootstrap is export 1
        held = [(await tester.newCounter(start=i)).counter for i in range(2)]
        assert len(server.session.exports.entries) == 3
        # The fourth export goes out with its Return; then the server aborts.
        held.append((await tester.newCounter(start=9)).counter)
        with pytest.raises(capsvc.Disconnected, match=r"over the limit of 3 \(Limits.max_"):
            await held[-1].get()
        await server.wait_closed()
        assert server.session.abort_reason is not None
        assert "Limits.max_exports" in server.session.abort_reason


async def test_too_many_questions_fails_the_call_locally_and_the_connection_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with pair(client_limits=Limits(max_questions=3)) as (client, server):
        tester = client.bootstrap(Tester)  # the bootstrap question is one

        async def hold() -> None:
            assert (await tester.slow(ms=1000)).done

        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(hold)
            await trio.sleep(0.1)
            with pytest.raises(capsvc.Overloaded, match=r"Limits.max_questions = 3"):
                await tester.echo(msg="one too many")
        assert (await tester.echo(msg="after")).reply == "after"
        assert not client.closed
        assert not server.closed


# ---------------------------------------------------------------------------- flow control


@pytest.mark.parametrize(
    ("limits", "most"),
    [
        (Limits(max_calls_in_flight=2), 2),
        (Limits(max_call_bytes_in_flight=1), 1),  # one call is always admitted
    ],
)
async def test_flow_budget_holds_calls_in_flight_and_loses_none(
    autojump_clock: trio.testing.MockClock, limits: Limits, most: int
) -> None:
    impl = SlowTester()
    async with pair(server_limits=limits, server=impl) as (client, server):
        tester = client.bootstrap(Tester)
        done: list[bool] = []

        async def one() -> None:
            done.append((await tester.slow(ms=1000)).done)

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
        assert done == [True] * 8
        assert impl.most == most
        assert server.flow_pauses > 0
        assert server.session.answers.in_flight == 0


async def test_flow_budget_does_not_deadlock_a_call_waiting_on_the_peer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Budget 1: the first callBack waits for the client's notify Return, which sits behind
    the second callBack in the stream. Pausing would deadlock; the server keeps reading
    while it waits on the peer itself (RpcSession.flow_blocked)."""
    async with pair(server_limits=Limits(max_calls_in_flight=1)) as (client, _):
        tester = client.bootstrap(Tester)
        callback = CallbackImpl()
        acks: list[int] = []

        async def one(value: int) -> None:
            acks.append((await tester.callBack(cb=callback, value=value)).ack)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, 1)
                nursery.start_soon(one, 2)
        assert sorted(acks) == [3, 5]


# ---------------------------------------------------------------------------- timeouts


async def test_a_served_connection_that_never_speaks_is_aborted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    left, right = memory_stream_pair()
    server = Connection(left, SlowTester()._new_hook(), served=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        await trio.sleep(59.9)
        assert not server.closed
        await trio.sleep(0.2)
        assert server.closed
        received = await right.receive_some(65536)
        assert aborts_in(received) == [
            (int(ExceptionType.FAILED), "no message within 60 s (Limits.first_message_timeout)")
        ]
        nursery.cancel_scope.cancel()


async def test_a_client_connection_may_stay_silent(autojump_clock: trio.testing.MockClock) -> None:
    left, _ = memory_stream_pair()
    client = Connection(left)  # not served: no first-message timeout
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.run)
        await trio.sleep(3600)
        assert not client.closed
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("drip", [False, True])
async def test_a_message_left_unfinished_is_aborted(
    autojump_clock: trio.testing.MockClock, drip: bool
) -> None:
    """Four bytes of a segment table, then nothing (or one byte every 10 s, slowloris)."""
    left, right = memory_stream_pair()
    limits = Limits(first_message_timeout=None)  # (it would strike first, at 60 s)
    server = Connection(left, SlowTester()._new_hook(), limits=limits, served=True)
    frame = bootstrap_frame(0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        await trio.sleep(1)
        await right.send_all(frame[:4])
        for index in range(4, 14 if drip else 4):  # the last drop at 101 s
            await trio.sleep(10)
            await right.send_all(frame[index : index + 1])
        await server.wait_closed()
        closed_at = trio.current_time()
        assert 121 <= closed_at <= 121 + 30  # the frame began at 1 s; the watchdog ticks 15 s
        data = b""
        while chunk := await right.receive_some(65536):
            data += chunk
        ((kind, reason),) = aborts_in(data)
        assert kind == int(ExceptionType.FAILED)
        assert reason.endswith("within 120 s of its first byte (Limits.frame_timeout)")
        nursery.cancel_scope.cancel()


class UnreadStream(trio.abc.HalfCloseableStream):
    """A peer that sends but never reads: every send blocks for good."""

    def __init__(self, inner: trio.abc.HalfCloseableStream) -> None:
        self.inner = inner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.sleep_forever()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.sleep_forever()

    async def send_eof(self) -> None:
        await trio.sleep_forever()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_peer_that_never_reads_is_cut_off(autojump_clock: trio.testing.MockClock) -> None:
    left, right = memory_stream_pair()
    limits = Limits(first_message_timeout=None, frame_timeout=None)
    server = Connection(UnreadStream(left), SlowTester()._new_hook(), limits=limits, served=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run)
        await right.send_all(bootstrap_frame(0))  # its Return can never be written
        await trio.sleep(119)
        assert not server.closed
        await server.wait_closed()
        assert 120 <= trio.current_time() <= 120 + 30 + 5  # a tick late, the Abort's 5 s
        assert server.session.abort_reason == (
            "our output waited 120 s and no write completed (Limits.send_timeout)"
        )
        nursery.cancel_scope.cancel()


async def test_idle_timeout_spares_connections_with_calls_outstanding(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits = Limits(idle_timeout=30)
    async with pair(server_limits=limits) as (client, server):
        tester = client.bootstrap(Tester)
        assert (await tester.slow(ms=100_000)).done  # 100 s of silence, a call outstanding
        assert not server.closed
        started = trio.current_time()
        await server.wait_closed()
        assert 30 <= trio.current_time() - started <= 30 + 7.5
        assert server.session.abort_reason == "idle for 30 s (Limits.idle_timeout)"
        with pytest.raises(capsvc.Disconnected, match="idle_timeout"):
            await tester.echo(msg="too late")


# ---------------------------------------------------------------------------- real processes
#
# ``capsvc serve`` runs as its own process on 127.0.0.1; raw sockets are the hostile peers.
# Socket timeouts are real time: the bytes go through the kernel, not trio's clock.

SOCKET_TIMEOUT = 20.0


def _connect(address: str) -> socket.socket:
    host, port = address.removeprefix("tcp:").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _returns_in(data: bytes) -> int:
    decoder = FrameDecoder()
    decoder.feed(data)
    count = 0
    while (segments := decoder.next_message()) is not None:
        count += wire.message_tag(segments) == wire.RETURN
    return count


def _bootstrap_round_trip(address: str) -> int:
    """One Bootstrap on a new connection; the number of Returns that came back."""
    with _connect(address) as sock:
        sock.sendall(bootstrap_frame(0))
        data = b""
        while _returns_in(data) < 1:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return _returns_in(data)


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert found is not None
    return int(found.group(1)) * 1024


def test_serve_aborts_a_flooding_peer_and_serves_the_next(tmp_path: Path) -> None:
    with running(
        tmp_path, "-v", "--listen", "tcp:127.0.0.1:0", "--limit", "max_answers=50"
    ) as server:
        with _connect(server.address) as sock:
            sock.sendall(b"".join(bootstrap_frame(q) for q in range(60)))
            data = _read_all(sock)  # the server aborts, half-closes, then closes
        assert _returns_in(data) == 50
        assert aborts_in(data) == [
            (
                int(ExceptionType.OVERLOADED),
                "the peer would hold 51 unfinished calls, over the limit of 50 "
                "(Limits.max_answers)",
            )
        ]
        assert _bootstrap_round_trip(server.address) == 1
        assert server.process.poll() is None
        status, _ = server.stop()
        assert status == 0
        assert re.search(
            r"connection from 127\.0\.0\.1:\d+ aborted after .*: .*Limits\.max_answers",
            server.stderr,
        )


def test_serve_refuses_connections_over_max_connections(tmp_path: Path) -> None:
    with running(tmp_path, "--listen", "tcp:127.0.0.1:0", "--max-connections", "2") as server:
        first, second = _connect(server.address), _connect(server.address)
        try:
            for sock in (first, second):  # both are served
                sock.sendall(bootstrap_frame(0))
            for sock in (first, second):
                assert _returns_in(sock.recv(65536)) == 1
            with _connect(server.address) as third:
                data = _read_all(third)
            assert aborts_in(data) == [
                (
                    int(ExceptionType.OVERLOADED),
                    "the server is at its limit of 2 connections (max_connections)",
                )
            ]
        finally:
            first.close()
            second.close()
        # Real time: the server notices the two closes through the kernel.
        deadline = time.monotonic() + SOCKET_TIMEOUT
        while time.monotonic() < deadline:
            if _bootstrap_round_trip(server.address) == 1:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the server did not take connections again")
        server.stop()
        assert "refused a connection from 127.0.0.1:" in server.stderr


def test_serve_first_message_timeout_from_the_command_line(tmp_path: Path) -> None:
    with running(
        tmp_path, "--listen", "tcp:127.0.0.1:0", "--limit", "first_message_timeout=0.5"
    ) as server:
        with _connect(server.address) as sock:
            started = time.monotonic()
            data = _read_all(sock)
            waited = time.monotonic() - started
        assert aborts_in(data) == [
            (int(ExceptionType.FAILED), "no message within 0.5 s (Limits.first_message_timeout)")
        ]
        assert 0.4 <= waited < SOCKET_TIMEOUT


def test_serve_rejects_an_unknown_limit() -> None:
    result = run("serve", "--limit", "max_pancakes=3")
    assert result.returncode == 2
    assert "max_pancakes" in result.stderr
    assert "max_answers" in result.stderr  # the names are listed


def test_unfinished_answers_cost_little_memory(tmp_path: Path) -> None:
    """The figure issue 11 asks for, as a bound: an unfinished Bootstrap answer used to
    hold a whole pycapnp message (~9.9 KB of RSS each); now its capabilities alone."""
    with running(
        tmp_path, "--listen", "tcp:127.0.0.1:0", "--limit", "max_answers=100000"
    ) as server:
        with _connect(server.address) as sock:
            rss = []
            sent = 0
            for total in (2_000, 22_000):
                frames = b"".join(bootstrap_frame(q) for q in range(sent, total))
                sock.sendall(frames)
                decoder = FrameDecoder()
                returns = 0
                while returns < total - sent:
                    chunk = sock.recv(1 << 16)
                    assert chunk, "the server closed the connection"
                    decoder.feed(chunk)
                    while (segments := decoder.next_message()) is not None:
                        returns += wire.message_tag(segments) == wire.RETURN
                sent = total
                rss.append(_rss(server.process.pid))
        per_answer = (rss[1] - rss[0]) / 20_000
        assert per_answer < 2048, f"{per_answer:.0f} B of RSS per unfinished answer"
        server.stop()


async def test_open_connection_takes_the_limits() -> None:
    left, _ = memory_stream_pair()
    limits = Limits(max_queued_bytes=12345)
    async with capsvc.open_connection(left, limits=limits) as conn:
        assert conn.limits is limits
        assert conn.max_buffered == 12345
