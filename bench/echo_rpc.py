"""Echo RPC, measured side by side: capsvc and pycapnp (the C++ reference) as client and server.

    python -m bench.echo_rpc compare [--calls N] [--payload BYTES] [--reps R]
    python -m bench.echo_rpc server --impl capsvc|pycapnp [--listen tcp:127.0.0.1:0]
    python -m bench.echo_rpc client --impl capsvc|pycapnp --connect tcp:HOST:PORT ...

Each server runs in its own process; each client run is a fresh process that makes exactly
``--calls`` calls after a warm-up, from ``--concurrency`` tasks on one connection, and prints
one JSON line (calls/s and the latency percentiles, nearest rank). ``compare`` runs every
client/server pairing at concurrency 1 and 12, repeating the whole set ``--reps`` times
(rep-major, to spread the machine's noise) and prints the median of each cell. The full
pyperf suite (bench issue) will grow out of this; this one is for quick, honest figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(ROOT, "tests", "peers")
ECHO_SCHEMA = os.path.join(ROOT, "schemas", "echo.capnp")


def percentile(values: list[int], fraction: float) -> int:
    rank = max(1, math.ceil(fraction * len(values)))
    return sorted(values)[rank - 1]


# ---------------------------------------------------------------------- capsvc side
def run_capsvc_server(listen: str, coalesce: bool, nodelay: bool) -> None:
    import trio

    import capsvc

    echo = capsvc.load_schema(ECHO_SCHEMA)

    class EchoServer(capsvc.Server, interface=echo.Echo):
        async def ping(self, params: Any, results: Any) -> None:
            results.reply = params.msg

        async def pingData(self, params: Any, results: Any) -> None:
            results.data = params.data

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            address = await nursery.start(
                lambda task_status: capsvc.serve(
                    listen,
                    EchoServer(),
                    coalesce=coalesce,
                    nodelay=nodelay,
                    task_status=task_status,
                )
            )
            print(f"LISTENING {address.rsplit(':', 1)[1]}", flush=True)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    trio.run(main)


def run_capsvc_client(
    connect: str,
    calls: int,
    concurrency: int,
    payload: int,
    warmup: int,
    nodelay: bool,
    coalesce: bool,
) -> dict[str, Any]:
    import trio

    import capsvc

    echo = capsvc.load_schema(ECHO_SCHEMA)
    message = "x" * payload
    latencies: list[int] = []

    async def main() -> float:
        async with capsvc.connect(connect, nodelay=nodelay, coalesce=coalesce) as conn:
            client = conn.bootstrap(echo.Echo)
            remaining = [warmup]

            async def worker(record: bool) -> None:
                perf = time.perf_counter_ns
                while remaining[0] > 0:
                    remaining[0] -= 1
                    start = perf()
                    reply = (await client.ping(msg=message)).reply
                    if record:
                        latencies.append(perf() - start)
                    if reply != message:
                        raise AssertionError("echo reply differs from the request")

            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker, False)
            remaining[0] = calls
            began = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker, True)
            return time.perf_counter() - began

    seconds = trio.run(main)
    return summary(latencies, seconds, concurrency, payload)


def summary(
    latencies_ns: list[int], seconds: float, concurrency: int, payload: int
) -> dict[str, Any]:
    values = sorted(latencies_ns)
    return {
        "calls": len(values),
        "concurrency": concurrency,
        "payload": payload,
        "seconds": seconds,
        "calls_per_s": len(values) / seconds,
        "latency_us": {
            name: percentile(values, q) / 1000
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999))
        }
        | {"max": values[-1] / 1000},
    }


# ---------------------------------------------------------------------- orchestration
class ServerProcess:
    """One server in its own process, stopped by PID."""

    def __init__(self, impl: str, coalesce: bool = True, nodelay: bool = True) -> None:
        if impl == "capsvc":
            command = [sys.executable, "-m", "bench.echo_rpc", "server", "--impl", "capsvc"]
            if not coalesce:
                command.append("--no-coalesce")
            if not nodelay:
                command.append("--no-nodelay")
        else:
            command = [
                sys.executable,
                os.path.join(PEERS, "pycapnp_server.py"),
                "--listen",
                "127.0.0.1:0",
                "--bootstrap",
                "echo",
            ]
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=_env()
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("LISTENING"):
            self.stop()
            raise RuntimeError(f"{impl} server did not start: {line!r}")
        self.port = int(line.split()[1])

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_client(
    impl: str, port: int, calls: int, concurrency: int, payload: int, **flags: bool
) -> dict[str, Any]:
    if impl == "capsvc":
        command = [
            sys.executable, "-m", "bench.echo_rpc", "client", "--impl", "capsvc",
            "--connect", f"tcp:127.0.0.1:{port}",
            "--calls", str(calls), "--concurrency", str(concurrency), "--payload", str(payload),
        ]  # fmt: skip
        if not flags.get("nodelay", True):
            command.append("--no-nodelay")
    else:
        command = [
            sys.executable, os.path.join(PEERS, "pycapnp_echo_client.py"), f"127.0.0.1:{port}",
            "--calls", str(calls), "--concurrency", str(concurrency), "--payload", str(payload),
            "--warmup", str(min(calls, 500)),
        ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=_env(), check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{impl} client failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


PAIRINGS = [
    ("capsvc", "capsvc"),
    ("pycapnp", "pycapnp"),
    ("capsvc", "pycapnp"),
    ("pycapnp", "capsvc"),
]


def compare(calls: int, payload: int, reps: int) -> None:
    cells: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    servers = {impl: ServerProcess(impl) for impl in ("capsvc", "pycapnp")}
    try:
        for _ in range(reps):
            for client, server in PAIRINGS:
                for concurrency in (1, 12):
                    result = run_client(client, servers[server].port, calls, concurrency, payload)
                    cells.setdefault((client, server, concurrency), []).append(result)
    finally:
        for server_process in servers.values():
            server_process.stop()
    print(f"echo RPC, payload {payload} B, {calls} calls per run, median of {reps} runs")
    print("| client -> server | conc | calls/s | p50 us | p99 us | max us |")
    print("|---|---|---|---|---|---|")
    for (client, server, concurrency), runs in cells.items():
        rate = statistics.median(r["calls_per_s"] for r in runs)
        p50 = statistics.median(r["latency_us"]["p50"] for r in runs)
        p99 = statistics.median(r["latency_us"]["p99"] for r in runs)
        top = statistics.median(r["latency_us"]["max"] for r in runs)
        row = f"{rate:.0f} | {p50:.0f} | {p99:.0f} | {top:.0f}"
        print(f"| {client} -> {server} | {concurrency} | {row} |")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.echo_rpc")
    sub = parser.add_subparsers(dest="command", required=True)
    server = sub.add_parser("server")
    server.add_argument("--impl", default="capsvc", choices=["capsvc"])
    server.add_argument("--listen", default="tcp:127.0.0.1:0")
    server.add_argument("--no-coalesce", action="store_true")
    server.add_argument("--no-nodelay", action="store_true")
    client = sub.add_parser("client")
    client.add_argument("--impl", default="capsvc", choices=["capsvc"])
    client.add_argument("--connect", required=True)
    client.add_argument("--calls", type=int, default=5000)
    client.add_argument("--concurrency", type=int, default=1)
    client.add_argument("--payload", type=int, default=16)
    client.add_argument("--warmup", type=int, default=500)
    client.add_argument("--no-nodelay", action="store_true")
    client.add_argument("--no-coalesce", action="store_true")
    both = sub.add_parser("compare")
    both.add_argument("--calls", type=int, default=5000)
    both.add_argument("--payload", type=int, default=16)
    both.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if args.command == "server":
        run_capsvc_server(args.listen, coalesce=not args.no_coalesce, nodelay=not args.no_nodelay)
    elif args.command == "client":
        result = run_capsvc_client(
            args.connect, args.calls, args.concurrency, args.payload, args.warmup,
            nodelay=not args.no_nodelay, coalesce=not args.no_coalesce,
        )  # fmt: skip
        print(json.dumps(result))
    else:
        compare(args.calls, args.payload, args.reps)


if __name__ == "__main__":
    main()
