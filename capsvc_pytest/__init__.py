"""pytest fixtures that serve an app on a real loopback port and connect to it.

Registered as the ``pytest11`` entry point ``capsvc``, so pytest loads this module in
every run where capsvc is installed: the fixtures are there without a conftest line
(``-p no:capsvc`` turns them off). It is a package of its own, outside ``capsvc``, and
imports neither capsvc nor trio until a fixture runs: loading it costs a pytest run
nothing, and capsvc picks its build (capsvc/_build.py) only when a test uses it. The
fixtures' types are ``capsvc.testing.Serve`` and ``capsvc.testing.Connect``.

The fixtures are async: they need pytest-trio, and a trio test (``@pytest.mark.trio``, or
``trio_mode = true``); they run in that test's trio loop. ``capsvc_serve`` and
``capsvc_connect`` each hold a nursery of their own for the test's duration, in which the
servers and connections they made run; at teardown the servers are cancelled (their ports
close, their connections drop) and the connections are closed gracefully.

For tests that need no socket, ``capsvc.testing`` connects a client to a server object in
memory.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import trio

    from capsvc.connection import Connection
    from capsvc.limits import Limits
    from capsvc.testing import Connect, Serve

#: Where ``capsvc_serve`` listens unless told: loopback, a port the kernel picks.
DEFAULT_LISTEN = "tcp:127.0.0.1:0"


class _Servers:
    """``capsvc_serve``'s value: starts ``capsvc.serve`` tasks in the fixture's nursery."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    async def __call__(
        self,
        app: object,
        *,
        listen: str = DEFAULT_LISTEN,
        limits: Limits | None = None,
        max_connections: int | None = None,
        access_log: bool = False,
    ) -> str:
        """Serve ``app`` on ``listen`` until the test ends; the address actually bound
        (``tcp:127.0.0.1:40123``), once it accepts connections.

        ``app`` is the bootstrap object (a server object, or a client to forward), or a
        string naming one as ``capsvc serve`` takes it: ``module:factory`` (a function
        returning the server, sync or async) or ``module:attribute``, imported from the
        test's ``sys.path``. ``limits``, ``max_connections`` and ``access_log`` are ``serve``'s.
        """
        from functools import partial

        import capsvc

        bootstrap = await _app(app) if isinstance(app, str) else app
        options: dict[str, Any] = {"limits": limits, "access_log": access_log}
        if max_connections is not None:
            options["max_connections"] = max_connections
        address: str = await self._nursery.start(
            partial(capsvc.serve, listen, bootstrap, **options)
        )
        return address


async def _app(spec: str) -> object:
    """The server object a ``module:factory`` spec names, as ``capsvc serve`` finds it."""
    from capsvc.cli import _make_bootstrap, load_app

    # app_dir=None: leave sys.path alone, as pytest set it up (rootdir, `pythonpath`).
    return await _make_bootstrap(load_app(spec, app_dir=None), spec)


class _Connections:
    """``capsvc_connect``'s value: each connection runs in a task of the fixture's nursery
    (a nursery must be exited by the task that opened it, and the test's task opens none),
    and stays open until ``close_all``."""

    def __init__(self, nursery: trio.Nursery) -> None:
        import trio

        self._nursery = nursery
        self._closing = trio.Event()

    async def __call__(
        self, address: str, *, bootstrap: object = None, limits: Limits | None = None
    ) -> Connection:
        """A connection to ``address``, open until the test ends (``connect``'s options)."""
        conn: Connection = await self._nursery.start(self._hold, address, bootstrap, limits)
        return conn

    async def _hold(
        self,
        address: str,
        bootstrap: object,
        limits: Limits | None,
        task_status: trio.TaskStatus[Connection],
    ) -> None:
        import capsvc

        async with capsvc.connect(address, bootstrap=bootstrap, limits=limits) as conn:
            task_status.started(conn)
            await self._closing.wait()

    def close_all(self) -> None:
        """Let every connection's block end: each writes what it queued, then closes."""
        self._closing.set()


@pytest.fixture
async def capsvc_serve() -> AsyncIterator[Serve]:
    """A factory: ``address = await capsvc_serve(MyServer())`` serves on a real loopback port
    (``listen="unix:..."`` or another address if asked) until the test ends.

    Needs pytest-trio (the test must be a trio test); stopped at teardown, so the port is
    closed and the server's connections dropped before the next test runs.
    """
    import trio

    async with trio.open_nursery() as nursery:
        yield _Servers(nursery)
        nursery.cancel_scope.cancel()


@pytest.fixture
async def capsvc_connect() -> AsyncIterator[Connect]:
    """A factory: ``conn = await capsvc_connect(address)`` is a ``capsvc.Connection`` to
    ``address``, closed at teardown (so the test needs no ``async with`` of its own).

    Needs pytest-trio (the test must be a trio test).
    """
    import trio

    async with trio.open_nursery() as nursery:
        connections = _Connections(nursery)
        yield connections
        connections.close_all()
