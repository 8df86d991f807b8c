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
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from capsvc.connection import Connection
from capsvc.errors import ExceptionType
from capsvc.framing import encode_message
from capsvc.health import HealthRouted, HealthServer, ServingState
from capsvc.limits import DEFAULT_GRACE, DEFAULT_MAX_CONNECTIONS, Limits
from capsvc.observe import ConnectionInfo, observer_for
from capsvc.rpc import wire
from capsvc.rpc.hooks import Hook
from capsvc.runtime import served_interface_name
from capsvc.transport import finish_accept, listener_address, open_listeners, open_stream
from capsvc.transport.busypoll import DEFAULT_BUDGET
from capsvc.transport.tls import ClientTls, ServerTls, TlsError, stream_socket

log = logging.getLogger("capsvc")

#: How long a refused connection gets to read its Abort before we close it.
_REFUSE_SECONDS = 1.0
#: What a call refused while draining, and the final Abort, tell the peer.
_DRAIN_REASON = "the server is shutting down"
#: How often the byte counters of capsvc.metrics take the open connections' totals.
_BYTES_REPORT_SECONDS = 1.0


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
    tls: ClientTls | None = None,
) -> AsyncIterator[Connection]:
    """Connect to ``address`` (``tcp:HOST:PORT``, ``unix:PATH``, ``tls:HOST:PORT`` or
    ``capnp://sha-256:FINGERPRINT@HOST:PORT``) for the block's duration.

    Args:
        bootstrap: a capability (Server object or Client) the peer may ask us for.
        nodelay: TCP_NODELAY (on by default; coalesced writes make it matter little).
        limits: every bound and timeout of the connection (capsvc.Limits; README
            "Limits and timeouts").
        coalesce: write each scheduler pass's messages at once (off only for experiments).
        busy_poll: how long (seconds) to keep polling for the peer's next message before
            sleeping, when recent messages came that fast (capsvc.transport.busypoll);
            None never polls.
        tls: certificates and pins for ``tls:`` addresses (capsvc.transport.tls.ClientTls);
            a ``capnp://`` address carries its pin itself.
    """
    stream = await open_stream(address, nodelay=nodelay, tls=tls)
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
    shutdown: trio.Event | None = None,
    grace: float = DEFAULT_GRACE,
    drain_delay: float = 0.0,
    tls: ServerTls | None = None,
    health: bool = False,
    serving: ServingState | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``bootstrap`` on ``address`` until cancelled or shut down (options as for
    ``connect``).

    ``max_connections`` bounds the connections held at once (module docstring).
    ``access_log`` logs a line per call on the logger ``capsvc.access`` at INFO: the peer,
    ``Interface.method``, how long the method took, and the outcome (capsvc.observe).
    ``shutdown``: when this event is set, the server drains and returns (a graceful
    shutdown, README "Running in production"): it stops accepting, refuses new calls on
    its connections with ``disconnected``, gives the calls in flight up to ``grace``
    seconds to finish, closes each connection as its last call returns, and aborts what is
    left at the deadline. Cancelling ``serve`` still stops it at once. ``drain_delay``:
    seconds between readiness turning false and the listeners closing, for load balancers
    that learn of the shutdown no sooner than we do (serving-notes F2); calls and
    connections are served as usual until then.
    ``tls``: the server's key (and certificate) for ``tls:`` and ``capnp://`` addresses.
    ``health``: serve capsvc's Health interface (schemas/health.capnp) beside
    ``bootstrap`` on the same capability (capsvc.health.with_health: calls route by
    interface ID), answering from ``serving``.
    ``serving``: the ServingState this server moves (SERVING once bound, DRAINING when
    ``shutdown`` is set, STOPPED when ``serve`` ends): give one to read it elsewhere
    (capsvc.probes' /readyz); without one, ``serve`` keeps its own.
    Connections and bytes count in capsvc.metrics while it is enabled (``enable()``
    before ``serve``).
    ``task_status.started`` receives the address actually bound (``tcp:127.0.0.1:40123``
    when port 0 was asked), so ``await nursery.start(capsvc.serve, ...)`` returns it.
    """
    _check_serve_options(max_connections, grace, drain_delay)
    listeners = await open_listeners(address, nodelay=nodelay, tls=tls)
    await serve_listeners(
        listeners,
        bootstrap,
        limits=limits,
        coalesce=coalesce,
        busy_poll=busy_poll,
        max_connections=max_connections,
        access_log=access_log,
        shutdown=shutdown,
        grace=grace,
        drain_delay=drain_delay,
        health=health,
        serving=serving,
        task_status=task_status,
    )


async def serve_listeners(
    listeners: Sequence[trio.abc.Listener[trio.abc.Stream]],
    bootstrap: Any,
    *,
    limits: Limits | None = None,
    coalesce: bool = True,
    busy_poll: float | None = DEFAULT_BUDGET,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    access_log: bool = False,
    shutdown: trio.Event | None = None,
    grace: float = DEFAULT_GRACE,
    drain_delay: float = 0.0,
    health: bool = False,
    serving: ServingState | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``serve`` on listeners already open (a worker process's inherited socket)."""
    _check_serve_options(max_connections, grace, drain_delay)
    bound = listener_address(listeners[0])
    state = serving if serving is not None else ServingState()
    if health:
        services = [name] if (name := served_interface_name(bootstrap)) else []
        bootstrap = HealthRouted(bootstrap, HealthServer(state, services))
    served = _Served(
        _bootstrap_hook(bootstrap),
        max_connections,
        lambda stream, hook: Connection(
            stream, hook, limits=limits, coalesce=coalesce, busy_poll=busy_poll, served=True
        ),
        access_log,
    )
    log.info("listening on %s", bound)
    log.debug("every connection: %r; at most %d at once", limits or Limits(), max_connections)
    try:
        async with trio.open_nursery() as connections:
            if served.metrics is not None:
                connections.start_soon(served.report_bytes)
            async with trio.open_nursery() as accepting:
                accepting.start_soon(
                    partial(
                        trio.serve_listeners,
                        served.handle,
                        list(listeners),
                        handler_nursery=connections,
                    )
                )
                state.serve()
                task_status.started(bound)
                if shutdown is None:
                    await trio.sleep_forever()
                else:
                    await shutdown.wait()
                # Readiness drops first, so probes turn a load balancer away before the
                # listeners refuse anyone (serving-notes F2).
                state.drain()
                if drain_delay:
                    log.info("not ready: listeners close in %g s (drain delay)", drain_delay)
                    await trio.sleep(drain_delay)
                # Closing the listeners (serve_listeners does, when cancelled) refuses new
                # connections; those already accepted are drained like the others.
                accepting.cancel_scope.cancel()
            await served.drain(grace)
            connections.cancel_scope.cancel()  # the byte reporter; no connection is left
    finally:
        state.stop()
        served.release()


def _check_serve_options(max_connections: object, grace: object, drain_delay: object) -> None:
    if not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(f"max_connections must be a positive int, got {max_connections!r}")
    if not isinstance(grace, (int, float)) or grace < 0:
        raise ValueError(f"grace must be a number of seconds >= 0, got {grace!r}")
    if not isinstance(drain_delay, (int, float)) or drain_delay < 0:
        raise ValueError(f"drain_delay must be a number of seconds >= 0, got {drain_delay!r}")


def _enabled_metrics() -> Any:
    """capsvc.metrics if it is enabled, else None (not imported here: it needs the
    ``metrics`` extra, and a server that counts nothing must not pay for it)."""
    metrics = sys.modules.get("capsvc.metrics")
    if metrics is not None and metrics.is_enabled():
        return metrics
    return None


class _Served:
    """The connections one ``serve`` holds: admission, their log lines, and the drain."""

    def __init__(
        self,
        hook: Hook | None,
        max_connections: int,
        new_connection: Callable[[trio.abc.Stream, Hook | None], Connection],
        access_log: bool,
    ) -> None:
        self.hook = hook
        self.max_connections = max_connections
        self.new_connection = new_connection
        self.access_log = access_log
        self.per_peer: Counter[str] = Counter()
        self.live: set[Connection] = set()
        self.draining = False
        self._all_closed = trio.Event()
        self.metrics = _enabled_metrics()
        #: Each live connection's part in capsvc.metrics (ConnectionMetrics), when enabled.
        self.counted: dict[Connection, Any] = {}

    def release(self) -> None:
        if self.hook is not None:
            self.hook.release()
            self.hook = None

    @property
    def held(self) -> int:
        return len(self.live)

    async def handle(self, stream: trio.abc.Stream) -> None:
        peer = peer_name(stream)
        try:
            # A TLS handshake, bounded by its own timeout: a client that says nothing
            # would otherwise hold the connection (trio's SSLStream finishes a handshake
            # even to close).
            await finish_accept(stream)
        except TlsError as error:
            log.warning("dropped a connection from %s: %s", peer, error)
            await trio.aclose_forcefully(stream)
            return
        per_peer = self.per_peer
        if self.held >= self.max_connections:
            log.warning(
                "refused a connection from %s: %d connections held, the limit "
                "(max_connections); that peer holds %d",
                peer,
                self.held,
                per_peer[peer],
            )
            await refuse(
                stream,
                f"the server is at its limit of {self.held} connections (max_connections)",
            )
            return
        hook = self.hook
        conn = self.new_connection(stream, hook.add_ref() if hook is not None else None)
        self.live.add(conn)
        per_peer[peer] += 1
        log.info(
            "connection from %s opened (%d from that peer, %d in all)",
            peer,
            per_peer[peer],
            self.held,
        )
        if self.draining:
            conn.drain(_DRAIN_REASON)
        _observe(conn, peer, served=True, access=self.access_log)
        if self.metrics is not None:
            self.counted[conn] = self.metrics.connection_opened()
        started = trio.current_time()
        try:
            await conn.run()
        finally:
            counted = self.counted.pop(conn, None)
            if counted is not None:
                counted.close(conn.bytes_received, conn.bytes_sent)
            self.live.discard(conn)
            per_peer[peer] -= 1
            if not per_peer[peer]:
                del per_peer[peer]
            if self.draining and not self.live:
                # Only while draining: the event would otherwise stay set from a moment
                # with no connections, and a later drain would not wait at all.
                self._all_closed.set()
            self._log_end(conn, peer, trio.current_time() - started)

    async def report_bytes(self) -> None:
        """Add what each connection read and wrote to the byte counters, once a second
        (and at its close, in ``handle``): a scrape sees bytes of long-lived connections."""
        while True:
            await trio.sleep(_BYTES_REPORT_SECONDS)
            for conn, counted in list(self.counted.items()):
                counted.report(conn.bytes_received, conn.bytes_sent)

    def _log_end(self, conn: Connection, peer: str, lasted: float) -> None:
        session = conn.session
        aborted = session.abort_reason is not None and not conn.drained
        log.log(
            logging.WARNING if aborted else logging.INFO,
            "connection from %s %s after %.3f s, %d calls answered, %d made: %s"
            " (%d more from that peer, %d in all)",
            peer,
            "aborted" if aborted else "closed",
            lasted,
            session.calls_received,
            session.calls_sent,
            session.abort_reason or _close_reason(conn),
            self.per_peer[peer],
            self.held,
        )

    async def drain(self, grace: float) -> None:
        """Close every connection once its calls in flight are done; abort the rest after
        ``grace`` seconds (``serve``'s ``shutdown``)."""
        self.draining = True
        if not self.live:
            log.info("shut down: no connections were open")
            return
        log.info("draining %d connections: calls in flight have %g s to finish", self.held, grace)
        for conn in list(self.live):
            conn.drain(_DRAIN_REASON)
        with trio.move_on_after(grace):
            await self._all_closed.wait()
        if self.live:
            running = sum(conn.session.answers.in_flight for conn in self.live)
            log.warning(
                "grace period of %g s over: aborting %d connections, %d calls still running",
                grace,
                self.held,
                running,
            )
            for conn in list(self.live):
                conn.expire_drain(
                    f"the server shut down: calls still running after the {grace:g} s grace period"
                )
        await self._all_closed.wait()
        log.info("shut down: every connection closed")


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
    sock = stream_socket(stream)
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
