"""A socket stream with a fast path that costs one scheduler pass less per operation.

Theory of operation: ``trio.SocketStream`` yields to the scheduler after every successful
send and receive (trio's "every await is a checkpoint" rule). An RPC round trip makes two
such operations per side, and on our machines every extra scheduler pass is another
``epoll_wait`` system call (~20 us of CPU each, pycapnp-notes.md §2-4).

``send_all`` and ``receive_some`` keep trio's rules exactly (they pass trio's stream
conformance checks, tests/test_transport.py). ``send_all_fast`` and ``receive_some_fast``
(:class:`~capsvc.transport.capabilities.FastPathStream`, which the RPC connection driver
uses for every read and write when a stream implements it) keep trio's *cancellation*
semantics (``checkpoint_if_cancelled`` first) but only park the task when the socket really
would block. To stay fair to other tasks, a fast receiver that never blocks still yields
once every ``_YIELD_EVERY`` calls.

The stream owns a plain non-blocking stdlib socket, taken over from a connected trio socket.
It implements every extra the driver knows (:mod:`capsvc.transport.capabilities`): the
fast paths, ``send_from_flusher`` for the end-of-pass flusher, adaptive ``busy_poll`` and
its ``socket`` (for TCP_NODELAY).

Receives go through one buffer per thread (``recv_into``, then a copy of what arrived),
not ``socket.recv(65536)``: that allocates a 64 KiB bytes object per read and shrinks it
to what arrived, and glibc, whose mmap threshold rises on its own to past 64 KiB, carves
those from the heap and leaves the freed tails between live objects. Measured with 500
connections under load (bench/soak.py): server RSS grew about 15 MB per 100,000 calls
and never came back; with the shared buffer it levels off.
"""

from __future__ import annotations

import socket
import threading
from typing import Any, final

import trio

from capsvc.transport import busypoll
from capsvc.transport.busypoll import BusyPoll
from capsvc.transport.capabilities import (
    BusyPollingStream,
    FastPathStream,
    FlusherSendStream,
    SocketBackedStream,
)

_YIELD_EVERY = 16
_BUFFER_SIZE = 65536


class _ReceiveBuffer(threading.local):
    """This thread's receive buffer (a trio run is one thread: no read spans an await)."""

    def __init__(self) -> None:
        self.buffer = bytearray(_BUFFER_SIZE)
        self.view = memoryview(self.buffer)


_RECEIVE = _ReceiveBuffer()


def _recv(sock: socket.socket, size: int) -> bytes:
    """``sock.recv(size)`` without a transient ``size``-byte allocation (module docstring)."""
    if size > _BUFFER_SIZE:
        return sock.recv(size)
    receive = _RECEIVE
    count = sock.recv_into(receive.buffer, size)
    return receive.view[:count].tobytes()


