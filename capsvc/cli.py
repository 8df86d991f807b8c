"""The ``capsvc`` command line: serve an app (or the demo), call the demo from the shell.

Theory of operation
-------------------
:func:`main` parses arguments with argparse and dispatches to one function per
subcommand; each returns the process exit status (0 success, 1 runtime failure such as a
refused connection or a failed call, 2 usage errors such as a bad address or an APP that
cannot be imported). ``capsvc`` (the console script), ``python -m capsvc`` and
``python -m capsvc.cli`` all end up here.

``serve`` resolves the bootstrap object *before* entering trio (so import errors are
reported plainly), then runs :func:`capsvc.serve` under trio with a signal receiver for
SIGINT and SIGTERM opened first: the first signal cancels the server, the process prints
``capsvc: stopped`` and exits 0. When the listener is bound, one line goes to stdout,
containing ``listening on ADDRESS`` with the address actually bound (the kernel's port for
``tcp:HOST:0``), so scripts and tests can find the server. Logging goes to stderr.

``call`` (alias ``demo-client``) connects to a calculator (the demo served by ``capsvc
serve``, or any conforming Calculator such as the C++ sample) and either runs the tour of
:func:`capsvc.demo.run_tour` or evaluates an infix expression given on the command line.

New subcommands register in :func:`build_parser`, in the marked block (``gen`` and ``nic``
are planned there, see DESIGN.md "Commands").
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from capsvc.limits import DEFAULT_GRACE, DEFAULT_MAX_CONNECTIONS

if TYPE_CHECKING:
    from capsvc.transport.address import Address

log = logging.getLogger("capsvc.cli")

DEFAULT_ADDRESS = "tcp:127.0.0.1:4000"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """A problem with what the user asked for (exit status 2)."""


def version() -> str:
    """capsvc's version: from the installed distribution, else from the source pyproject."""
    from importlib import metadata

    try:
        return metadata.version("capsvc")
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        import tomllib

        with pyproject.open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
    except (OSError, KeyError, ValueError):
        return "unknown"


def _run_trio(function: Callable[..., Awaitable[None]], *args: Any) -> None:
    """``trio.run``, re-raising a lone error out of any ExceptionGroups nurseries made."""
    try:
        trio.run(function, *args)
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from group
        raise


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            found.extend(_leaves(error))
        else:
            found.append(error)
    return found


def _os_reason(error: OSError) -> str:
    """The most specific text for ``error`` (trio hides "Connection refused" in __cause__)."""
    candidates: list[BaseException] = [error]
    if isinstance(error.__cause__, BaseExceptionGroup):
        candidates += _leaves(error.__cause__)
    for candidate in candidates:
        if isinstance(candidate, OSError) and candidate.errno:
            return os.strerror(candidate.errno)
    return str(error)


def _say(text: str) -> None:
    """One line to stdout, flushed at once (other programs may be waiting for it)."""
    print(text, flush=True)


