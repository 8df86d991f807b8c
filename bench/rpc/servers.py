"""The benchmark's server programs, and running each one as a separate process.

Theory of operation
-------------------
Every server runs in its own process, started by the driver before a repetition and
stopped (SIGTERM, by PID) after it, so that client and server never share an interpreter,
a GIL or an event loop, as in capnp-rpc's echo_bench. Three programs:

- ``capsvc``: ``capsvc.serve`` with a ``BenchEcho`` object (schemas/bench_echo.capnp,
  which extends the plain ``Echo``, so pycapnp's client calls it unchanged), written on
  the generated base (capsvc.generated.bench_echo_capnp: typed readers and builders);
  with ``--dynamic`` the same object on the dynamic path (``capsvc.load_schema``, pycapnp
  readers and builders), so that the two can be compared in one run; with
  ``--async-methods`` the generated base with ``async def`` methods (pycapnp's server
  methods must be coroutines; capsvc runs a plain ``def`` inline in the reader). TCP_NODELAY,
  write coalescing and busy polling are the documented switches of ``capsvc.serve``.
- ``pycapnp``: tests/peers/pycapnp_server.py, the C++ reference's RPC (``--bootstrap echo``).
- ``raw``: a trio ping-pong server, the ceiling for any trio RPC: it parses 8-byte frame
  headers (``body length, reply length``, little-endian u32s) and answers every whole
  request with a reply of the asked length, all replies of one read in one ``send_all``.
  Unless ``--no-busy-poll``, it busy-polls its socket before sleeping (``raw_receiver``),
  as capsvc does, so that capsvc with polling on has a ceiling measured the same way.

Each program prints exactly one ``LISTENING <address>`` line when it accepts connections
(``tcp:HOST:PORT`` or ``unix:PATH``; pycapnp's peer prints a bare port). The capsvc and raw
servers answer SIGUSR1 with one ``STATS {json}`` line (process CPU seconds and trio
scheduler passes so far; for capsvc also the writes of its live connections), which
the profiling command uses to count per-call costs on the server side.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import IO, Any

from bench.rpc.scenarios import BENCH_ECHO_SCHEMA, PEERS, ROOT, ServerKind

FRAME_HEADER = struct.Struct("<II")  # raw ping-pong: body length, reply length (bytes)

Receive = Callable[[int], Awaitable[bytes]]


# ------------------------------------------------------------------------ in-process parts
@contextlib.contextmanager
def raw_receiver(stream: Any, busy_poll: bool, budget: float | None = None) -> Iterator[Receive]:
    """The ``receive_some`` of the raw ping-pong's ``trio.SocketStream``, both ends.

    Without ``busy_poll``: the stream's own (a receive that finds nothing sleeps in
    ``epoll_wait`` until the socket is readable). With it, the ceiling of an RPC that
    busy-polls as capsvc does (capsvc.transport.fastsocket ``_wait_and_receive``): a
    receive that finds nothing keeps polling, one zero-timeout scheduler pass, a
    non-blocking ``recv`` and a ``sched_yield`` at a time, until ``budget`` seconds have
    passed (default: capsvc's, ``capsvc.transport.busypoll.DEFAULT_BUDGET``, 400 µs), and
    only then sleeps. No adaptive policy (the ceiling always polls, however often it
    misses), and sends stay the stream's, so that the two variants differ in the polling
    only.
    """
    if not busy_poll:
        yield stream.receive_some
        return
    import trio

    from capsvc.transport.busypoll import DEFAULT_BUDGET

    budget = DEFAULT_BUDGET if budget is None else budget
    trio_socket = stream.socket
    # A second Python socket object on the stream's file descriptor, for synchronous
    # non-blocking recv calls (trio's socket has async ones only). It does not own the
    # descriptor: detached on the way out, so that only the stream closes it.
    sock = socket.socket(trio_socket.family, trio_socket.type, trio_socket.proto,
                         fileno=trio_socket.fileno())  # fmt: skip
    sock.setblocking(False)  # already so (trio's); this sets the Python object's mode
    now = time.perf_counter
    sched_yield = os.sched_yield
    checkpoint = trio.lowlevel.checkpoint

    async def receive(max_bytes: int) -> bytes:
        # As trio.SocketStream.receive_some when data is waiting: one recv, one pass.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            try:
                data = sock.recv(max_bytes)
            except BlockingIOError:
                pass
            else:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return data
            deadline = now() + budget
            while True:
                await checkpoint()  # other tasks run (a c12 client's callers)
                try:
                    return sock.recv(max_bytes)
                except BlockingIOError:
                    if now() >= deadline:
                        break
                    sched_yield()
            while True:
                await trio.lowlevel.wait_readable(sock)
                try:
                    return sock.recv(max_bytes)
                except BlockingIOError:
                    continue
        except OSError as error:
            raise trio.BrokenResourceError(f"socket error: {error}") from error

    try:
        yield receive
    finally:
        sock.detach()


class PassCounter:
    """A trio instrument that counts scheduler passes (one ``before_io_wait`` each)."""

    def __init__(self) -> None:
        self.passes = 0

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1


_COUNTING = [0.0]  # CPU seconds spent counting writes so far (left out of "cpu")


def _stats_line(counter: PassCounter, writes: Any) -> str:
    # Counting the writes walks the heap: no call's cost, so its CPU time is left out.
    began = time.process_time()
    count = writes()
    _COUNTING[0] += time.process_time() - began
    stats: dict[str, Any] = {"cpu": time.process_time() - _COUNTING[0], "passes": counter.passes}
    if count is not None:
        stats["writes"] = count
    return "STATS " + json.dumps(stats)


async def _serve_until_signalled(
    start: Any, counter: PassCounter, writes: Any = lambda: None
) -> None:
    """Run ``start`` (a ``nursery.start`` target returning the address) until SIGTERM."""
    import trio

    trio.lowlevel.add_instrument(counter)  # type: ignore[arg-type]
    signals = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
    profiler: Any = None
    with trio.open_signal_receiver(*signals) as received:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(start)
            print(f"LISTENING {address}", flush=True)
            async for signum in received:
                if signum == signal.SIGUSR1:
                    print(_stats_line(counter, writes), flush=True)
                    continue
                if signum == signal.SIGUSR2:
                    profiler = _toggle_profiler(profiler)
                    continue
                nursery.cancel_scope.cancel()
                break


def _toggle_profiler(profiler: Any) -> Any:
    """SIGUSR2: start cProfile (in this thread, where trio runs everything); the next
    SIGUSR2 stops it and writes the stats to $BENCH_RPC_CPROFILE."""
    import cProfile

    if profiler is None:
        profiler = cProfile.Profile()
        profiler.enable()
        print("PROFILING", flush=True)
        return profiler
    profiler.disable()
    path = os.environ.get("BENCH_RPC_CPROFILE", "server.prof")
    profiler.dump_stats(path)
    print(f"PROFILED {path}", flush=True)
    return None


def typed_bench_echo(async_methods: bool = False) -> Any:
    """The BenchEcho server object on the generated base (what users of ``capsvc gen`` write).

    Plain methods: an echo never waits, so it runs inline in the connection's reader
    (capsvc.server). pycapnp's peer has no such option (its methods must be coroutines);
    ``async_methods`` gives the same server with ``async def`` methods, which capsvc runs
    as tasks, the like-with-like comparison with pycapnp's server.
    """
    if async_methods:
        return async_typed_bench_echo()
    from capsvc.generated.bench_echo_capnp import BenchEcho
    from capsvc.generated.echo_capnp import Echo

    class TypedBenchEcho(BenchEcho.Server):
        def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
            results.reply = params.msg

        def pingData(
            self, params: Echo.PingDataParams.Reader, results: Echo.PingDataResults.Builder
        ) -> None:
            results.data = params.data

        def pingCap(
            self,
            params: BenchEcho.PingCapParams.Reader,
            results: BenchEcho.PingCapResults.Builder,
        ) -> None:
            results.reply = params.msg
            results.cap = self

    return TypedBenchEcho()


def async_typed_bench_echo() -> Any:
    """The BenchEcho server on the generated base with ``async def`` methods."""
    from capsvc.generated.bench_echo_capnp import BenchEcho
    from capsvc.generated.echo_capnp import Echo

    class AsyncTypedBenchEcho(BenchEcho.Server):
        async def ping(
            self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder
        ) -> None:
            results.reply = params.msg

        async def pingData(
            self, params: Echo.PingDataParams.Reader, results: Echo.PingDataResults.Builder
        ) -> None:
            results.data = params.data

        async def pingCap(
            self,
            params: BenchEcho.PingCapParams.Reader,
            results: BenchEcho.PingCapResults.Builder,
        ) -> None:
            results.reply = params.msg
            results.cap = self

    return AsyncTypedBenchEcho()


def dynamic_bench_echo() -> Any:
    """The same BenchEcho server on the dynamic path (``capsvc.load_schema``)."""
    import capsvc

    schema = capsvc.load_schema(BENCH_ECHO_SCHEMA, check=False)

    class DynamicBenchEcho(capsvc.Server, interface=schema.BenchEcho):
        def ping(self, params: Any, results: Any) -> None:
            results.reply = params.msg

        def pingData(self, params: Any, results: Any) -> None:
            results.data = params.data

        def pingCap(self, params: Any, results: Any) -> None:
            results.reply = params.msg
            results.cap = self

    return DynamicBenchEcho()


def run_capsvc_server(
    listen: str,
    *,
    nodelay: bool,
    coalesce: bool,
    busy_poll: bool = True,
    dynamic: bool = False,
    async_methods: bool = False,
) -> None:
    """The capsvc BenchEcho server (blocks until SIGTERM/SIGINT); ``dynamic``: on the
    dynamic path instead of the generated base; ``async_methods``: ``async def`` methods
    on the generated base."""
    import gc

    import trio

    import capsvc

    if dynamic and async_methods:
        raise ValueError("the dynamic server has plain methods only")
    server = dynamic_bench_echo() if dynamic else typed_bench_echo(async_methods)

    async def start(task_status: Any) -> None:
        await capsvc.serve(
            listen,
            server,
            nodelay=nodelay,
            coalesce=coalesce,
            busy_poll=capsvc.DEFAULT_BUSY_POLL if busy_poll else None,
            task_status=task_status,
        )

    def writes() -> int:
        # capsvc.serve keeps its connections to itself; find the live ones (stats only).
        return sum(o.writes for o in gc.get_objects() if isinstance(o, capsvc.Connection))

    trio.run(_serve_until_signalled, start, PassCounter(), writes)


def run_raw_server(listen: str, busy_poll: bool = False) -> None:
    """The raw trio ping-pong server (blocks until SIGTERM/SIGINT); ``busy_poll``: its
    receives poll before they sleep (``raw_receiver``)."""
    import trio

    replies: dict[int, bytes] = {}

    def reply(size: int) -> bytes:
        frame = replies.get(size)
        if frame is None:
            frame = replies[size] = FRAME_HEADER.pack(size - 8, 0) + bytes(size - 8)
        return frame

    async def handle(stream: trio.SocketStream) -> None:
        with raw_receiver(stream, busy_poll) as receive:
            await ping_pong(stream, receive)

    async def ping_pong(stream: trio.SocketStream, receive: Receive) -> None:
        buffer = bytearray()
        header = FRAME_HEADER
        while True:
            try:
                data = await receive(65536)
            except trio.BrokenResourceError:
                return
            if not data:
                return
            buffer += data
            out = []
            offset = 0
            while len(buffer) - offset >= 8:
                body, reply_size = header.unpack_from(buffer, offset)
                if len(buffer) - offset < 8 + body:
                    break
                offset += 8 + body
                out.append(reply(reply_size))
            del buffer[:offset]
            if out:
                try:
                    await stream.send_all(out[0] if len(out) == 1 else b"".join(out))
                except trio.BrokenResourceError:
                    return

    async def start(task_status: Any) -> None:
        if listen.startswith("unix:"):
            path = listen[len("unix:") :]
            sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
            await sock.bind(path)
            sock.listen(128)
            listeners = [trio.SocketListener(sock)]
            address = listen
        else:
            host, port = listen[len("tcp:") :].rsplit(":", 1)
            listeners = await trio.open_tcp_listeners(int(port), host=host)
            address = f"tcp:{host}:{listeners[0].socket.getsockname()[1]}"
        task_status.started(address)
        try:
            await trio.serve_listeners(handle, listeners)
        finally:
            if listen.startswith("unix:"):
                os.unlink(listen[len("unix:") :])

    trio.run(_serve_until_signalled, start, PassCounter())


# ------------------------------------------------------------------------ processes
def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


class ServerProcess:
    """One benchmark server in its own process; ``start()`` then ``wait_ready()``."""

    def __init__(
        self,
        kind: ServerKind,
        socket_dir: str,
        log: IO[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.env = env or {}
        self.socket_dir = socket_dir
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.address = ""
        self._buffer = b""

    def command(self) -> list[str]:
        kind = self.kind
        if kind.impl == "pycapnp":
            if kind.transport != "tcp":
                raise ValueError("the pycapnp peer serves TCP only")
            return [
                sys.executable, os.path.join(PEERS, "pycapnp_server.py"),
                "--listen", "127.0.0.1:0", "--bootstrap", "echo",
            ]  # fmt: skip
        if kind.transport == "unix":
            listen = "unix:" + os.path.join(self.socket_dir, f"{kind.name}.sock")
        else:
            listen = "tcp:127.0.0.1:0"
        command = [sys.executable, "-m", "bench.rpc", "server", kind.impl, "--listen", listen]
        if not kind.nodelay:
            command.append("--no-nodelay")
        if not kind.coalesce:
            command.append("--no-coalesce")
        if not kind.busy_poll:
            command.append("--no-busy-poll")
        if kind.dynamic:
            command.append("--dynamic")
        if kind.async_methods:
            command.append("--async-methods")
        return command

    def start(self) -> ServerProcess:
        self.process = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=child_env() | self.env,
            stdout=subprocess.PIPE,
            stderr=self.log if self.log is not None else subprocess.DEVNULL,
            bufsize=0,
        )
        return self

    def wait_ready(self, timeout: float = 60.0) -> str:
        line = self._read_line(timeout)
        if not line.startswith("LISTENING "):
            self.stop()
            raise RuntimeError(f"{self.kind.name} server did not start: {line!r}")
        address = line.split(None, 1)[1].strip()
        self.address = address if ":" in address else f"tcp:127.0.0.1:{address}"
        return self.address

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far."""
        import psutil  # type: ignore[import-untyped]

        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)

    def cpu_split(self) -> tuple[float, float]:
        """(user, system) CPU seconds of the server process so far."""
        import psutil

        times = psutil.Process(self.pid).cpu_times()
        return float(times.user), float(times.system)

    def stats(self, timeout: float = 10.0) -> dict[str, Any]:
        """The server's own counters (capsvc and raw servers only): CPU, passes, writes."""
        assert self.process is not None
        self.process.send_signal(signal.SIGUSR1)
        line = self._read_line(timeout)
        if not line.startswith("STATS "):
            raise RuntimeError(f"{self.kind.name} server sent {line!r} instead of STATS")
        return dict(json.loads(line[len("STATS ") :]))

    def toggle_profiler(self, timeout: float = 30.0) -> str:
        """Start or stop cProfile in the server (capsvc and raw servers); returns its answer."""
        assert self.process is not None
        self.process.send_signal(signal.SIGUSR2)
        return self._read_line(timeout)

    def _read_line(self, timeout: float) -> str:
        assert self.process is not None
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"{self.kind.name} server: no answer within {timeout} s")
            chunk = os.read(fd, 4096)
            if not chunk:
                code = self.process.poll()
                raise RuntimeError(f"{self.kind.name} server exited (status {code})")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_servers(
    kinds: list[ServerKind],
    socket_dir: str,
    log: IO[str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, ServerProcess]:
    """Start every server at once (they import in parallel), then wait for each."""
    servers = {kind.name: ServerProcess(kind, socket_dir, log, env).start() for kind in kinds}
    try:
        for server in servers.values():
            server.wait_ready()
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict[str, ServerProcess], grace: float = 3.0) -> None:
    """SIGTERM every server, wait up to ``grace`` seconds in all, then SIGKILL the rest."""
    running = [s.process for s in servers.values() if s.process and s.process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
