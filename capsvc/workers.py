"""``capsvc serve --workers N``: a supervisor process and N worker processes on one address.

Theory of operation
-------------------
Python runs one core per process, so a server that wants every core runs several
processes (serving-notes §1; uvicorn, gunicorn and hypercorn do the same). The
supervisor binds the listening sockets itself and keeps them open for its whole life; it
starts each worker as a fresh interpreter running the same ``capsvc serve`` command line,
with the worker's sockets passed as inherited file descriptors and ``CAPSVC_WORKER`` in
its environment saying which. A worker wraps them as trio listeners
(:func:`worker_listeners`) and serves them like any server (capsvc.api.serve_listeners):
its own trio loop, its own vat. A client's capabilities live in the worker that
accepted its connection and nowhere else.

Sockets: by default one SO_REUSEPORT socket per worker, all bound to the same port, so
the kernel hashes each new connection to one worker's accept queue and the load spreads
evenly (serving-notes §1: a shared accept queue skews it, 3:1 and worse). A replacement
worker takes over the socket of the worker it replaces, so that socket's queue is served
again, and a socket is never closed while the supervisor runs: no connection queued on it
is reset. ``--shared-socket`` gives every worker one socket instead (any idle worker
accepts; it favours latency over balance), and Unix sockets are always shared (Linux
does not spread Unix connections over SO_REUSEPORT sockets).

Each worker keeps one end of a socketpair, the control line: it writes ``ready LABEL``
once it is serving, and reads ``drain`` (begin a graceful shutdown) or ``stop`` (stop at
once). End of file means the supervisor is gone, and the worker drains. A worker ignores
SIGINT (a terminal's Ctrl-C reaches the whole process group; the supervisor decides) and
takes SIGTERM as ``drain`` however often it comes (systemd signals every process of the
unit at once), so a second signal to the supervisor, not to a worker, stops at once.

Lifecycles (explicit state machines, as capsvc.rpc.lifecycle):

- a worker is STARTING (spawned, not ready), READY, DRAINING (told to drain, or
  replaced), then EXITED (``WORKER_TRANSITIONS``);
- the supervisor's own state is a capsvc.health.ServingState, which its ``/readyz``
  reports: SERVING once every worker of the first generation is ready, DRAINING from the
  first SIGTERM or SIGINT, STOPPED when the last worker exited.

Restarts: a worker that exits while it should be serving is logged with its status and
started again after a back-off (0.1 s, doubling to 10 s; reset once a worker has served
for a minute). A worker of the first generation that exits before it was ever ready
stops the supervisor with an error: the app does not start, and retrying would only loop.
SIGHUP restarts the workers one at a time: a new worker on the same sockets, and once it
is ready the old one drains (``--grace``) while the next is replaced.

Metrics (``--http-port``): the workers write prometheus-client's multiprocess files in a
directory the supervisor made (``PROMETHEUS_MULTIPROC_DIR``), the supervisor serves their
sum on /metrics and marks each exited worker dead (capsvc.metrics).
"""

from __future__ import annotations

import enum
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from capsvc.errors import LocalProtocolError
from capsvc.health import Serving, ServingState
from capsvc.transport.address import Address
from capsvc.transport.fastsocket import FastListener
from capsvc.transport.tcp import TcpListener
from capsvc.transport.tls import ServerTls, TlsListener
from capsvc.transport.unix import remove_stale_socket

__all__ = [
    "WORKER_ENV",
    "WORKER_TRANSITIONS",
    "Supervisor",
    "WorkerControl",
    "WorkerOptions",
    "WorkerState",
    "bind_sockets",
    "cpu_count",
    "worker_control",
    "worker_listeners",
]

log = logging.getLogger("capsvc")