def _error(text: str) -> None:
    print(f"capsvc: error: {text}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- serve
def load_app(spec: str, app_dir: str | None = ".") -> Any:
    """The object named by ``module:attr`` (``attr`` may be dotted).

    ``app_dir`` is put first on ``sys.path`` so that modules beside the user are found even
    when capsvc runs as a console script.

    Raises:
        UsageError: a malformed spec, a module that cannot be imported, a missing attribute.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"APP must look like module:factory, got {spec!r}")
    if app_dir is not None:
        directory = os.path.abspath(app_dir)
        if directory not in sys.path:
            sys.path.insert(0, directory)
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import {module_name!r}: {error}") from error
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    return target


async def _make_bootstrap(target: Any, spec: str) -> Any:
    """A Server instance from ``target``: the instance itself, or what a factory returns."""
    from capsvc.server import Server
    from capsvc.typed import Server as TypedServer

    servers = (Server, TypedServer)  # dynamic (load_schema) or generated (capsvc gen)
    if isinstance(target, servers):
        return target
    if not callable(target):
        raise UsageError(f"{spec} is neither a capsvc.Server instance nor a factory")
    made = target()
    if inspect.isawaitable(made):
        made = await made
    if not isinstance(made, servers):
        raise UsageError(
            f"{spec}() returned {type(made).__name__}, not a server object"
            " (a capsvc.Server, or a subclass of a generated Interface.Server)"
        )
    return made


def _describe(bootstrap: Any) -> str:
    info = getattr(bootstrap, "_capsvc_interface", None)
    name = type(bootstrap).__name__
    if info is not None:
        return f"{name} ({info.name})"
    generated = getattr(bootstrap, "_INTERFACE_NAME", None)  # set on generated Servers
    return f"{name} ({generated})" if generated else name


async def _serve(address: str, target: Any, spec: str | None, options: ServeOptions) -> None:
    """Serve until a signal: the first SIGTERM or SIGINT drains (calls in flight get
    ``--grace`` seconds), a second one stops at once. As a worker of ``--workers``, the
    supervisor's control line says when instead (capsvc.workers)."""
    from capsvc.api import serve_listeners
    from capsvc.health import ServingState
    from capsvc.transport import open_listeners
    from capsvc.workers import worker_control, worker_listeners

    worker = worker_control()
    watched = (signal.SIGTERM,) if worker is not None else (signal.SIGINT, signal.SIGTERM)
    with trio.open_signal_receiver(*watched) as signals:
        if spec is None:
            bootstrap: Any = target
            label = "the Calculator demo"
        else:
            bootstrap = await _make_bootstrap(target, spec)
            label = _describe(bootstrap)
        addr = options.address
        if worker is not None:
            listeners = worker_listeners(worker.listen_fds, addr, nodelay=True, tls=options.tls)
        else:
            listeners = await open_listeners(addr, tls=options.tls)
        shutdown = trio.Event()
        state = ServingState()
        probes = _start_probes(options, state) if worker is None else None
        try:
            async with trio.open_nursery() as nursery:

                async def run_server(task_status: trio.TaskStatus[str]) -> None:
                    await serve_listeners(
                        listeners,
                        bootstrap,
                        shutdown=shutdown,
                        serving=state,
                        task_status=task_status,
                        **options.serve_kwargs(),
                    )
                    nursery.cancel_scope.cancel()  # drained: stop watching for signals

                bound = await nursery.start(run_server)
                if worker is not None:
                    await worker.ready(label)
                    nursery.start_soon(worker.follow, shutdown, nursery.cancel_scope)
                else:
                    if probes is not None:  # first: see _supervise
                        _say(f"capsvc: probes on {probes.url} (/healthz, /readyz, /metrics)")
                    _say(f"capsvc: serving {label}, listening on {bound} (Ctrl-C to stop)")
                nursery.start_soon(_on_signals, signals, shutdown, nursery, options, worker)
        finally:
            if probes is not None:
                await trio.to_thread.run_sync(probes.close)


async def _on_signals(
    signals: Any,
    shutdown: trio.Event,
    nursery: trio.Nursery,
    options: ServeOptions,
    worker: Any,
) -> None:
    async for signum in signals:
        name = signal.Signals(signum).name
        if not shutdown.is_set():
            log.info(
                "received %s: draining (calls in flight get %g s; %s again stops at once)",
                name,
                options.grace,
                name if worker is None else "the supervisor's 'stop'",
            )
            shutdown.set()
        elif worker is None:
            log.warning("received %s again: stopping now", name)
            nursery.cancel_scope.cancel()
        # A worker: every process of a service may get the signal at once (systemd);
        # only the supervisor's "stop" stops a worker at once.


def _start_probes(options: ServeOptions, state: Any) -> Any:
    """The side HTTP listener of ``--http-port``, with metrics enabled (None without)."""
    if options.http is None:
        return None
    from capsvc import metrics
    from capsvc.probes import start_http

    metrics.enable()
    return start_http(*options.http, state, metrics.registry_for_scrape(None))


@dataclass(frozen=True)
class ServeOptions:
    """What ``capsvc serve`` was asked for, checked (cmd_serve)."""

    address: Address
    limits: Any
    max_connections: int
    access_log: bool
    grace: float
    drain_delay: float
    busy_poll: bool
    health: bool
    tls: Any
    http: tuple[str, int] | None

    def serve_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of capsvc.api.serve_listeners."""
        from capsvc.transport.busypoll import DEFAULT_BUDGET

        return {
            "limits": self.limits,
            "max_connections": self.max_connections,
            "access_log": self.access_log,
            "grace": self.grace,
            "drain_delay": self.drain_delay,
            "busy_poll": DEFAULT_BUDGET if self.busy_poll else None,
            "health": self.health,
        }


def cmd_serve(args: argparse.Namespace) -> int:
    """``capsvc serve [APP] [--listen ADDR] [--workers N]``."""
    from capsvc.transport import parse_address
    from capsvc.workers import worker_control

    try:
        address = parse_address(args.listen)
    except ValueError as error:
        raise UsageError(str(error)) from None
    limits = _limits(args.limit)
    if args.max_connections < 1:
        raise UsageError(f"--max-connections must be at least 1, got {args.max_connections}")
    if args.grace < 0:
        raise UsageError(f"--grace must be at least 0 seconds, got {args.grace:g}")
    if args.drain_delay < 0:
        raise UsageError(f"--drain-delay must be at least 0 seconds, got {args.drain_delay:g}")
    workers = _workers(args.workers)
    if workers > 1 and address.scheme not in ("tcp", "tls", "capnp", "unix"):
        raise UsageError(
            f"--workers serves tcp:, tls:, capnp:// and unix: addresses, not {address.scheme}:"
        )
    http = _http_address(args)
    tls = _server_tls(args, address.uses_tls)
    if tls is not None and address.fingerprint and address.fingerprint != tls.fingerprint:
        raise UsageError(
            f"--listen pins {address.fingerprint}, but the key in {args.tls_key} is "
            f"{tls.fingerprint}"
        )
    options = ServeOptions(
        address=address,
        limits=limits,
        max_connections=args.max_connections,
        access_log=args.access_log or getattr(args, "verbose", 0) > 0,  # -v: calls too
        grace=args.grace,
        drain_delay=args.drain_delay,
        busy_poll=not args.no_busy_poll,
        health=not args.no_health,
        tls=tls,
        http=http,
    )
    worker = worker_control()
    if worker is None and workers > 1:
        return _supervise(args, options, workers)
    if worker is not None:
        # A worker: Ctrl-C in a terminal reaches the whole process group, and the
        # supervisor decides what it means (capsvc.workers).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if http is not None:
            from capsvc import metrics

            metrics.enable()  # into the supervisor's PROMETHEUS_MULTIPROC_DIR
    if args.app is None:
        from capsvc import demo

        target: Any = demo.bootstrap()
    else:
        target = load_app(args.app, args.app_dir)
    try:
        _run_trio(_serve, args.listen, target, args.app, options)
    except OSError as error:
        _error(f"cannot listen on {args.listen}: {_os_reason(error)}")
        return EXIT_FAILURE
    if worker is None:
        _say("capsvc: stopped")
    return EXIT_OK


def _supervise(args: argparse.Namespace, options: ServeOptions, workers: int) -> int:
    """``--workers N`` (N > 1): this process supervises N worker processes."""
    from capsvc.workers import StartupFailed, Supervisor, WorkerOptions

    supervisor = Supervisor(
        WorkerOptions(
            count=workers,
            argv=list(args.argv),
            address=options.address,
            shared_socket=args.shared_socket,
            grace=options.grace,
            http=options.http,
        )
    )

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            label = await nursery.start(supervisor.run)
            how = "one shared socket" if supervisor.shared else "SO_REUSEPORT"
            # The probes' line first: whoever waits for "listening on" then has both.
            if supervisor.probes is not None:
                _say(f"capsvc: probes on {supervisor.probes.url} (/healthz, /readyz, /metrics)")
            _say(
                f"capsvc: serving {label}, listening on {supervisor.bound} with {workers} "
                f"workers ({how}; Ctrl-C to stop)"
            )

    try:
        _run_trio(run)
    except StartupFailed as error:
        _error(str(error))
        return EXIT_FAILURE
    except OSError as error:
        _error(f"cannot listen on {args.listen}: {_os_reason(error)}")
        return EXIT_FAILURE
    _say("capsvc: stopped")
    return EXIT_OK


def _workers(value: str) -> int:
    """``--workers N`` or ``auto`` (one per core this process may use)."""
    from capsvc.workers import cpu_count

    if value == "auto":
        return cpu_count()
    try:
        count = int(value)
    except ValueError:
        raise UsageError(f"--workers takes a number or 'auto', got {value!r}") from None
    if count < 1:
        raise UsageError(f"--workers must be at least 1, got {count}")
    return count


def _http_address(args: argparse.Namespace) -> tuple[str, int] | None:
    """``(host, port)`` of ``--http-port``/``--http-host``, or None without a port."""
    if args.http_port is None:
        if args.http_host is not None:
            raise UsageError("--http-host goes with --http-port")
        return None
    if not 0 <= args.http_port <= 65535:
        raise UsageError(f"--http-port must be 0..65535, got {args.http_port}")
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise UsageError(
            "--http-port serves /metrics with prometheus-client: pip install 'capsvc[metrics]'"
        ) from None
    return (args.http_host or "127.0.0.1", args.http_port)


def _server_tls(args: argparse.Namespace, uses_tls: bool) -> Any:
    """``ServerTls`` from ``--tls-key``/``--tls-cert`` for a tls: or capnp:// address."""
    if not uses_tls:
        if args.tls_key or args.tls_cert:
            raise UsageError("--tls-key/--tls-cert need a tls: or capnp:// --listen address")
        return None
    if not args.tls_key:
        raise UsageError(
            f"listening on {args.listen} needs --tls-key FILE (make one with `capsvc keygen`)"
        )
    from capsvc.transport.tls import ServerTls

    try:
        return ServerTls(args.tls_key, args.tls_cert)
    except (OSError, ValueError) as error:
        raise UsageError(f"cannot use --tls-key {args.tls_key}: {error}") from None


def cmd_health(args: argparse.Namespace) -> int:
    """``capsvc health ADDR``: 0 iff the server reports serving (capsvc.health)."""
    from capsvc.health import main_health

    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0 seconds, got {args.timeout:g}")
    return main_health(args.address, args.service, args.timeout)


def cmd_keygen(args: argparse.Namespace) -> int:
    """``capsvc keygen FILE``: a new server key; prints its capnp:// fingerprint."""
    from capsvc.keys import generate_key

    try:
        fingerprint = generate_key(args.file)
    except (OSError, ValueError) as error:
        _error(f"cannot write {args.file}: {error}")
        return EXIT_FAILURE
    print(fingerprint)
    _say(
        f"capsvc: wrote {args.file}; serve with --tls-key {args.file} --listen "
        f"'capnp://{fingerprint}@HOST:PORT' and connect to that address"
    )
    return EXIT_OK


def _limits(settings: list[str]) -> Any:
    """``capsvc.Limits`` from ``--limit NAME=VALUE`` flags (the defaults for the rest)."""
    from capsvc.limits import Limits, parse_limit

    changes: dict[str, Any] = {}
    try:
        for text in settings:
            name, value = parse_limit(text)
            changes[name] = value
        return Limits(**changes)
    except ValueError as error:
        raise UsageError(str(error)) from None


# ------------------------------------------------------------------------------ call
#: The schemes a first word of ``capsvc call`` is taken as an address for.
_ADDRESS_SCHEMES = ("tcp", "unix", "nic")


class _IntermixedParser(argparse.ArgumentParser):
    """A parser whose options may come between its positionals (``call ADDR --schema FILE
    Interface.method x=1``): plain argparse matches a ``*`` positional once, so the words
    after an option would be "unrecognized arguments"."""

    _intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._intermixing:  # parse_known_intermixed_args calls back in: the plain parse
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


async def _call(address: str, expressions: Sequence[str]) -> None:
    import capsvc
    from capsvc import demo

    text = " ".join(expressions).strip()
    if text:
        demo.parse_infix(text)  # syntax errors before any connection
    async with capsvc.connect(address) as conn:
        calc = conn.bootstrap(demo.CALCULATOR)
        if text:
            value = await demo.evaluate_infix(calc, text)
            _say(f"{text} = {demo.format_number(value)}")
            return
        _say(f"capsvc: calculator tour against {address}")
        await demo.run_tour(calc, _say)


async def _call_schema(address: str, plan: Any, compact: bool) -> None:
    from capsvc import caller

    results = await caller.run_calls(address, plan)
    _say(caller.to_json(results, compact=compact))


def _call_address(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The address (``--connect``, or a first word that looks like one) and the rest."""
    words = list(args.words)
    address: str | None = args.connect
    if words and words[0].partition(":")[0].lower() in _ADDRESS_SCHEMES and ":" in words[0]:
        if address is not None and address != words[0]:
            raise UsageError(f"two addresses given ({address} and {words[0]}): give one")
        address = words.pop(0)
    return address or DEFAULT_ADDRESS, words


def _plan_call(args: argparse.Namespace, words: list[str]) -> Any:
    """Check ``Interface.method field=value ...`` against ``--schema`` (no connection yet)."""
    from capsvc import caller

    if not words:
        raise UsageError("--schema FILE needs Interface.method (and its field=value arguments)")
    try:
        module = caller.load(args.schema, args.import_path)
        return caller.plan_call(module, words[0], words[1:], args.schema)
    except caller.CallerUsageError as error:
        raise UsageError(str(error)) from None


def _schema_hint(error: ValueError, words: Sequence[str]) -> str:
    """The demo's parse error, plus a hint when the words look like a method call."""
    looks_like_call = any("=" in word or "." in word.strip("0123456789.") for word in words)
    if looks_like_call:
        return f"{error} (to call a method, give the schema: --schema FILE Interface.method)"
    return str(error)


def cmd_call(args: argparse.Namespace) -> int:
    """``capsvc call [ADDR] [EXPR...]`` (the calculator demo), or ``capsvc call [ADDR]
    --schema FILE Interface.method [field=value ...] [field.method [field=value ...]]...``."""
    import capsvc
    from capsvc.transport import parse_address

    address, words = _call_address(args)
    try:
        parse_address(address)
    except ValueError as error:
        raise UsageError(str(error)) from None
    function: Callable[..., Awaitable[None]]
    call_args: tuple[Any, ...]
    if args.schema is None:
        if args.import_path or args.compact:
            raise UsageError("-I/--import-path and --compact go with --schema FILE")
        function, call_args = _call, (address, words)
    else:
        try:
            plan = _plan_call(args, words)
        except capsvc.SchemaError as error:  # as for `capsvc gen`: the compiler's message
            _error(str(error))
            return EXIT_FAILURE
        function, call_args = _call_schema, (address, plan, args.compact)
    try:
        _run_trio(function, *call_args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ValueError as error:
        raise UsageError(_schema_hint(error, words)) from None
    except OSError as error:
        _error(f"cannot connect to {address}: {_os_reason(error)}")
        return EXIT_FAILURE
    except capsvc.RpcError as error:
        _error(f"call failed ({type(error).__name__}): {error.reason}")
        return EXIT_FAILURE
    return EXIT_OK


def cmd_describe(args: argparse.Namespace) -> int:
    """``capsvc describe FILE [-I DIR]... [--json]``."""
    import capsvc
    from capsvc import caller

    try:
        module = caller.load(args.schema, args.import_path)
    except caller.CallerUsageError as error:
        raise UsageError(str(error)) from None
    except capsvc.SchemaError as error:
        _error(str(error))
        return EXIT_FAILURE
    if args.json:
        _say(caller.to_json(caller.describe_json(module)))
    else:
        _say(caller.describe_text(module))
    return EXIT_OK


# ---------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``capsvc`` command (every subcommand registered)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log more (-v: debug)",
    )

    parser = argparse.ArgumentParser(
        prog="capsvc",
        description="Cap'n Proto RPC services on trio.",
        parents=[common],
    )
    # No set_defaults(verbose=...) here: it would set the default of the shared -v action,
    # and a subcommand's parser would then reset a `capsvc -v serve` to that default.
    parser.add_argument("--version", action="version", version=f"capsvc {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        parents=[common],
        help="serve an app, or the calculator demo",
        description="Serve APP's bootstrap object; with no APP, the calculator demo.",
    )
    serve.add_argument(
        "app",
        nargs="?",
        metavar="APP",
        help="module:factory (called for the bootstrap object) or module:instance",
    )
    serve.add_argument(
        "--listen",
        default=DEFAULT_ADDRESS,
        metavar="ADDR",
        help="address to listen on: tcp:HOST:PORT, unix:PATH, tls:HOST:PORT or "
        f"capnp://sha-256:FINGERPRINT@HOST:PORT (default {DEFAULT_ADDRESS})",
    )
    serve.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="directory put first on sys.path to import APP from (default: .)",
    )
    serve.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set one of capsvc.Limits for every connection, e.g. max_answers=1000 or "
        "idle_timeout=300 (a timeout: seconds, or none); repeat for more. The names and "
        "defaults are in the README, 'Limits and timeouts'",
    )
    serve.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"connections held at once; more are refused (default {DEFAULT_MAX_CONNECTIONS})",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log a line per call (logger capsvc.access, INFO): peer, Interface.method, "
        "duration, outcome (on with -v too)",
    )
    serve.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE,
        metavar="SECONDS",
        help="on SIGTERM or Ctrl-C, how long calls in flight get to finish before what is "
        f"left is aborted (default {DEFAULT_GRACE:g}); a second signal stops at once",
    )
    serve.add_argument(
        "--drain-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="on SIGTERM, keep accepting for this long after /readyz turns false, for load "
        "balancers that learn of the shutdown late (default 0)",
    )
    serve.add_argument(
        "--workers",
        default="1",
        metavar="N",
        help="worker processes, each its own vat and trio loop, behind one listening "
        "address; 'auto': one per core (default 1: this process serves)",
    )
    serve.add_argument(
        "--shared-socket",
        action="store_true",
        help="with --workers: one listening socket all workers accept on, instead of one "
        "SO_REUSEPORT socket each (README 'Running in production')",
    )
    serve.add_argument(
        "--http-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve /healthz, /readyz and /metrics (Prometheus) over HTTP on this port",
    )
    serve.add_argument(
        "--http-host",
        default=None,
        metavar="HOST",
        help="the host --http-port binds (default 127.0.0.1)",
    )
    serve.add_argument(
        "--no-health",
        action="store_true",
        help="do not serve the Health interface (schemas/health.capnp) on the bootstrap",
    )
    serve.add_argument(
        "--no-busy-poll",
        action="store_true",
        help="never poll for the next message before sleeping (saves CPU, costs latency)",
    )
    serve.add_argument(
        "--tls-key",
        metavar="FILE",
        help="the server's private key (PEM) for a tls: or capnp:// address (capsvc keygen)",
    )
    serve.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="its certificate (PEM); without one, a self-signed certificate for the key",
    )
    serve.set_defaults(handler=cmd_serve)

    keygen = commands.add_parser(
        "keygen",
        parents=[common],
        help="write a new TLS key and print its capnp:// fingerprint",
        description="Write a new ECDSA P-256 private key (PEM, mode 0600) to FILE and print "
        "its fingerprint, sha-256:..., for capnp://FINGERPRINT@HOST:PORT addresses.",
    )
    keygen.add_argument("file", metavar="FILE", help="where to write the key (not overwritten)")
    keygen.set_defaults(handler=cmd_keygen)

    health = commands.add_parser(
        "health",
        parents=[common],
        help="ask a server's Health interface whether it serves (exit 0 if so, else 1)",
        description="Bootstrap ADDR, call Health.check (schemas/health.capnp) and print the "
        "status: exit 0 for serving, 1 for anything else or no answer.",
    )
    health.add_argument("address", metavar="ADDR", help="tcp:HOST:PORT, unix:PATH, tls:, capnp://")
    health.add_argument(
        "--service", default="", metavar="NAME", help="a service (interface) name to ask for"
    )
    health.add_argument(
        "--timeout", type=float, default=5.0, metavar="SECONDS", help="the whole check's budget"
    )
    health.set_defaults(handler=cmd_health)

    call = commands.add_parser(
        "call",
        aliases=["demo-client"],
        parents=[common],
        help="call a method of any service (--schema), or the calculator demo",
        usage=(
            "%(prog)s [ADDR] [EXPR ...]\n"
            "       %(prog)s [ADDR] --schema FILE [-I DIR]... [--compact] Interface.method"
            " [field=value ...] [field.method [field=value ...]]..."
        ),
        description=(
            "With --schema: bootstrap Interface from the service at ADDR, call method with "
            "the fields given, print its results as JSON. Values are parsed by the field's "
            "type: Text as is, Data as UTF-8 text or base64:..., numbers, true/false, enums by "
            "name, structs and lists as JSON. A word field.method calls a method of the "
            "capability field of the previous call's results (pipelined: no waiting); only "
            "the last call's results are printed. "
            "Without --schema: run a tour of the calculator demo (calls, pipelining, "
            "functions, callbacks), or with EXPR (e.g. '2 + 3 * 4'; numbers, + - * / ** and "
            "parentheses) evaluate it remotely. "
            f"ADDR is tcp:HOST:PORT or unix:PATH (default {DEFAULT_ADDRESS})."
        ),
    )
    # Options may come between the words: `call ADDR --schema FILE Interface.method x=1`.
    call.__class__ = _IntermixedParser
    call.add_argument(
        "--connect",
        default=None,
        metavar="ADDR",
        help=f"the service's address, as the first word may also give it (default "
        f"{DEFAULT_ADDRESS})",
    )
    call.add_argument(
        "--schema",
        metavar="FILE",
        help="the .capnp file declaring the interface (loaded on the dynamic path)",
    )
    _add_import_path(call)
    call.add_argument("--compact", action="store_true", help="print the results' JSON on one line")
    call.add_argument(
        "words",
        nargs="*",
        metavar="ARG",
        help="[ADDR] then EXPR, or (with --schema) Interface.method, field=value, field.method",
    )
    call.set_defaults(handler=cmd_call)

    describe = commands.add_parser(
        "describe",
        parents=[common],
        help="list the interfaces, methods, structs and enums of a schema",
        description=(
            "List every interface of the schema FILE (nested ones too, by schema name) with "
            "its superclasses and methods (parameters and results with their types), then "
            "its structs and enums."
        ),
    )
    describe.add_argument("schema", metavar="FILE", help="a .capnp file")
    _add_import_path(describe)
    describe.add_argument("--json", action="store_true", help="print it as JSON")
    describe.set_defaults(handler=cmd_describe)

    from capsvc.nicdriver.cli import add_nic_parser

    add_nic_parser(commands, parents=[common])

    gen = commands.add_parser(
        "gen",
        parents=[common],
        help="generate typed Python for schemas",
        description=(
            "Write one Python module per schema file (and per file it imports): typed "
            "readers and builders for every struct, enums, constants, and for every "
            "interface a typed client and a server base. Deterministic: the same schema "
            "gives the same bytes."
        ),
    )
    gen.add_argument("schemas", nargs="+", metavar="SCHEMA", help="a .capnp file")
    gen.add_argument("-o", "--output", required=True, metavar="DIR", help="where to write")
    _add_import_path(gen)
    gen.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a module in DIR is missing or stale",
    )
    gen.set_defaults(handler=cmd_gen)
    return parser


