"""Echo RPC calls/s over ``nic:`` next to TCP loopback, in one pyperf run.

    python -m bench.nic.echo [pyperf options, e.g. --fast, -o out.json]
    python -m bench.nic.echo --quick [--calls N] [--reps R]   # no pyperf
    python -m bench.nic.echo server ADDRESS                    # (internal) an echo server

Servers run in their own processes, started once by the parent and shared by all workers:
a capsvc TCP echo server on loopback; a model pair host (``capsvc.nicdriver.modelhost``,
in-process cable, the spec's process mode) with a capsvc echo server driving its port
``proc.0``; and a *co-located* model pair (``--wire colocated``: each port's model runs
inside the process that drives it, :mod:`capsvc.nicdriver.colocated`) with an echo server
on ``coloc.0``. Each measurement connects from a fresh worker process (over TCP, or over
port ``.1`` of a pair), warms up, and times ``loops`` ``ping`` calls (16-byte message) from
1 or 12 concurrent tasks on one connection. Benchmarks ``echo-{tcp,nic,nic-coloc}-c{1,12}``
give the time per call; the parent prints calls/s and the ratios to TCP at the end.

In the process mode three processes share the machine (client, server, model host) and
every frame wakes two of them; the co-located mode needs two processes and one wake-up per
frame, like TCP. The model's work is part of both nic figures. The model host runs with
``--spin-us 300`` (:data:`MODEL_SPIN_US`): it keeps polling for 300 µs after work, yielding
the CPU each round, and sleeps when idle. Both transports get capsvc's end-of-pass write
and its adaptive busy polling of receives (``NicStream.send_from_flusher``
and ``NicStream.busy_poll``), so the comparison is of the frame paths.

Figures (2026-11-30, 2-vCPU VM shared with other jobs; ranges over runs), calls/s
relative to TCP loopback, model process / co-located: at load ~2.5 (``--quick --calls
2000 --reps 5``) c1 0.55-0.56 / 0.58-0.61 and c12 0.86-0.88 / 0.79-0.82 (before the tuning
of this date, alternated with those runs: c1 0.44-0.48 / 0.52-0.55, c12 0.62-0.64 /
0.72-0.73); at load ~1.5-2 (this command and ``--quick``), where TCP's busy polling keeps
both of its processes awake, c1 0.32-0.42 / 0.52-0.56 and c12 0.33-0.45 / 0.68-0.69. What
bounds them: per frame, the driver's descriptor work, the stream protocol and the model's
DMA copy and wire hand-off, all in Python, cost about as much CPU as a whole small call
over TCP; the process mode adds the model host's hop, and its three processes cannot all
poll on two CPUs (see the README's NIC section).
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ECHO_SCHEMA = os.path.join(ROOT, "schemas", "echo.capnp")
MESSAGE = "x" * 16
WARMUP = 200
# The model host process polls this long after its last work before it sleeps (yielding
# the CPU on every round): a device is always awake while traffic flows, and a host that
# slept between a request and its reply would add a process wake-up to every frame.
# Idle, it sleeps as before. (Only the process mode has a host that runs models.)
MODEL_SPIN_US = 300


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ------------------------------------------------------------------------------ server
def _echo_server() -> Any:
    import capsvc

    echo = capsvc.load_schema(ECHO_SCHEMA)

    class EchoServer(capsvc.Server, interface=echo.Echo):
        async def ping(self, params: Any, results: Any) -> None:
            results.reply = params.msg

        async def pingData(self, params: Any, results: Any) -> None:
            results.data = params.data

    return EchoServer()


def run_server(address: str) -> None:
    """Serve Echo on ``address`` (tcp: through capsvc.serve, nic: through listen_nic)."""
    import trio

    from capsvc.api import _bootstrap_hook
    from capsvc.connection import Connection
    from capsvc.transport import listener_address, open_listeners
    from capsvc.transport.nic import listen_nic

    async def main() -> None:
        hook = _bootstrap_hook(_echo_server())
        assert hook is not None
        if address.startswith("nic:"):
            listeners = await listen_nic(address)
            bound = address
        else:
            listeners = await open_listeners(address)
            bound = listener_address(listeners[0])

        async def handle(stream: Any) -> None:
            await Connection(stream, hook.add_ref()).run()

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, handle, listeners)
                print(f"LISTENING {bound}", flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    trio.run(main)


class Servers:
    """The TCP server, two model pairs (process and co-located) and their nic servers."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []
        self.rundir = tempfile.mkdtemp(prefix="capsvc-bench-", dir="/dev/shm")
        atexit.register(self.stop)
        line = self._start([sys.executable, "-m", "bench.nic.echo", "server", "tcp:127.0.0.1:0"])
        self.addresses = {"tcp": line.split()[1]}
        for kind, pair, wire in (("nic", "proc", "pair"), ("nic-coloc", "coloc", "colocated")):
            self._start(
                [sys.executable, "-m", "capsvc.nicdriver.modelhost", pair,
                 "--rundir", self.rundir, "--wire", wire, "--spin-us", str(MODEL_SPIN_US)],
                "READY",
            )  # fmt: skip
            server = f"nic:model:{pair}.0,rundir={self.rundir}"
            self._start([sys.executable, "-m", "bench.nic.echo", "server", server])
            self.addresses[kind] = f"nic:model:{pair}.1,rundir={self.rundir}"

    def _start(self, command: list[str], ready: str = "LISTENING") -> str:
        process = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
        self.processes.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith(ready):
            raise RuntimeError(f"{command[2]} did not start: {line!r}")
        return line

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
        self.processes = []
        shutil.rmtree(self.rundir, ignore_errors=True)


