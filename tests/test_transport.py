"""Tests for capsvc.transport: address parsing, TCP/Unix/memory streams, NODELAY, listeners."""

from __future__ import annotations

import errno
import os
import socket as stdlib_socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing

from capsvc.transport import (
    Address,
    FastListener,
    FastSocketStream,
    TcpListener,
    UnixListener,
    connect_tcp,
    connect_unix,
    listen_tcp,
    listen_unix,
    listener_address,
    open_listeners,
    open_stream,
    parse_address,
)
from capsvc.transport.memory import memory_stream_pair
from tests.support.checks import Ticker


def _has_ipv6_loopback() -> bool:
    try:
        with stdlib_socket.socket(stdlib_socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")


# -- address parsing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "canonical"),
    [
        ("tcp:127.0.0.1:4000", Address("tcp", host="127.0.0.1", port=4000), None),
        ("tcp:localhost:0", Address("tcp", host="localhost", port=0), None),
        ("tcp:[::1]:4000", Address("tcp", host="::1", port=4000), None),
        ("tcp:[::]:65535", Address("tcp", host="::", port=65535), None),
        ("tcp:[fe80::1%eth0]:7", Address("tcp", host="fe80::1%eth0", port=7), None),
        ("TCP:example.org:80", Address("tcp", host="example.org", port=80), "tcp:example.org:80"),
        ("unix:/tmp/capsvc.sock", Address("unix", path="/tmp/capsvc.sock"), None),
        ("unix:relative/dir/x.sock", Address("unix", path="relative/dir/x.sock"), None),
        ("unix:with:colons", Address("unix", path="with:colons"), None),
    ],
)
def test_parse_good(text: str, expected: Address, canonical: str | None) -> None:
    address = parse_address(text)
    assert address == expected
    assert str(address) == (canonical or text)
    assert parse_address(str(address)) == address


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "malformed address"),
        ("tcp", "malformed address"),
        (":4000", "malformed address"),
        ("tcp:", "expected tcp:HOST:PORT"),
        ("tcp:localhost", "expected tcp:HOST:PORT"),
        ("tcp::4000", "missing host"),
        ("tcp:::1:4000", "must be in brackets"),
        ("tcp:[::1]4000", "expected ':PORT' after"),
        ("tcp:[::1:4000", "missing ']'"),
        ("tcp:[127.0.0.1]:4000", "not an IPv6 address"),
        ("tcp:[nonsense]:4000", "not an IPv6 address"),
        ("tcp:host:", "is not a number"),
        ("tcp:host:http", "is not a number"),
        ("tcp:host:-1", "is not a number"),
        ("tcp:host:+1", "is not a number"),
        ("tcp:host:\u0663", "is not a number"),  # an Arabic-Indic digit
        ("tcp:host:65536", "out of range"),
        ("tcp://host:4000", "without '//'"),
        ("tcp:ho st:4000", "invalid host"),
        ("unix:", "expected unix:PATH"),
        ("unix:a\0b", "NUL"),
        ("pipe:", "not supported yet"),
        ("pipe:/dev/stdin", "not supported yet"),
        ("nic:", "expected nic:model:NAME or nic:PCI_ADDRESS"),
        ("nic:zzz", "expected model:NAME or a PCI address"),
        ("memory:", "not an address"),
        ("http://example.org/", "unknown address scheme 'http'"),
        ("udp:127.0.0.1:53", "unknown address scheme 'udp'"),
    ],
)
def test_parse_bad(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_address(text)


def test_address_constructors() -> None:
    assert str(Address.tcp("::1", 5)) == "tcp:[::1]:5"
    assert Address.tcp("127.0.0.1", 0) == parse_address("tcp:127.0.0.1:0")
    assert str(Address.unix("/run/x.sock")) == "unix:/run/x.sock"
    with pytest.raises(ValueError, match="out of range"):
        Address.tcp("127.0.0.1", 70000)


def test_parse_rejects_non_str() -> None:
    with pytest.raises(TypeError):
        parse_address(b"tcp:127.0.0.1:1")  # type: ignore[arg-type]


# -- helpers -------------------------------------------------------------------------------

StreamPair = tuple[trio.SocketStream, trio.SocketStream]


async def fill_stream(stream: trio.SocketStream) -> None:
    """Send until the kernel buffers are full and send_all blocks (as trio's own tests)."""

    async def sender() -> None:
        while True:
            await stream.send_all(b"x" * 10000)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()


def clogged(maker: Callable[[], Awaitable[StreamPair]]) -> Callable[[], Awaitable[StreamPair]]:
    async def clogged_maker() -> StreamPair:
        left, right = await maker()
        await fill_stream(left)
        await fill_stream(right)
        return left, right

    return clogged_maker


def tcp_pair_maker(host: str, *, nodelay: bool) -> Callable[[], Awaitable[StreamPair]]:
    async def maker() -> StreamPair:
        (listener,) = await listen_tcp(host, 0, nodelay=nodelay)
        async with listener:
            port = listener.socket.getsockname()[1]
            client = await connect_tcp(host, port, nodelay=nodelay)
            server = await listener.accept()
        return client, server

    return maker


def nodelay_of(stream: trio.SocketStream | FastSocketStream) -> int:
    return stream.getsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY)