def _add_import_path(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "-I",
        "--import-path",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory to look for imported schemas in (may repeat)",
    )


def cmd_gen(args: argparse.Namespace) -> int:
    from capsvc.codegen import is_package, schema_of_paths, sources, write
    from capsvc.errors import SchemaError

    for path in args.schemas:
        if not os.path.isfile(path):
            raise UsageError(f"no such schema file: {path}")
    try:
        schema = schema_of_paths(list(args.schemas), args.import_path)
    except SchemaError as error:
        _error(str(error))
        return EXIT_FAILURE
    files = sources(schema, relative_imports=is_package(args.output))
    changed = write(files, args.output, check=args.check)
    if args.check:
        for path in changed:
            _say(f"stale: {path}")
        return EXIT_FAILURE if changed else EXIT_OK
    for path in changed:
        _say(f"wrote {path}")
    return EXIT_OK


def _setup_logging(verbosity: int) -> None:
    from capsvc.workers import WORKER_ENV

    # A worker of `serve --workers` says which it is: its lines share the terminal.
    slot = os.environ.get(WORKER_ENV, "").rpartition(":")[2]
    who = f"[worker {slot} pid {os.getpid()}] " if slot else ""
    logging.basicConfig(
        level=logging.DEBUG if verbosity > 0 else logging.INFO,
        format=f"%(asctime)s %(levelname)-7s %(name)s: {who}%(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``capsvc`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # What a worker process of `serve --workers` runs again (capsvc.workers).
    args.argv = list(sys.argv[1:] if argv is None else argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _setup_logging(getattr(args, "verbose", 0))
    try:
        return handler(args)
    except UsageError as error:
        _error(str(error))
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say("capsvc: stopped")
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
