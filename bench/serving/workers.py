"""``capsvc serve --workers N``: calls/s as workers are added, a drain under load (issue 13),
and one worker killed under load (serving-notes M1).

    python -m bench.serving.workers                   # the scaling run (about 90 s)
    python -m bench.serving.workers --reps 1 --seconds 1 --clients 2 --connections 2   # a look
    python -m bench.serving.workers --drain           # SIGTERM under load: is any call lost?
    python -m bench.serving.workers --kill            # SIGKILL a worker: others spared? respawn?
    python -m bench.serving.workers --load cxx        # scaling, the load from C++ clients

Theory of operation
-------------------
The server under test is the real command, a process tree of its own started by this
driver: ``python -m capsvc serve APP --listen tcp:127.0.0.1:PORT --workers N
[--shared-socket] --no-busy-poll --grace SECONDS`` (the port chosen here: bound to
127.0.0.1:0, read, released). The supervisor prints ``... listening on ADDRESS`` once
every worker is ready; the workers are its descendants that hold a listening socket on
PORT (psutil; with N=1 capsvc serves in the one process, which is then the worker). It
is stopped by PID: SIGTERM to the supervisor, SIGKILL after a timeout, then SIGKILL to any
worker still alive, each by the PID recorded when it was ready.

The load comes from ``--clients`` client processes (this module with ``--client
ADDRESS``), each one trio loop holding ``--connections`` connections
(``capsvc.connect(address, busy_poll=None)``), ``--in-flight`` calls in flight on each:
``Echo.ping`` with a 16-character message through the generated stubs, every reply
checked, driven by bench.rpc.clients' load loop. A client opens all its connections,
makes one call on each, prints ``READY PORT...`` (its connections' local ports, so that
the driver can tell which worker serves which) and waits for ``GO <instant>`` on stdin (a
``time.monotonic`` instant, the same clock in every process here): that line, written to
every client once all are ready, is the start barrier. At the end a client prints one
JSON line with its counts, its own CPU seconds (``time.process_time``) and wall seconds,
and exits. Busy polling is off on both ends (bench/rpc/README.md: polling buys latency
with CPU, and on a machine whose cores the clients share it would also steal them).

``--load cxx`` (scaling only) makes the client processes C++ instead:
bench/serving/cxx_load/load.c++, Cap'n Proto's own C++ RPC (``TwoPartyClient``, one KJ
event loop in one thread), built by bench.serving.cxx_build into ``build/cxx_load/<hash
of the sources>/`` (``capnp compile`` and ``g++``, libcapnp-dev). It is the same
protocol at a fraction of the CPU per call: ``--connections`` connections, one checked
call on each, ``READY`` (no ports: no ``--kill``, and no ``--drain``, which it does not
classify), ``GO <instant>`` on stdin (it sleeps until that CLOCK_MONOTONIC instant,
``time.monotonic``'s clock), ``--in-flight`` calls in flight per connection, the same
16-character message, every reply checked, ``WARMUP`` then ``--seconds`` counted, and one
JSON line (its CPU from ``getrusage``, over the window). A failed call ends its chain of
calls there (no retry). The Python clients cost about 220 µs of CPU per call, enough to
take most of a core of this 2-core machine at N=1's rate: what they leave bounds N=2.

Scaling (the default). One cell per worker count in ``--workers`` and socket mode in
``--modes`` (``reuseport``: one listening socket per worker, the kernel spreads
connections by hash; ``shared``: one socket inherited by every worker, whichever accepts
first gets the connection); N=1 is measured once, in the first mode. A measurement is a
fresh server and fresh clients; the load runs a ``WARMUP`` (0.5 s, not counted), then
``--seconds``: only calls whose reply comes inside that window count, and the server's
CPU seconds (supervisor + every descendant, psutil ``cpu_times``) are read at its two
ends. Half-way through, each worker's ESTABLISHED TCP connections on PORT are counted:
balance = max / min connections per worker (1.00 is perfect; a worker with none gives
inf). The cells are interleaved, their order rotating every repetition (``--reps``), so
that drift in the machine's state falls on every cell; a cell's figure is the median.

Per cell: calls/s, server CPU cores used (CPU s / wall s), the clients' CPU cores used,
calls per server CPU second, balance. Then, against N=1: speedup = rate(N) / rate(1),
efficiency per worker = rate(N) / (N * rate(1)), and the CPU-normalised efficiency =
(calls per server CPU s at N) / (calls per server CPU s at N=1). Both matter because
cores are not free here: on a 2-core machine the clients (and this driver) share the
cores with the workers. N=1 already uses most of a core and the clients another part;
N=2 can only have what the clients leave, so the raw efficiency is bounded by the room
(``room`` = (cores - client cores at N) / server cores at N=1, the most speedup that
room allows) and says little about the server. The CPU-normalised efficiency says
whether a worker does as many calls per CPU second as a lone server: 1.0 means adding
workers costs nothing per call, so with free cores the raw efficiency would follow.
Issue 13's goals: efficiency >= 0.8 per core where cores are free, balance <= 1.3 with
reuseport.

Drain (``--drain``). One worker count (default 2) and one mode; each repetition a fresh
server serving ``slow_echo`` (this module: its ``ping`` sleeps ``--call-ms``, via the
environment variable ``CAPSVC_BENCH_CALL_MS``, so that calls are in flight when the
signal comes) with ``--grace``, and fresh clients calling in a loop. ``--before`` seconds
after the start, SIGTERM to the supervisor; the driver times it until it exits. Clients
keep calling until their connection is gone, and do not reconnect (every connection was
opened before the signal, so none is refused at connect). Each call is classified: ok;
refused (a ``capsvc.RpcError`` whose message says "shutting down": the server never
started it, safe to retry elsewhere); lost (any other error, e.g. the "grace period"
abort, or no reply by the client's bound, ``--seconds`` after the start). A caller stops
at its first failed call: every later call on a draining connection is refused too. Calls
started before the signal and answered after it (finished in the drain) show that the
signal did find calls in flight. Goal: lost 0, exit status 0.

Kill (``--kill``). serving-notes M1: "Kill one worker: 0 failures on other workers'
connections; respawn <= 2 s." One worker count (default 2, at least 2) and one mode
(default reuseport); each repetition a fresh server serving the scaling app (fast echo)
and fresh clients calling in a loop until ``--seconds`` (default ``--before`` + 3) after
the start. Once every client is READY, each connection is mapped to its worker: for each
worker, the remote ports of its ESTABLISHED TCP connections on PORT (psutil), against the
local ports in the clients' READY lines. ``--before`` seconds (default 2) after the start
the worker with the most connections (the first on a tie) gets SIGKILL. A connection
whose call fails makes no more calls and never reconnects; each client reports per
connection its local port, its ok calls (and those answered after the kill's instant),
and its first error (type, message, instant) or none; a call with no reply by the
client's bound (``--seconds`` + 1) is a ``TimeoutError``. Respawn is the time from the
SIGKILL to the supervisor's ``worker N (pid P) ready ... s after it was started`` line
(INFO for a replacement only) appearing in the server's log, read every 5 ms for at most
15 s; the replacement must also show up as a new descendant holding a listening socket on
PORT (psutil, and the same PID as the line's), and is then stopped by PID with the rest.
Then the driver opens 8 fresh connections, one checked call on each, and counts those the
replacement serves: the listening sockets kept working. Goals: 0 failures on the
survivors' connections (every connection mapped, calls answered after the kill), respawn
<= 2 s; every fresh connection ok. The victim's connections are expected to fail, with
``capsvc.Disconnected``. The respawn includes the supervisor's back-off (0.1 s for a
first crash) and the new process's start-up (Python, capsvc, the app), which contends for
the cores with the clients.

The machine's state (CPU, cpuidle, load average, capsvc build) is printed before and
after with ``bench.rpc.profile.machine_state``, and the command line with it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

from bench.rpc.scenarios import ROOT, ServerKind
from bench.rpc.servers import ServerProcess, child_env
from bench.serving import cxx_build
from bench.serving.tls_echo import MESSAGE, _positive

#: Issue 13's goals: efficiency per worker (where cores are free), balance with reuseport.
EFFICIENCY_GOAL = 0.8
BALANCE_GOAL = 1.3
MODES = ("reuseport", "shared")
#: --load: the client processes, this module (python) or bench/serving/cxx_load (cxx).
LOADS = ("python", "cxx")
#: Seconds of load before the measured window (not counted).
WARMUP = 0.5
#: Seconds between the GO line and the start (every client has read it by then).
START_DELAY = 0.3
#: The drain app's call duration, in milliseconds, from the driver to ``slow_echo``.
CALL_MS_VARIABLE = "CAPSVC_BENCH_CALL_MS"
#: Seconds a server or client gets to start, and to stop before SIGKILL.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
#: The load loop's bound in calls (its time bound is the window's end).
MAX_CALLS = 10**9
SCALING_APP = "bench.rpc.servers:typed_bench_echo"
DRAIN_APP = "bench.serving.workers:slow_echo"
LISTENING = re.compile(r"listening on (\S+)")
#: serving-notes M1's goal: a killed worker's replacement ready within this, seconds.
RESPAWN_GOAL = 2.0
#: The most the driver waits for a replacement, and how often it reads the log, seconds.
RESPAWN_TIMEOUT = 15.0
RESPAWN_POLL = 0.005
#: Connections the driver opens once the replacement is ready.
FRESH_CONNECTIONS = 8
#: The supervisor's lines (capsvc/workers.py) when a worker dies, and when its
#: replacement is ready (INFO for a replacement only).
RESTARTING = re.compile(
    r"worker \d+ \(pid (\d+)\) exited with status .*?; restarting it in (\S+) s"
)
READY_AGAIN = re.compile(r"worker (\d+) \(pid (\d+)\) ready ([\d.]+) s after it was started")

T = TypeVar("T")


# ------------------------------------------------------------------ the drain's server app
def slow_echo() -> Any:
    """BenchEcho whose ``ping`` takes $CAPSVC_BENCH_CALL_MS milliseconds (default 50): an
    ``async def`` on the generated base (as ``bench.rpc.servers.async_typed_bench_echo``)
    sleeping before it answers, so that a drain finds calls in flight."""
    import trio

    from capsvc.generated.bench_echo_capnp import BenchEcho
    from capsvc.generated.echo_capnp import Echo

    text = os.environ.get(CALL_MS_VARIABLE, "50")
    try:
        delay = float(text) / 1e3
    except ValueError:
        raise ValueError(f"${CALL_MS_VARIABLE}={text!r} is not a number") from None
    if delay < 0:
        raise ValueError(f"${CALL_MS_VARIABLE}={text!r} must be >= 0")

    class SlowBenchEcho(BenchEcho.Server):
        async def ping(
            self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder
        ) -> None:
            await trio.sleep(delay)
            results.reply = params.msg

    return SlowBenchEcho()


# ------------------------------------------------------------------ the client process
class _Gone(Exception):
    """A connection closed under a caller (scaling mode): its callers stop."""


class _Stop(Exception):
    """A drain caller's call failed: it makes no more calls."""


