"""Transports: the byte streams capsvc runs the Cap'n Proto framing over.

Theory of operation
-------------------
DESIGN.md: a transport is anything with ``send_all``, ``receive_some`` and ``aclose``,
i.e. a :class:`trio.abc.Stream`; the RPC layer never knows which one it has. This package
maps an address URI (:mod:`capsvc.transport.address`) to the backend that serves it:

- :func:`open_stream` dials an address and returns a connected stream;
- :func:`open_listeners` listens on an address and returns one or more
  :class:`trio.abc.Listener` objects (a TCP host name may resolve to several addresses);
- :func:`listener_address` gives the URI a listener is actually bound to (the port the
  kernel chose for ``tcp:HOST:0``), for "listening on ..." messages and for tests.

Connected sockets are handed out as :class:`~capsvc.transport.fastsocket.FastSocketStream`
(a trio stream that skips trio's extra scheduler pass per operation).

A stream may offer more than trio's Stream; it declares each extra by inheriting one of
the small ABCs of :mod:`capsvc.transport.capabilities` (``FlusherSendStream``,
``FastPathStream``, ``BusyPollingStream``, ``SocketBackedStream``), whose docstrings are
the contract, and the connection driver detects them once per connection.

Backends: :mod:`~capsvc.transport.tcp`, :mod:`~capsvc.transport.unix`, and for unit tests
:mod:`~capsvc.transport.memory`. TCP_NODELAY is on by default (rpc-protocol.md §1, send
side); ``nodelay`` is ignored by transports that have no such option.
"""

from __future__ import annotations

import trio

from capsvc.transport.address import Address, parse_address
from capsvc.transport.capabilities import (
    BusyPollingStream,
    FastPathStream,
    FlusherSendStream,
    SocketBackedStream,
)
from capsvc.transport.fastsocket import FastListener, FastSocketStream
from capsvc.transport.tcp import TcpListener, connect_tcp, listen_tcp
from capsvc.transport.unix import UnixListener, connect_unix, listen_unix

__all__ = [
    "Address",
    "BusyPollingStream",
    "FastListener",
    "FastPathStream",
    "FastSocketStream",
    "FlusherSendStream",
    "SocketBackedStream",
    "TcpListener",
    "UnixListener",
    "connect_tcp",
    "connect_unix",
    "listen_tcp",
    "listen_unix",
    "listener_address",
    "open_listeners",
    "open_stream",
    "parse_address",
]


def _as_address(address: str | Address) -> Address:
    return address if isinstance(address, Address) else parse_address(address)


async def open_stream(address: str | Address, *, nodelay: bool = True) -> trio.abc.Stream:
    """Connect to ``address`` (a URI or an :class:`Address`)."""
    addr = _as_address(address)
    if addr.scheme == "tcp" and addr.host is not None and addr.port is not None:
        if addr.port == 0:
            raise ValueError(f"cannot connect to port 0 ({addr})")
        return FastSocketStream.take_over(await connect_tcp(addr.host, addr.port, nodelay=nodelay))
    if addr.scheme == "unix" and addr.path is not None:
        return FastSocketStream.take_over(await connect_unix(addr.path))
    if addr.scheme == "nic" and addr.path is not None:
        from capsvc.transport.nic import connect_nic

        return await connect_nic(addr.path)
    raise ValueError(f"cannot connect to {addr!r}")


async def open_listeners(
    address: str | Address, *, nodelay: bool = True
) -> list[trio.abc.Listener[trio.abc.Stream]]:
    """Listen on ``address``; every accepted stream is a :class:`trio.abc.Stream`."""
    addr = _as_address(address)
    listeners: list[trio.abc.Listener[trio.abc.Stream]] = []
    if addr.scheme == "tcp" and addr.host is not None and addr.port is not None:
        listeners.extend(await listen_tcp(addr.host, addr.port, nodelay=nodelay))
    elif addr.scheme == "unix" and addr.path is not None:
        listeners.append(await listen_unix(addr.path))
    elif addr.scheme == "nic" and addr.path is not None:
        from capsvc.transport.nic import listen_nic

        return list(await listen_nic(addr.path))
    else:
        raise ValueError(f"cannot listen on {addr!r}")
    return [FastListener(listener) for listener in listeners]


def listener_address(listener: trio.abc.Listener[trio.abc.Stream]) -> str:
    """The URI ``listener`` is bound to, e.g. ``tcp:127.0.0.1:40123`` after asking for 0."""
    if isinstance(listener, FastListener):
        listener = listener.inner
    from capsvc.transport.nic import NicListener

    if isinstance(listener, NicListener):
        return str(listener.address)
    if isinstance(listener, UnixListener):
        return str(Address("unix", path=listener.path))
    if isinstance(listener, TcpListener | trio.SocketListener):
        sock = listener.socket
        if sock.family == trio.socket.AF_UNIX:
            name = sock.getsockname()
            path = name.decode(errors="surrogateescape") if isinstance(name, bytes) else name
            return str(Address("unix", path=path))
        if sock.family in (trio.socket.AF_INET, trio.socket.AF_INET6):
            host, port = sock.getsockname()[:2]
            return str(Address("tcp", host=host, port=port))
    raise TypeError(f"no address known for listener {listener!r}")
