"""In-memory connections for unit tests: a server and a client in one trio run, no sockets.

Theory of operation: ``ends`` runs two real capsvc connections (``capsvc.open_connection``)
over the two ends of an in-memory stream pair (capsvc.transport.memory), one offering the
server object as its bootstrap, the other the one a test calls through. Every message is
framed, sent and handled by the whole protocol engine, both ways, as over a socket; only
the kernel is left out. So a test is fast and deterministic: trio's ``autojump_clock``
drives the timeouts, and once ``trio.testing.wait_all_tasks_blocked()`` returns every
message sent has been handled (a Release or a Finish included: tables can be checked).
``connected`` and ``client`` are the same pair, giving the client end only, or its
bootstrap capability already typed.

Leaving the block closes the client end first (what it queued is written, and every call
still waiting on it fails with ``capsvc.Disconnected``), then the server end, whose running
methods are cancelled as when a real peer goes away. An exception raised in the block
comes out as itself, as from ``open_connection``.

The streams are unbounded (a send never blocks), so backpressure (``max_queued_bytes``)
needs a real socket: serve on loopback (the pytest plugin's ``capsvc_serve``, capsvc_pytest).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NamedTuple, Protocol, TypeVar, overload

from capsvc.api import open_connection
from capsvc.connection import Connection
from capsvc.limits import Limits
from capsvc.transport.memory import memory_stream_pair
from capsvc.typed import Client as TypedClient
from capsvc.typed import Interface

__all__ = ["Connect", "Ends", "Serve", "client", "connected", "ends"]

C = TypeVar("C", bound=TypedClient)


#: Where ``capsvc_serve`` listens unless told: loopback, a port the kernel picks.
DEFAULT_LISTEN = "tcp:127.0.0.1:0"


class Serve(Protocol):
    """The type of the ``capsvc_serve`` fixture (annotate a test's argument with it)."""

    async def __call__(
        self,
        app: object,
        *,
        listen: str = DEFAULT_LISTEN,
        limits: Limits | None = None,
        max_connections: int | None = None,
        access_log: bool = False,
    ) -> str: ...


class Connect(Protocol):
    """The type of the ``capsvc_connect`` fixture."""

    async def __call__(
        self, address: str, *, bootstrap: object = None, limits: Limits | None = None
    ) -> Connection: ...


class Ends(NamedTuple):
    """Both ends of an in-memory pair, each a real ``capsvc.Connection``."""

    #: The end that offers the server object (its ``session`` shows what it exports).
    server: Connection
    #: The end the test calls through: ``ends.client.bootstrap(Iface)``.
    client: Connection


@asynccontextmanager
async def ends(
    server: object,
    *,
    bootstrap: object = None,
    limits: Limits | None = None,
    server_limits: Limits | None = None,
) -> AsyncIterator[Ends]:
    """Both ends of a connected in-memory pair, for the block's duration.

    Args:
        server: what the server end offers as its bootstrap: a server object (generated or
            ``capsvc.Server``), or a client, whose capability is forwarded.
        bootstrap: what the client end offers (``ends.server.bootstrap(...)`` reaches it),
            as ``connect``'s ``bootstrap``.
        limits: the client end's bounds and timeouts, as ``connect``'s.
        server_limits: the server end's, as ``serve``'s. It is no accepted connection, so
            ``first_message_timeout`` does not apply to it.
    """
    server_stream, client_stream = memory_stream_pair()
    # Nested, so that the client end closes first: its pending calls fail with
    # Disconnected("connection closed locally"), and nothing is left running when the
    # server end closes. Each open_connection unwraps a lone error, so errors come out bare.
    async with (
        open_connection(server_stream, bootstrap=server, limits=server_limits) as server_end,
        open_connection(client_stream, bootstrap=bootstrap, limits=limits) as client_end,
    ):
        yield Ends(server_end, client_end)


@asynccontextmanager
async def connected(
    server: object,
    *,
    bootstrap: object = None,
    limits: Limits | None = None,
    server_limits: Limits | None = None,
) -> AsyncIterator[Connection]:
    """The client end of an in-memory pair serving ``server`` (arguments as for ``ends``):

    ``async with capsvc.testing.connected(MyServer()) as conn: echo = conn.bootstrap(Echo)``
    """
    async with ends(
        server, bootstrap=bootstrap, limits=limits, server_limits=server_limits
    ) as pair:
        yield pair.client


@overload
def client(
    server: object,
    interface: type[Interface[C]],
    *,
    limits: Limits | None = None,
    server_limits: Limits | None = None,
) -> AbstractAsyncContextManager[C]: ...
@overload
def client(
    server: object,
    interface: Any,
    *,
    limits: Limits | None = None,
    server_limits: Limits | None = None,
) -> AbstractAsyncContextManager[Any]: ...


def client(
    server: object,
    interface: Any,
    *,
    limits: Limits | None = None,
    server_limits: Limits | None = None,
) -> AbstractAsyncContextManager[Any]:
    """``server``'s capability as a client of ``interface``, over an in-memory pair:

    ``async with capsvc.testing.client(EchoServer(), Echo) as echo:`` (an ``Echo.Client``
    to mypy, as ``conn.bootstrap(Echo)`` gives). A generated interface gives its typed
    client; a ``capsvc.load_schema`` interface a dynamic ``capsvc.Client``.
    """
    # A plain function, so that its overloads can tell mypy what the block gets.
    return _client(server, interface, limits=limits, server_limits=server_limits)


@asynccontextmanager
async def _client(
    server: object, interface: Any, *, limits: Limits | None, server_limits: Limits | None
) -> AsyncIterator[Any]:
    async with connected(server, limits=limits, server_limits=server_limits) as conn:
        yield conn.bootstrap(interface)