#: The environment variable that makes ``capsvc serve`` a worker: ``CONTROL:FD,FD,...:SLOT``,
#: the control line's descriptor, the listening sockets', and which worker it is.
WORKER_ENV = "CAPSVC_WORKER"
#: How long a worker may take to become ready before it is killed as hung.
READY_TIMEOUT = 60.0
#: Restart back-off: first delay, cap, and how long a worker must serve to reset it.
BACKOFF_FIRST, BACKOFF_MAX, BACKOFF_RESET = 0.1, 10.0, 60.0
#: After the grace period, how long workers get to exit before they are killed.
EXIT_MARGIN = 5.0
#: The listen backlog of each socket (trio's default is the kernel's maximum; say it).
BACKLOG = 1024


def cpu_count() -> int:
    """The cores this process may run on (``--workers auto``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


# ---------------------------------------------------------------------- sockets


async def bind_sockets(address: Address, count: int, *, shared: bool) -> list[list[socket.socket]]:
    """The listening sockets of ``count`` workers: per worker, one socket per address the
    host resolves to. ``shared`` (and every Unix address): the same sockets for all;
    otherwise SO_REUSEPORT sockets of their own, on the port the first one bound."""
    if address.scheme == "unix":
        assert address.path is not None
        await remove_stale_socket(address.path)
        return [_bind_unix(address.path)] * count
    if (
        address.host is None
        or address.port is None
        or address.scheme not in ("tcp", "tls", "capnp")
    ):
        raise ValueError(
            f"--workers cannot listen on {address}: tcp:, tls:, capnp:// or unix: only"
        )
    if shared:
        return [_bind_tcp(address.host, address.port, reuse_port=False)] * count
    first = _bind_tcp(address.host, address.port, reuse_port=True)
    port = first[0].getsockname()[1]
    try:
        rest = [_bind_tcp(address.host, port, reuse_port=True) for _ in range(count - 1)]
    except BaseException:
        for sock in first:
            sock.close()
        raise
    return [first, *rest]


def _bind_tcp(host: str, port: int, *, reuse_port: bool) -> list[socket.socket]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _name, sockaddr in _unique(infos):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and bound[0] is not sock:
                sockaddr = (sockaddr[0], bound[0].getsockname()[1], *sockaddr[2:])
            sock.bind(sockaddr)
            sock.listen(BACKLOG)
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


def _unique(infos: list[Any]) -> list[Any]:
    """getaddrinfo's answers, one per socket address (it may repeat one per protocol)."""
    unique: dict[Any, Any] = {}
    for info in infos:
        unique.setdefault(info[4], info)
    return list(unique.values())


