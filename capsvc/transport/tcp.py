"""TCP transport: connect and listen, with TCP_NODELAY under the caller's control.

Theory of operation
-------------------
A connection is a plain :class:`trio.SocketStream`. rpc-protocol.md §1 (send side) asks
for TCP_NODELAY, and trio's ``SocketStream`` constructor already turns it on for every
stream it wraps. capsvc also lets a user turn it *off* (``nodelay=False``) to check that
latency does not depend on it (DESIGN.md, "Buffered framing"): since trio switches it on
again for every accepted socket, the option is written explicitly after each connect and
each accept.

``trio.SocketListener`` cannot be subclassed, so :func:`listen_tcp` returns
:class:`TcpListener`, a thin :class:`trio.abc.Listener` that wraps one and applies the
option on accept. It exposes the bound ``socket`` like ``trio.SocketListener`` does (used
by :func:`capsvc.transport.listener_address`).
"""

from __future__ import annotations

from typing import final

import trio

__all__ = ["TcpListener", "connect_tcp", "listen_tcp", "set_nodelay"]


def set_nodelay(stream: trio.SocketStream, nodelay: bool) -> None:
    """Write TCP_NODELAY on a TCP stream (§1 send side: NODELAY on by default)."""
    stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1 if nodelay else 0)


async def connect_tcp(host: str, port: int, *, nodelay: bool = True) -> trio.SocketStream:
    """Connect to ``host:port`` (names are resolved; IPv6 literals without brackets)."""
    stream = await trio.open_tcp_stream(host, port)
    try:
        set_nodelay(stream, nodelay)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream


@final
class TcpListener(trio.abc.Listener[trio.SocketStream]):
    """A listening TCP socket whose accepted streams get TCP_NODELAY = ``nodelay``."""

    def __init__(self, inner: trio.SocketListener, *, nodelay: bool = True) -> None:
        self._inner = inner
        self.nodelay = nodelay

    @property
    def socket(self) -> trio.socket.SocketType:
        """The bound listening socket (``getsockname()`` gives the actual port)."""
        return self._inner.socket

    async def accept(self) -> trio.SocketStream:
        stream = await self._inner.accept()
        try:
            set_nodelay(stream, self.nodelay)
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return stream

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __repr__(self) -> str:
        try:
            name = self.socket.getsockname()
        except OSError:
            name = "closed"
        return f"<TcpListener {name} nodelay={self.nodelay}>"


async def listen_tcp(host: str, port: int, *, nodelay: bool = True) -> list[TcpListener]:
    """Listen on ``host:port`` (port 0: the kernel picks one per listener).

    A host name may resolve to several addresses: one listener each, as trio does.
    """
    inner = await trio.open_tcp_listeners(port, host=host)
    return [TcpListener(listener, nodelay=nodelay) for listener in inner]
