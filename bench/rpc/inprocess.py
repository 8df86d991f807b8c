"""Echo calls with both ends in one process: CPU time, or instructions counted by callgrind.

    python -m bench.rpc.inprocess                 # CPU µs per call, typed vs dynamic, rounds
    python -m bench.rpc.inprocess --instructions  # instructions per call (valgrind callgrind)
    python -m bench.rpc.inprocess --observers     # CPU µs per call with each call observer
    python -m bench.rpc.inprocess --health        # CPU µs per call, Health routed or not
    python -m bench.rpc.inprocess --raw           # ... with the raw trio ping-pong beside

Theory of operation
-------------------
The profile command (bench.rpc.profile) measures each side in its own process, as users run
capsvc; on a shared 2-vCPU machine its CPU figures move with whatever else runs (a busy
sibling vCPU slows every instruction). This is the control: client and server connections
on one trio loop over a Unix socket pair (capsvc's FastSocketStream, busy polling off), so
no wake-up crosses processes, and the figure is both sides' work together. The generated
stubs (capsvc.generated: the typed BenchEcho server and typed clients of bench.rpc) and the
dynamic path (``load_schema``) alternate round by round.

``--instructions`` runs the same calls under ``valgrind --tool=callgrind`` three times per
path, (a, b) calls at (c1, c12) = (n, n), (3n, n) and (n, 3n), and takes instructions per
call from the differences: start-up (interpreter, imports, schema loading) cancels out, and
instruction counts do not depend on the machine's load (they do on trio's scheduling,
which at c12 batches differently from run to run: a few percent).

``--raw`` adds the raw trio ping-pong on the same loop (c1 only: one client task sends a
frame the size of capsvc's Call and reads one the size of its Return, the server task the
reverse; what ``raw-trio`` does across processes): the floor of any trio RPC, measured the
same way, CPU time or instructions.

``--health`` compares the typed server as the bootstrap with the same server behind
capsvc.health's router (``HealthRouted``: Health beside the app, what ``capsvc serve``
does unless ``--no-health``), alternating round by round: the router's cost per call.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

KINDS = ("typed", "dynamic")
LEVELS = (1, 12)


#: What watches the calls in ``--observers`` rounds (capsvc.observe, capsvc.otel,
#: capsvc.metrics: Prometheus counters, gauge and histogram, on the served side only, as
#: ``capsvc.metrics.enable`` watches them).
OBSERVERS = ("none", "access-log", "otel-noop", "otel-sdk", "metrics")


def measure(
    kind: str,
    counts: dict[int, int],
    warmup: int = 300,
    observer: str = "none",
    health: bool = False,
) -> dict[int, float]:
    """CPU seconds of ``counts[level]`` calls at each concurrency level (after a warm-up)."""
    import trio

    import capsvc
    from bench.rpc.scenarios import ECHO_SCHEMA
    from bench.rpc.servers import dynamic_bench_echo, typed_bench_echo
    from capsvc.generated.echo_capnp import Echo
    from capsvc.transport.fastsocket import FastSocketStream

    async def main() -> dict[int, float]:
        left, right = socket.socketpair()
        server = typed_bench_echo() if kind == "typed" else dynamic_bench_echo()
        if health:
            from capsvc.health import HealthRouted, HealthServer, Serving, ServingState

            server = HealthRouted(server, HealthServer(ServingState(Serving.SERVING)))
        interface: Any = Echo
        if kind == "dynamic":
            interface = capsvc.load_schema(ECHO_SCHEMA, check=False).Echo
        async with (
            capsvc.open_connection(
                FastSocketStream(left), bootstrap=server, busy_poll=None
            ) as served,
            capsvc.open_connection(FastSocketStream(right), busy_poll=None) as conn,
        ):
            if observer != "none":
                _observe(served, observer, served=True)
            if observer != "none":
                _observe(conn, observer, served=False)
            client = conn.bootstrap(interface)
            message = "x" * 16
            remaining = 0

            async def worker() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    if (await client.ping(msg=message)).reply != message:
                        raise AssertionError("echo reply differs from the request")

            async def load(level: int, calls: int) -> float:
                nonlocal remaining
                remaining = calls
                began = time.process_time()
                async with trio.open_nursery() as nursery:
                    for _ in range(level):
                        nursery.start_soon(worker)
                return time.process_time() - began

            seconds = {}
            for level, calls in counts.items():
                await load(level, warmup)
                seconds[level] = await load(level, calls)
            client.close()
            return seconds

    return trio.run(main)


def measure_raw(calls: int, warmup: int = 300) -> float:
    """CPU seconds of ``calls`` raw ping-pong round trips on one trio loop (after a
    warm-up): plain ``trio.SocketStream``s over a socket pair, no capsvc code."""
    import trio

    from bench.rpc.clients import frame_sizes

    call_size, return_size = frame_sizes(16)

    async def receive_exactly(stream: trio.SocketStream, size: int) -> None:
        got = 0
        while got < size:
            got += len(await stream.receive_some(65536))

    async def main() -> float:
        left, right = socket.socketpair()
        server = trio.SocketStream(trio.socket.from_stdlib_socket(left))
        client = trio.SocketStream(trio.socket.from_stdlib_socket(right))
        call, reply = b"c" * call_size, b"r" * return_size

        async def serve(count: int) -> None:
            for _ in range(count):
                await receive_exactly(server, call_size)
                await server.send_all(reply)

        async def round_trips(count: int) -> float:
            began = time.process_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve, count)
                for _ in range(count):
                    await client.send_all(call)
                    await receive_exactly(client, return_size)
            return time.process_time() - began

        with trio.fail_after(600):  # bounded: a frame size gone wrong would wait forever
            await round_trips(warmup)
            seconds = await round_trips(calls)
        await client.aclose()
        await server.aclose()
        return seconds

    return trio.run(main)


def _observe(conn: Any, observer: str, *, served: bool) -> None:
    """Give one connection the observer named (both sides get one: both are measured;
    the metrics observer watches only the served side, and gives the client none)."""
    import logging

    from capsvc.observe import AccessLog, ConnectionInfo

    if observer == "metrics":
        import capsvc.metrics

        side = ConnectionInfo("bench", served, lambda: False)
        conn.session.observer = capsvc.metrics.metrics_observer(side)
        return
    info = ConnectionInfo("bench", True, lambda: False)
    if observer == "access-log":  # the line is formatted and handled (into a null stream)
        access = logging.getLogger("capsvc.access")
        if not access.handlers:
            access.addHandler(logging.StreamHandler(open(os.devnull, "w")))
            access.setLevel(logging.INFO)
            access.propagate = False
        conn.session.observer = AccessLog(info)
        return
    from opentelemetry import trace

    import capsvc.otel

    provider: Any = trace.NoOpTracerProvider()
    if observer == "otel-sdk":  # real spans, recorded and dropped (no exporter)
        from opentelemetry.sdk.trace import TracerProvider

        provider = TracerProvider()
    conn.session.observer = capsvc.otel._Tracing(provider.get_tracer("bench"), info)


def observer_rounds(rounds: int, calls: int) -> None:
    per_call: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for observer in OBSERVERS:
            measured = measure("typed", dict.fromkeys(LEVELS, calls), observer=observer)
            for level, seconds in measured.items():
                per_call.setdefault((observer, level), []).append(seconds / calls * 1e6)
    print(f"CPU µs per call, both sides in one process (typed stubs, both sides observed),"
          f" {rounds} round(s) of {calls:,} calls")  # fmt: skip
    print("| observer | c1 | c12 | c1 ÷ none | c12 ÷ none |\n|---|---|---|---|---|")
    for observer in OBSERVERS:
        cells = [_spread(per_call[(observer, level)], "{:.1f}") for level in LEVELS]
        ratios = [
            statistics.median(per_call[(observer, level)])
            / statistics.median(per_call[("none", level)])
            for level in LEVELS
        ]
        print(f"| {observer} | {' | '.join(cells)} | {ratios[0]:.2f} | {ratios[1]:.2f} |")


def health_rounds(rounds: int, calls: int) -> None:
    per_call: dict[tuple[bool, int], list[float]] = {}
    for _ in range(rounds):
        for routed in (False, True):
            measured = measure("typed", dict.fromkeys(LEVELS, calls), health=routed)
            for level, seconds in measured.items():
                per_call.setdefault((routed, level), []).append(seconds / calls * 1e6)
    print(f"CPU µs per call, both sides in one process (typed stubs), {rounds} round(s) of"
          f" {calls:,} calls: the bootstrap as is, and behind the Health router")  # fmt: skip
    print("| conc | app | app + Health | routed ÷ app |\n|---|---|---|---|")
    for level in LEVELS:
        plain, routed = per_call[(False, level)], per_call[(True, level)]
        ratio = statistics.median(routed) / statistics.median(plain)
        print(f"| {level} | {_spread(plain, '{:.1f}')} | {_spread(routed, '{:.1f}')} | "
              f"{ratio:.2f} |")  # fmt: skip


def cpu_rounds(rounds: int, calls: int, raw: bool = False) -> None:
    per_call: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for kind in KINDS:
            for level, seconds in measure(kind, dict.fromkeys(LEVELS, calls)).items():
                per_call.setdefault((kind, level), []).append(seconds / calls * 1e6)
        if raw:
            per_call.setdefault(("raw", 1), []).append(measure_raw(calls) / calls * 1e6)
    print(f"CPU µs per call, both sides in one process, {rounds} round(s) of {calls:,} calls")
    print("| conc | typed | dynamic | typed ÷ dynamic (per round) |\n|---|---|---|---|")
    for level in LEVELS:
        typed, dynamic = per_call[("typed", level)], per_call[("dynamic", level)]
        ratios = [t / d for t, d in zip(typed, dynamic, strict=True)]
        print(f"| {level} | {_spread(typed, '{:.1f}')} | {_spread(dynamic, '{:.1f}')} | "
              f"{_spread(ratios, '{:.2f}')} |")  # fmt: skip
    if raw:
        plain, typed = per_call[("raw", 1)], per_call[("typed", 1)]
        ratios = [p / t for p, t in zip(plain, typed, strict=True)]
        print(f"\nraw trio ping-pong, c1: {_spread(plain, '{:.1f}')} µs per round trip; "
              f"raw ÷ typed (per round) {_spread(ratios, '{:.2f}')}")  # fmt: skip


def _spread(values: list[float], fmt: str) -> str:
    middle = fmt.format(statistics.median(values))
    return f"{middle} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def instructions(calls: int, raw: bool = False) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    shapes = [(calls, calls), (3 * calls, calls), (calls, 3 * calls)]
    print(f"instructions per call, both sides in one process (callgrind, n = {calls:,})")
    print("| conc | typed | dynamic | typed ÷ dynamic |\n|---|---|---|---|")
    found: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory(prefix="capsvc-ir-") as scratch:
        for kind in KINDS:
            totals = [_callgrind(valgrind, scratch, kind, c1, c12) for c1, c12 in shapes]
            found[(kind, 1)] = (totals[1] - totals[0]) / (2 * calls)
            found[(kind, 12)] = (totals[2] - totals[0]) / (2 * calls)
        if raw:
            small = _callgrind(valgrind, scratch, "raw", calls, 0)
            large = _callgrind(valgrind, scratch, "raw", 3 * calls, 0)
            found[("raw", 1)] = (large - small) / (2 * calls)
    for level in LEVELS:
        typed, dynamic = found[("typed", level)], found[("dynamic", level)]
        print(f"| {level} | {typed:,.0f} | {dynamic:,.0f} | {typed / dynamic:.2f} |")
    if raw:
        plain = found[("raw", 1)]
        print(f"\nraw trio ping-pong, c1: {plain:,.0f} instructions per round trip "
              f"(raw ÷ typed {plain / found[('typed', 1)]:.2f})")  # fmt: skip


def _callgrind(valgrind: str, scratch: str, kind: str, c1: int, c12: int) -> int:
    out = os.path.join(scratch, f"{kind}-{c1}-{c12}.out")
    command = [
        valgrind, "--tool=callgrind", f"--callgrind-out-file={out}",
        sys.executable, "-m", "bench.rpc.inprocess", "--run", kind, str(c1), str(c12),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, timeout=3600)
    with open(out) as source:
        for line in source:
            if match := re.match(r"(?:summary|totals): (\d+)", line):
                return int(match.group(1))
    raise RuntimeError(f"no totals in {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rpc.inprocess", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--instructions", action="store_true", help="count with callgrind")
    parser.add_argument(
        "--observers", action="store_true", help="CPU per call with each call observer"
    )
    parser.add_argument(
        "--health", action="store_true", help="CPU per call with the Health router or not"
    )
    parser.add_argument("--raw", action="store_true", help="the raw trio ping-pong beside (c1)")
    parser.add_argument("--run", nargs=3, metavar=("KIND", "C1", "C12"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        kind, c1, c12 = args.run[0], int(args.run[1]), int(args.run[2])
        if kind == "raw":
            measure_raw(c1, warmup=100)
        else:
            measure(kind, {1: c1, 12: c12}, warmup=100)
    elif args.observers:
        observer_rounds(args.rounds, args.calls)
    elif args.health:
        health_rounds(args.rounds, args.calls)
    elif args.instructions:
        instructions(args.calls if args.calls != 5_000 else 1_000, raw=args.raw)
    else:
        cpu_rounds(args.rounds, args.calls, raw=args.raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