@dataclass
class Tally:
    """One client process's counts (printed as its JSON line)."""

    calls: int = 0  # scaling: replies inside the window; drain: ok calls
    errors: int = 0  # scaling: failed calls
    refused: int = 0  # drain
    lost: int = 0  # drain
    drained: int = 0  # drain: started before the SIGTERM, answered after it
    unfinished: int = 0  # drain: callers still calling at the bound
    in_flight: int = 0
    #: kill: per connection, its local port, ok calls (and those answered after the
    #: SIGKILL's instant) and its first error ({type, message, at}) or None.
    connections: list[dict[str, Any]] = field(default_factory=list)
    reasons: dict[str, Counter[str]] = field(
        default_factory=lambda: {"refused": Counter(), "lost": Counter(), "errors": Counter()}
    )
    cpu: float = 0.0
    wall: float = 0.0

    def note(self, kind: str, reason: str, count: int = 1) -> None:
        """Count ``reason`` for ``kind`` (at most 10 different reasons are kept)."""
        reasons = self.reasons[kind]
        if reason in reasons or len(reasons) < 10:
            reasons[reason] += count

    def as_json(self) -> str:
        fields = {k: v for k, v in vars(self).items() if k not in ("reasons", "in_flight")}
        fields["reasons"] = {k: dict(v) for k, v in self.reasons.items() if v}
        return json.dumps(fields)


def _trio_time(instant: float) -> float:
    """The trio clock's time for a ``time.monotonic`` instant."""
    import trio

    return trio.current_time() + (instant - time.monotonic())


def _perf_ns(instant: float) -> int:
    """``time.perf_counter_ns`` for a ``time.monotonic`` instant (the load loop's clock)."""
    return time.perf_counter_ns() + int((instant - time.monotonic()) * 1e9)


def local_port(conn: Any) -> int:
    """The local (client side) TCP port of a ``capsvc.connect`` connection."""
    from capsvc.transport.tls import stream_socket

    sock = stream_socket(conn.stream)
    if sock is None:
        raise RuntimeError(f"no socket under the connection's {type(conn.stream).__name__}")
    return int(sock.getsockname()[1])


def _failure(error: BaseException) -> dict[str, Any]:
    """A kill-mode connection's first error, as reported: type, message, instant."""
    return {"type": type(error).__name__, "message": str(error)[:160], "at": time.monotonic()}


