"""The Nagle experiment: sequential calls with TCP_NODELAY off, with and without coalescing.

Theory of operation
-------------------
Nagle's algorithm holds a small write back while earlier data is unacknowledged; the
receiver's delayed ACK (40 ms minimum on Linux) holds that acknowledgement back when it has
nothing to send. A peer that writes the Finish of one call and the next Call with two
``send`` calls therefore waits ~40 ms per call (pycapnp-notes.md §4). capsvc writes
everything one scheduler pass produces with a single write, so the two leave together.

A plain echo call cannot show this: it is one message each way, and capsvc sends a Finish
only when the results hold a capability. So the experiment calls ``BenchEcho.pingCap``
(schemas/bench_echo.capnp), whose results carry a capability: every sequential round trip
then has Finish + next Call on the client side. The cases (``CASES``), each a capsvc server
process of its own and a client process:

- ``pingcap-nodelay-off`` — capsvc as built, NODELAY off on both ends: 10,000 calls;
  the goal is no call slower than 10 ms.
- ``pingcap-nodelay-off-nocoalesce`` — the ablation, ``coalesce=False`` on both ends
  (each message its own ``send_all``): stalls by design, so it is capped by time.
- ``ping-nodelay-off-nocoalesce`` — control: plain echo, coalescing off: no Finish, no
  stall.
- ``pingcap-nodelay-on-nocoalesce`` — control: coalescing off but NODELAY on: no stall
  (NODELAY hides the problem; capsvc must not depend on it).

The figures are per-call latencies, stored as pyperf values (one ``pyperf.Run`` per case
and repetition, built with pyperf's Run API, in ``nagle.json.gz``), with the count of calls
over 10 ms and 30 ms, calls/s and client writes per call as run metadata. They are counts
of rare events over a fixed number of sequential calls, not a throughput, which is why they
do not go through ``Runner.bench_time_func`` (whose loop calibration would change the call
count and whose mean hides exactly the outliers this experiment is about).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import pyperf

from bench.rpc.scenarios import ROOT, SERVER_KINDS
from bench.rpc.servers import ServerProcess, child_env

PAYLOAD = 16
STALL_MS = (10, 30)


@dataclass(frozen=True)
class NagleCase:
    name: str
    server: str  # a SERVER_KINDS key
    method: str  # "pingCap" | "ping"
    nodelay: bool
    coalesce: bool
    calls: int
    max_seconds: float
    warmup: int
    title: str
    pause: float = 0.0  # seconds the caller sleeps between calls


def cases(smoke: bool = False, ablation_seconds: float = 7.0) -> list[NagleCase]:
    """The experiment's cases; ``ablation_seconds`` caps the stalling one (per repetition)."""
    built, control = (300, 200) if smoke else (10_000, 2_000)
    pause_seconds = min(ablation_seconds, 3.0)
    return [
        NagleCase(
            "pingcap-nodelay-off", "capsvc-tcp-nagle", "pingCap", False, True,
            built, 120.0, 20 if smoke else 200,
            "pingCap, NODELAY off, capsvc as built (coalescing on)",
        ),
        NagleCase(
            "pingcap-nodelay-off-pause1ms", "capsvc-tcp-nagle", "pingCap", False, True,
            100_000, pause_seconds, 3,
            "pingCap, NODELAY off, capsvc as built, caller pauses 1 ms between calls",
            pause=0.001,
        ),
        NagleCase(
            "pingcap-nodelay-off-nocoalesce", "capsvc-tcp-nagle-nocoalesce", "pingCap",
            False, False, 100_000, ablation_seconds, 3,
            "pingCap, NODELAY off, coalescing off (ablation)",
        ),
        NagleCase(
            "ping-nodelay-off-nocoalesce", "capsvc-tcp-nagle-nocoalesce", "ping",
            False, False, control, 30.0, 20,
            "plain ping, NODELAY off, coalescing off (control)",
        ),
        NagleCase(
            "pingcap-nodelay-on-nocoalesce", "capsvc-tcp-nocoalesce", "pingCap",
            True, False, control, 30.0, 20,
            "pingCap, NODELAY on, coalescing off (control)",
        ),
    ]  # fmt: skip


