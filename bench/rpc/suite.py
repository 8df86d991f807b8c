"""The pyperf script of one pairing: ``python -m bench.rpc.suite`` (run by the driver).

Theory of operation
-------------------
The driver (bench.rpc.driver) starts the server, then runs this script once per pairing
and repetition. This script is a ``pyperf.Runner`` master: for every load it calls
``Runner.bench_time_func("echo-<load>", ...)``; pyperf spawns worker processes (this
same script with ``--worker``), calibrates the loop count, runs warm-ups and values, and
hands back a ``pyperf.Benchmark`` whose values are *seconds per call* (calls/s is their
inverse). The server's address, the pairing, the loads and the repetition reach the
workers through ``Runner(add_cmdline_args=...)``.

Each worker connects one client (bench.rpc.clients) on first use. Its ``time_func(loops)``
makes ``loops`` calls and returns the wall time; for the timed values (not the warm-ups,
not calibration runs: pyperf's order is fixed, warm-ups first) it also records every
call's latency and its CPU time. At exit the worker writes them to a side file; the master
then turns each worker's latencies into a ``pyperf.Run`` (one value per call, unit
seconds) of the benchmark ``echo-<load>-latency``, with per-call costs as run metadata:
client CPU µs/call, client scheduler passes/call, client writes/call (capsvc), and the
server's CPU µs/call (psutil, over every call of the benchmark, warm-ups included).

The first repetition lets pyperf calibrate the loops of each benchmark; the driver passes
the calibrated counts to the later repetitions (``--loops-of``), so that every repetition
measures the same number of calls per value (and saves a calibration process).

Both benchmarks are appended (``pyperf.add_runs``) to ``<results>/<pairing>.json.gz``, so
repetitions accumulate as runs tagged ``rpc_rep``; ``pyperf stats``, ``hist`` and
``compare_to`` work on these files.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from typing import Any

import pyperf

from bench.rpc.clients import EchoClient, make_client
from bench.rpc.scenarios import LOADS, PAIRINGS, Load, bench_name, latency_bench_name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("bench.rpc")
    group.add_argument("--pairing", required=True, choices=sorted(PAIRINGS))
    group.add_argument("--loads", required=True, help="comma-separated load names")
    group.add_argument("--server-address", required=True)
    group.add_argument("--server-pid", type=int, default=0)
    group.add_argument("--rep", type=int, default=1)
    group.add_argument("--results", required=True, help="results directory")
    group.add_argument("--side-dir", required=True, help="where workers leave latencies")
    group.add_argument(
        "--loops-of", default="", help="LOAD=N,...: fixed loops per load (no calibration)"
    )


def _forward(cmd: list[str], args: argparse.Namespace) -> None:
    cmd.extend([
        "--pairing", args.pairing, "--loads", args.loads,
        "--server-address", args.server_address, "--server-pid", str(args.server_pid),
        "--rep", str(args.rep), "--results", args.results, "--side-dir", args.side_dir,
    ])  # fmt: skip
    # --loops-of is the master's business: pyperf passes the loops itself.


class Worker:
    """The benchmark function of one load in a worker process (see the module docstring)."""

    def __init__(self, runner: pyperf.Runner, pairing: str, load: Load, address: str) -> None:
        args = runner.args
        self.pairing = PAIRINGS[pairing]
        self.load = load
        self.address = address
        calibrating = (
            args.calibrate_loops
            or args.recalibrate_loops
            or args.calibrate_warmups
            or args.recalibrate_warmups
        )
        # pyperf runs the warm-ups first, then the values (WorkerTask.compute).
        self.skip = float("inf") if calibrating else (args.warmups or 0)
        self.side_dir = args.side_dir
        self.client: EchoClient | None = None
        self.invocations = 0
        self.total_calls = 0
        self.latencies: list[int] = []
        self.measured_calls = 0
        self.measured_seconds = 0.0
        self.cpu_seconds = 0.0
        self.before: dict[str, float] = {}
        self.after: dict[str, float] = {}

    def time_func(self, loops: int) -> float:
        client = self.client
        if client is None:
            client = self.client = make_client(
                self.pairing.client, self.address, self.load.concurrency, self.load.payload
            ).start()
        measured = self.invocations >= self.skip
        self.invocations += 1
        self.total_calls += loops
        if not measured:
            return client.run(loops)
        if not self.before:
            self.before = client.stats()
        cpu = time.process_time()
        seconds = client.run(loops, self.latencies)
        self.cpu_seconds += time.process_time() - cpu
        self.after = client.stats()
        self.measured_calls += loops
        self.measured_seconds += seconds
        return seconds

    def finish(self) -> None:
        """Close the client and leave the side file for the master."""
        if self.client is None:
            return
        self.client.close()
        calls = self.measured_calls
        record: dict[str, Any] = {"total_calls": self.total_calls, "measured_calls": calls}
        if calls:
            record |= {
                "latencies_ns": self.latencies,
                "measured_seconds": self.measured_seconds,
                "client_cpu_us_per_call": self.cpu_seconds / calls * 1e6,
            }
            for key in ("passes", "writes"):
                if key in self.after:
                    per_call = (self.after[key] - self.before.get(key, 0)) / calls
                    record[f"client_{key}_per_call"] = per_call
        path = os.path.join(self.side_dir, f"{self.load.name}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as out:
            json.dump(record, out)
        os.replace(path + ".tmp", path)


def scenario_metadata(args: argparse.Namespace, load: Load) -> dict[str, Any]:
    pairing = PAIRINGS[args.pairing]
    return {
        "rpc_rep": args.rep,
        "rpc_pairing": pairing.name,
        "rpc_client": pairing.client,
        "rpc_server": pairing.server,
        "rpc_load": load.name,
        "rpc_concurrency": load.concurrency,
        "rpc_payload": load.payload,
    }


def latency_runs(
    args: argparse.Namespace, load: Load, server_cpu_seconds: float | None
) -> list[pyperf.Run]:
    """The master's half: one latency Run per worker side file of ``load``."""
    records = []
    for path in sorted(glob.glob(os.path.join(args.side_dir, f"{load.name}-*.json"))):
        with open(path) as source:
            records.append(json.load(source))
        os.unlink(path)
    total_calls = sum(r["total_calls"] for r in records)
    runs = []
    for record in records:
        if not record["measured_calls"]:
            continue  # a calibration worker
        metadata = scenario_metadata(args, load) | {
            "name": latency_bench_name(load),
            "unit": "second",
            "loops": 1,
            "rpc_calls_per_s": record["measured_calls"] / record["measured_seconds"],
            "rpc_client_cpu_us_per_call": record["client_cpu_us_per_call"],
        }
        for key in ("client_passes_per_call", "client_writes_per_call"):
            if key in record:
                metadata["rpc_" + key] = record[key]
        if server_cpu_seconds is not None and total_calls:
            metadata["rpc_server_cpu_us_per_call"] = server_cpu_seconds / total_calls * 1e6
        values = [max(ns, 1) * 1e-9 for ns in record["latencies_ns"]]
        runs.append(pyperf.Run(values, metadata=metadata))
    return runs