async def run_client(args: argparse.Namespace) -> Tally:
    """A client process's life (module docstring): connect, READY, wait for GO, load."""
    import trio

    import capsvc
    from bench.rpc.clients import _load
    from capsvc.generated.echo_capnp import Echo

    tally = Tally()
    ports: list[int] = []
    connected = 0
    all_connected = trio.Event()
    go = trio.Event()
    clock: dict[str, float] = {}

    async def checked_ping(echo: Any) -> None:
        if (await echo.ping(msg=MESSAGE)).reply != MESSAGE:
            raise AssertionError("echo reply differs from the request")

    async def scaling_load(conn: Any, echo: Any) -> None:
        window_ns, end_ns = _perf_ns(clock["window"]), _perf_ns(clock["end"])

        async def one_call() -> None:
            try:
                reply = (await echo.ping(msg=MESSAGE)).reply
            except capsvc.RpcError as error:
                tally.errors += 1
                tally.note("errors", str(error)[:120])
                if conn.closed:
                    raise _Gone from None
                return
            if reply != MESSAGE:
                raise AssertionError("echo reply differs from the request")
            if window_ns <= time.perf_counter_ns() < end_ns:
                tally.calls += 1

        with trio.move_on_at(_trio_time(clock["end"] + STOP_TIMEOUT)):
            try:
                await _load(one_call, MAX_CALLS, args.in_flight, None, trio.open_nursery, end_ns)
            except* _Gone:
                pass

    async def drain_caller(echo: Any) -> None:
        sigterm = clock["sigterm"]

        async def one_call() -> None:
            began = time.monotonic()
            tally.in_flight += 1
            try:
                reply = (await echo.ping(msg=MESSAGE)).reply
            except capsvc.RpcError as error:
                tally.in_flight -= 1
                kind = "refused" if "shutting down" in str(error) else "lost"
                setattr(tally, kind, getattr(tally, kind) + 1)
                tally.note(kind, str(error)[:120])
                raise _Stop from None
            tally.in_flight -= 1
            if reply != MESSAGE:
                tally.lost += 1
                tally.note("lost", "the echo reply differs from the request")
                raise _Stop
            tally.calls += 1
            if began < sigterm <= time.monotonic():
                tally.drained += 1

        try:
            await _load(one_call, MAX_CALLS, 1, None, trio.open_nursery, _perf_ns(clock["end"]))
        except _Stop:
            return
        tally.unfinished += 1

    async def kill_load(echo: Any, record: dict[str, Any]) -> None:
        # Calls until the end; the connection's first failed call stops all its callers.
        kill, end = clock["kill"], clock["end"]

        async def one_call() -> None:
            try:
                reply = (await echo.ping(msg=MESSAGE)).reply
            except Exception as error:  # what a dead worker's connection gives is measured
                record["error"] = record["error"] or _failure(error)
                raise _Stop from None
            if reply != MESSAGE:
                failure = _failure(AssertionError("the echo reply differs from the request"))
                record["error"] = record["error"] or failure
                raise _Stop
            record["ok"] += 1
            if time.monotonic() >= kill:
                record["after"] += 1

        with trio.move_on_at(_trio_time(end + 1.0)) as bound:
            try:
                await _load(
                    one_call, MAX_CALLS, args.in_flight, None, trio.open_nursery, _perf_ns(end)
                )
            except* _Stop:
                pass
        if bound.cancelled_caught and record["error"] is None:
            record["error"] = _failure(TimeoutError("no reply by the client's bound"))

    async def drain_load(echo: Any) -> None:
        # Calls still in flight when the bound cancels them got no reply: lost.
        with trio.move_on_at(_trio_time(clock["end"] + 1.0)):
            async with trio.open_nursery() as callers:
                for _ in range(args.in_flight):
                    callers.start_soon(drain_caller, echo)

    async def connection(record: dict[str, Any]) -> None:
        nonlocal connected
        async with capsvc.connect(args.client, busy_poll=None) as conn:
            echo = conn.bootstrap(Echo)
            await checked_ping(echo)
            record["port"] = local_port(conn)
            ports.append(record["port"])
            connected += 1
            if connected == args.connections:
                all_connected.set()
            await go.wait()
            if args.drain:
                await drain_load(echo)
            elif args.kill:
                await kill_load(echo, record)
            else:
                await scaling_load(conn, echo)

    async def one_connection() -> None:
        record: dict[str, Any] = {"port": None, "ok": 0, "after": 0, "error": None}
        try:
            await connection(record)
        except capsvc.RpcError as error:
            if not go.is_set():
                raise  # set-up failed: the driver reports this client's stderr
            # The connection ended under the load (a drain's Abort): its callers have
            # counted their calls already.
            record["error"] = record["error"] or _failure(error)
        except Exception as error:
            if not go.is_set() or not args.kill:
                raise
            record["error"] = record["error"] or _failure(error)  # e.g. closing a dead one
        finally:
            if args.kill and record["port"] is not None:
                tally.connections.append(record)

    async def timekeeper() -> None:
        await trio.sleep_until(_trio_time(clock["start"]))
        go.set()
        began_cpu, began = time.process_time(), time.monotonic()
        if not (args.drain or args.kill):
            await trio.sleep_until(_trio_time(clock["window"]))
            began_cpu, began = time.process_time(), time.monotonic()
            await trio.sleep_until(_trio_time(clock["end"]))
            tally.cpu, tally.wall = time.process_time() - began_cpu, time.monotonic() - began
        else:
            clock["began_cpu"], clock["began"] = began_cpu, began

    async with trio.open_nursery() as nursery:
        for _ in range(args.connections):
            nursery.start_soon(one_connection)
        with trio.fail_after(START_TIMEOUT):
            await all_connected.wait()
        # The local ports let the driver find which worker serves each connection.
        print("READY " + " ".join(map(str, ports)), flush=True)
        with trio.fail_after(START_TIMEOUT):
            line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        words = line.split()
        if len(words) != 2 or words[0] != "GO":
            raise RuntimeError(f"expected 'GO <instant>' on stdin, got {line!r}")
        start = float(words[1])
        clock["start"] = start
        if args.drain:
            clock["sigterm"] = start + args.before
            clock["end"] = start + args.seconds
        elif args.kill:
            clock["kill"] = start + args.before
            clock["end"] = start + args.seconds
        else:
            clock["window"] = start + WARMUP
            clock["end"] = start + WARMUP + args.seconds
        nursery.start_soon(timekeeper)
    if args.drain:
        tally.lost += tally.in_flight
        if tally.in_flight:
            tally.note("lost", "no reply by the client's bound", tally.in_flight)
    if args.drain or args.kill:
        tally.cpu = time.process_time() - clock["began_cpu"]
        tally.wall = time.monotonic() - clock["began"]
    return tally


