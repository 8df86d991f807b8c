"""Unix-domain-socket transport: connect, and listen with socket-file housekeeping.

Theory of operation
-------------------
A connection is a plain :class:`trio.SocketStream` over ``AF_UNIX``/``SOCK_STREAM``.

Listening binds a file, which outlives a crashed server. :func:`listen_unix` therefore
looks at what is already at the path first:

- nothing: bind;
- a socket nobody listens on (a connect is refused): a stale leftover, remove it, bind;
- a socket a live server listens on: refuse with ``EADDRINUSE`` (never steal it; the probe
  shows that server one connection that closes at once);
- anything that is not a socket: refuse with ``EEXIST``, never delete a user's file.

:class:`UnixListener` remembers the device and inode of the file it bound, and its
``aclose`` removes the file only if it is still that one (a later server may have
replaced it).
"""

from __future__ import annotations

import errno
import os
import stat
from typing import final

import trio

__all__ = ["UnixListener", "connect_unix", "listen_unix"]


async def connect_unix(path: str | os.PathLike[str]) -> trio.SocketStream:
    """Connect to the Unix socket at ``path``."""
    return await trio.open_unix_socket(os.fspath(path))


@final
class UnixListener(trio.abc.Listener[trio.SocketStream]):
    """A listening Unix socket that removes its own socket file on ``aclose``."""

    def __init__(self, inner: trio.SocketListener, path: str, identity: tuple[int, int]) -> None:
        self._inner = inner
        self.path = path
        self._identity: tuple[int, int] | None = identity  # (st_dev, st_ino) of our file

    @property
    def socket(self) -> trio.socket.SocketType:
        return self._inner.socket

    async def accept(self) -> trio.SocketStream:
        return await self._inner.accept()

    async def aclose(self) -> None:
        identity, self._identity = self._identity, None
        if identity is not None:
            try:
                st = os.lstat(self.path)
                if (st.st_dev, st.st_ino) == identity:
                    os.unlink(self.path)
            except OSError:  # already gone, or not ours to remove: nothing to clean up
                pass
        await self._inner.aclose()

    def __repr__(self) -> str:
        return f"<UnixListener {self.path!r}>"


async def remove_stale_socket(path: str) -> None:
    """Remove ``path`` if it is a socket nobody listens on (a dead server's); refuse to
    touch anything else."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise FileExistsError(errno.EEXIST, "exists and is not a socket; not removing it", path)
    with trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM) as probe:
        try:
            await probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # nobody listens: a stale file left by a dead server
            return
        except FileNotFoundError:
            return
    raise OSError(errno.EADDRINUSE, "a running server is listening on this socket", path)


async def listen_unix(path: str | os.PathLike[str], *, backlog: int = 128) -> UnixListener:
    """Listen on a Unix socket at ``path``, replacing a stale socket file if present."""
    path = os.fspath(path)
    await remove_stale_socket(path)
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    try:
        await sock.bind(path)
        st = os.lstat(path)
        sock.listen(backlog)
        return UnixListener(trio.SocketListener(sock), path, (st.st_dev, st.st_ino))
    except BaseException:
        sock.close()
        raise
