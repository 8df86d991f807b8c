"""The entry points: ``connect`` and ``serve``.

Theory of operation: both open transport streams (capsvc.transport) and run one
``Connection`` per stream. ``serve`` gives every connection the same bootstrap object;
connections are independent, so one that breaks (or is aborted for a protocol violation)
never disturbs the others.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from capsvc.connection import Connection
from capsvc.framing import FramingLimits
from capsvc.rpc.hooks import Hook
from capsvc.transport import listener_address, open_listeners, open_stream
from capsvc.transport.busypoll import DEFAULT_BUDGET

log = logging.getLogger("capsvc")


def _bootstrap_hook(bootstrap: Any) -> Hook | None:
    from capsvc.structs import _hook_of

    return _hook_of(bootstrap)


@asynccontextmanager
async def connect(
    address: str,
    *,
    bootstrap: Any = None,
    nodelay: bool = True,
    limits: FramingLimits | None = None,
    coalesce: bool = True,
    busy_poll: float | None = DEFAULT_BUDGET,
) -> AsyncIterator[Connection]:
    """Connect to ``address`` (``tcp:HOST:PORT`` or ``unix:PATH``) for the block's duration.

    Args:
        bootstrap: a capability (Server object or Client) the peer may ask us for.
        nodelay: TCP_NODELAY (on by default; coalesced writes make it matter little).
        limits: framing and traversal limits for what the peer sends.
        coalesce: write each scheduler pass's messages at once (off only for experiments).
        busy_poll: how long (seconds) to keep polling for the peer's next message before
            sleeping, when recent messages came that fast (capsvc.transport.busypoll);
            None never polls.
    """
    stream = await open_stream(address, nodelay=nodelay)
    async with open_connection(
        stream, bootstrap=bootstrap, limits=limits, coalesce=coalesce, busy_poll=busy_poll
    ) as conn:
        yield conn


@asynccontextmanager
async def open_connection(
    stream: trio.abc.Stream,
    *,
    bootstrap: Any = None,
    limits: FramingLimits | None = None,
    coalesce: bool = True,
    busy_poll: float | None = DEFAULT_BUDGET,
) -> AsyncIterator[Connection]:
    """Run an RPC connection over an already open stream for the block's duration."""
    conn = Connection(
        stream, _bootstrap_hook(bootstrap), limits=limits, coalesce=coalesce, busy_poll=busy_poll
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        try:
            yield conn
        finally:
            await conn.aclose()
            nursery.cancel_scope.cancel()


async def serve(
    address: str,
    bootstrap: Any,
    *,
    nodelay: bool = True,
    limits: FramingLimits | None = None,
    coalesce: bool = True,
    busy_poll: float | None = DEFAULT_BUDGET,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``bootstrap`` on ``address`` until cancelled (options as for ``connect``).

    ``task_status.started`` receives the address actually bound (``tcp:127.0.0.1:40123``
    when port 0 was asked), so ``await nursery.start(capsvc.serve, ...)`` returns it.
    """
    listeners = await open_listeners(address, nodelay=nodelay)
    bound = listener_address(listeners[0])
    hook = _bootstrap_hook(bootstrap)

    async def handle(stream: trio.abc.Stream) -> None:
        conn = Connection(
            stream,
            hook.add_ref() if hook is not None else None,
            limits=limits,
            coalesce=coalesce,
            busy_poll=busy_poll,
        )
        try:
            await conn.run()
        finally:
            reason = conn.close_reason
            if conn.session.abort_reason is not None:
                log.warning("connection aborted: %s", conn.session.abort_reason)
            else:
                log.debug("connection closed: %s", reason)

    log.info("listening on %s", bound)
    task_status.started(bound)
    try:
        await trio.serve_listeners(handle, listeners)
    finally:
        if hook is not None:
            hook.release()
