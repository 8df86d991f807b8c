"""``capsvc serve --workers N`` (issue 13, point 1), as real processes on loopback sockets.

Each test starts a supervisor with :func:`supervised`, which stops it, and every worker
it ever saw, by PID in its ``finally``. The app (tests/apps/pid_echo_app.py) replies with
the PID of the worker that answered, so a test knows which process served a connection.
Real time: these are other interpreters; every wait is bounded (``fail_after``, TIMEOUT).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

import capsvc
from capsvc.generated.echo_capnp import Echo
from tests.test_cli import ENV, PYTHON_M, ROOT, TIMEOUT, Server, run

APP = "tests.apps.pid_echo_app:factory"
PROBES = re.compile(r"probes on (http://\S+) ")


class Supervised(Server):
    """A supervisor process, the workers it has now, and every worker ever seen."""

    seen: set[int]

    def workers(self) -> set[int]:
        children = {child.pid for child in psutil.Process(self.process.pid).children()}
        self.seen |= children
        return children

    @property
    def probes_url(self) -> str:
        match = PROBES.search(self.stdout.decode())
        assert match is not None, self.describe()
        return match.group(1)


@contextmanager
def supervised(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[Supervised]:
    stderr_path = tmp_path / f"supervisor-{len(list(tmp_path.glob('supervisor-*')))}.err"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [*PYTHON_M, "serve", APP, *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=ROOT,
            env={**ENV, **(env or {})},
        )
    server = Supervised(process, stderr_path)
    server.seen = set()
    try:
        server.wait_listening()
        server.workers()
        yield server
    finally:
        if process.poll() is None:
            server.workers()
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=TIMEOUT)
        for pid in server.seen:  # a worker outliving its supervisor would be a leak
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if process.stdout is not None:
            process.stdout.close()


@asynccontextmanager
async def echo_at(address: str) -> AsyncIterator[Any]:
    async with capsvc.connect(address) as conn:
        yield conn.bootstrap(Echo)


async def answered_by(echo: Any, msg: str = "hi") -> int:
    pid, _, rest = (await echo.ping(msg=msg)).reply.partition(" ")
    assert rest == msg
    return int(pid)


async def wait_until(predicate: Any, what: str, seconds: float = TIMEOUT) -> None:
    # Real time: another process is doing the work, and there is no event to wait on
    # (psutil, HTTP, a log file); this polls, and the limit only bounds a hang.
    with trio.move_on_after(seconds):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.05)
        return
    raise AssertionError(f"not within {seconds:g} s: {what}")


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


# ---------------------------------------------------------------------- serving


async def test_two_workers_each_serve_connections_of_their_own(tmp_path: Path) -> None:
    with supervised(tmp_path, "--listen", "tcp:127.0.0.1:0", "--workers", "2") as server:
        assert "with 2 workers (SO_REUSEPORT" in server.stdout.decode()
        workers = server.workers()
        assert len(workers) == 2
        answered: list[int] = []
        with trio.fail_after(TIMEOUT):
            for _ in range(24):  # the kernel hashes each connection to one worker's socket
                async with echo_at(server.address) as echo:
                    answered.append(await answered_by(echo))
        assert set(answered) == workers  # 24 connections all on one socket: p = 2**-23
        status = await trio.to_thread.run_sync(run, "health", server.address)
        assert (status.returncode, status.stdout.strip()) == (0, f"{server.address}: serving")
        code, stdout = await trio.to_thread.run_sync(server.stop)
    assert code == 0, server.describe()
    assert "capsvc: stopped" in stdout
    assert not any(psutil.pid_exists(pid) for pid in workers)


@pytest.mark.parametrize("how", ["unix", "shared-socket"])
async def test_one_shared_socket_serves_too(tmp_path: Path, how: str) -> None:
    if how == "unix":
        args = ["--listen", f"unix:{tmp_path / 'w.sock'}", "--workers", "2"]
    else:
        args = ["--listen", "tcp:127.0.0.1:0", "--workers", "2", "--shared-socket"]
    with supervised(tmp_path, *args) as server:
        assert "with 2 workers (one shared socket" in server.stdout.decode()
        with trio.fail_after(TIMEOUT):
            for _ in range(6):
                async with echo_at(server.address) as echo:
                    assert await answered_by(echo) in server.workers()
        code, _ = await trio.to_thread.run_sync(server.stop)
    assert code == 0, server.describe()
    if how == "unix":
        assert not (tmp_path / "w.sock").exists()  # the supervisor removed its socket


async def test_workers_serve_a_pinned_capnp_address(tmp_path: Path) -> None:
    """TLS with workers: each worker loads the key itself and presents it (the pin holds
    on whichever worker a connection reaches)."""
    from tests.test_cli_tls import keygen

    key = tmp_path / "server.key"
    fingerprint = keygen(key)
    listen = f"capnp://{fingerprint}@127.0.0.1:0"
    with supervised(
        tmp_path, "--listen", listen, "--tls-key", str(key), "--workers", "2"
    ) as server:
        assert server.address.startswith(f"capnp://{fingerprint}@127.0.0.1:")
        answered = set()
        with trio.fail_after(TIMEOUT):
            for _ in range(16):
                async with echo_at(server.address) as echo:
                    answered.add(await answered_by(echo))
        assert answered == server.workers()
        code, _ = await trio.to_thread.run_sync(server.stop)
    assert code == 0


async def test_a_killed_worker_is_restarted_and_the_others_keep_serving(tmp_path: Path) -> None:
    with supervised(tmp_path, "--listen", "tcp:127.0.0.1:0", "--workers", "2") as server:
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                echoes: dict[int, list[Any]] = {}
                for _ in range(16):
                    conn = await nursery.start(_hold_connection, server.address)
                    echo = conn.bootstrap(Echo)
                    echoes.setdefault(await answered_by(echo), []).append(echo)
                assert len(echoes) == 2, "16 connections, all on one worker"
                victim, survivor = sorted(echoes)
                os.kill(victim, signal.SIGKILL)
                # The other worker's connections do not notice.
                for _ in range(3):
                    for echo in echoes[survivor]:
                        assert await answered_by(echo) == survivor
                # The victim's callers get a typed error, not a hang.
                with pytest.raises(capsvc.Disconnected):
                    await echoes[victim][0].ping(msg="anyone?")
                await wait_until(
                    lambda: len(server.workers() - {victim, survivor}) == 1,
                    "a replacement worker",
                )
                replacement = (server.workers() - {survivor}).pop()
                answered = set()
                for _ in range(24):
                    async with echo_at(server.address) as echo:
                        answered.add(await answered_by(echo))
                assert answered == {survivor, replacement}
                nursery.cancel_scope.cancel()
        code, _ = await trio.to_thread.run_sync(server.stop)
    assert code == 0
    assert f"(pid {victim}) exited with status -9 (SIGKILL); restarting it" in server.stderr


async def _hold_connection(address: str, task_status: Any) -> None:
    async with capsvc.connect(address) as conn:
        task_status.started(conn)
        await trio.sleep_forever()


# ---------------------------------------------------------------------- signals


async def test_sigterm_drains_every_worker_and_no_call_is_lost(tmp_path: Path) -> None:
    with supervised(
        tmp_path, "--listen", "tcp:127.0.0.1:0", "--workers", "2", "--grace", "20"
    ) as server:
        workers = server.workers()
        replies: list[str] = []
        with trio.fail_after(TIMEOUT):
            async with trio.open_nursery() as nursery:
                arrived = 0
                for _ in range(12):
                    conn = await nursery.start(_hold_connection, server.address)
                    echo = conn.bootstrap(Echo)

                    async def slow(echo: Any = echo, *, task_status: Any) -> None:
                        promise = echo.ping(msg="sleep:1500")  # the Call is queued now
                        task_status.started()
                        replies.append((await promise).reply)

                    await nursery.start(slow)
                    # Calls on one connection arrive in order, and the slow one was queued
                    # first: this answer means the slow call is in flight in its worker.
                    await answered_by(echo)
                    arrived += 1
                server.process.send_signal(signal.SIGTERM)
                # While the slow calls run, the port refuses new connections (the
                # supervisor does not keep the sockets listening behind the workers).
                refused = False
                while not refused and len(replies) < arrived:
                    try:
                        async with echo_at(server.address) as echo:
                            await answered_by(echo)
                    except OSError:  # connection refused
                        refused = True
                    except capsvc.Disconnected:
                        pass  # accepted just before the listeners closed, then drained
                    await trio.sleep(0.05)
                assert refused, "connections were still accepted during the drain"
                await wait_until(lambda: len(replies) == arrived, "the slow calls' replies")
                nursery.cancel_scope.cancel()
        rest, _ = await trio.to_thread.run_sync(server.process.communicate, None, TIMEOUT)
    assert len(replies) == 12
    assert {int(reply.split()[0]) for reply in replies} == workers
    assert server.process.returncode == 0, server.describe()
    assert "capsvc: stopped" in rest.decode()
    assert "draining 2 workers" in server.stderr


async def test_a_second_signal_stops_every_worker_at_once(tmp_path: Path) -> None:
    with supervised(tmp_path, "--listen", "tcp:127.0.0.1:0", "--workers", "2") as server:
        failures: list[BaseException] = []
        with trio.fail_after(TIMEOUT):
            async with echo_at(server.address) as echo:
                async with trio.open_nursery() as nursery:

                    async def endless() -> None:
                        try:
                            await echo.ping(msg="sleep:600000")
                        except capsvc.Disconnected as error:
                            failures.append(error)

                    nursery.start_soon(endless)
                    await answered_by(echo)  # the endless call is in flight
                    server.process.send_signal(signal.SIGINT)
                    await wait_until(lambda: "draining 2 workers" in server.stderr, "the drain")
                    server.process.send_signal(signal.SIGINT)
            rest, _ = await trio.to_thread.run_sync(server.process.communicate, None, TIMEOUT)
    assert server.process.returncode == 0, server.describe()
    assert len(failures) == 1  # the call was cut off, with the typed error
    assert "stopping the workers now" in server.stderr
    assert "capsvc: stopped" in rest.decode()


async def test_sighup_replaces_every_worker_without_closing_the_socket(tmp_path: Path) -> None:
    with supervised(tmp_path, "--listen", "tcp:127.0.0.1:0", "--workers", "2") as server:
        old = server.workers()
        refused: list[BaseException] = []
        served: set[int] = set()
        with trio.fail_after(TIMEOUT):
            async with echo_at(server.address) as held:
                before = await answered_by(held)
                async with trio.open_nursery() as nursery:
                    slow_reply: list[str] = []

                    async def slow() -> None:
                        slow_reply.append((await held.ping(msg="sleep:1000")).reply)

                    nursery.start_soon(slow)
                    await answered_by(held)  # the slow call is in flight
                    server.process.send_signal(signal.SIGHUP)

                    async def answered_once() -> int:
                        async with echo_at(server.address) as echo:
                            return await answered_by(echo)

                    async def keep_connecting() -> None:
                        # Until the restart is done and a new worker has answered: on a
                        # loaded machine the whole restart can fit between two attempts.
                        while "rolling restart done" not in server.stderr or not served - old:
                            try:
                                try:
                                    served.add(await answered_once())
                                except capsvc.Disconnected:
                                    # Accepted by the old worker just as it began to drain:
                                    # its calls fail ``disconnected``, and a client that
                                    # connects again (README) reaches a worker that serves.
                                    served.add(await answered_once())
                            except Exception as error:  # any other failure is what we test
                                refused.append(error)
                            await trio.sleep(0.02)

                    # Both tasks run to their end: the restart may be done before the
                    # slow call (the old worker drains it after), so nothing cancels it.
                    nursery.start_soon(keep_connecting)
                # The held connection's worker drained: its call finished first.
                assert slow_reply == [f"{before} sleep:1000"]
        assert refused == []
        # The drained old worker exits once its last connection (``held``) has closed.
        await wait_until(lambda: not server.workers() & old, "the old workers to exit")
        new = server.workers()
        assert len(new) == 2
        assert served - old  # new workers answered on the socket the old ones served
        code, _ = await trio.to_thread.run_sync(server.stop)
    assert code == 0


async def test_workers_drain_and_exit_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the supervisor no say: its workers see their control line close,
    drain (the call in flight finishes) and exit by themselves."""
    with supervised(tmp_path, "--listen", "tcp:127.0.0.1:0", "--workers", "2") as server:
        workers = server.workers()
        with trio.fail_after(TIMEOUT):
            async with echo_at(server.address) as echo:
                async with trio.open_nursery() as nursery:
                    reply: list[str] = []

                    async def slow() -> None:
                        reply.append((await echo.ping(msg="sleep:1000")).reply)

                    nursery.start_soon(slow)
                    pid = await answered_by(echo)
                    server.process.kill()
                await trio.to_thread.run_sync(server.process.wait)
        assert reply == [f"{pid} sleep:1000"]
        await wait_until(
            lambda: not any(psutil.pid_exists(worker) for worker in workers),
            "the orphaned workers to exit",
        )
    assert "the supervisor is gone: draining" in server.stderr