# ------------------------------------------------------------------ processes
def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (bound to port 0, read, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(log: IO[str] | None, lines: int = 15) -> str:
    if log is None:
        return ""
    log.flush()
    log.seek(0)
    return "".join(log.readlines()[-lines:])


class WorkersServer(ServerProcess):
    """``capsvc serve ... --workers N``: the supervisor, and its workers found by psutil."""

    def __init__(
        self,
        workers: int,
        mode: str,
        app: str,
        grace: float,
        log: IO[str],
        env: dict[str, str] | None = None,
    ) -> None:
        kind = ServerKind(f"workers={workers} {mode}", "capsvc", "tcp", busy_poll=False)
        super().__init__(kind, socket_dir="", log=log, env=env)
        self.workers = workers
        self.mode = mode
        self.app = app
        self.grace = grace
        self.port = free_port()
        self.tree: list[Any] = []  # psutil.Process: the supervisor, then its descendants
        self.worker_processes: list[Any] = []

    def command(self) -> list[str]:
        command = [
            sys.executable, "-m", "capsvc", "serve", self.app,
            "--listen", f"tcp:127.0.0.1:{self.port}", "--grace", f"{self.grace:g}",
        ]  # fmt: skip
        command += ["--workers", str(self.workers)]
        if self.mode == "shared":
            command.append("--shared-socket")
        return command + ["--no-busy-poll"]

    def wait_ready(self, timeout: float = START_TIMEOUT) -> str:
        import psutil  # type: ignore[import-untyped]

        deadline = time.monotonic() + timeout
        for _ in range(1000):  # the serving line comes first; bounded all the same
            try:
                line = self._read_line(max(0.0, deadline - time.monotonic()))
            except RuntimeError as error:
                raise RuntimeError(f"{error}; its log ends:\n{_tail(self.log)}") from None
            found = LISTENING.search(line)
            if found:
                self.address = found.group(1).rstrip(",")
                break
        else:
            raise RuntimeError(f"{self.kind.name}: no 'listening on' line")
        supervisor = psutil.Process(self.pid)
        self.tree = [supervisor, *supervisor.children(recursive=True)]
        listening = [p for p in self.tree if self._listens(p)]
        self.worker_processes = [p for p in listening if p.pid != self.pid] or [supervisor]
        return self.address

    def _listens(self, process: Any) -> bool:
        import psutil

        try:
            return any(
                c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port
                for c in process.net_connections(kind="tcp")
            )
        except psutil.Error:
            return False

    def cpu_seconds(self) -> float:
        """User + system CPU seconds so far of the supervisor and every descendant."""
        import psutil

        total = 0.0
        for process in self.tree:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def connections_per_worker(self) -> list[int]:
        """Each worker's ESTABLISHED TCP connections on the server's port."""
        import psutil

        counts = []
        for process in self.worker_processes:
            try:
                connections = process.net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                connections = []
            counts.append(
                sum(
                    1
                    for c in connections
                    if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == self.port
                )
            )
        return counts

    def client_ports_per_worker(self) -> list[set[int]]:
        """For each worker, the remote (client side) ports of its ESTABLISHED TCP
        connections on the server's port: which worker serves which connection."""
        import psutil

        ports = []
        for process in self.worker_processes:
            try:
                connections = process.net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                connections = []
            ports.append(
                {
                    c.raddr.port
                    for c in connections
                    if c.status == psutil.CONN_ESTABLISHED
                    and c.laddr
                    and c.laddr.port == self.port
                    and c.raddr
                }
            )
        return ports

    def new_worker(self, known: set[int]) -> Any | None:
        """A descendant of the supervisor, not among ``known`` PIDs, that holds a listening
        socket on the port (a replacement worker); None if there is none (yet)."""
        import psutil

        try:
            descendants = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return None
        return next((p for p in descendants if p.pid not in known and self._listens(p)), None)

    def log_since(self, offset: int) -> str:
        """The server's log (its stderr) from byte ``offset`` on, as written so far."""
        assert self.log is not None
        with open(self.log.name, encoding="utf-8", errors="replace") as log:
            log.seek(offset)
            return log.read()

    def log_size(self) -> int:
        assert self.log is not None
        return os.path.getsize(self.log.name)

    def terminate(self, timeout: float) -> tuple[int | None, float]:
        """SIGTERM to the supervisor; (its exit status, or None if it had to be killed,
        and the seconds from the signal to its exit)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            status: int | None = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = None
        return status, time.monotonic() - sent

    def stop(self) -> None:
        """The supervisor by PID (SIGTERM, then SIGKILL), then any worker left (SIGKILL)."""
        import psutil

        process = self.process
        if process is not None and process.poll() is None:
            if not self.tree:  # not ready yet: find its children now, while it lives
                try:
                    supervisor = psutil.Process(process.pid)
                    self.tree = [supervisor, *supervisor.children(recursive=True)]
                except psutil.Error:
                    pass
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        left = [p for p in self.tree[1:] if p.is_running()]
        _, alive = psutil.wait_procs(left, timeout=STOP_TIMEOUT)
        for straggler in alive:
            try:
                straggler.kill()  # psutil checks that the PID is still that process
            except psutil.Error:
                pass


class ClientProcess:
    """One client process (``--client``, or the C++ load generator with ``load="cxx"``):
    READY, then GO on stdin, then one JSON line (``result``)."""

    def __init__(self, command: list[str], log: IO[str], load: str = "python") -> None:
        if load not in LOADS:
            raise ValueError(f"load {load!r}: expected one of {', '.join(LOADS)}")
        self.log = log
        self.load = load
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            bufsize=0,
        )
        self._buffer = b""

    def read_line(self, timeout: float) -> str:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"client {self.process.pid}: no answer within {timeout:g} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                status = self.process.wait(timeout=STOP_TIMEOUT)
                raise RuntimeError(
                    f"client {self.process.pid} exited (status {status}); its stderr ends:\n"
                    f"{_tail(self.log)}"
                )
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def result(self, timeout: float) -> dict[str, Any]:
        """The client's JSON line, as a Python client's: the C++ client's ``cpu_seconds``
        and ``wall_seconds`` become ``cpu`` and ``wall``, with no ``reasons`` (it writes
        the first errors to its stderr, the client's log)."""
        line = self.read_line(timeout)
        try:
            result: dict[str, Any] = json.loads(line)
        except json.JSONDecodeError:
            raise RuntimeError(
                f"client {self.process.pid} said {line!r} instead of its JSON line"
            ) from None
        if self.load == "cxx":
            result = {
                "calls": int(result["calls"]),
                "errors": int(result["errors"]),
                "cpu": float(result["cpu_seconds"]),
                "wall": float(result["wall_seconds"]),
                "reasons": {},
            }
        return result

    def go(self, instant: float) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"GO {instant!r}\n".encode())
        self.process.stdin.flush()

    def stop(self) -> None:
        process = self.process
        if process.stdin is not None:
            process.stdin.close()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def client_command(args: argparse.Namespace, address: str) -> list[str]:
    """A client process's command line: this module with ``--client``, or with ``--load
    cxx`` the C++ load generator (built first if ``args.cxx_binary`` is not set yet)."""
    if args.load == "cxx":
        if args.cxx_binary is None:
            args.cxx_binary = cxx_build.build()
        host, port = address.removeprefix("tcp:").rsplit(":", 1)
        return [
            str(args.cxx_binary), host, port, str(args.connections), str(args.in_flight),
            repr(args.seconds), repr(WARMUP),
        ]  # fmt: skip
    command = [
        sys.executable, "-m", "bench.serving.workers", "--client", address,
        "--connections", str(args.connections), "--in-flight", str(args.in_flight),
        "--seconds", repr(args.seconds),
    ]  # fmt: skip
    if args.drain:
        command += ["--drain", "--before", repr(args.before)]
    elif args.kill:
        command += ["--kill", "--before", repr(args.before)]
    return command


def _sleep_until(instant: float) -> None:
    time.sleep(max(0.0, instant - time.monotonic()))


class Run:
    """One measurement's server and clients, their logs, and stopping them all by PID."""

    def __init__(self, args: argparse.Namespace, workers: int, mode: str) -> None:
        self.args = args
        self.scratch = tempfile.TemporaryDirectory(prefix="capsvc-workers-bench-")
        self.logs: list[IO[str]] = []
        env = {CALL_MS_VARIABLE: repr(args.call_ms)} if args.drain else {}
        app = DRAIN_APP if args.drain else SCALING_APP
        self.server = WorkersServer(workers, mode, app, args.grace, self._log("server"), env)
        self.clients: list[ClientProcess] = []
        #: Per client, its connections' local ports (its READY line).
        self.ports: list[list[int]] = []

    def _log(self, name: str) -> IO[str]:
        log = open(os.path.join(self.scratch.name, f"{name}.log"), "w+")
        self.logs.append(log)
        return log

    def __enter__(self) -> Run:
        return self

    def start(self) -> float:
        """Start the server, then the clients; once all are READY, GO. The start instant."""
        self.server.start()
        self.server.wait_ready()
        command = client_command(self.args, self.server.address)
        self.clients = [
            ClientProcess(command, self._log(f"client{i}"), self.args.load)
            for i in range(self.args.clients)
        ]
        for client in self.clients:
            words = (line := client.read_line(START_TIMEOUT)).split()
            if not words or words[0] != "READY" or not all(w.isdigit() for w in words[1:]):
                raise RuntimeError(f"a client said {line!r} instead of READY PORT...")
            self.ports.append([int(word) for word in words[1:]])
        start = time.monotonic() + START_DELAY
        for client in self.clients:
            client.go(start)
        return start

    def results(self, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        return [client.result(max(0.1, deadline - time.monotonic())) for client in self.clients]

    def __exit__(self, *exc: object) -> None:
        try:
            for client in self.clients:
                client.stop()
        finally:
            self.server.stop()
            for log in self.logs:
                log.close()
            self.scratch.cleanup()


# ------------------------------------------------------------------ scaling
@dataclass
class Sample:
    """One scaling measurement."""

    rate: float
    server_cores: float
    client_cores: float
    per_server_cpu: float
    balance: float
    connections: list[int]
    errors: int
    reasons: Counter[str]


def measure(args: argparse.Namespace, workers: int, mode: str) -> Sample:
    """One scaling measurement: a fresh server and clients (module docstring)."""
    with Run(args, workers, mode) as run:
        start = run.start()
        server = run.server
        window = start + WARMUP
        end = window + args.seconds
        _sleep_until(window)
        cpu_before, began = server.cpu_seconds(), time.monotonic()
        _sleep_until(window + args.seconds / 2)
        connections = server.connections_per_worker()
        _sleep_until(end)
        cpu, wall = server.cpu_seconds() - cpu_before, time.monotonic() - began
        results = run.results(STOP_TIMEOUT + 5)
    rate = sum(r["calls"] / r["wall"] for r in results)
    client_cores = sum(r["cpu"] / r["wall"] for r in results)
    calls = sum(r["calls"] for r in results)
    reasons: Counter[str] = Counter()
    for r in results:
        reasons.update(r["reasons"].get("errors", {}))
    least = min(connections)
    return Sample(
        rate=rate,
        server_cores=cpu / wall,
        client_cores=client_cores,
        per_server_cpu=calls / cpu if cpu > 0 else float("inf"),
        balance=max(connections) / least if least else float("inf"),
        connections=connections,
        errors=sum(r["errors"] for r in results),
        reasons=reasons,
    )


def scaling_cells(args: argparse.Namespace) -> list[tuple[int, str]]:
    """(workers, mode) per cell: N=1 in the first mode only."""
    return [(n, mode) for n in args.workers for mode in (args.modes if n > 1 else args.modes[:1])]


def run_scaling(args: argparse.Namespace) -> dict[tuple[int, str], list[Sample]]:
    cells = scaling_cells(args)
    samples: dict[tuple[int, str], list[Sample]] = {cell: [] for cell in cells}
    for rep in range(args.reps):
        shift = rep % len(cells)
        for workers, mode in cells[shift:] + cells[:shift]:
            sample = measure(args, workers, mode)
            samples[workers, mode].append(sample)
            if not args.quiet:
                print(
                    f"  rep {rep + 1} {_label(workers, mode):13} {sample.rate:9,.0f} calls/s, "
                    f"server {sample.server_cores:.2f} cores, clients "
                    f"{sample.client_cores:.2f}, connections per worker {sample.connections}"
                    + (f", {sample.errors} errors" if sample.errors else ""),
                    flush=True,
                )
    return samples


def _label(workers: int, mode: str) -> str:
    """A cell's name: N=1 is one process whatever the mode."""
    return "N=1" if workers == 1 else f"N={workers} {mode}"


def _median(samples: list[Sample], key: Callable[[Sample], float]) -> float:
    return statistics.median(key(s) for s in samples)


def _met(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _load_name(args: argparse.Namespace) -> str:
    return "C++ (capnp-rpc)" if args.load == "cxx" else "Python (capsvc)"


def report_scaling(args: argparse.Namespace, samples: dict[tuple[int, str], list[Sample]]) -> str:
    total = args.clients * args.connections
    lines = [
        f"echo calls/s, capsvc serve --workers N, busy polling off, 16 B message; "
        f"{args.clients} {_load_name(args)} client processes x {args.connections} "
        f"connections ({total}) x "
        f"{args.in_flight} in flight; median of {args.reps} repetition(s) of {args.seconds:g} s "
        f"(after {WARMUP:g} s warm-up); {os.cpu_count()} CPUs shared by server and clients",
        "",
        f"{'cell':14} {'calls/s':>9} {'server cores':>12} {'client cores':>12} "
        f"{'calls/server-CPU-s':>18} {'balance':>8} {'errors':>6}",
    ]
    for (workers, mode), cell in samples.items():
        balance = _median(cell, lambda s: s.balance)
        goal = ""
        if workers > 1 and mode == "reuseport":
            goal = f"  balance ≤{BALANCE_GOAL} {_met(balance <= BALANCE_GOAL)}"
        lines.append(
            f"{_label(workers, mode):14} {_median(cell, lambda s: s.rate):9,.0f} "
            f"{_median(cell, lambda s: s.server_cores):12.2f} "
            f"{_median(cell, lambda s: s.client_cores):12.2f} "
            f"{_median(cell, lambda s: s.per_server_cpu):18,.0f} {balance:8.2f} "
            f"{sum(s.errors for s in cell):6}{goal}"
        )
    if args.reps > 1:
        lines.append("range of calls/s over repetitions: " + ", ".join(
            f"{_label(w, m)} {min(s.rate for s in c):,.0f}-{max(s.rate for s in c):,.0f}"
            for (w, m), c in samples.items()
        ))  # fmt: skip
    errors: Counter[str] = Counter()
    for cell in samples.values():
        for sample in cell:
            errors.update(sample.reasons)
    for reason, count in errors.most_common(5):
        lines.append(f"error x{count}: {reason}")
    base = next((cell for (w, _), cell in samples.items() if w == 1), None)
    if base is None or all(w == 1 for w, _ in samples):
        return "\n".join(lines + ["", "(no N=1 and N > 1 cells to compare: no scaling figures)"])
    rate1 = _median(base, lambda s: s.rate)
    per_cpu1 = _median(base, lambda s: s.per_server_cpu)
    cores1 = _median(base, lambda s: s.server_cores)
    cpus = os.cpu_count() or 1
    lines += [
        "",
        f"scaling against N=1: {'speedup':>7} {'efficiency/worker':>17} {'CPU-normalised':>14} "
        f"{'room':>5}  goal (≥{EFFICIENCY_GOAL} per worker)",
    ]
    for (workers, mode), cell in samples.items():
        if workers == 1:
            continue
        speedup = _median(cell, lambda s: s.rate) / rate1
        efficiency = speedup / workers
        normalised = _median(cell, lambda s: s.per_server_cpu) / per_cpu1
        room = min(workers, (cpus - _median(cell, lambda s: s.client_cores)) / cores1)
        lines.append(
            f"{_label(workers, mode):20} {speedup:7.2f} {efficiency:17.2f} {normalised:14.2f} "
            f"{room:5.2f}  raw {_met(efficiency >= EFFICIENCY_GOAL)}, "
            f"CPU-normalised {_met(normalised >= EFFICIENCY_GOAL)}"
        )
    lines.append(
        "room: the speedup the cores left by the clients allow, (CPUs - client cores at N) / "
        "server cores at N=1; a raw efficiency near room / N is all this machine can show"
    )
    return "\n".join(lines)


# ------------------------------------------------------------------ drain
@dataclass
class Drained:
    """One drain repetition."""

    ok: int
    refused: int
    lost: int
    drained: int
    unfinished: int
    status: int | None
    exit_seconds: float
    reasons: dict[str, Counter[str]]


def drain_once(args: argparse.Namespace) -> Drained:
    workers, mode = args.workers[0], args.modes[0]
    with Run(args, workers, mode) as run:
        start = run.start()
        _sleep_until(start + args.before)
        status, seconds = run.server.terminate(args.grace + STOP_TIMEOUT)
        results = run.results(max(0.0, start + args.seconds - time.monotonic()) + STOP_TIMEOUT)
    reasons: dict[str, Counter[str]] = {"refused": Counter(), "lost": Counter()}
    for r in results:
        for kind in reasons:
            reasons[kind].update(r["reasons"].get(kind, {}))
    return Drained(
        ok=sum(r["calls"] for r in results),
        refused=sum(r["refused"] for r in results),
        lost=sum(r["lost"] for r in results),
        drained=sum(r["drained"] for r in results),
        unfinished=sum(r["unfinished"] for r in results),
        status=status,
        exit_seconds=seconds,
        reasons=reasons,
    )


def repeat(
    args: argparse.Namespace, once: Callable[[argparse.Namespace], T], row: Callable[[T], str]
) -> list[T]:
    """``--reps`` runs of ``once``, each printed with ``row`` as it ends (unless quiet)."""
    runs = []
    for rep in range(args.reps):
        result = once(args)
        runs.append(result)
        if not args.quiet:
            print(f"  rep {rep + 1}: {row(result)}", flush=True)
    return runs


def _status(status: int | None) -> str:
    return "none (killed)" if status is None else str(status)


def _drain_row(d: Drained) -> str:
    return (
        f"ok {d.ok:,}, refused {d.refused:,}, lost {d.lost:,}, finished in the drain "
        f"{d.drained:,}, callers never stopped {d.unfinished}; exit {_status(d.status)} "
        f"after {d.exit_seconds:.2f} s"
    )


def report_drain(args: argparse.Namespace, runs: list[Drained]) -> str:
    total = args.clients * args.connections
    lines = [
        f"drain under load: capsvc serve --workers {args.workers[0]} ({args.modes[0]}), "
        f"--grace {args.grace:g}; ping takes {args.call_ms:g} ms; {args.clients} client "
        f"processes x {args.connections} connections ({total}) x {args.in_flight} in flight; "
        f"SIGTERM {args.before:g} s after the start; {len(runs)} repetition(s)",
        "",
        f"{'rep':>3} {'ok':>8} {'refused':>7} {'lost':>5} {'finished in drain':>17} "
        f"{'exit':>5} {'SIGTERM to exit s':>17}",
    ]
    for i, d in enumerate(runs, 1):
        lines.append(
            f"{i:3} {d.ok:8,} {d.refused:7,} {d.lost:5,} {d.drained:17,} "
            f"{_status(d.status):>5} {d.exit_seconds:17.2f}"
        )
    lost = sum(d.lost for d in runs)
    statuses = sorted({_status(d.status) for d in runs})
    exits = [d.exit_seconds for d in runs]
    unfinished = sum(d.unfinished for d in runs)
    met = lost == 0 and statuses == ["0"] and unfinished == 0
    lines += [
        "",
        f"total: ok {sum(d.ok for d in runs):,}, refused {sum(d.refused for d in runs):,}, "
        f"lost {lost:,}; exit {', '.join(statuses)}; SIGTERM to exit median "
        f"{statistics.median(exits):.2f} s (max {max(exits):.2f} s)"
        + (f"; {unfinished} callers never stopped" if unfinished else "")
        + f"; goal (lost 0, exit 0) {_met(met)}",
    ]
    for kind in ("refused", "lost"):
        merged: Counter[str] = Counter()
        for d in runs:
            merged.update(d.reasons[kind])
        for reason, count in merged.most_common(5):
            lines.append(f"{kind} x{count}: {reason}")
    return "\n".join(lines)


# ------------------------------------------------------------------ kill
@dataclass
class Side:
    """One side of a kill: the victim's connections, or the survivors'."""

    connections: int = 0
    failures: int = 0
    ok: int = 0
    after: int = 0  # ok calls answered after the SIGKILL's instant
    #: Failure type -> count; message -> count; ms from the SIGKILL to each failure.
    types: Counter[str] = field(default_factory=Counter)
    messages: Counter[str] = field(default_factory=Counter)
    failed_ms: list[float] = field(default_factory=list)

    def add(self, record: dict[str, Any], killed: float) -> None:
        self.connections += 1
        self.ok += record["ok"]
        self.after += record["after"]
        error = record["error"]
        if error is not None:
            self.failures += 1
            self.types[error["type"]] += 1
            message = f"{error['type']}: {error['message']}"
            if message in self.messages or len(self.messages) < 10:
                self.messages[message] += 1
            self.failed_ms.append((error["at"] - killed) * 1e3)


@dataclass
class Killed:
    """One kill repetition."""

    victim_pid: int
    survivor: Side
    victim: Side
    unmapped: int  # client connections found on no worker
    respawn: float | None  # s from the SIGKILL to the replacement's ready line; None: none
    ready_after: float | None  # the line's own figure: s from its start to ready
    restart_delay: str  # the supervisor's back-off ("restarting it in ... s")
    log_pid: int | None  # the replacement's PID in that line
    new_pid: int | None  # the replacement found by psutil
    fresh_ok: int
    fresh_total: int
    fresh_on_new: int  # fresh connections the replacement served
    fresh_errors: Counter[str]


def wait_respawn(
    server: WorkersServer, victim: int, offset: int, killed: float
) -> tuple[float | None, float | None, str, int | None]:
    """Poll the server's log from ``offset`` for the replacement's ready line (bounded by
    RESPAWN_TIMEOUT): (seconds from ``killed`` to seeing it, its own ready figure, the
    supervisor's back-off, its PID); None for what was not seen."""
    deadline = killed + RESPAWN_TIMEOUT
    delay = "?"
    for _ in range(int(RESPAWN_TIMEOUT / RESPAWN_POLL) + 1):
        text = server.log_since(offset)
        if exited := RESTARTING.search(text):
            if int(exited.group(1)) != victim:
                raise RuntimeError(f"the supervisor restarts pid {exited.group(1)}, not {victim}")
            delay = exited.group(2)
        if ready := READY_AGAIN.search(text):
            return time.monotonic() - killed, float(ready.group(3)), delay, int(ready.group(2))
        if time.monotonic() >= deadline:
            break
        time.sleep(RESPAWN_POLL)
    return None, None, delay, None


def fresh_connections(server: WorkersServer, new_pid: int | None) -> tuple[int, int, Counter[str]]:
    """Open FRESH_CONNECTIONS connections from this process, one checked call on each, all
    held open until counted: (how many worked, how many of those the replacement serves,
    the failures' reasons). Bounded by START_TIMEOUT in all."""
    import trio

    async def check() -> tuple[int, int, Counter[str]]:
        import capsvc
        from capsvc.generated.echo_capnp import Echo

        ports: list[int] = []
        errors: Counter[str] = Counter()
        finished = 0
        all_finished, counted = trio.Event(), trio.Event()
        on_new = 0

        def finish() -> None:
            nonlocal finished
            finished += 1
            if finished == FRESH_CONNECTIONS:
                all_finished.set()

        async def one() -> None:
            done = False
            try:
                async with capsvc.connect(server.address, busy_poll=None) as conn:
                    reply = (await conn.bootstrap(Echo).ping(msg=MESSAGE)).reply
                    if reply == MESSAGE:
                        ports.append(local_port(conn))
                    else:
                        errors["the echo reply differs from the request"] += 1
                    done = True
                    finish()
                    await counted.wait()  # held open until the workers' are counted
            except Exception as error:
                if not done:
                    errors[f"{type(error).__name__}: {str(error)[:120]}"] += 1
                    finish()

        with trio.move_on_after(START_TIMEOUT) as bound:
            async with trio.open_nursery() as nursery:
                for _ in range(FRESH_CONNECTIONS):
                    nursery.start_soon(one)
                await all_finished.wait()
                served = server.client_ports_per_worker()
                for process, remote in zip(server.worker_processes, served, strict=True):
                    if process.pid == new_pid:
                        on_new = len(remote.intersection(ports))
                counted.set()
        if bound.cancelled_caught:
            errors[f"not done within {START_TIMEOUT:g} s"] += FRESH_CONNECTIONS - finished
        return len(ports), on_new, errors

    return trio.run(check)


def kill_once(args: argparse.Namespace) -> Killed:
    """One kill repetition (module docstring): map connections to workers, SIGKILL the
    worker with more, time its replacement, check fresh connections, count failures."""
    workers, mode = args.workers[0], args.modes[0]
    with Run(args, workers, mode) as run:
        start = run.start()
        server = run.server
        # Every client connection made a call before READY: the workers have them all.
        served = server.client_ports_per_worker()
        index = max(range(len(served)), key=lambda i: len(served[i]))
        victim = server.worker_processes[index]
        known = {p.pid for p in server.tree}
        offset = server.log_size()
        _sleep_until(start + args.before)
        victim.kill()  # SIGKILL; psutil checks that the PID is still that process
        killed = time.monotonic()
        respawn, ready_after, delay, log_pid = wait_respawn(server, victim.pid, offset, killed)
        replacement = None
        for _ in range(100):  # it listens before it is ready: there at once, bounded
            if respawn is None or (replacement := server.new_worker(known)) is not None:
                break
            time.sleep(RESPAWN_POLL)
        if replacement is not None:
            server.tree.append(replacement)  # stopped by PID with the others
            server.worker_processes[index] = replacement
        new_pid = None if replacement is None else replacement.pid
        if respawn is not None:
            fresh_ok, fresh_on_new, fresh_errors = fresh_connections(server, new_pid)
        else:
            fresh_ok, fresh_on_new, fresh_errors = 0, 0, Counter({"no respawn seen": 1})
        results = run.results(max(0.0, start + args.seconds - time.monotonic()) + STOP_TIMEOUT)
    victim_ports = served[index]
    others = set().union(*(ports for i, ports in enumerate(served) if i != index))
    survivor, victim_side, unmapped = Side(), Side(), 0
    for result in results:
        for record in result["connections"]:
            if record["port"] in victim_ports:
                victim_side.add(record, killed)
            elif record["port"] in others:
                survivor.add(record, killed)
            else:
                unmapped += 1
    return Killed(
        victim_pid=victim.pid,
        survivor=survivor,
        victim=victim_side,
        unmapped=unmapped,
        respawn=respawn,
        ready_after=ready_after,
        restart_delay=delay,
        log_pid=log_pid,
        new_pid=new_pid,
        fresh_ok=fresh_ok,
        fresh_total=FRESH_CONNECTIONS,
        fresh_on_new=fresh_on_new,
        fresh_errors=fresh_errors,
    )


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


def _ms_range(values: list[float]) -> str:
    return f"{min(values):.0f}..{max(values):.0f}" if values else "-"


def _kill_row(k: Killed) -> str:
    s, v = k.survivor, k.victim
    types = ", ".join(f"{t} x{n}" for t, n in v.types.most_common()) or "none"
    return (
        f"SIGKILL pid {k.victim_pid}; survivor {s.failures}/{s.connections} connections "
        f"failed, {s.after:,} calls after the kill; victim {v.failures}/{v.connections} failed "
        f"({types}) {_ms_range(v.failed_ms)} ms after it; respawn {_seconds(k.respawn)} s "
        f"(back-off {k.restart_delay} s, ready {_seconds(k.ready_after)} s after its start, "
        f"pid {k.new_pid if k.new_pid is not None else 'not found'}); fresh "
        f"{k.fresh_ok}/{k.fresh_total} ok ({k.fresh_on_new} on the replacement)"
        + (f"; {k.unmapped} connections on no worker" if k.unmapped else "")
    )


def report_kill(args: argparse.Namespace, runs: list[Killed]) -> str:
    total = args.clients * args.connections
    lines = [
        f"kill one worker under load: capsvc serve --workers {args.workers[0]} "
        f"({args.modes[0]}), echo; {args.clients} client processes x {args.connections} "
        f"connections ({total}) x {args.in_flight} in flight, calling for {args.seconds:g} s; "
        f"SIGKILL to the worker with the most connections {args.before:g} s after the start; "
        f"{len(runs)} repetition(s)",
        "",
        f"{'rep':>3} {'survivor conns':>14} {'failed':>6} {'calls after kill':>16} "
        f"{'victim conns':>12} {'failed':>6} {'failed ms after':>15} {'respawn s':>9} "
        f"{'fresh ok':>8}",
    ]
    for i, k in enumerate(runs, 1):
        s, v = k.survivor, k.victim
        lines.append(
            f"{i:3} {s.connections:14} {s.failures:6} {s.after:16,} {v.connections:12} "
            f"{v.failures:6} {_ms_range(v.failed_ms):>15} {_seconds(k.respawn):>9} "
            f"{f'{k.fresh_ok}/{k.fresh_total}':>8}"
        )
    survivor_failures = sum(k.survivor.failures for k in runs)
    survivor_total = sum(k.survivor.connections for k in runs)
    after = [k.survivor.after for k in runs]
    unmapped = sum(k.unmapped for k in runs)
    victim_failures = sum(k.victim.failures for k in runs)
    victim_total = sum(k.victim.connections for k in runs)
    types: Counter[str] = Counter()
    for k in runs:
        types.update(k.victim.types)
    respawns = [k.respawn for k in runs if k.respawn is not None]
    missing = sum(1 for k in runs if k.respawn is None or k.new_pid is None)
    mismatched = sum(1 for k in runs if k.respawn is not None and k.log_pid != k.new_pid)
    fresh_ok = sum(k.fresh_ok for k in runs)
    fresh_total = sum(k.fresh_total for k in runs)
    survivors_met = survivor_failures == 0 and unmapped == 0 and min(after) > 0
    respawn_met = not missing and not mismatched and max(respawns) <= RESPAWN_GOAL
    fresh_met = fresh_ok == fresh_total
    lines += [
        "",
        f"survivor's connections: {survivor_failures} failed of {survivor_total}, every "
        f"repetition at least {min(after):,} calls answered after the kill"
        + (f"; {unmapped} connections found on no worker" if unmapped else "")
        + f"; goal (0 failures) {_met(survivors_met)}",
        f"victim's connections: {victim_failures} failed of {victim_total} ("
        + (", ".join(f"{t} x{n}" for t, n in types.most_common()) or "none")
        + ")",
        "respawn (SIGKILL to the replacement's ready line in the log): "
        + (
            f"median {statistics.median(respawns):.2f} s, max {max(respawns):.2f} s"
            if respawns
            else "never seen"
        )
        + (f"; {missing} repetition(s) without a replacement" if missing else "")
        + (f"; {mismatched} with the log's PID not psutil's" if mismatched else "")
        + f"; goal (<= {RESPAWN_GOAL:g} s) {_met(respawn_met)}",
        f"fresh connections after the respawn: {fresh_ok}/{fresh_total} ok, "
        f"{sum(k.fresh_on_new for k in runs)} served by the replacement; {_met(fresh_met)}",
        f"goal (0 failures on the survivor, respawn <= {RESPAWN_GOAL:g} s, fresh connections "
        f"ok) {_met(survivors_met and respawn_met and fresh_met)}",
    ]
    for name in ("survivor", "victim"):
        merged: Counter[str] = Counter()
        for k in runs:
            merged.update((k.survivor if name == "survivor" else k.victim).messages)
        for message, count in merged.most_common(3):
            lines.append(f"{name} failure x{count}: {message}")
    fresh_errors: Counter[str] = Counter()
    for k in runs:
        fresh_errors.update(k.fresh_errors)
    for message, count in fresh_errors.most_common(3):
        lines.append(f"fresh connection failure x{count}: {message}")
    return "\n".join(lines)


# ------------------------------------------------------------------ the command line
def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 1,2") from None
    if any(count < 1 for count in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: every worker count must be >= 1")
    if len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"{text!r}: a worker count is repeated")
    return counts


def _modes(text: str) -> list[str]:
    modes = text.split(",")
    if unknown := [mode for mode in modes if mode not in MODES]:
        raise argparse.ArgumentTypeError(
            f"{text!r}: unknown mode {unknown[0]!r} (choose from {', '.join(MODES)})"
        )
    if len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"{text!r}: a mode is repeated")
    return modes


def _not_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from capsvc.limits import DEFAULT_MAX_CONNECTIONS

    parser = argparse.ArgumentParser(
        prog="python -m bench.serving.workers",
        description="capsvc serve --workers: calls/s scaling, a drain under load, and a "
        "worker killed under load (module docstring).",
    )
    parser.add_argument("--workers", type=_counts, default=None,
                        help="worker counts (default 1,2; with --drain or --kill one "
                             "count, default 2)")  # fmt: skip
    parser.add_argument("--modes", type=_modes, default=None,
                        help="socket modes for N > 1: reuseport, shared (default both; "
                             "with --drain or --kill one, default reuseport)")  # fmt: skip
    parser.add_argument("--seconds", type=_positive(float), default=None,
                        help="seconds measured per cell (default 5); with --drain the most "
                             "a client calls, from the start (default --before + --grace "
                             "+ 10; with --kill --before + 3)")  # fmt: skip
    parser.add_argument("--reps", type=_positive(int), default=3,
                        help="repetitions, the cells interleaved (default 3)")  # fmt: skip
    parser.add_argument("--clients", type=_positive(int), default=4,
                        help="client processes (default 4)")  # fmt: skip
    parser.add_argument("--connections", type=_positive(int), default=16,
                        help="connections per client process (default 16)")  # fmt: skip
    parser.add_argument("--in-flight", type=_positive(int), default=1,
                        help="calls in flight per connection (default 1)")  # fmt: skip
    parser.add_argument("--drain", action="store_true",
                        help="SIGTERM the server under load and count lost calls")  # fmt: skip
    parser.add_argument("--kill", action="store_true",
                        help="SIGKILL one worker under load: failures elsewhere, "
                             "respawn time")  # fmt: skip
    parser.add_argument("--grace", type=_not_negative, default=30.0,
                        help="the server's --grace, seconds (default 30)")  # fmt: skip
    parser.add_argument("--call-ms", type=_not_negative, default=None,
                        help="--drain: how long each ping takes, ms (default 50)")  # fmt: skip
    parser.add_argument("--before", type=_positive(float), default=None,
                        help="--drain, --kill: seconds of load before the SIGTERM or "
                             "SIGKILL (default 2)")  # fmt: skip
    parser.add_argument("--load", choices=LOADS, default="python",
                        help="scaling: the client processes, python (this module, capsvc) "
                             "or cxx (bench/serving/cxx_load, Cap'n Proto's C++ RPC; "
                             "built with g++ and libcapnp-dev) (default python)")  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="print the tables only")
    parser.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drain and args.kill:
        parser.error("--kill and --drain exclude each other")
    if args.load == "cxx" and (args.drain or args.kill or args.client is not None):
        parser.error(
            f"--load cxx is for the scaling run only, not with "
            f"{'--drain' if args.drain else '--kill' if args.kill else '--client'} (the C++ "
            "client reports no ports for --kill, and does not classify a drain's calls)"
        )
    args.cxx_binary = None  # --load cxx: the C++ client's path, once built
    if not args.drain and args.call_ms is not None:
        parser.error("--call-ms goes with --drain")
    if not (args.drain or args.kill) and args.before is not None:
        parser.error("--before goes with --drain or --kill")
    one_cell = "--drain" if args.drain else "--kill" if args.kill else None
    args.workers = args.workers or ([2] if one_cell else [1, 2])
    args.modes = args.modes or (["reuseport"] if one_cell else list(MODES))
    args.call_ms = 50.0 if args.call_ms is None else args.call_ms
    args.before = 2.0 if args.before is None else args.before
    if args.seconds is None:
        if args.drain:
            args.seconds = args.before + args.grace + 10
        else:
            args.seconds = args.before + 3 if args.kill else 5.0
    if one_cell:
        if len(args.workers) != 1:
            parser.error(f"{one_cell} takes one --workers count")
        if len(args.modes) != 1:
            parser.error(f"{one_cell} takes one --modes value")
        if args.seconds <= args.before:
            parser.error(f"--seconds must be more than --before with {one_cell}")
    if args.kill and args.workers[0] < 2:
        parser.error("--kill needs --workers >= 2 (one to kill, one to survive)")
    if args.clients * args.connections > DEFAULT_MAX_CONNECTIONS:
        parser.error(
            f"--clients x --connections must be <= {DEFAULT_MAX_CONNECTIONS} "
            "(the server's max_connections)"
        )
    if args.client is not None and not args.client.startswith("tcp:127.0.0.1:"):
        parser.error("--client takes a tcp:127.0.0.1:PORT address")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.client is not None:
        import trio

        print(trio.run(run_client, args).as_json(), flush=True)
        return 0
    from bench.rpc.profile import machine_state

    print("command line: " + shlex.join(["python", "-m", "bench.serving.workers", *argv]))
    if args.load == "cxx":
        try:
            args.cxx_binary = cxx_build.build(quiet=args.quiet)
        except cxx_build.BuildError as error:
            print(f"--load cxx: {error}", file=sys.stderr)
            return 2
        print(f"load: C++ client {args.cxx_binary}", flush=True)
    print(machine_state("before"), flush=True)
    if args.drain:
        runs = repeat(args, drain_once, _drain_row)
        table = report_drain(args, runs)
        failed = False
    elif args.kill:
        killed = repeat(args, kill_once, _kill_row)
        table = report_kill(args, killed)
        failed = False
    else:
        samples = run_scaling(args)
        table = report_scaling(args, samples)
        failed = any(s.errors for cell in samples.values() for s in cell)
    print()
    print(table)
    print()
    print(machine_state("after"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