@final
class FastSocketStream(
    trio.abc.HalfCloseableStream,
    FastPathStream,
    FlusherSendStream,
    BusyPollingStream,
    SocketBackedStream,
):
    """A connected SOCK_STREAM socket as a trio stream (TCP or Unix)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.socket = sock
        self._sending = False
        self._receiving = False
        self._closed = False
        self._eof_sent = False
        self._streak = 0
        #: Adaptive busy polling of receives (None: always sleep until readable).
        self.busy_poll: BusyPoll | None = None

    @classmethod
    def take_over(cls, stream: trio.SocketStream) -> FastSocketStream:
        """Move the OS socket of a connected trio stream into a FastSocketStream."""
        trio_socket = stream.socket
        sock = socket.socket(trio_socket.family, trio_socket.type, trio_socket.proto,
                             fileno=trio_socket.detach())  # fmt: skip
        return cls(sock)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.send_all_fast(data)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.receive_some_fast(max_bytes)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return data

    async def send_all_fast(self, data: bytes | bytearray | memoryview) -> None:
        """``send_all`` that only yields when the socket's buffer is full."""
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        if self._closed or self._eof_sent:
            raise trio.ClosedResourceError("the stream is closed for sending")
        await trio.lowlevel.checkpoint_if_cancelled()
        self._sending = True
        try:
            with memoryview(data) as view:
                sent = 0
                total = len(view)
                while sent < total:
                    try:
                        sent += self.socket.send(view[sent:])
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(self.socket)
                    except OSError as error:
                        raise self._translate(error) from error
        finally:
            self._sending = False

    def send_from_flusher(self, data: bytes | bytearray | memoryview) -> int:
        """Send what fits without blocking; 0 if nothing does (FlusherSendStream: one
        non-blocking ``send``, no task is rescheduled); the rest is left to the
        connection's writer task."""
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        if self._closed or self._eof_sent:
            raise trio.ClosedResourceError("the stream is closed for sending")
        try:
            return self.socket.send(data)
        except BlockingIOError:
            return 0
        except OSError as error:
            raise self._translate(error) from error

    async def wait_send_all_might_not_block(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        self._sending = True
        try:
            await trio.lowlevel.wait_writable(self.socket)
        except OSError as error:
            raise self._translate(error) from error
        finally:
            self._sending = False

    async def send_eof(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is already sending on this stream")
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        await trio.lowlevel.checkpoint()
        if self._eof_sent:
            return
        self._eof_sent = True
        try:
            self.socket.shutdown(socket.SHUT_WR)
        except OSError as error:
            raise self._translate(error) from error

    async def receive_some_fast(self, max_bytes: int | None = None) -> bytes:
        """``receive_some`` that only yields when no data is waiting (or, for fairness,
        once every ``_YIELD_EVERY`` calls)."""
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this stream")
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        await trio.lowlevel.checkpoint_if_cancelled()
        self._receiving = True
        try:
            self._streak += 1
            if self._streak >= _YIELD_EVERY:
                self._streak = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
            size = max_bytes or _BUFFER_SIZE
            try:
                return _recv(self.socket, size)
            except BlockingIOError:
                self._streak = 0
            except OSError as error:
                raise self._translate(error) from error
            return await self._wait_and_receive(size)
        finally:
            self._receiving = False

    async def _wait_and_receive(self, size: int) -> bytes:
        """Nothing is waiting: poll for a while (capsvc.transport.busypoll) or sleep."""
        poll = self.busy_poll
        if poll is None:
            return await self._sleep_and_receive(size)
        started = busypoll.now()
        poll.begin_wait(started)
        if poll.should_poll():
            deadline = started + poll.budget
            while True:
                # One zero-timeout scheduler pass: other tasks run, output is flushed.
                await trio.lowlevel.checkpoint()
                try:
                    data = _recv(self.socket, size)
                except BlockingIOError:
                    if busypoll.now() >= deadline or not poll.yield_cpu():
                        # Out of budget, or another process wants this CPU: sleep.
                        poll.polled(found=False)
                        break
                    continue
                except OSError as error:
                    raise self._translate(error) from error
                poll.polled(found=True, waited=busypoll.now() - started)
                return data
            # Out of budget: this cycle's length is mostly the budget, not a wake-up's
            # cost, so it is no sample for the policy's wake-up rule.
            return await self._sleep_and_receive(size)
        poll.slept()
        return await self._sleep_and_receive(size)

    async def _sleep_and_receive(self, size: int) -> bytes:
        while True:
            await trio.lowlevel.wait_readable(self.socket)
            try:
                return _recv(self.socket, size)
            except BlockingIOError:
                continue
            except OSError as error:
                raise self._translate(error) from error

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self.socket)
            self.socket.close()
        await trio.lowlevel.checkpoint()

    def setsockopt(self, level: int, option: int, value: int | bytes) -> None:
        self.socket.setsockopt(level, option, value)

    def getsockopt(self, level: int, option: int, buffersize: int = 0) -> Any:
        if buffersize:
            return self.socket.getsockopt(level, option, buffersize)
        return self.socket.getsockopt(level, option)

    def _translate(self, error: OSError) -> Exception:
        if self._closed:
            return trio.ClosedResourceError("the stream was closed")
        return trio.BrokenResourceError(f"socket error: {error}")


@final
class FastListener(trio.abc.Listener[trio.abc.Stream]):
    """Wraps a listener of trio SocketStreams so that it hands out FastSocketStreams."""

    def __init__(self, inner: trio.abc.Listener[Any]) -> None:
        self.inner = inner

    @property
    def socket(self) -> Any:
        """The listening socket of the wrapped listener."""
        return self.inner.socket  # type: ignore[attr-defined]

    async def accept(self) -> trio.abc.Stream:
        stream = await self.inner.accept()
        return (
            FastSocketStream.take_over(stream) if isinstance(stream, trio.SocketStream) else stream
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