# ---------------------------------------------------------------------- start-up


def test_a_worker_that_cannot_start_stops_the_supervisor(tmp_path: Path) -> None:
    process = subprocess.run(
        [*PYTHON_M, "serve", APP, "--listen", "tcp:127.0.0.1:0", "--workers", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**ENV, "CAPSVC_TEST_FAIL_AT_START": "1"},
        timeout=TIMEOUT,
        check=False,
    )
    assert process.returncode == 1, process.stderr
    assert "this app refuses to start" in process.stderr  # the worker's own error
    assert "before it was ready" in process.stderr


def test_workers_auto_is_one_per_core() -> None:
    from capsvc.cli import _workers
    from capsvc.workers import cpu_count

    assert _workers("auto") == cpu_count() == len(os.sched_getaffinity(0))
    assert _workers("3") == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "--workers must be at least 1"),
        (["--workers", "many"], "--workers takes a number or 'auto'"),
        (["--http-host", "0.0.0.0"], "--http-host goes with --http-port"),
        (["--http-port", "70000"], "--http-port must be 0..65535"),
        (["--drain-delay", "-1"], "--drain-delay must be at least 0"),
        (["--workers", "2", "--listen", "nic:model:w.0"], "--workers serves tcp:, tls:"),
    ],
)
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    result = run("serve", APP, *args)
    assert result.returncode == 2
    assert message in result.stderr