# ------------------------------------------------------------------------------ client
def measure(address: str, calls: int, concurrency: int) -> float:
    """Seconds for ``calls`` pings from ``concurrency`` tasks (connect and warm-up apart)."""
    import trio

    import capsvc

    echo = capsvc.load_schema(ECHO_SCHEMA)

    async def open_stream() -> Any:
        if address.startswith("nic:"):
            from capsvc.transport.nic import connect_nic

            return await connect_nic(address)
        from capsvc.transport import open_stream as open_any

        return await open_any(address)

    async def main() -> float:
        stream = await open_stream()
        async with capsvc.open_connection(stream) as conn:
            client = conn.bootstrap(echo.Echo)
            remaining = [WARMUP]

            async def worker() -> None:
                while remaining[0] > 0:
                    remaining[0] -= 1
                    if (await client.ping(msg=MESSAGE)).reply != MESSAGE:
                        raise AssertionError("echo reply differs")

            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker)
            remaining[0] = calls
            began = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(concurrency):
                    nursery.start_soon(worker)
            elapsed = time.perf_counter() - began
        await trio.sleep(0.05)  # let the nic poll loop deliver the FIN before the run ends
        return elapsed

    return float(trio.run(main))


def time_calls(loops: int, address: str, concurrency: int) -> float:
    return measure(address, loops, concurrency)


# ------------------------------------------------------------------------------ main
KINDS = ["tcp", "nic", "nic-coloc"]
CASES = [(kind, concurrency) for concurrency in (1, 12) for kind in KINDS]
LABELS = {
    "tcp": "TCP loopback",
    "nic": "nic: (model process)",
    "nic-coloc": "nic: (co-located model)",
}


def table(rates: dict[tuple[str, int], float]) -> str:
    head = " | ".join(f"{LABELS[k]} calls/s" for k in KINDS)
    lines = [
        f"| concurrency | {head} | nic / TCP | co-located / TCP |",
        "|---|---|---|---|---|---|",
    ]
    for concurrency in (1, 12):
        tcp = rates[("tcp", concurrency)]
        cells = " | ".join(f"{rates[(k, concurrency)]:.0f}" for k in KINDS)
        ratios = " | ".join(f"{rates[(k, concurrency)] / tcp:.2f}" for k in KINDS[1:])
        lines.append(f"| {concurrency} | {cells} | {ratios} |")
    return "\n".join(lines)


def quick(calls: int, reps: int) -> None:
    servers = Servers()
    try:
        rates: dict[tuple[str, int], list[float]] = {case: [] for case in CASES}
        for _ in range(reps):
            for kind, concurrency in CASES:
                result = subprocess.run(
                    [sys.executable, "-m", "bench.nic.echo", "client", servers.addresses[kind],
                     str(calls), str(concurrency)],
                    cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300, check=True,
                )  # fmt: skip
                rates[(kind, concurrency)].append(calls / float(result.stdout.split()[-1]))
        print(f"echo RPC, {calls} calls per run, median of {reps} runs, one client process each")
        print(table({case: statistics.median(values) for case, values in rates.items()}))
    finally:
        servers.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        run_server(sys.argv[2])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        print(measure(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
        return
    if "--quick" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--quick", action="store_true")
        parser.add_argument("--calls", type=int, default=3000)
        parser.add_argument("--reps", type=int, default=3)
        args = parser.parse_args()
        quick(args.calls, args.reps)
        return
    import pyperf

    def worker_args(command: list[str], args: argparse.Namespace) -> None:
        command.extend(["--addresses", args.addresses])

    runner = pyperf.Runner(processes=3, values=3, warmups=1, add_cmdline_args=worker_args)
    runner.argparser.add_argument("--addresses", help="(internal) kind=address;...")
    args = runner.parse_args()
    if not args.worker and not args.addresses:
        servers = Servers()
        args.addresses = ";".join(f"{k}={a}" for k, a in servers.addresses.items())
    addresses = dict(item.split("=", 1) for item in args.addresses.split(";"))
    results = {}
    for kind, concurrency in CASES:
        bench = runner.bench_time_func(
            f"echo-{kind}-c{concurrency}", time_calls, addresses[kind], concurrency
        )
        if bench is not None and not args.worker:
            results[(kind, concurrency)] = 1 / statistics.mean(bench.get_values())
    if len(results) == len(CASES):
        print()
        print(table(results))


if __name__ == "__main__":
    main()
