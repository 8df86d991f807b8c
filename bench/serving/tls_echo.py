"""Echo calls/s over plain TCP and over TLS, side by side in one run (serving-notes §4 M4).

    python -m bench.serving.tls_echo                      # the default run (about a minute)
    python -m bench.serving.tls_echo --reps 1 --seconds 1 --handshakes 10   # a quick look
    python -m bench.serving.tls_echo --key-type rsa       # capnp-rpc's default key, RSA-2048

Theory of operation
-------------------
Two capsvc servers, each a process of its own started by this driver and stopped by PID
(SIGTERM) at the end (``python -m bench.serving.tls_echo --server ADDRESS [--key FILE]``):
one on ``tcp:127.0.0.1:0``, one on ``capnp://sha-256:<its key>@127.0.0.1:0``, the TLS
form capsvc clients pin (capsvc.transport.tls; the key is made fresh in a temporary
directory). Both serve bench/rpc's ``BenchEcho`` on the generated base
(``bench.rpc.servers.typed_bench_echo``: plain methods, run inline in the reader) through
the same handler: ``finish_accept`` (the TLS handshake; nothing for TCP), then one
``capsvc.connection.Connection``. The client is this process: one connection per
measurement, ``Echo.ping`` with a 16-character message through the generated stubs, every
reply checked, with ``bench.rpc.clients``' load loop (12 in flight: 12 tasks calling in a
loop on the one connection).

Busy polling is off on both ends (``busy_poll=None``): capsvc's adaptive polling buys
latency with CPU, and the headline must not flatter it (bench/rpc/README.md). Plain and
TLS are measured alternately (the order flips every repetition) so that drift in the
machine's state (a noisy neighbour on a shared VM) falls on both; a cell's figure is the
median over repetitions. Each measurement warms up (``--warmup`` calls, not counted),
then runs ``--calls`` calls or ``--seconds`` seconds, whichever ends first.

Per cell: calls/s, median call latency, and CPU per call on each side (this process's
``process_time``; the server's from psutil), which says where TLS's cost goes. Then the
connection set-up, ``--handshakes`` times each, alternating: TCP connect (+ TLS handshake
and pin check) then close, and connect + bootstrap + one echo (what a reconnect costs);
medians and 90th percentiles.

The machine's state (CPU model, cpuidle driver and governor, load average: what decides
how far a shared VM's figures can be trusted) is printed before and after, with
``bench.rpc.profile.machine_state``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.rpc.scenarios import ServerKind
from bench.rpc.servers import ServerProcess

#: M4's goals (serving-notes §4): TLS ÷ plain calls/s.
GOALS = {1: 0.6, 12: 0.7}
MESSAGE = "x" * 16


# ------------------------------------------------------------------ the server process
def run_server(listen: str, key: str | None) -> None:
    """Serve BenchEcho on ``listen`` until SIGTERM; print ``LISTENING <address>`` first."""
    import trio

    from bench.rpc.servers import PassCounter, _serve_until_signalled, typed_bench_echo
    from capsvc.connection import Connection
    from capsvc.structs import _hook_of
    from capsvc.transport import (
        ServerTls,
        TlsError,
        finish_accept,
        listener_address,
        open_listeners,
    )

    hook = _hook_of(typed_bench_echo())
    assert hook is not None
    tls = ServerTls(key) if key is not None else None

    async def handle(stream: trio.abc.Stream) -> None:
        try:
            await finish_accept(stream)
        except TlsError as error:
            print(f"handshake failed: {error}", file=sys.stderr, flush=True)
            return
        await Connection(stream, hook.add_ref(), busy_poll=None, served=True).run()

    async def start(task_status: Any) -> None:
        listeners = await open_listeners(listen, tls=tls)
        task_status.started(listener_address(listeners[0]))
        await trio.serve_listeners(handle, listeners)

    trio.run(_serve_until_signalled, start, PassCounter())


class EchoServer(ServerProcess):
    """This module's server in its own process (bench.rpc's process handling)."""

    def __init__(self, name: str, listen: str, key: str | None) -> None:
        super().__init__(ServerKind(name, "capsvc", "tcp", busy_poll=False), socket_dir="")
        self.listen = listen
        self.key = key

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "bench.serving.tls_echo", "--server", self.listen]
        return command + (["--key", self.key] if self.key else [])


# ------------------------------------------------------------------ the client side
@dataclass
class Cell:
    """One (transport, concurrency) cell: a figure per repetition."""

    rates: list[float] = field(default_factory=list)
    p50_us: list[float] = field(default_factory=list)
    client_cpu_us: list[float] = field(default_factory=list)
    server_cpu_us: list[float] = field(default_factory=list)


async def measure(
    address: str, concurrency: int, calls: int, seconds: float, warmup: int, server: EchoServer
) -> tuple[float, float, float, float]:
    """calls/s, p50 latency (µs), client and server CPU µs per call, over one connection."""
    import trio

    from bench.rpc.clients import _load
    from capsvc.api import open_connection
    from capsvc.generated.echo_capnp import Echo
    from capsvc.transport import open_stream

    async with open_connection(await open_stream(address), busy_poll=None) as conn:
        echo = conn.bootstrap(Echo)

        async def one_call() -> None:
            if (await echo.ping(msg=MESSAGE)).reply != MESSAGE:
                raise AssertionError("echo reply differs from the request")

        await _load(one_call, warmup, concurrency, None, trio.open_nursery)
        latencies: list[int] = []
        server_before = server.cpu_seconds()
        client_before = time.process_time()
        deadline = time.perf_counter_ns() + int(seconds * 1e9)
        elapsed = await _load(one_call, calls, concurrency, latencies, trio.open_nursery, deadline)
        client_cpu = time.process_time() - client_before
        server_cpu = server.cpu_seconds() - server_before
    done = len(latencies)
    return (
        done / elapsed,
        statistics.median(latencies) / 1e3,
        client_cpu / done * 1e6,
        server_cpu / done * 1e6,
    )


async def connect_times(address: str, echo_too: bool) -> float:
    """Seconds to open a stream (TCP connect, TLS handshake, pin check) and close it;
    ``echo_too``: also bootstrap and make one call before closing."""
    from capsvc.api import open_connection
    from capsvc.generated.echo_capnp import Echo
    from capsvc.transport import open_stream

    began = time.perf_counter()
    stream = await open_stream(address)
    if echo_too:
        async with open_connection(stream, busy_poll=None) as conn:
            if (await conn.bootstrap(Echo).ping(msg=MESSAGE)).reply != MESSAGE:
                raise AssertionError("echo reply differs from the request")
    else:
        await stream.aclose()
    return time.perf_counter() - began


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def drive(args: argparse.Namespace, servers: dict[str, EchoServer]) -> dict[str, Any]:
    """Every measurement, in the interleaved order of the module docstring."""
    names = list(servers)
    cells = {(name, c): Cell() for name in names for c in args.concurrency}
    for rep in range(args.reps):
        order = names if rep % 2 == 0 else names[::-1]
        for concurrency in args.concurrency:
            for name in order:
                server = servers[name]
                rate, p50, client_cpu, server_cpu = await measure(
                    server.address, concurrency, args.calls, args.seconds, args.warmup, server
                )
                cell = cells[name, concurrency]
                cell.rates.append(rate)
                cell.p50_us.append(p50)
                cell.client_cpu_us.append(client_cpu)
                cell.server_cpu_us.append(server_cpu)
                if not args.quiet:
                    print(
                        f"  rep {rep + 1} c{concurrency:<2} {name:5} {rate:9,.0f} calls/s",
                        flush=True,
                    )
    setups: dict[tuple[str, bool], list[float]] = {
        (name, echo_too): [] for name in names for echo_too in (False, True)
    }
    for i in range(args.handshakes):
        for name in names if i % 2 == 0 else names[::-1]:
            for echo_too in (False, True):
                setups[name, echo_too].append(await connect_times(servers[name].address, echo_too))
    return {"cells": cells, "setups": setups}


# ------------------------------------------------------------------ the report
def report(args: argparse.Namespace, results: dict[str, Any], key_type: str) -> str:
    cells: dict[tuple[str, int], Cell] = results["cells"]
    setups: dict[tuple[str, bool], list[float]] = results["setups"]
    lines = [
        f"echo calls/s, capsvc to capsvc, busy polling off, 16 B message, "
        f"median of {args.reps} repetition(s) of <= {args.calls:,} calls or {args.seconds:g} s; "
        f"TLS = capnp:// pinned, {key_type} server key",
        "",
        f"{'load':5} {'transport':9} {'calls/s':>9} {'p50 µs':>8} {'client CPU µs/call':>19} "
        f"{'server CPU µs/call':>19} {'TLS÷plain':>10} {'goal':>6}",
    ]
    for concurrency in args.concurrency:
        plain = statistics.median(cells["plain", concurrency].rates)
        for name in ("plain", "tls"):
            cell = cells[name, concurrency]
            rate = statistics.median(cell.rates)
            ratio, goal = "", ""
            if name == "tls":
                ratio = f"{rate / plain:.2f}"
                if concurrency in GOALS:
                    met = "met" if rate / plain >= GOALS[concurrency] else "MISSED"
                    goal = f"≥{GOALS[concurrency]} {met}"
            lines.append(
                f"c{concurrency:<4} {name:9} {rate:9,.0f} {statistics.median(cell.p50_us):8.0f} "
                f"{statistics.median(cell.client_cpu_us):19.1f} "
                f"{statistics.median(cell.server_cpu_us):19.1f} {ratio:>10} {goal}"
            )
        if args.reps > 1:
            spread = {
                name: f"{min(cells[name, concurrency].rates):,.0f}-"
                f"{max(cells[name, concurrency].rates):,.0f}"
                for name in ("plain", "tls")
            }
            lines.append(
                f"{'':5} range over repetitions: plain {spread['plain']}, tls {spread['tls']}"
            )
    lines += [
        "",
        f"connection set-up, {args.handshakes} each (ms): median / 90th percentile",
    ]
    for echo_too, what in ((False, "connect (+ TLS handshake) + close"),
                           (True, "connect + bootstrap + 1 echo")):  # fmt: skip
        figures = {}
        for name in ("plain", "tls"):
            values = setups[name, echo_too]
            figures[name] = (statistics.median(values) * 1e3, _percentile(values, 0.9) * 1e3)
        lines.append(
            f"  {what:36} plain {figures['plain'][0]:6.2f} / {figures['plain'][1]:6.2f}   "
            f"tls {figures['tls'][0]:6.2f} / {figures['tls'][1]:6.2f}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ the command line
def _concurrency(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers like 1,12") from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: every concurrency must be >= 1")
    return levels


def _positive(kind: type[int] | type[float]) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
        return value

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.serving.tls_echo",
        description="Echo calls/s over plain TCP and TLS, side by side (module docstring).",
    )
    parser.add_argument("--calls", type=_positive(int), default=20_000,
                        help="calls per measurement at most (default 20000)")  # fmt: skip
    parser.add_argument("--seconds", type=_positive(float), default=3.0,
                        help="seconds per measurement at most (default 3)")  # fmt: skip
    parser.add_argument("--warmup", type=_positive(int), default=500,
                        help="uncounted calls before each measurement (default 500)")  # fmt: skip
    parser.add_argument("--reps", type=_positive(int), default=3,
                        help="repetitions, plain and TLS alternating (default 3)")  # fmt: skip
    parser.add_argument("--concurrency", type=_concurrency, default=[1, 12],
                        help="calls in flight on the one connection (default 1,12)")  # fmt: skip
    parser.add_argument("--handshakes", type=_positive(int), default=50,
                        help="connection set-ups timed per transport (default 50)")  # fmt: skip
    parser.add_argument("--key-type", choices=("ecdsa", "rsa"), default="ecdsa",
                        help="the TLS server's key: ECDSA P-256 (capsvc's default) "
                             "or RSA-2048 (capnp-rpc's)")  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="print the table only")
    parser.add_argument("--server", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--key", metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.key is not None and args.server is None:
        parser.error("--key goes with --server")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.server is not None:
        run_server(args.server, args.key)
        return 0
    import trio

    from bench.rpc.profile import machine_state
    from capsvc import keys

    print(machine_state("before"), flush=True)
    with tempfile.TemporaryDirectory(prefix="capsvc-tls-bench-") as scratch:
        key = os.path.join(scratch, "server.key")
        fingerprint = keys.generate_key(key, rsa_bits=2048 if args.key_type == "rsa" else None)
        servers = {
            "plain": EchoServer("plain", "tcp:127.0.0.1:0", None),
            "tls": EchoServer("tls", f"capnp://{fingerprint}@127.0.0.1:0", key),
        }
        try:
            for server in servers.values():
                server.start()
            for server in servers.values():
                server.wait_ready()
                if not args.quiet:
                    print(f"{server.kind.name} server {server.pid}: {server.address}", flush=True)
            results = trio.run(drive, args, servers)
        finally:
            for server in servers.values():
                server.stop()
    key_type = "RSA-2048" if args.key_type == "rsa" else "ECDSA P-256"
    print()
    print(report(args, results, key_type))
    print()
    print(machine_state("after"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