def _bind_unix(path: str) -> list[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return [sock]


def worker_listeners(
    fds: Sequence[int], address: Address, *, nodelay: bool, tls: ServerTls | None
) -> list[trio.abc.Listener[trio.abc.Stream]]:
    """A worker's listeners over the sockets it inherited, wrapped as
    capsvc.transport.open_listeners wraps the sockets it binds (TLS for tls: and capnp://)."""
    if address.uses_tls:
        if tls is None:
            raise ValueError(f"listening on {address} needs the server's key (--tls-key)")
        if address.fingerprint is not None and address.fingerprint != tls.fingerprint:
            raise ValueError(
                f"cannot listen on {address}: the address pins {address.fingerprint}, but "
                f"the server's key is {tls.fingerprint}"
            )
    listeners: list[trio.abc.Listener[trio.abc.Stream]] = []
    for fd in fds:
        sock = trio.socket.from_stdlib_socket(socket.socket(fileno=fd))
        inner = trio.SocketListener(sock)
        if sock.family == socket.AF_UNIX:
            # Not capsvc's UnixListener: its close removes the socket file, which is the
            # supervisor's to remove.
            listeners.append(FastListener(inner))
        elif tls is not None and address.uses_tls:
            listeners.append(TlsListener(TcpListener(inner, nodelay=nodelay), tls, address.scheme))
        else:
            listeners.append(FastListener(TcpListener(inner, nodelay=nodelay)))
    return listeners


# ---------------------------------------------------------------------- the worker's side


class WorkerControl:
    """A worker's end of the control line (module docstring)."""

    def __init__(self, control_fd: int, listen_fds: list[int], slot: int = 0) -> None:
        #: Which worker this is (0..N-1; a replacement gets the slot it replaces).
        self.slot = slot
        self.control_fd = control_fd
        self.listen_fds = listen_fds
        self._stream: trio.SocketStream | None = None

    def _open(self) -> trio.SocketStream:
        if self._stream is None:
            sock = socket.socket(fileno=self.control_fd)
            self._stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        return self._stream

    async def ready(self, label: str) -> None:
        """Tell the supervisor this worker serves (``label``: what it serves)."""
        await self._open().send_all(f"ready {label}\n".encode())

    async def follow(self, drain: trio.Event, stop: trio.CancelScope) -> None:
        """Obey the supervisor until the line closes: ``drain`` sets ``drain``, ``stop``
        cancels ``stop``; end of file (the supervisor is gone) sets ``drain``."""
        stream = self._open()
        buffer = b""
        while True:
            try:
                data = await stream.receive_some(4096)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                if not drain.is_set():
                    log.warning("worker %d: the supervisor is gone: draining", os.getpid())
                drain.set()
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line == b"drain":
                    drain.set()
                elif line == b"stop":
                    stop.cancel()


def worker_control() -> WorkerControl | None:
    """This process's control line if it is a worker (``CAPSVC_WORKER`` is set), else None."""
    value = os.environ.get(WORKER_ENV)
    if not value:
        return None
    try:
        control, fds, slot = value.split(":")
        return WorkerControl(int(control), [int(fd) for fd in fds.split(",") if fd], int(slot))
    except ValueError:
        raise ValueError(f"{WORKER_ENV}={value!r} is not CONTROL:FD,FD,...:SLOT") from None


# ---------------------------------------------------------------------- the supervisor


class WorkerState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    EXITED = "exited"


class WorkerInput(enum.Enum):
    READY = "it said it is ready"
    DRAIN = "it was told to drain"
    EXIT = "it exited"


W, WI = WorkerState, WorkerInput
#: Every legal move of a worker (module docstring). DRAIN repeats harmlessly (a SIGTERM
#: during a rolling restart), and a worker may exit from any state.
WORKER_TRANSITIONS: dict[WorkerState, dict[WorkerInput, WorkerState]] = {
    W.STARTING: {WI.READY: W.READY, WI.DRAIN: W.DRAINING, WI.EXIT: W.EXITED},
    W.READY: {WI.DRAIN: W.DRAINING, WI.EXIT: W.EXITED},
    W.DRAINING: {WI.DRAIN: W.DRAINING, WI.READY: W.DRAINING, WI.EXIT: W.EXITED},
    W.EXITED: {WI.DRAIN: W.EXITED},
}


@dataclass(eq=False)  # each worker is itself (kept in sets)
class _Worker:
    slot: int
    generation: int
    process: trio.Process
    control: trio.SocketStream
    state: WorkerState = WorkerState.STARTING
    ready: trio.Event = field(default_factory=trio.Event)
    exited: trio.Event = field(default_factory=trio.Event)
    label: str = ""
    ready_at: float | None = None
    started_at: float = field(default_factory=trio.current_time)
    #: Whether it replaces a worker that exited (its readiness is logged at INFO).
    restart: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def step(self, event: WorkerInput) -> None:
        following = WORKER_TRANSITIONS[self.state].get(event)
        if following is None:
            raise LocalProtocolError(f"worker {self.pid} {self.state.value}: {event.value}")
        self.state = following


@dataclass(frozen=True)
class WorkerOptions:
    """What the supervisor needs to know of ``capsvc serve``'s command line."""

    count: int
    #: The ``capsvc`` arguments every worker runs (the supervisor's own command line).
    argv: list[str]
    address: Address
    shared_socket: bool = False
    grace: float = 30.0
    #: ``(host, port)`` of the side HTTP listener, served by the supervisor.
    http: tuple[str, int] | None = None


class StartupFailed(Exception):
    """A worker of the first generation exited before it was ready."""


class Supervisor:
    """Runs the workers (module docstring); ``run`` returns when they all exited."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.state = ServingState()
        self.sockets: list[list[socket.socket]] = []
        self.current: dict[int, _Worker] = {}
        self.everyone: set[_Worker] = set()
        self.generation = 0
        self.backoff: dict[int, float] = {}
        self.metrics_dir: str | None = None
        self.bound = ""
        #: The side HTTP listener (capsvc.probes.HttpProbes) once ``run`` opened it.
        self.probes: Any = None
        self._nursery: trio.Nursery | None = None
        self._startup_failure: str | None = None

    # -- life
    async def run(self, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind, start the workers, supervise them until a signal, drain, return.
        ``task_status.started`` receives the label of what the workers serve."""
        options = self.options
        self.sockets = await bind_sockets(
            options.address, options.count, shared=options.shared_socket
        )
        self.bound = _bound_address(options.address, self.sockets[0][0])
        try:
            if options.http is not None:
                self.probes = self._start_probes(*options.http)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
                async with trio.open_nursery() as nursery:
                    self._nursery = nursery
                    label = await self._start_first_generation()
                    if label is not None:
                        self.state.serve()
                        task_status.started(label)
                        nursery.start_soon(self._follow_signals, signals, nursery)
                        await self._all_exited()
                    nursery.cancel_scope.cancel()
        finally:
            self.state.stop()
            await self._kill_all()
            if self.probes is not None:
                await trio.to_thread.run_sync(self.probes.close)
            self._close_sockets()
            if self.metrics_dir is not None:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)
        if self._startup_failure is not None:
            raise StartupFailed(self._startup_failure)

    def _start_probes(self, host: str, port: int) -> Any:
        from capsvc import metrics
        from capsvc.probes import start_http

        self.metrics_dir = tempfile.mkdtemp(prefix="capsvc-metrics-")
        metrics.reset_multiproc_dir(self.metrics_dir)
        return start_http(host, port, self.state, metrics.registry_for_scrape(self.metrics_dir))

    async def _start_first_generation(self) -> str | None:
        """Start every worker and wait until all are ready: the label of what they serve,
        or None (``_startup_failure`` says why) if one exited first or they took too long."""
        workers = [await self._spawn(slot) for slot in range(self.options.count)]
        with trio.move_on_after(READY_TIMEOUT) as waiting:
            for worker in workers:
                await _first(worker.ready, worker.exited)
                if worker.state is WorkerState.EXITED:
                    self._startup_failure = (
                        f"worker {worker.slot} (pid {worker.pid}) exited with status "
                        f"{worker.process.returncode} before it was ready (its errors are above)"
                    )
                    break
        if waiting.cancelled_caught:
            self._startup_failure = f"the workers were not ready within {READY_TIMEOUT:g} s"
        if self._startup_failure is not None:
            await self._kill_all()
            return None
        log.info(
            "%d workers ready (pids %s), %s",
            len(workers),
            ", ".join(str(worker.pid) for worker in workers),
            "one shared socket" if self.shared else "one SO_REUSEPORT socket each",
        )
        return workers[0].label

    @property
    def shared(self) -> bool:
        """Whether the workers accept on one socket (``--shared-socket``, Unix addresses)."""
        return self.options.count > 1 and self.sockets[0] is self.sockets[1]

    async def _spawn(self, slot: int) -> _Worker:
        assert self._nursery is not None
        ours, theirs = socket.socketpair()
        listen_fds = [sock.fileno() for sock in self.sockets[slot]]
        env = dict(os.environ)
        env[WORKER_ENV] = f"{theirs.fileno()}:{','.join(map(str, listen_fds))}:{slot}"
        if self.metrics_dir is not None:
            env["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "capsvc", *self.options.argv],
                env=env,
                pass_fds=(theirs.fileno(), *listen_fds),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.generation += 1
        worker = _Worker(
            slot,
            self.generation,
            process,
            trio.SocketStream(trio.socket.from_stdlib_socket(ours)),
        )
        self.current[slot] = worker
        self.everyone.add(worker)
        self._nursery.start_soon(self._watch, worker)
        self._nursery.start_soon(self._ready_deadline, worker)
        log.debug("worker %d started (pid %d)", slot, worker.pid)
        return worker

    async def _watch(self, worker: _Worker) -> None:
        """Read the worker's control line until it exits, then restart it if it should."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_control, worker)
            await worker.process.wait()
            nursery.cancel_scope.cancel()
        worker.step(WorkerInput.EXIT)
        worker.control.socket.close()
        if self.metrics_dir is not None:
            from capsvc import metrics

            metrics.mark_worker_dead(worker.pid, self.metrics_dir)
        status = worker.process.returncode
        replaced = self.current.get(worker.slot) is not worker
        expected = replaced or self.state.state in (Serving.DRAINING, Serving.STOPPED)
        if expected:
            log.info("worker %d (pid %d) exited with status %s", worker.slot, worker.pid, status)
        # Set only now: the supervisor may end as soon as the last worker's event is set.
        worker.exited.set()
        self.everyone.discard(worker)  # a crash loop must not grow the set for ever
        if expected or self.state.state is Serving.STARTING:
            return  # (STARTING: the first generation's failure, reported by the starter)
        delay = self._next_backoff(worker)
        log.warning(
            "worker %d (pid %d) exited with status %s; restarting it in %g s",
            worker.slot,
            worker.pid,
            _describe_status(status),
            delay,
        )
        await trio.sleep(delay)
        if self.current.get(worker.slot) is worker and self.state.ready:
            replacement = await self._spawn(worker.slot)
            replacement.restart = True

    async def _ready_deadline(self, worker: _Worker) -> None:
        """Kill a worker that neither becomes ready nor exits in READY_TIMEOUT (a hang in
        the app's start-up); its exit then counts as any other."""
        with trio.move_on_after(READY_TIMEOUT):
            await _first(worker.ready, worker.exited)
        if worker.state is WorkerState.STARTING:
            log.warning(
                "worker %d (pid %d) not ready after %g s: killing it",
                worker.slot,
                worker.pid,
                READY_TIMEOUT,
            )
            worker.process.kill()

    def _next_backoff(self, worker: _Worker) -> float:
        served = trio.current_time() - worker.ready_at if worker.ready_at is not None else 0.0
        if served >= BACKOFF_RESET:
            self.backoff.pop(worker.slot, None)
        delay = self.backoff.get(worker.slot, BACKOFF_FIRST)
        self.backoff[worker.slot] = min(delay * 2, BACKOFF_MAX)
        return delay

    async def _read_control(self, worker: _Worker) -> None:
        buffer = b""
        while True:
            try:
                data = await worker.control.receive_some(4096)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.startswith(b"ready"):
                    worker.label = line[6:].decode(errors="replace")
                    worker.ready_at = trio.current_time()
                    worker.step(WorkerInput.READY)
                    worker.ready.set()
                    log.log(
                        logging.INFO if worker.restart else logging.DEBUG,
                        "worker %d (pid %d) ready %.2f s after it was started",
                        worker.slot,
                        worker.pid,
                        worker.ready_at - worker.started_at,
                    )

    async def _tell(self, worker: _Worker, command: str) -> None:
        if command == "drain":
            worker.step(WorkerInput.DRAIN)
        if worker.state is WorkerState.EXITED:
            return
        try:
            await worker.control.send_all(f"{command}\n".encode())
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # it exited meanwhile: _watch sees to it

    # -- signals
    async def _follow_signals(self, signals: Any, nursery: trio.Nursery) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP:
                if self.state.ready:
                    nursery.start_soon(self._rolling_restart)
                continue
            if self.state.ready:
                log.info(
                    "received %s: draining %d workers (calls in flight get %g s; %s again "
                    "stops at once)",
                    name,
                    len(self._live()),
                    self.options.grace,
                    name,
                )
                nursery.start_soon(self._drain_all)
            else:
                log.warning("received %s again: stopping the workers now", name)
                for worker in self._live():
                    await self._tell(worker, "stop")

    def _live(self) -> list[_Worker]:
        return [worker for worker in self.everyone if worker.state is not WorkerState.EXITED]

    async def _drain_all(self) -> None:
        self.state.drain()
        for worker in self._live():
            await self._tell(worker, "drain")
        # Each worker closes its listeners as it stops accepting (after its drain delay);
        # our copies would keep the sockets listening, and connections would queue where
        # nobody accepts them until we exit. Without ours, the last worker to stop
        # accepting closes the socket and new clients are refused, as with one process.
        self._close_sockets(unlink=False)
        # Workers abort what is left at their grace deadline; one that hangs beyond it
        # (a method that ignores cancellation) is killed.
        with trio.move_on_after(self.options.grace + EXIT_MARGIN):
            await self._all_exited()
        if self._live():
            log.warning(
                "workers still running %g s after the grace period: killing them", EXIT_MARGIN
            )
            await self._kill_all()

    async def _rolling_restart(self) -> None:
        """SIGHUP: replace each worker in turn (module docstring)."""
        log.info("received SIGHUP: restarting %d workers one at a time", self.options.count)
        for slot in range(self.options.count):
            if not self.state.ready:
                return
            old = self.current.get(slot)
            new = await self._spawn(slot)
            with trio.move_on_after(READY_TIMEOUT):
                await _first(new.ready, new.exited)
            if new.state is not WorkerState.READY:
                log.warning(
                    "rolling restart: the new worker %d (pid %d) did not become ready; "
                    "keeping the old one",
                    slot,
                    new.pid,
                )
                if old is not None and old.state is not WorkerState.EXITED:
                    self.current[slot] = old
                await self._tell(new, "stop")
                return
            if old is not None:
                await self._tell(old, "drain")
        log.info("rolling restart done")

    async def _all_exited(self) -> None:
        while live := self._live():
            await live[0].exited.wait()

    async def _kill_all(self) -> None:
        for worker in self._live():
            try:
                worker.process.kill()
            except ProcessLookupError:
                pass
        with trio.move_on_after(EXIT_MARGIN) as scope:
            scope.shield = True
            for worker in list(self.everyone):
                await worker.process.wait()

    def _close_sockets(self, *, unlink: bool = True) -> None:
        """Close our listening sockets (again: closing twice is harmless); ``unlink``
        removes a Unix socket's file too (at the very end)."""
        for group in self.sockets:
            for sock in group:
                sock.close()
        if unlink and self.options.address.scheme == "unix" and self.options.address.path:
            try:
                os.unlink(self.options.address.path)
            except OSError:
                pass


async def _first(*events: trio.Event) -> None:
    """Wait until any of ``events`` is set."""
    async with trio.open_nursery() as nursery:
        for event in events:

            async def wait(event: trio.Event = event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait)


def _describe_status(status: int | None) -> str:
    if status is not None and status < 0:
        return f"{status} ({signal.Signals(-status).name})"
    return str(status)


def _bound_address(address: Address, sock: socket.socket) -> str:
    if address.scheme == "unix":
        return str(address)
    host, port = sock.getsockname()[:2]
    if address.scheme == "capnp":
        return str(
            Address(
                "capnp",
                host=host,
                port=port,
                fingerprint=address.fingerprint,
                insecure=address.insecure,
            )
        )
    return str(Address(address.scheme, host=host, port=port))
