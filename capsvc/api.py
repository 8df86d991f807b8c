"""The entry points: ``connect`` and ``serve``.

Theory of operation: both open transport streams (capsvc.transport) and run one
``Connection`` per stream. ``serve`` gives every connection the same bootstrap object;
connections are independent, so one that breaks (or is aborted for a protocol violation)
never disturbs the others. ``serve`` holds at most ``max_connections`` at once: one more
is refused cleanly (an Abort of type overloaded naming the limit, then a close), and the
log names every aborted or refused connection's peer with how many that peer holds.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from capsvc.connection import Connection
from capsvc.errors import ExceptionType
from capsvc.framing import encode_message
from capsvc.limits import DEFAULT_MAX_CONNECTIONS, Limits
from capsvc.observe import ConnectionInfo, observer_for
from capsvc.rpc import wire
from capsvc.rpc.hooks import Hook
from capsvc.transport import listener_address, open_listeners, open_stream
from capsvc.transport.busypoll import DEFAULT_BUDGET

log = logging.getLogger("capsvc")

#: How long a refused connection gets to read its Abort before we close it.
_REFUSE_SECONDS = 1.0


def _bootstrap_hook(bootstrap: Any) -> Hook | None:
    from capsvc.structs import _hook_of

    return _hook_of(bootstrap)


@asynccontextmanager
async def connect(
    address: str,
    *,
    bootstrap: Any = None,
    nodelay: bool = True,
    limits: Limits | None = None,
    coalesce: bool = True,
    busy_poll: float | None = DEFAULT_BUDGET,
) -> AsyncIterator[Connection]:
    """Connect to ``address`` (``tcp:HOST:PORT`` or ``unix:PATH``) for the block's duration.

    Args:
        bootstrap: a capability (Server object or Client) the peer may ask us for.
        nodelay: TCP_NODELAY (on by default; coalesced writes make it matter little).
        limits: every bound and timeout of the connection (capsvc.Limits; README
            "Limits and timeouts").
        coalesce: write each scheduler pass's messages at once (off only for experiments).
        busy_poll: how long (seconds) to keep polling for the peer's next message before
            sleeping, when recent messages came that fast (capsvc.transport.busypoll);
            None never polls.
    """
    stream = await open_stream(address, nodelay=nodelay)
    log.debug("connected to %s", address)
    async with open_connection(
        stream, bootstrap=bootstrap, limits=limits, coalesce=coalesce, busy_poll=busy_poll
    ) as conn:
        yield conn


@asynccontextmanager
async def open_connection(
    stream: trio.abc.Stream,
    *,
    bootstrap: Any = None,
    limits: Limits | None = None,
    coalesce: bool = True,
    busy_poll: float | None = DEFAULT_BUDGET,
) -> AsyncIterator[Connection]:
    """Run an RPC connection over an already open stream for the block's duration.

    An exception raised in the block comes out as itself (``except capsvc.RpcError``
    around the block catches it), not as an ExceptionGroup of one: the connection's own
    tasks end quietly when the block ends. Only when several errors happen at once (the
    block's and a connection task's) do they come out together, as an ExceptionGroup.
    """
    conn = Connection(
        stream, _bootstrap_hook(bootstrap), limits=limits, coalesce=coalesce, busy_poll=busy_poll
    )
    _observe(conn, peer_name(stream), served=False, access=False)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            try:
                yield conn
            finally:
                await conn.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


async def serve(
    address: str,
    bootstrap: Any,
    *,
    nodelay: bool = True,
    limits: Limits | None = None,
    coalesce: bool = True,
    busy_poll: float | None = DEFAULT_BUDGET,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    access_log: bool = False,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``bootstrap`` on ``address`` until cancelled (options as for ``connect``).

    ``max_connections`` bounds the connections held at once (module docstring).
    ``access_log`` logs a line per call on the logger ``capsvc.access`` at INFO: the peer,
    ``Interface.method``, how long the method took, and the outcome (capsvc.observe).
    ``task_status.started`` receives the address actually bound (``tcp:127.0.0.1:40123``
    when port 0 was asked), so ``await nursery.start(capsvc.serve, ...)`` returns it.
    """
    if not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(f"max_connections must be a positive int, got {max_connections!r}")
    listeners = await open_listeners(address, nodelay=nodelay)
    bound = listener_address(listeners[0])
    hook = _bootstrap_hook(bootstrap)
    per_peer: Counter[str] = Counter()
    held = 0

    async def handle(stream: trio.abc.Stream) -> None:
        nonlocal held
        peer = peer_name(stream)
        if held >= max_connections:
            log.warning(
                "refused a connection from %s: %d connections held, the limit "
                "(max_connections); that peer holds %d",
                peer,
                held,
                per_peer[peer],
            )
            await refuse(
                stream, f"the server is at its limit of {held} connections (max_connections)"
            )
            return
        held += 1
        per_peer[peer] += 1
        log.info(
            "connection from %s opened (%d from that peer, %d in all)", peer, per_peer[peer], held
        )
        conn = Connection(
            stream,
            hook.add_ref() if hook is not None else None,
            limits=limits,
            coalesce=coalesce,
            busy_poll=busy_poll,
            served=True,
        )
        _observe(conn, peer, served=True, access=access_log)
        started = trio.current_time()
        try:
            await conn.run()
        finally:
            held -= 1
            per_peer[peer] -= 1
            if not per_peer[peer]:
                del per_peer[peer]
            session = conn.session
            ended = "aborted" if session.abort_reason is not None else "closed"
            log.log(
                logging.WARNING if session.abort_reason is not None else logging.INFO,
                "connection from %s %s after %.3f s, %d calls answered, %d made: %s"
                " (%d more from that peer, %d in all)",
                peer,
                ended,
                trio.current_time() - started,
                session.calls_received,
                session.calls_sent,
                session.abort_reason or _close_reason(conn),
                per_peer[peer],
                held,
            )

    log.info("listening on %s", bound)
    log.debug("every connection: %r; at most %d at once", limits or Limits(), max_connections)
    task_status.started(bound)
    try:
        await trio.serve_listeners(handle, listeners)
    finally:
        if hook is not None:
            hook.release()


