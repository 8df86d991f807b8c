"""Graceful shutdown (issue 13, point 2): ``serve(shutdown=event, grace=...)``.

Over loopback TCP, in process: when the event is set the server stops accepting, refuses
calls that arrive afterwards with ``Disconnected``, lets the calls in flight finish (none
lost), closes each connection with an Abort of type disconnected once its calls are done,
and returns; calls still running after ``grace`` fail with ``Disconnected`` naming it.
Real time throughout (real sockets; the server's tasks see the peer in their own passes):
every wait is bounded by ``fail_after``.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import trio

import capsvc
from tests.support.tester import Tester, TesterImpl
from tests.test_cli import running


class Counting(TesterImpl):
    """A Tester whose ``slow`` calls say how many have begun."""

    def __init__(self, expected: int) -> None:
        super().__init__()
        self.expected = expected
        self.all_began = trio.Event()

    async def slow(self, params: Any, results: Any) -> None:
        if self.slow_started + 1 >= self.expected:
            self.all_began.set()
        await super().slow(params, results)


async def _start(nursery: trio.Nursery, server: Any, shutdown: trio.Event, grace: float) -> str:
    address: str = await nursery.start(
        lambda task_status: capsvc.serve(
            "tcp:127.0.0.1:0", server, shutdown=shutdown, grace=grace, task_status=task_status
        )
    )
    return address


async def test_calls_in_flight_finish_and_new_calls_are_refused() -> None:
    server = Counting(expected=8)
    shutdown = trio.Event()
    results: list[bool] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, server, shutdown, grace=10)
            async with capsvc.connect(address) as conn:
                tester = conn.bootstrap(Tester)
                assert (await tester.echo(msg="before")).reply == "before"

                async def slow() -> None:
                    results.append((await tester.slow(ms=300)).done)

                async with trio.open_nursery() as calls:
                    for _ in range(8):
                        calls.start_soon(slow)
                    await server.all_began.wait()
                    shutdown.set()
                    await trio.sleep(0.05)  # real time: the server's drain begins
                    with pytest.raises(capsvc.Disconnected, match="shutting down"):
                        await tester.echo(msg="during")
                # The last Return is followed by the Abort that ends the connection.
                await conn.wait_closed()
            # serve returned by itself: the nursery ends without a cancel.
    assert results == [True] * 8


async def test_a_drain_waits_even_after_the_server_once_had_no_connections() -> None:
    """Regression: the "every connection closed" event was set whenever the last
    connection closed, so a drain after such a moment did not wait and aborted at once."""
    server = Counting(expected=1)
    shutdown = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, server, shutdown, grace=10)
            async with capsvc.connect(address) as conn:
                assert (await conn.bootstrap(Tester).echo(msg="x")).reply == "x"
            await trio.sleep(0.1)  # real time: the server sees that connection close
            async with capsvc.connect(address) as conn:
                tester = conn.bootstrap(Tester)

                async def stop_when_begun() -> None:
                    await server.all_began.wait()
                    shutdown.set()

                nursery.start_soon(stop_when_begun)
                assert (await tester.slow(ms=300)).done


async def test_the_listener_closes_at_once() -> None:
    server = Counting(expected=1)
    shutdown = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, server, shutdown, grace=10)
            async with capsvc.connect(address) as conn:
                tester = conn.bootstrap(Tester)

                async def slow() -> None:
                    assert (await tester.slow(ms=500)).done

                async with trio.open_nursery() as calls:
                    calls.start_soon(slow)
                    await server.all_began.wait()
                    shutdown.set()
                    await trio.sleep(0.05)  # real time: the listener closes
                    with pytest.raises(OSError, match="connect"):
                        async with capsvc.connect(address):
                            pass


async def test_calls_still_running_after_the_grace_period_fail_disconnected() -> None:
    server = Counting(expected=1)
    shutdown = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            address = await _start(nursery, server, shutdown, grace=0.3)
            async with capsvc.connect(address) as conn:
                tester = conn.bootstrap(Tester)

                async def stop_when_begun() -> None:
                    await server.all_began.wait()
                    shutdown.set()

                nursery.start_soon(stop_when_begun)
                with pytest.raises(capsvc.Disconnected, match=r"0\.3 s grace period"):
                    await tester.slow(ms=60_000)


async def test_shutdown_with_no_connections_returns() -> None:
    shutdown = trio.Event()
    shutdown.set()
    with trio.fail_after(10):
        await capsvc.serve("tcp:127.0.0.1:0", Counting(expected=1), shutdown=shutdown)


async def test_grace_must_be_a_number_of_seconds() -> None:
    with pytest.raises(ValueError, match="grace must be"):
        await capsvc.serve("tcp:127.0.0.1:0", Counting(expected=1), grace=-1)


async def test_sigterm_drains_capsvc_serve_and_exits_0(tmp_path: Path) -> None:
    """A real ``capsvc serve`` process: calls in flight at SIGTERM all complete."""
    app = "tests.support.tester:TesterImpl"
    with running(tmp_path, app, "--listen", "tcp:127.0.0.1:0", "--grace", "20") as server:
        async with capsvc.connect(server.address) as conn:
            tester = conn.bootstrap(Tester)
            done: list[bool] = []

            async def slow() -> None:
                done.append((await tester.slow(ms=1500)).done)

            with trio.fail_after(20):
                async with trio.open_nursery() as calls:
                    for _ in range(20):
                        calls.start_soon(slow)
                    await tester.echo(msg="the slow calls have arrived")
                    server.process.send_signal(signal.SIGTERM)
                await conn.wait_closed()
        rest, _ = await trio.to_thread.run_sync(server.process.communicate, None, 20)
    assert done == [True] * 20
    assert server.process.returncode == 0, server.describe()
    assert "capsvc: stopped" in (server.stdout + rest).decode()
    assert "draining" in server.stderr
