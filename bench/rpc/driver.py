"""The master command: servers, pyperf suites and the Nagle experiment, repetition-major.

Theory of operation
-------------------
One ``run`` is ``reps`` repetitions of the same sequence, one after the other
(rep-major), so that slow phases of the shared machine spread over every scenario instead
of hitting one: the medians and ranges in the report are over these repetitions, and every
capsvc/pycapnp ratio is taken within a repetition (figures measured minutes apart on the
same machine state) before its median is taken.

A repetition:
1. starts every server the selected pairings need, each a process of its own
   (bench.rpc.servers), fresh for this repetition;
2. for each pairing, runs ``python -m bench.rpc.suite`` (a pyperf Runner master; pyperf
   spawns the client worker processes) against that pairing's server, appending its runs
   to ``<out>/<pairing>.json.gz``, and stops the servers;
3. runs the Nagle cases (bench.rpc.nagle), each against a capsvc server started for it,
   appending to ``<out>/nagle.json.gz``.

``manifest.json`` records what was asked (scenarios, pyperf options, repetitions) and
how long each phase took; the report reads it together with the pyperf files.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pyperf

from bench.rpc import nagle
from bench.rpc.scenarios import RESULTS_ROOT, ROOT, SERVER_KINDS, Scenario
from bench.rpc.servers import child_env, start_servers, stop_servers

# pyperf options of a full run, and of the smoke run (fixed loops: no calibration worker).
FULL_PYPERF = ["--processes", "3", "--values", "4", "--warmups", "1", "--min-time", "0.1"]
SMOKE_PYPERF = ["--processes", "1", "--values", "1", "--warmups", "0", "--loops", "25"]


@dataclass
class RunConfig:
    out: str
    scenarios: list[Scenario]
    reps: int = 3
    pyperf_args: list[str] = field(default_factory=lambda: list(FULL_PYPERF))
    nagle: bool = True
    smoke: bool = False
    ablation_seconds: float = 21.0  # the Nagle ablation's total budget, over all reps
    quiet: bool = False


def default_out_dir(smoke: bool = False) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return os.path.join(RESULTS_ROOT, "rpc", ("smoke-" if smoke else "") + stamp)


def capsvc_state() -> dict[str, Any]:
    """Which capsvc was measured: the commit, and whether capsvc/ had local changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    import capsvc

    diff = git("diff", "HEAD", "--stat", "--", "capsvc")
    return {
        "commit": git("rev-parse", "--short", "HEAD") or "unknown",
        # The build the servers and clients ran (they inherit CAPSVC_PURE): compiled or pure.
        "build": "compiled" if capsvc.COMPILED else "pure",
        "capsvc_modified": bool(diff),
        "capsvc_diff_stat": diff.splitlines()[-1].strip() if diff else "",
    }


def _say(config: RunConfig, text: str) -> None:
    if not config.quiet:
        print(text, flush=True)


