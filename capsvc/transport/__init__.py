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
  kernel chose for ``tcp:HOST:0``), for "listening on ..." messages and for tests;
- :func:`finish_accept` completes what an accepted stream needs before RPC may start on
  it: the TLS handshake, bounded in time, for TLS listeners (nothing for the others).
  Call it in the connection handler, never in ``accept`` (capsvc.transport.tls).

Connected sockets are handed out as :class:`~capsvc.transport.fastsocket.FastSocketStream`
(a trio stream that skips trio's extra scheduler pass per operation).

A stream may offer more than trio's Stream; it declares each extra by inheriting one of
the small ABCs of :mod:`capsvc.transport.capabilities` (``FlusherSendStream``,
``FastPathStream``, ``BusyPollingStream``, ``SocketBackedStream``), whose docstrings are
the contract, and the connection driver detects them once per connection.

Backends: :mod:`~capsvc.transport.tcp`, :mod:`~capsvc.transport.unix`, and for unit tests
:mod:`~capsvc.transport.memory`. TCP_NODELAY is on by default (rpc-protocol.md §1, send
side); ``nodelay`` is ignored by transports that have no such option.

TLS (:mod:`~capsvc.transport.tls`): ``tls:HOST:PORT`` and ``capnp://sha-256:DIGEST@...``
streams are ``trio.SSLStream`` objects over a FastSocketStream (already handshaken when
:func:`open_stream` returns them; :func:`stream_socket` finds the socket under one).
``tls=`` is a :class:`ClientTls` or :class:`ServerTls`; a TLS listen address without one
is refused, and so is ``tls=`` with an address that is not TLS (``tcp:``, ``unix:``,
``capnp://insecure@``): its bytes would go out in clear although TLS was asked for.
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
from capsvc.transport.tls import (
    ClientTls,
    ServerTls,
    TlsError,
    TlsHandshakeError,
    TlsIdentityError,
    TlsListener,
    default_client,
    stream_socket,
    tls_client_stream,
    tls_server_handshake,
)
from capsvc.transport.unix import UnixListener, connect_unix, listen_unix

__all__ = [
    "Address",
    "BusyPollingStream",
    "ClientTls",
    "FastListener",
    "FastPathStream",
    "FastSocketStream",
    "FlusherSendStream",
    "ServerTls",
    "SocketBackedStream",
    "TcpListener",
    "TlsError",
    "TlsHandshakeError",
    "TlsIdentityError",
    "TlsListener",
    "UnixListener",
    "connect_tcp",
    "connect_unix",
    "finish_accept",
    "listen_tcp",
    "listen_unix",
    "listener_address",
    "open_listeners",
    "open_stream",
    "parse_address",
    "stream_socket",
]


def _as_address(address: str | Address) -> Address:
    return address if isinstance(address, Address) else parse_address(address)


async def open_stream(
    address: str | Address, *, nodelay: bool = True, tls: ClientTls | None = None
) -> trio.abc.Stream:
    """Connect to ``address`` (a URI or an :class:`Address`).

    For ``tls:`` and ``capnp://sha-256:...@`` addresses, the stream returned has done its
    TLS handshake and checked the server: ``tls`` says how (None: the pin of a
    ``capnp://`` address, or the system's CAs for ``tls:``). Raises
    :class:`TlsIdentityError` for the wrong server, :class:`TlsHandshakeError` for a
    failed handshake, ``ValueError`` for ``tls=`` with an address that is not TLS.
    """
    addr = _as_address(address)
    if addr.scheme in ("tls", "capnp") and addr.host is not None and addr.port is not None:
        _refuse_service(addr)
        if addr.port == 0:
            raise ValueError(f"cannot connect to port 0 ({addr})")
        if not addr.uses_tls:
            _refuse_tls(addr, tls)
            return FastSocketStream.take_over(
                await connect_tcp(addr.host, addr.port, nodelay=nodelay)
            )
        client = tls if tls is not None else default_client()
        if addr.fingerprint is not None:
            client = client.pinned(addr.fingerprint)
        client.context  # noqa: B018 - built (a bad file fails) before we dial
        tcp = await connect_tcp(addr.host, addr.port, nodelay=nodelay)
        return await tls_client_stream(
            FastSocketStream.take_over(tcp), client, addr.host, addr.port
        )
    _refuse_tls(addr, tls)
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


def _refuse_tls(addr: Address, tls: ClientTls | ServerTls | None) -> None:
    """``tls=`` for an address sent in clear: refuse rather than silently ignore it."""
    if tls is not None:
        raise ValueError(
            f"tls= was given, but {addr} is not a TLS address: use tls:HOST:PORT or "
            "capnp://sha-256:DIGEST@HOST:PORT (or drop tls=)"
        )


def _refuse_service(addr: Address) -> None:
    if addr.service:
        raise ValueError(
            f"{addr} names the service {addr.service!r}: sturdy-ref service IDs (Level 2 "
            "restore) are not supported yet; drop '/SERVICE' to reach the bootstrap object"
        )


async def open_listeners(
    address: str | Address, *, nodelay: bool = True, tls: ServerTls | None = None
) -> list[trio.abc.Listener[trio.abc.Stream]]:
    """Listen on ``address``; every accepted stream is a :class:`trio.abc.Stream`.

    ``tls:`` and ``capnp://sha-256:...@`` addresses need ``tls`` (the server's key), and a
    ``capnp://`` one must pin that very key; their listeners hand out TLS streams whose
    handshake :func:`finish_accept` completes.
    """
    addr = _as_address(address)
    listeners: list[trio.abc.Listener[trio.abc.Stream]] = []
    if addr.scheme in ("tls", "capnp") and addr.host is not None and addr.port is not None:
        if addr.service:
            raise ValueError(f"cannot listen on {addr}: a listen address has no service ID")
        if not addr.uses_tls:
            _refuse_tls(addr, tls)
            listeners.extend(await listen_tcp(addr.host, addr.port, nodelay=nodelay))
            return [FastListener(listener) for listener in listeners]
        if tls is None:
            raise ValueError(
                f"listening on {addr} needs the server's key: pass tls=ServerTls(key_file) "
                "(`capsvc keygen` makes one)"
            )
        if addr.fingerprint is not None and addr.fingerprint != tls.fingerprint:
            raise ValueError(
                f"cannot listen on {addr}: the address pins {addr.fingerprint}, but the "
                f"server's key is {tls.fingerprint}"
            )
        inner = await listen_tcp(addr.host, addr.port, nodelay=nodelay)
        return [TlsListener(listener, tls, addr.scheme) for listener in inner]
    _refuse_tls(addr, tls)
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


async def finish_accept(stream: trio.abc.Stream) -> None:
    """Make an accepted stream ready for RPC: the TLS handshake for a TLS listener's
    streams (within ``ServerTls.handshake_timeout``), nothing for other streams.

    Raises :class:`TlsHandshakeError` (or :class:`TlsIdentityError`, a client certificate
    that does not verify) after closing the stream: catch it in the handler, log, return.
    """
    if isinstance(stream, trio.SSLStream) and stream.server_side:
        await tls_server_handshake(stream)


def listener_address(listener: trio.abc.Listener[trio.abc.Stream]) -> str:
    """The URI ``listener`` is bound to, e.g. ``tcp:127.0.0.1:40123`` after asking for 0
    (``tls:...`` or ``capnp://sha-256:<the server's key>@...`` for TLS listeners)."""
    if isinstance(listener, TlsListener):
        host, port = listener.socket.getsockname()[:2]
        if listener.scheme == "capnp":
            return str(Address("capnp", host=host, port=port, fingerprint=listener.tls.fingerprint))
        return str(Address("tls", host=host, port=port))
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
