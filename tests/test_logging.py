"""Logs a person can read (issue 12, point 2): the access log, connection lines, ``-v``.

- in process, over loopback TCP: ``serve(access_log=True)`` writes one ``capsvc.access``
  line per call with the peer, ``Interface.method``, a duration and the outcome (ok, the
  exception type and reason, canceled, disconnected); connection open and close lines
  name the peer and count the calls; without ``access_log`` there are no call lines;
- as real subprocesses: ``-v`` works before and after the subcommand, and turns on the
  access log and the debug lines; ``--access-log`` alone gives call lines at INFO.
"""

from __future__ import annotations

import logging
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import trio

import capsvc
from tests.support.tester import Tester, TesterImpl
from tests.test_cli import PYTHON_M, run, running

ACCESS = re.compile(r"^(\S+) (\S+) (\d+\.\d{3}) ms (.*)$")


def access_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    """(peer, method, outcome) of every access-log record."""
    lines = []
    for record in caplog.records:
        if record.name == "capsvc.access":
            found = ACCESS.match(record.getMessage())
            assert found is not None, record.getMessage()
            lines.append((found.group(1), found.group(2), found.group(4)))
    return lines


def messages(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == name]


class Watched(TesterImpl):
    """A Tester that says when ``slow`` has begun on the server."""

    def __init__(self) -> None:
        super().__init__()
        self.slow_began = trio.Event()

    async def slow(self, params: Any, results: Any) -> None:
        self.slow_began.set()
        await super().slow(params, results)


class Broken(TesterImpl):
    async def echo(self, params: Any, results: Any) -> None:
        raise ValueError("no")


async def serve_and(
    caplog: pytest.LogCaptureFixture, server: Any, calls: Any, **options: Any
) -> str:
    """Serve ``server`` (loopback TCP), run ``calls(conn)`` on a connection, wait for the
    server's close line; the peer name the server saw (our side's address)."""
    caplog.set_level(logging.INFO, logger="capsvc")
    closed = trio.Event()
    watcher = CloseWatcher(closed)
    logging.getLogger("capsvc").addHandler(watcher)
    try:
        return await _serve_and(server, calls, closed, options)
    finally:
        logging.getLogger("capsvc").removeHandler(watcher)


class CloseWatcher(logging.Handler):
    """Sets ``event`` when the server logs a connection's close line."""

    def __init__(self, event: trio.Event) -> None:
        super().__init__()
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if "closed after" in record.getMessage() or "aborted after" in record.getMessage():
            self.event.set()


async def _serve_and(server: Any, calls: Any, closed: trio.Event, options: Any) -> str:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(
            lambda task_status: capsvc.serve(
                "tcp:127.0.0.1:0", server, task_status=task_status, **options
            )
        )
        async with capsvc.connect(address) as conn:
            host, port = conn.stream.socket.getsockname()[:2]  # type: ignore[attr-defined]
            await calls(conn)
        # Real time: the server's reader sees the close in its own task; bounds a hang.
        with trio.fail_after(10):
            await closed.wait()
        nursery.cancel_scope.cancel()
    return f"{host}:{port}"


