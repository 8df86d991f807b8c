"""Leak checks on capsvc connections: tables must empty once user code drops everything.

The waits here are on trio's clock, meant to be real time: they serve tests whose peer is
another process or a real socket (a C++ peer's Releases, a subprocess client), where a
jumping clock would time out while the peer is still working. Each wait ends as soon as
its condition holds, so the limits are generous: they only decide how long a failure takes.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio
import trio.lowlevel

import capsvc

if TYPE_CHECKING:
    from capsvc.connection import Connection

EMPTY = {"questions": 0, "answers": 0, "exports": 0, "imports": 0, "embargoes": 0}


async def settle(seconds: float = 0.05) -> None:
    """Collect garbage (cycles through tracebacks keep Clients alive) and let trio run."""
    gc.collect()
    await trio.sleep(seconds)  # real time: a poll interval while a real peer catches up
    gc.collect()
    await trio.lowlevel.checkpoint()


async def wait_for_tables(
    conn: capsvc.Connection, *, within: float = 10.0, **expected: int
) -> dict[str, int]:
    """Wait (up to ``within`` s) until the session's table sizes equal ``expected``
    (default: all zero), collecting garbage in between; returns the last sizes seen."""
    want = dict(EMPTY, **expected)
    sizes = conn.session.table_sizes()
    with trio.move_on_after(within):  # real time (see the module docstring)
        while True:
            await settle()
            sizes = conn.session.table_sizes()
            if sizes == want:
                break
    return sizes


async def assert_tables(conn: capsvc.Connection, *, within: float = 10.0, **expected: int) -> None:
    want = dict(EMPTY, **expected)
    sizes = await wait_for_tables(conn, within=within, **expected)
    assert sizes == want, f"connection tables leak: {sizes}, expected {want}{_details(conn)}"


def _details(conn: capsvc.Connection) -> str:
    session = conn.session
    parts = []
    for name in ("questions", "answers", "exports", "imports", "embargoes"):
        table = getattr(session, name).entries
        if table:
            parts.append(f"\n  {name}: {sorted(table)} -> {list(table.values())[:8]!r}")
    return "".join(parts)


async def poll_until(predicate: Callable[[], bool], *, within: float = 5.0) -> None:
    """Wait until ``predicate()`` is true (checked every 10 ms); fail after ``within`` s."""
    with trio.fail_after(within):  # real time (see the module docstring)
        for _ in iter(int, 1):
            if predicate():
                return
            await trio.sleep(0.01)


async def exercise(
    address: str, interface: Any, body: Callable[[Any], Awaitable[None]], **connect_kw: Any
) -> None:
    """Connect, run ``body(bootstrap)``, then check the engine does not leak.

    After ``body`` returns (its locals are gone), only the bootstrap import we still hold
    may remain; after closing that too, every table must be empty.
    """
    async with capsvc.connect(address, **connect_kw) as conn:
        boot = conn.bootstrap(interface)
        await body(boot)
        await assert_tables(conn, imports=1)
        boot.close()
        del boot
        await assert_tables(conn)


def peer_deadline(seconds: float = 20.0) -> trio.CancelScope:
    """A hang guard around calls to a real peer process (``with peer_deadline(): ...``).

    Real time, on purpose: the peer answers on its own schedule from another process, so
    the guard must never sit on a clock that jumps while we wait for it (autojump_clock).
    Generous: it only decides how long a hung test takes to fail.
    """
    return trio.fail_after(seconds)


class TaskSteps(trio.abc.Instrument):
    """Counts the steps of the tasks with one name (a connection's run task, its reader)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name == self.name:
            self.steps += 1


@asynccontextmanager
async def both_running(client: Connection, server: Connection) -> AsyncIterator[None]:
    """Run both ends of a connection (tasks named "client connection" and "served
    connection", for TaskSteps); on the way out, close the client and stop both."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.run, name="served connection")
        nursery.start_soon(client.run, name="client connection")
        try:
            yield
        finally:
            await client.aclose()
            nursery.cancel_scope.cancel()


class Ticker:
    """Counts the scheduler passes a task of its own gets (``run`` in a nursery): a
    fairness check's measure of whether a busy task lets the others run."""

    def __init__(self) -> None:
        self.ticks = 0

    async def run(self) -> None:
        while True:
            self.ticks += 1
            await trio.lowlevel.checkpoint()