# ------------------------------------------------------------------------ client process
def client_main(
    connect: str,
    method: str,
    calls: int,
    max_seconds: float,
    warmup: int,
    nodelay: bool,
    coalesce: bool,
    out: str,
    pause: float = 0.0,
) -> None:
    """``python -m bench.rpc nagle-client``: sequential calls, latencies to ``out``.

    The warm-up calls and the measured ones are one unbroken sequence (one ``run``): a
    pause between them would let the last warm-up's Finish leave alone, and the first
    measured Call would then meet Nagle (see the ``pause1ms`` case).
    """
    from bench.rpc.clients import CapsvcClient

    client = CapsvcClient(
        connect, 1, PAYLOAD, method=method, nodelay=nodelay, coalesce=coalesce, pause=pause
    ).start()
    try:
        before = client.stats()
        latencies: list[int] = []
        cpu = time.process_time()
        seconds = client.run(warmup + calls, latencies, max_seconds=max_seconds)
        cpu = time.process_time() - cpu
        after = client.stats()
    finally:
        client.close()
    # Costs are over the whole sequence; latencies and calls/s over the measured part.
    total = max(len(latencies), 1)
    measured_ns = sum(latencies[warmup:])
    latencies = latencies[warmup:]
    made = len(latencies)
    record = {
        "latencies_ns": latencies,
        # c1: the measured part lasted its calls' latencies plus the caller's pauses.
        "seconds": measured_ns * 1e-9 + made * pause,
        "whole_seconds": seconds,
        "calls": made,
        "writes_per_call": (after["writes"] - before["writes"]) / total,
        "passes_per_call": (after["passes"] - before["passes"]) / total,
        "cpu_us_per_call": cpu / total * 1e6,
    }
    with open(out, "w") as sink:
        json.dump(record, sink)


# ------------------------------------------------------------------------ driver side
def run_case(case: NagleCase, server: ServerProcess, out_dir: str, rep: int) -> pyperf.Run:
    """Run one case's client process against ``server``; return its pyperf Run."""
    path = os.path.join(out_dir, f"nagle-{case.name}-{rep}.json")
    command = [
        sys.executable, "-m", "bench.rpc", "nagle-client", "--connect", server.address,
        "--method", case.method, "--calls", str(case.calls),
        "--max-seconds", str(case.max_seconds), "--warmup", str(case.warmup), "--out", path,
    ]  # fmt: skip
    if not case.nodelay:
        command.append("--no-nodelay")
    if not case.coalesce:
        command.append("--no-coalesce")
    if case.pause:
        command.extend(["--pause", str(case.pause)])
    timeout = case.max_seconds + case.warmup * 0.1 + 120
    subprocess.run(command, cwd=ROOT, env=child_env(), check=True, timeout=timeout)
    with open(path) as source:
        record = json.load(source)
    os.unlink(path)
    latencies = record["latencies_ns"]
    if not latencies:
        raise RuntimeError(f"nagle case {case.name}: no call completed")
    kind = SERVER_KINDS[case.server]
    metadata: dict[str, Any] = {
        "name": case.name,
        "unit": "second",
        "loops": 1,
        "rpc_rep": rep,
        "rpc_method": case.method,
        "rpc_client_nodelay": int(case.nodelay),
        "rpc_client_coalesce": int(case.coalesce),
        "rpc_pause_ms": case.pause * 1e3,
        "rpc_server_nodelay": int(kind.nodelay),
        "rpc_server_coalesce": int(kind.coalesce),
        "rpc_calls": record["calls"],
        "rpc_calls_per_s": record["calls"] / record["seconds"],
        "rpc_client_writes_per_call": record["writes_per_call"],
        "rpc_client_passes_per_call": record["passes_per_call"],
        "rpc_client_cpu_us_per_call": record["cpu_us_per_call"],
    }
    for ms in STALL_MS:
        metadata[f"rpc_over_{ms}ms"] = sum(1 for ns in latencies if ns > ms * 1_000_000)
    return pyperf.Run([max(ns, 1) * 1e-9 for ns in latencies], metadata=metadata)
