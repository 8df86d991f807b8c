"""``ab``: two formats timed in alternation, for a ratio that machine drift cannot move.

    python -m bench.serialization ab --benchmark eval --mode pipe-async
                                     [--formats capsvc,msgpack] [--compression none]
                                     [--rounds 20] [--processes 5] [--iterations N]
                                     [--depth 4] [-o FILE.json]

Theory of operation
-------------------
``run`` hands each benchmark to pyperf, which times one format's worker processes to the
end before it starts the next format's. On our 2-vCPU guests the machine's speed drifts
by tens of percent over minutes (one format's own eval pipe-async time moved from 27 to
50 µs between runs), so a ratio of two medians taken seconds apart carries that drift:
five such runs of one code gave 0.85 to 1.49. ``ab`` takes the same batches (the first N
requests of a fresh generator, §7), the same cases, codecs and pipe sessions as ``run``,
but times one batch of each format per *round*, back to back, and reports the median and
quartiles of the per-round ratios. Drift slower than a round (about 60 ms for eval)
cancels in each ratio; the order within a round alternates, so neither format always
goes first. The first ``WARMUP_ROUNDS`` rounds are not counted.

A process has its own luck too (its hash seed and memory layout, its servers'): the
same code's median ratio moved by about 3 % from one process to the next. So, as pyperf
spreads values over worker processes, ``--processes N`` runs the rounds in N fresh
processes one after another (``python -m bench.serialization ab ... --processes 1``,
each with fresh pipe servers) and pools their per-round ratios; each process's own
median is reported beside the pooled one.

As in ``run``, the cyclic GC is collected before and disabled during each timed batch,
and in the pipe modes the client's and the server's CPU time per iteration are recorded
(pipe.CPU_LOG: both to the nanosecond on Linux). The machine's state (CPU model,
cpuidle driver and haltpoll setting, load) is printed with the figures and stored in the
JSON output. Rounds and iterations are bounded, and every pipe server is stopped by PID
when the command ends.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.serialization.base import BENCHMARKS, COMPRESSIONS, FORMATS, MODES

__all__ = ["WARMUP_ROUNDS", "main", "measure"]

WARMUP_ROUNDS = 2
MAX_ROUNDS = 1_000
MAX_ITERATIONS = 100_000
MAX_PROCESSES = 50
PROCESS_TIMEOUT = 600  # seconds for one process's rounds: every loop here is bounded
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A batch long enough that a round's two batches see the same machine, short enough that
# the drift within a round is small: about 30-60 ms of each format for every benchmark.
DEFAULT_ITERATIONS = {"carsales": 256, "catrank": 64, "eval": 2000}


def _machine() -> dict[str, str]:
    from bench.codec import machine_state

    return machine_state()


def _timer(benchmark: str, mode: str, fmt: str, compression: str, depth: int, batch: Any) -> Any:
    """(time one batch → seconds, CPU log or None, close) for one format."""
    from bench.serialization import modes
    from bench.serialization.codecs import make_codec

    case = modes.make_case(benchmark, fmt)
    codec = make_codec(modes.load_benchmark(benchmark), fmt, compression)
    if mode in ("pipe", "pipe-async"):
        from bench.serialization import pipe

        session = pipe.PipeSession(benchmark, case, codec)
        window = None if mode == "pipe" else depth

        def run_pipe() -> float:
            return session.run(batch, window)  # type: ignore[no-any-return]

        return run_pipe, pipe.CPU_LOG, session.close
    perf_counter = time.perf_counter
    run = modes.run_bytes if mode == "bytes" else modes.run_object

    def run_in_process() -> float:
        start = perf_counter()
        run(case, codec, batch)
        return perf_counter() - start

    return run_in_process, None, lambda: None


def _timed(run: Callable[[], float]) -> float:
    gc.collect()
    gc.disable()  # as run's batches: no collection inside the timed region
    try:
        return run()
    finally:
        gc.enable()


def measure(
    benchmark: str,
    mode: str,
    formats: Sequence[str],
    compression: str = "none",
    rounds: int = 40,
    iterations: int | None = None,
    depth: int = 4,
) -> dict[str, Any]:
    """Time ``formats`` (two) in alternation; the figures as :func:`main` prints them."""
    from bench.serialization.modes import generate_batch

    if len(formats) != 2 or formats[0] == formats[1]:
        raise ValueError("ab compares exactly two different formats")
    if not 1 <= rounds <= MAX_ROUNDS:
        raise ValueError(f"rounds must be 1..{MAX_ROUNDS}")
    count = DEFAULT_ITERATIONS[benchmark] if iterations is None else iterations
    if not 1 <= count <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be 1..{MAX_ITERATIONS}")
    batch = generate_batch(benchmark, count)
    gc.collect()
    gc.freeze()  # the inputs live for the whole command: out of every collection
    before = _machine()
    timers: dict[str, Any] = {}
    times: dict[str, list[float]] = {fmt: [] for fmt in formats}
    cpu: dict[str, list[tuple[float, float]]] = {fmt: [] for fmt in formats}
    try:
        for fmt in formats:
            timers[fmt] = _timer(benchmark, mode, fmt, compression, depth, batch)
        for index in range(WARMUP_ROUNDS + rounds):
            order = formats if index % 2 == 0 else formats[::-1]
            for fmt in order:
                run, log, _close = timers[fmt]
                elapsed = _timed(run)
                if index < WARMUP_ROUNDS:
                    continue
                times[fmt].append(elapsed / count * 1e6)
                if log is not None:
                    client, server, done = log[-1]
                    cpu[fmt].append((client / done * 1e6, server / done * 1e6))
    finally:
        for _run, _log, close in timers.values():
            close()
    first, second = formats
    ratios = [a / b for a, b in zip(times[first], times[second], strict=True)]
    result: dict[str, Any] = {
        "benchmark": benchmark,
        "mode": mode,
        "compression": compression,
        "formats": list(formats),
        "rounds": rounds,
        "iterations": count,
        "depth": depth if mode == "pipe-async" else None,
        "machine_before": before,
        "machine_after": _machine(),
        "us_per_iteration": {fmt: times[fmt] for fmt in formats},
        "ratios": ratios,
        "ratio_median": statistics.median(ratios),
        "ratio_quartiles": _quartiles(ratios),
    }
    if all(cpu[fmt] for fmt in formats):
        result["cpu_us_per_iteration"] = {
            fmt: {
                "client": statistics.median(c for c, _s in cpu[fmt]),
                "server": statistics.median(s for _c, s in cpu[fmt]),
            }
            for fmt in formats
        }
    return result


def _without(argv: Sequence[str], options: Sequence[str]) -> list[str]:
    """``argv`` less each of ``options`` and its value (``--name value`` or ``--name=value``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in options:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def _quartiles(values: Sequence[float]) -> list[float]:
    if len(values) < 2:
        return [values[0], values[0], values[0]]
    return statistics.quantiles(values, n=4)


def render(result: dict[str, Any]) -> str:
    first, second = result["formats"]
    times = result["us_per_iteration"]
    machine = result["machine_before"]
    lines = [
        f"{result['benchmark']} {result['mode']} ({result['compression']}), "
        f"{result.get('processes', 1)} process(es) x {result['rounds']} rounds of"
        f" {result['iterations']} iterations, alternating",
        f"machine: {machine['cpu_model']}; cpuidle {machine['cpuidle_driver']}"
        f" ({machine['cpuidle_governor']}), guest_halt_poll_ns {machine['haltpoll_ns']};"
        f" load {machine['loadavg']} (after: {result['machine_after']['loadavg']});"
        f" {machine['capsvc_build']} build",
    ]
    for fmt in (first, second):
        line = f"  {fmt}: median {statistics.median(times[fmt]):.2f} µs per iteration"
        cpu = result.get("cpu_us_per_iteration", {}).get(fmt)
        if cpu is not None:
            line += f" (CPU: client {cpu['client']:.2f}, server {cpu['server']:.2f})"
        lines.append(line)
    low, _median, high = result["ratio_quartiles"]
    lines.append(
        f"  {first} / {second}: median of per-round ratios {result['ratio_median']:.3f}"
        f" (quartiles {low:.3f} to {high:.3f})"
    )
    if "process_medians" in result:
        each = ", ".join(f"{value:.3f}" for value in result["process_medians"])
        lines.append(f"  each process's median: {each}")
    return "\n".join(lines)


def pooled(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One figure from the results of several processes (the same arguments each)."""
    first = results[0]
    formats = first["formats"]
    ratios = [ratio for result in results for ratio in result["ratios"]]
    out = dict(first)
    out["processes"] = len(results)
    out["machine_after"] = results[-1]["machine_after"]
    out["us_per_iteration"] = {
        fmt: [value for result in results for value in result["us_per_iteration"][fmt]]
        for fmt in formats
    }
    out["ratios"] = ratios
    out["ratio_median"] = statistics.median(ratios)
    out["ratio_quartiles"] = _quartiles(ratios)
    out["process_medians"] = [result["ratio_median"] for result in results]
    if all("cpu_us_per_iteration" in result for result in results):
        out["cpu_us_per_iteration"] = {
            fmt: {
                side: statistics.median(
                    result["cpu_us_per_iteration"][fmt][side] for result in results
                )
                for side in ("client", "server")
            }
            for fmt in formats
        }
    return out


def _in_processes(argv: Sequence[str], processes: int) -> dict[str, Any]:
    """The same command in ``processes`` fresh processes, one after another, pooled."""
    results = []
    with tempfile.TemporaryDirectory(prefix="capsvc-ab-") as directory:
        for index in range(processes):
            path = os.path.join(directory, f"{index}.json")
            command = [sys.executable, "-m", "bench.serialization", "ab", *argv]
            command += ["--processes", "1", "--quiet", "-o", path]
            subprocess.run(command, check=True, cwd=ROOT, timeout=PROCESS_TIMEOUT)
            with open(path) as data:
                results.append(json.load(data))
    return pooled(results)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serialization ab")
    parser.add_argument("--benchmark", required=True, choices=BENCHMARKS)
    parser.add_argument("--mode", required=True, choices=MODES)
    parser.add_argument("--formats", default="capsvc,msgpack")
    parser.add_argument("--compression", default="none", choices=COMPRESSIONS)
    parser.add_argument("--rounds", type=int, default=20, help="counted rounds per process")
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--depth", type=int, default=4, help="pipe-async: requests in flight")
    parser.add_argument("-o", "--output", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    formats = [fmt.strip() for fmt in args.formats.split(",")]
    for fmt in formats:
        if fmt not in FORMATS:
            parser.error(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    if not 1 <= args.processes <= MAX_PROCESSES:
        parser.error(f"processes must be 1..{MAX_PROCESSES}")
    if args.processes > 1:
        passed = [arg for arg in argv if arg not in ("--quiet",)]
        result = _in_processes(_without(passed, ("--processes", "-o", "--output")), args.processes)
    else:
        try:
            result = measure(
                args.benchmark,
                args.mode,
                formats,
                args.compression,
                args.rounds,
                args.iterations,
                args.depth,
            )
        except ValueError as error:
            parser.error(str(error))
    if not args.quiet:
        print(render(result))
    if args.output:
        with open(args.output, "w") as out:
            json.dump(result, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