def run(config: RunConfig) -> dict[str, Any]:
    """Run the suite; return the manifest (also written to ``<out>/manifest.json``)."""
    os.makedirs(config.out, exist_ok=True)
    if any(name.endswith(".json.gz") for name in os.listdir(config.out)):
        raise SystemExit(f"{config.out} already holds results: choose a new --out")
    manifest: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "smoke": config.smoke,
        "reps": config.reps,
        "scenarios": [s.id for s in config.scenarios],
        "pyperf_args": config.pyperf_args,
        "nagle_cases": [],
        "host": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "pyperf": pyperf.__version__,
            "load_avg_before": os.getloadavg()[0],
        },
        "capsvc": capsvc_state(),
        "phases": [],
    }
    began = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="capsvc-bench-")
    by_pairing: dict[str, list[Scenario]] = {}
    for scenario in config.scenarios:
        by_pairing.setdefault(scenario.pairing.name, []).append(scenario)
    kinds = []
    for scenarios in by_pairing.values():
        kind = SERVER_KINDS[scenarios[0].pairing.server]
        if kind not in kinds:
            kinds.append(kind)
    nagle_cases = nagle.cases(config.smoke, config.ablation_seconds / max(config.reps, 1))
    manifest["nagle_cases"] = [asdict(c) for c in nagle_cases] if config.nagle else []
    try:
        with open(os.path.join(config.out, "servers.log"), "a") as log:
            for rep in range(1, config.reps + 1):
                if by_pairing:
                    _suite_rep(config, rep, by_pairing, kinds, scratch, log, manifest)
                if config.nagle:
                    _nagle_rep(config, rep, nagle_cases, scratch, log, manifest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        manifest["seconds"] = round(time.monotonic() - began, 1)
        manifest["host"]["load_avg_after"] = os.getloadavg()[0]
        with open(os.path.join(config.out, "manifest.json"), "w") as sink:
            json.dump(manifest, sink, indent=1)
    _say(config, f"done in {manifest['seconds']:.0f} s; results in {config.out}")
    return manifest


def _suite_rep(
    config: RunConfig,
    rep: int,
    by_pairing: dict[str, list[Scenario]],
    kinds: list[Any],
    scratch: str,
    log: Any,
    manifest: dict[str, Any],
) -> None:
    servers = start_servers(kinds, scratch, log)
    try:
        for pairing, scenarios in by_pairing.items():
            server = servers[scenarios[0].pairing.server]
            loads = ",".join(s.load.name for s in scenarios)
            _say(config, f"== rep {rep}/{config.reps}: {pairing} ({loads}) ==")
            side = tempfile.mkdtemp(prefix="side-", dir=scratch)
            command = [
                sys.executable, "-m", "bench.rpc.suite", *config.pyperf_args,
                "--pairing", pairing, "--loads", loads,
                "--server-address", server.address, "--server-pid", str(server.pid),
                "--rep", str(rep), "--results", os.path.abspath(config.out), "--side-dir", side,
            ]  # fmt: skip
            loops = _calibrated_loops(config.out, pairing)
            if loops and not _has_loops_option(config.pyperf_args):
                command.extend(["--loops-of", loops])
            if config.quiet:
                command.append("--quiet")
            start = time.monotonic()
            subprocess.run(
                command,
                cwd=ROOT,
                env=child_env(),
                check=True,
                stdout=subprocess.DEVNULL if config.quiet else None,
            )
            manifest["phases"].append(
                {"rep": rep, "phase": pairing, "seconds": round(time.monotonic() - start, 1)}
            )
    finally:
        stop_servers(servers)


def _has_loops_option(args: list[str]) -> bool:
    return any(a in ("-l", "--loops") or a.startswith("--loops=") for a in args)


def _calibrated_loops(out: str, pairing: str) -> str:
    """``LOAD=N,...`` from the loops pyperf calibrated in an earlier repetition."""
    path = os.path.join(out, f"{pairing}.json.gz")
    if not os.path.exists(path):
        return ""
    items = []
    for bench in pyperf.BenchmarkSuite.load(path):
        name = bench.get_name()
        if name.startswith("echo-") and not name.endswith("-latency"):
            loops = bench.get_runs()[-1].get_metadata().get("loops")
            if loops:
                items.append(f"{name[len('echo-') :]}={loops}")
    return ",".join(items)


def _nagle_rep(
    config: RunConfig,
    rep: int,
    cases: list[nagle.NagleCase],
    scratch: str,
    log: Any,
    manifest: dict[str, Any],
) -> None:
    kinds = []
    for case in cases:
        if SERVER_KINDS[case.server] not in kinds:
            kinds.append(SERVER_KINDS[case.server])
    servers = start_servers(kinds, scratch, log)
    results = os.path.join(config.out, "nagle.json.gz")
    try:
        for case in cases:
            _say(config, f"== rep {rep}/{config.reps}: nagle {case.name} ==")
            start = time.monotonic()
            run = nagle.run_case(case, servers[case.server], scratch, rep)
            meta = run.get_metadata()
            _say(
                config,
                f"{case.name}: {meta['rpc_calls']} calls, {meta['rpc_calls_per_s']:.0f} calls/s,"
                f" max {max(run.values) * 1e3:.1f} ms, > 10 ms: {meta['rpc_over_10ms']},"
                f" > 30 ms: {meta['rpc_over_30ms']},"
                f" writes/call {meta['rpc_client_writes_per_call']:.2f}",
            )
            pyperf.add_runs(results, pyperf.Benchmark([run]))
            manifest["phases"].append(
                {
                    "rep": rep,
                    "phase": "nagle " + case.name,
                    "seconds": round(time.monotonic() - start, 1),
                }
            )
    finally:
        stop_servers(servers)