def _close_reason(conn: Connection) -> str:
    reason = conn.close_reason
    if reason is None:
        return "closed by the server"
    return reason.reason or type(reason).__name__


def _observe(conn: Connection, peer: str, *, served: bool, access: bool) -> None:
    """Give the connection's engine its call observer, if anything watches (capsvc.observe)."""
    session = conn.session
    info = ConnectionInfo(peer, served, lambda: session.closed is not None)
    session.observer = observer_for(info, access=access)


def peer_name(stream: trio.abc.Stream) -> str:
    """The peer's address for logs: ``HOST:PORT`` for TCP, ``unix`` for a Unix socket."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return type(stream).__name__
    try:
        if sock.family == socket.AF_UNIX:
            return "unix"
        name = sock.getpeername()
    except OSError:
        return "unknown"
    host, port = name[0], name[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def refuse(stream: trio.abc.Stream, reason: str) -> None:
    """Tell a connection we will not serve it (an Abort of type overloaded), then close.

    Half-close and read a little before closing: closing with unread input sends a reset,
    which can destroy the Abort before the peer reads it (see Connection's lingering close).
    """
    message = wire.Message.new_message()
    body = message.init("abort")
    body.reason = reason
    body.type = int(ExceptionType.OVERLOADED)
    with trio.move_on_after(_REFUSE_SECONDS):
        try:
            await stream.send_all(encode_message(message.to_segments()))
            if isinstance(stream, trio.abc.HalfCloseableStream):
                await stream.send_eof()
                for _ in range(16):  # bounded: at most 1 MiB is read and dropped
                    if not await stream.receive_some(65536):
                        break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
    await trio.aclose_forcefully(stream)