async def test_access_log_names_peer_method_and_outcome(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Watched()

    async def calls(conn: capsvc.Connection) -> None:
        tester = conn.bootstrap(Tester)
        assert (await tester.echo(msg="hi")).reply == "hi"
        with pytest.raises(capsvc.Overloaded):
            await tester.fail(kind="overloaded", reason="too busy")

        async def slow() -> None:
            await tester.slow(ms=60_000)

        async with trio.open_nursery() as nursery:  # the caller gives up: a Finish
            nursery.start_soon(slow)
            await server.slow_began.wait()
            nursery.cancel_scope.cancel()
        await tester.echo(msg="after")  # after the Finish: the cancellation is logged

    peer = await serve_and(caplog, server, calls, access_log=True)
    assert access_lines(caplog) == [
        (peer, "Tester.echo", "ok"),
        (peer, "Tester.fail", "overloaded: too busy"),
        (peer, "Tester.slow", "canceled"),
        (peer, "Tester.echo", "ok"),
    ]
    server_lines = messages(caplog, "capsvc")
    opened = [m for m in server_lines if "opened" in m]
    assert opened == [f"connection from {peer} opened (1 from that peer, 1 in all)"]
    (closed,) = [m for m in server_lines if "closed after" in m]
    assert re.fullmatch(
        rf"connection from {re.escape(peer)} closed after \d+\.\d{{3}} s, 4 calls answered,"
        r" 0 made: peer closed the connection \(0 more from that peer, 0 in all\)",
        closed,
    ), closed


async def test_a_call_cut_off_by_the_connection_is_logged_as_disconnected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Watched()

    kept: list[Any] = []  # the promise outlives the connection: no Finish is sent

    async def calls(conn: capsvc.Connection) -> None:
        kept.append(conn.bootstrap(Tester).slow(ms=60_000))
        await server.slow_began.wait()  # then the block ends: the connection closes

    peer = await serve_and(caplog, server, calls, access_log=True)
    assert access_lines(caplog) == [(peer, "Tester.slow", "disconnected")]


async def test_a_method_that_raises_is_logged_failed_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def calls(conn: capsvc.Connection) -> None:
        with pytest.raises(capsvc.Failed):
            await conn.bootstrap(Tester).echo(msg="x")

    peer = await serve_and(caplog, Broken(), calls, access_log=True)
    assert access_lines(caplog) == [
        (peer, "Tester.echo", "failed: Tester.echo raised ValueError: no")
    ]


async def test_no_access_log_unless_asked(caplog: pytest.LogCaptureFixture) -> None:
    async def calls(conn: capsvc.Connection) -> None:
        await conn.bootstrap(Tester).echo(msg="x")

    await serve_and(caplog, TesterImpl(), calls)
    assert access_lines(caplog) == []
    assert any("1 calls answered" in line for line in messages(caplog, "capsvc"))


# ----------------------------------------------------------------- the command line
@pytest.mark.parametrize(
    ("before", "after"),
    [pytest.param(["-v"], [], id="capsvc -v serve"), pytest.param([], ["-v"], id="serve -v")],
)
def test_verbose_works_before_and_after_the_subcommand(
    tmp_path: Path, before: list[str], after: list[str]
) -> None:
    with running(tmp_path, *after, "--listen", "tcp:127.0.0.1:0", command=PYTHON_M + before) as s:
        called = run("call", "--connect", s.address, "1 + 2")
        assert called.returncode == 0, called.stderr
        status, _ = s.stop(signal.SIGINT)
    assert status == 0
    stderr = s.stderr
    assert "DEBUG   capsvc: every connection: Limits(" in stderr, stderr
    assert re.search(r"INFO    capsvc.access: \S+ Calculator.evaluate \d+\.\d{3} ms ok", stderr)
    assert re.search(r"INFO    capsvc: connection from \S+ opened", stderr), stderr


def test_access_log_flag_alone(tmp_path: Path) -> None:
    with running(tmp_path, "--access-log", "--listen", "tcp:127.0.0.1:0") as s:
        called = run("call", "--connect", s.address, "1 + 2")
        assert called.returncode == 0, called.stderr
        s.stop(signal.SIGINT)
    assert re.search(r"INFO    capsvc.access: \S+ Calculator.evaluate \d+\.\d{3} ms ok", s.stderr)
    assert "DEBUG" not in s.stderr


def test_no_call_lines_by_default(tmp_path: Path) -> None:
    with running(tmp_path, "--listen", "tcp:127.0.0.1:0") as s:
        called = run("call", "--connect", s.address, "1 + 2")
        assert called.returncode == 0, called.stderr
        s.stop(signal.SIGINT)
    assert "capsvc.access" not in s.stderr
    assert re.search(
        r"INFO    capsvc: connection from \S+ closed after \d+\.\d{3} s, \d+ calls answered, "
        r"0 made: peer closed the connection",
        s.stderr,
    ), s.stderr