# -- stream conformance ----------------------------------------------------------------------


@pytest.mark.parametrize("nodelay", [True, False])
async def test_tcp_stream_conformance(nodelay: bool) -> None:
    maker = tcp_pair_maker("127.0.0.1", nodelay=nodelay)
    await trio.testing.check_half_closeable_stream(maker, clogged(maker))


@needs_ipv6
async def test_tcp_ipv6_stream_conformance() -> None:
    maker = tcp_pair_maker("::1", nodelay=True)
    await trio.testing.check_half_closeable_stream(maker, clogged(maker))


async def test_unix_stream_conformance(tmp_path: Path) -> None:
    counter = 0

    async def maker() -> StreamPair:
        nonlocal counter
        counter += 1
        path = tmp_path / f"s{counter}.sock"
        async with await listen_unix(path) as listener:
            client = await connect_unix(path)
            server = await listener.accept()
        return client, server

    await trio.testing.check_half_closeable_stream(maker, clogged(maker))


@pytest.mark.parametrize("nodelay", [True, False])
async def test_fast_tcp_stream_conformance(nodelay: bool) -> None:
    async def maker() -> StreamPair:
        (listener,) = await open_listeners("tcp:127.0.0.1:0", nodelay=nodelay)
        async with listener:
            client = await open_stream(listener_address(listener), nodelay=nodelay)
            server = await listener.accept()
        assert isinstance(client, FastSocketStream)
        assert isinstance(server, FastSocketStream)
        return client, server  # type: ignore[return-value]

    await trio.testing.check_half_closeable_stream(maker, clogged(maker))


async def test_fast_unix_stream_conformance(tmp_path: Path) -> None:
    counter = 0

    async def maker() -> StreamPair:
        nonlocal counter
        counter += 1
        (listener,) = await open_listeners(f"unix:{tmp_path / f'f{counter}.sock'}")
        async with listener:
            client = await open_stream(listener_address(listener))
            server = await listener.accept()
        return client, server  # type: ignore[return-value]

    await trio.testing.check_half_closeable_stream(maker, clogged(maker))


async def test_fast_stream_yields_to_other_tasks_when_data_never_runs_out() -> None:
    """A receiver that never blocks must still let other tasks run (fairness)."""
    (listener,) = await open_listeners("tcp:127.0.0.1:0")
    async with listener:
        client = await open_stream(listener_address(listener))
        server = await listener.accept()
    ticker = Ticker()
    async with client, server, trio.open_nursery() as nursery:
        nursery.start_soon(client.send_all, b"x" * 200_000)
        nursery.start_soon(ticker.run)
        received = 0
        while received < 200_000:
            received += len(await server.receive_some_fast(1000))  # type: ignore[attr-defined]
        nursery.cancel_scope.cancel()
    assert ticker.ticks > 5


async def test_memory_stream_conformance() -> None:
    # half-closeable: the lingering close after an Abort (capsvc.connection) needs send_eof
    async def maker() -> tuple[trio.abc.HalfCloseableStream, trio.abc.HalfCloseableStream]:
        return memory_stream_pair()

    await trio.testing.check_half_closeable_stream(maker, None)


# -- TCP_NODELAY ---------------------------------------------------------------------------


@pytest.mark.parametrize("nodelay", [True, False])
async def test_nodelay_readback(nodelay: bool) -> None:
    client, server = await tcp_pair_maker("127.0.0.1", nodelay=nodelay)()
    async with client, server:
        assert bool(nodelay_of(client)) is nodelay
        assert bool(nodelay_of(server)) is nodelay
        if not nodelay:
            assert nodelay_of(client) == 0
            assert nodelay_of(server) == 0


async def test_nodelay_through_uris() -> None:
    (listener,) = await open_listeners("tcp:127.0.0.1:0", nodelay=False)
    async with listener:
        client = await open_stream(listener_address(listener), nodelay=False)
        server = await listener.accept()
        async with client, server:
            assert isinstance(client, FastSocketStream)
            assert isinstance(server, FastSocketStream)
            assert nodelay_of(client) == 0
            assert nodelay_of(server) == 0
            await client.send_all(b"ping")
            assert await server.receive_some(10) == b"ping"


