"""The typed stream extras (capsvc.transport.capabilities) and how Connection detects them."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from capsvc.connection import Connection
from capsvc.transport import open_listeners, open_stream
from capsvc.transport.busypoll import BusyPoll
from capsvc.transport.capabilities import (
    BusyPollingStream,
    FastPathStream,
    FlusherSendStream,
    SocketBackedStream,
)
from capsvc.transport.fastsocket import FastSocketStream
from capsvc.transport.memory import memory_stream_pair
from capsvc.transport.nic import NicStream
from capsvc.transport.tcp import connect_tcp


def test_streams_declare_what_they_offer() -> None:
    for extra in (FastPathStream, FlusherSendStream, BusyPollingStream, SocketBackedStream):
        assert issubclass(FastSocketStream, extra)
    for extra in (FastPathStream, FlusherSendStream, BusyPollingStream):
        assert issubclass(NicStream, extra)
    assert not issubclass(NicStream, SocketBackedStream)  # no OS socket: no Nagle handling


async def tcp_stream_pair(nodelay: bool = True) -> tuple[FastSocketStream, FastSocketStream]:
    listeners = await open_listeners("tcp:127.0.0.1:0", nodelay=nodelay)
    port = listeners[0].socket.getsockname()[1]  # type: ignore[attr-defined]
    client = await open_stream(f"tcp:127.0.0.1:{port}", nodelay=nodelay)
    server = await listeners[0].accept()
    for listener in listeners:
        await listener.aclose()
    assert isinstance(client, FastSocketStream)
    assert isinstance(server, FastSocketStream)
    return client, server


async def test_connection_binds_the_extras_of_a_fast_socket_stream() -> None:
    client, server = await tcp_stream_pair()
    async with client, server:
        connection = Connection(client, busy_poll=300e-6)
        assert connection._flusher is not None
        assert connection._send_from_flusher == client.send_from_flusher
        assert connection._receive_some == client.receive_some_fast
        assert connection._send_all == client.send_all_fast
        assert isinstance(client.busy_poll, BusyPoll)
        assert client.busy_poll.budget == 300e-6
        assert not connection._hold_housekeeping  # TCP_NODELAY is on
        assert Connection(server, busy_poll=None)._flusher is not None
        assert server.busy_poll is None
        assert Connection(server, coalesce=False)._flusher is None


async def test_a_plain_stream_gets_trio_methods_and_the_writer_task() -> None:
    left, _ = memory_stream_pair()
    connection = Connection(left)
    assert connection._flusher is None
    assert connection._receive_some == left.receive_some
    assert connection._send_all == left.send_all
    assert connection._send_from_flusher(b"x") == 0  # (never called: no flusher)
    assert not connection._hold_housekeeping


class LookAlike(trio.abc.Stream):
    """Has methods of the right names but declares none of the extras."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.busy_poll: BusyPoll | None = None

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def send_from_flusher(self, data: bytes) -> int:
        raise AssertionError("a method name alone does not promise the contract")

    async def receive_some_fast(self, max_bytes: int | None = None) -> bytes:
        raise AssertionError("a method name alone does not promise the contract")


async def test_method_names_alone_are_not_an_interface() -> None:
    left, _ = memory_stream_pair()
    stream = LookAlike(left)
    connection = Connection(stream)
    assert connection._flusher is None
    assert connection._receive_some == stream.receive_some
    assert stream.busy_poll is None


@pytest.mark.parametrize("nodelay", [True, False])
async def test_nagle_detection(nodelay: bool) -> None:
    client, server = await tcp_stream_pair(nodelay=nodelay)
    async with client, server:
        assert Connection(client)._hold_housekeeping is not nodelay
        assert not Connection(client, coalesce=False)._hold_housekeeping
    # trio's own SocketStream (handed to open_connection by a user) is detected too
    listeners = await open_listeners("tcp:127.0.0.1:0")
    port = listeners[0].socket.getsockname()[1]  # type: ignore[attr-defined]
    plain = await connect_tcp("127.0.0.1", port, nodelay=nodelay)
    async with plain:
        assert plain.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == int(nodelay)
        assert Connection(plain)._hold_housekeeping is not nodelay
        assert Connection(plain)._flusher is None  # no FlusherSendStream: the writer task
    for listener in listeners:
        await listener.aclose()