def main() -> None:
    runner = pyperf.Runner(add_cmdline_args=_forward, program_args=("-m", "bench.rpc.suite"))
    add_arguments(runner.argparser)
    args = runner.parse_args()
    loads = [LOADS[name] for name in args.loads.split(",")]
    results = os.path.join(args.results, f"{args.pairing}.json.gz")
    server_cpu: Any = None
    if not args.worker and args.server_pid:
        import psutil  # type: ignore[import-untyped]

        process = psutil.Process(args.server_pid)

        def server_cpu() -> float:
            times = process.cpu_times()
            return float(times.user + times.system)

    workers = []
    fixed_loops = dict(item.split("=") for item in args.loops_of.split(",") if item)
    calibrate = runner.args.loops
    for load in loads:
        if not args.worker:
            # Reuse an earlier repetition's calibration (pyperf reads args.loops per
            # benchmark when it spawns the workers): every repetition then measures the
            # same number of calls per value, and skips a calibration process.
            runner.args.loops = int(fixed_loops.get(load.name, calibrate))
        worker = Worker(runner, args.pairing, load, args.server_address)
        workers.append(worker)
        cpu_before = server_cpu() if server_cpu else 0.0
        bench = runner.bench_time_func(
            bench_name(load), worker.time_func, metadata=scenario_metadata(args, load)
        )
        if bench is None or args.worker:
            continue
        cpu = server_cpu() - cpu_before if server_cpu else None
        pyperf.add_runs(results, bench)
        runs = latency_runs(args, load, cpu)
        if runs:
            pyperf.add_runs(results, pyperf.Benchmark(runs))
        else:
            print(f"warning: no latencies recorded for {load.name}", file=sys.stderr)
    for worker in workers:
        worker.finish()


if __name__ == "__main__":
    main()