# ---------------------------------------------------------------------- probes, metrics


async def test_probes_and_metrics_cover_every_worker(tmp_path: Path) -> None:
    with supervised(
        tmp_path, "--listen", "tcp:127.0.0.1:0", "--workers", "2", "--http-port", "0"
    ) as server:
        url = server.probes_url
        assert await trio.to_thread.run_sync(http_get, url + "/readyz") == (200, "ready\n")
        answered = []
        with trio.fail_after(TIMEOUT):
            for _ in range(20):
                async with echo_at(server.address) as echo:
                    answered.append(await answered_by(echo))
        assert len(set(answered)) == 2
        _, metrics = await trio.to_thread.run_sync(http_get, url + "/metrics")
        assert 'capsvc_calls_total{method="Echo.ping"} 20.0' in metrics
        assert "capsvc_connections_total 20.0" in metrics
        with trio.fail_after(TIMEOUT):
            async with echo_at(server.address) as echo:
                async with trio.open_nursery() as nursery:

                    async def slow() -> None:
                        await echo.ping(msg="sleep:1500")

                    nursery.start_soon(slow)
                    await answered_by(echo)
                    server.process.send_signal(signal.SIGTERM)
                    # Readiness drops while the call is still in flight.
                    status: list[tuple[int, str]] = []

                    def not_ready() -> bool:
                        status[:] = [http_get(url + "/readyz")]
                        return status[0][0] == 503

                    await wait_until(not_ready, "/readyz to turn 503")
                    assert status == [(503, "draining\n")]
        await trio.to_thread.run_sync(server.process.communicate, None, TIMEOUT)
    assert server.process.returncode == 0