# -- listeners and addresses ---------------------------------------------------------------


async def test_listener_address_tcp() -> None:
    listeners = await open_listeners("tcp:127.0.0.1:0")
    assert len(listeners) == 1
    (listener,) = listeners
    async with listener:
        assert isinstance(listener, FastListener)
        assert isinstance(listener.inner, TcpListener)
        uri = listener_address(listener)
        address = parse_address(uri)
        assert address.host == "127.0.0.1"
        assert address.port == listener.inner.socket.getsockname()[1]
        assert address.port != 0
        async with await open_stream(uri) as client, await listener.accept() as server:
            await server.send_all(b"hello")
            assert await client.receive_some(10) == b"hello"


@needs_ipv6
async def test_listener_address_ipv6() -> None:
    (listener,) = await open_listeners("tcp:[::1]:0")
    async with listener:
        uri = listener_address(listener)
        assert uri.startswith("tcp:[::1]:")
        assert parse_address(uri).port == listener.socket.getsockname()[1]  # type: ignore[attr-defined]
        async with await open_stream(uri) as client, await listener.accept() as server:
            await client.send_all(b"6")
            assert await server.receive_some(10) == b"6"


async def test_listener_address_plain_trio_listener() -> None:
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    async with listener:
        port = listener.socket.getsockname()[1]
        assert listener_address(listener) == f"tcp:127.0.0.1:{port}"


async def test_listener_address_rejects_unknown_listeners() -> None:
    class Odd(trio.abc.Listener[trio.abc.Stream]):
        async def accept(self) -> trio.abc.Stream:
            raise NotImplementedError

        async def aclose(self) -> None:
            pass

    with pytest.raises(TypeError, match="no address known"):
        listener_address(Odd())


async def test_unix_listener_address_and_cleanup(tmp_path: Path) -> None:
    path = tmp_path / "server.sock"
    (listener,) = await open_listeners(f"unix:{path}")
    assert isinstance(listener, FastListener)
    assert isinstance(listener.inner, UnixListener)
    assert listener_address(listener) == f"unix:{path}"
    assert path.is_socket()
    async with await open_stream(f"unix:{path}") as client, await listener.accept() as server:
        await client.send_all(b"over unix")
        assert await server.receive_some(100) == b"over unix"
    await listener.aclose()
    assert not path.exists()
    await listener.aclose()  # idempotent


async def test_unix_stale_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    with stdlib_socket.socket(stdlib_socket.AF_UNIX) as dead:
        dead.bind(str(path))  # bound, never listening, then closed: a leftover file
    assert path.is_socket()
    async with await listen_unix(path) as listener:
        async with await connect_unix(path) as client, await listener.accept() as server:
            await client.send_all(b"fresh")
            assert await server.receive_some(10) == b"fresh"


async def test_unix_live_socket_is_not_stolen(tmp_path: Path) -> None:
    path = tmp_path / "live.sock"
    async with await listen_unix(path):
        with pytest.raises(OSError, match="running server") as excinfo:
            await listen_unix(path)
        assert excinfo.value.errno == errno.EADDRINUSE
        assert path.is_socket()


async def test_unix_regular_file_is_not_removed(tmp_path: Path) -> None:
    path = tmp_path / "precious.txt"
    path.write_text("keep me")
    with pytest.raises(FileExistsError, match="not a socket"):
        await listen_unix(path)
    assert path.read_text() == "keep me"


async def test_unix_aclose_leaves_a_replacement_alone(tmp_path: Path) -> None:
    path = tmp_path / "replaced.sock"
    first = await listen_unix(path)
    os.unlink(path)
    async with await listen_unix(path):
        await first.aclose()
        assert path.is_socket()  # the second server's file survives the first's aclose
    assert not path.exists()


# -- failures ------------------------------------------------------------------------------


async def test_connect_to_closed_port_fails() -> None:
    with stdlib_socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # nothing listens on that port now
    with pytest.raises(OSError):  # noqa: PT011 -- any OSError is the contract
        await open_stream(f"tcp:127.0.0.1:{port}")


async def test_connect_to_missing_unix_socket_fails(tmp_path: Path) -> None:
    with pytest.raises(OSError):  # noqa: PT011
        await open_stream(f"unix:{tmp_path / 'nobody.sock'}")


async def test_connect_to_port_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="port 0"):
        await open_stream("tcp:127.0.0.1:0")


async def test_reserved_schemes_are_not_opened() -> None:
    with pytest.raises(ValueError, match="not supported yet"):
        await open_stream("pipe:")
    with pytest.raises(ValueError, match="not supported yet"):
        await open_listeners("pipe:")
