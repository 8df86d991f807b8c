"""The RPC benchmarks cannot rot: the smoke run of the whole suite, end to end.

Theory of operation: ``python -m bench.rpc smoke`` runs every pairing (each server in its
own process, pyperf worker processes as clients) at one load each, every Nagle case, and
the report, in a few seconds. The test checks the shape of what it leaves behind: pyperf
files that pyperf's own commands read and compare, the latency benchmarks, the Nagle
write counts (one write per call when coalescing, two without: properties of the code,
not of the machine's timing), the Markdown report and the charts.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pyperf
import pytest

from bench.rpc.scenarios import ROOT, SMOKE


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rpc-smoke") / "results"
    # Real time: the whole suite in subprocesses (a few seconds; the limit bounds a hang).
    done = subprocess.run(
        [sys.executable, "-m", "bench.rpc", "smoke", "--out", str(out), "--quiet"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_every_smoke_scenario_has_timings_and_latencies(smoke_results: Path) -> None:
    for scenario in SMOKE:
        pairing, load = scenario.split("/")
        suite = pyperf.BenchmarkSuite.load(str(smoke_results / f"{pairing}.json.gz"))
        timing = suite.get_benchmark(f"echo-{load}")
        assert timing.get_nvalue() >= 1
        # A measured real-time figure, so only a sanity bound: a loopback echo call takes
        # well under a millisecond; a second per call means it is broken, not loaded.
        assert 0 < timing.mean() < 1.0  # seconds per call
        latency = suite.get_benchmark(f"echo-{load}-latency")
        assert latency.get_nvalue() >= 25  # one value per call
        meta = latency.get_runs()[0].get_metadata()
        assert meta["rpc_pairing"] == pairing
        assert meta["rpc_client_cpu_us_per_call"] > 0


def test_pyperf_commands_read_the_results(smoke_results: Path) -> None:
    # Same benchmark name in two files: compare_to is the capsvc-vs-reference view.
    a = smoke_results / "capsvc-tcp.json.gz"
    b = smoke_results / "pycapnp-to-capsvc.json.gz"
    for command in (["stats", str(a)], ["hist", str(a)], ["compare_to", str(b), str(a)]):
        done = subprocess.run(
            [sys.executable, "-m", "pyperf", *command],
            capture_output=True,
            text=True,
            timeout=60,  # real time: a subprocess; bounds a hang
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "echo-c1-16B" in done.stdout


def test_nagle_cases_write_once_per_call_only_when_coalescing(smoke_results: Path) -> None:
    suite = pyperf.BenchmarkSuite.load(str(smoke_results / "nagle.json.gz"))
    writes = {
        bench.get_name(): bench.get_runs()[0].get_metadata()["rpc_client_writes_per_call"]
        for bench in suite
    }
    # Finish + next Call: one write as built, two with coalescing off. (The counts include
    # the bootstrap's messages: the time-capped ablation makes only a dozen calls here.)
    assert writes["pingcap-nodelay-off"] < 1.1
    assert writes["pingcap-nodelay-off-nocoalesce"] == pytest.approx(2.0, abs=0.2)
    assert writes["pingcap-nodelay-on-nocoalesce"] == pytest.approx(2.0, abs=0.05)
    # A plain echo is one message each way: nothing to coalesce.
    assert writes["ping-nodelay-off-nocoalesce"] == pytest.approx(1.0, abs=0.05)
    built = suite.get_benchmark("pingcap-nodelay-off")
    assert built.get_nvalue() == 300


def test_report_and_charts(smoke_results: Path) -> None:
    report = (smoke_results / "report.md").read_text()
    for heading in ("### Goals", "### Echo calls per second", "### Nagle experiment"):
        assert heading in report
    manifest = json.loads((smoke_results / "manifest.json").read_text())
    assert manifest["smoke"] is True
    assert manifest["scenarios"] == list(SMOKE)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("charts need matplotlib (the bench extra)")
    for chart in ("rpc-calls.png", "rpc-latency.png", "rpc-latency-hist.png", "rpc-nagle.png"):
        assert (smoke_results / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_files_are_gzipped_json(smoke_results: Path) -> None:
    with gzip.open(smoke_results / "capsvc-tcp.json.gz", "rt") as source:
        assert "benchmarks" in json.load(source)
