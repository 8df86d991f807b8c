"""What a stream can do beyond :class:`trio.abc.Stream`: the extras the RPC driver uses.

Theory of operation
-------------------
DESIGN.md: a transport is a :class:`trio.abc.Stream` (``send_all``, ``receive_some``,
``aclose``), and capsvc's connection driver (:mod:`capsvc.connection`) works over any
stream with those alone. Some of capsvc's own streams can do more, and the driver goes
faster when they do: it sends from trio's ``before_io_wait``, skips trio's extra scheduler
pass per operation, busy-polls for the peer's reply, and knows whether Nagle's algorithm
is on. Each extra is one small ABC here, with its contract in its docstring:

- :class:`FlusherSendStream`: a non-blocking send for the end-of-pass flusher;
- :class:`FastPathStream`: ``send_all_fast`` / ``receive_some_fast``;
- :class:`BusyPollingStream`: takes an adaptive busy-polling policy;
- :class:`SocketBackedStream`: exposes its OS socket (for TCP_NODELAY).

They are mixins, not stream classes, and nominal on purpose: a stream *declares* what it
offers by inheriting them (:class:`~capsvc.transport.fastsocket.FastSocketStream` all
four, :class:`~capsvc.transport.nic.NicStream` the first three), mypy checks its
signatures against them, and the driver detects each with one ``isinstance`` when a
connection is built and binds the methods it will call then, so the per-call path pays
nothing for the choice. A stream with the right method names that does not inherit the
ABC is served as a plain Stream: a name alone does not promise the contract.
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod

from capsvc.transport.busypoll import BusyPoll

__all__ = ["BusyPollingStream", "FastPathStream", "FlusherSendStream", "SocketBackedStream"]


class FlusherSendStream(ABC):
    """A stream that can send without blocking from trio's ``before_io_wait``.

    capsvc's end-of-pass flusher (:mod:`capsvc.flusher`) writes a connection's output with
    it once per scheduler pass, after every task of the pass has run; whatever it does not
    take, the connection's writer task sends with ``send_all`` (or ``send_all_fast``) a
    pass later, in order.
    """

    __slots__ = ()

    @abstractmethod
    def send_from_flusher(self, data: bytes | bytearray | memoryview) -> int:
        """Send a prefix of ``data`` now, without blocking; return its length.

        It runs outside any task (in an instrument hook, where trio has already chosen how
        long to sleep), so it must not block, await or reschedule a task; a wake-up it
        needs goes through ``run_sync_soon``. It may take all, some or none of ``data``
        (0 when nothing fits); the bytes it took are on their way, in order after every
        earlier send.

        Raises:
            trio.BrokenResourceError: the connection is broken (nothing was sent).
            trio.ClosedResourceError: the stream, or its send side, is closed.
            trio.BusyResourceError: a task is inside ``send_all`` on this stream.
        """


class FastPathStream(ABC):
    """A stream whose send and receive skip trio's extra scheduler pass when they need not
    wait (:mod:`capsvc.transport.fastsocket` explains the cost).

    Both keep trio's *cancellation* semantics (a cancelled call raises before doing
    anything: ``checkpoint_if_cancelled`` first) and the errors of ``send_all`` and
    ``receive_some``, but park the task only when they have to wait. The driver uses them
    instead of ``send_all``/``receive_some`` for every read and every write-task send.
    """

    __slots__ = ()

    @abstractmethod
    async def send_all_fast(self, data: bytes | bytearray | memoryview) -> None:
        """``send_all`` that yields to the scheduler only when it has to wait."""

    @abstractmethod
    async def receive_some_fast(self, max_bytes: int | None = None) -> bytes:
        """``receive_some`` that yields only when no data is waiting (a stream may also
        yield now and then for fairness); ``b""`` at EOF."""


class BusyPollingStream(ABC):
    """A stream whose receives can poll briefly for data instead of sleeping.

    ``busy_poll`` is the adaptive policy (:mod:`capsvc.transport.busypoll`) its receives
    follow when no data is waiting; ``None`` (what an implementation starts with) means
    sleep until readable. capsvc's Connection sets it once, when it is built, from its
    ``busy_poll=`` budget; an implementation may raise the policy's budget to a floor of
    its own (``nic:`` does) but must not share it with another stream.
    """

    __slots__ = ()

    busy_poll: BusyPoll | None


class SocketBackedStream(ABC):
    """A stream over one connected OS socket, which it exposes as ``socket``.

    The driver only reads socket options through it (``family``, TCP_NODELAY: with Nagle's
    algorithm on, it holds a lone Finish or Release back for the next message); sending
    and receiving on it directly would bypass the stream. It is the stream's socket for
    the stream's whole life (closed by ``aclose``).
    """

    __slots__ = ()

    socket: socket.socket
