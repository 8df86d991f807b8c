"""The pyperf command line: smoke run, worker processes, compare_to and the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.serialization.cli import default_formats, select_specs

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # Real time: a subprocess run to completion; the limit only bounds a hang.
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _names(path: Path) -> list[str]:
    data = json.loads(path.read_text())
    return [bench["metadata"]["name"] for bench in data["benchmarks"]]


def test_spec_selection_and_names() -> None:
    everything = select_specs(
        ("carsales", "catrank", "eval"),
        ("gen", "object", "bytes", "pipe", "pipe-async"),
        ("capnp", "capnp-direct", "msgpack"),
        ("none", "packed"),
    )
    # per benchmark: gen, object x3, and 5 per serializing mode (2 capnp x none/packed, msgpack)
    assert len(everything) == 3 * (1 + 3 + 3 * 5)
    names = [spec.name for spec in everything]
    assert len(set(names)) == len(names)
    assert names[:10] == [
        "carsales/gen",
        "carsales/object/capnp",
        "carsales/object/capnp-direct",
        "carsales/object/msgpack",
        "carsales/bytes/none/capnp",
        "carsales/bytes/packed/capnp",
        "carsales/bytes/none/capnp-direct",
        "carsales/bytes/packed/capnp-direct",
        "carsales/bytes/msgpack",
        "carsales/pipe/none/capnp",
    ]
    packed_only = select_specs(("eval",), ("object", "bytes"), ("capnp", "msgpack"), ("packed",))
    assert [spec.name for spec in packed_only] == ["eval/bytes/packed/capnp", "eval/bytes/msgpack"]


def test_smoke_run_compare_to_and_report(tmp_path: Path) -> None:
    results = tmp_path / "smoke.json"
    done = _run("-m", "bench.serialization", "run", "--smoke", "-o", str(results))
    assert done.returncode == 0, done.stdout + done.stderr
    names = _names(results)
    formats = default_formats()  # capnpy only where it is installed
    per_mode = sum(1 if fmt in ("capnpy", "msgpack") else 2 for fmt in formats)
    assert len(names) == 3 * (1 + len(formats) + 3 * per_mode)
    assert "catrank/pipe-async/packed/capnp" in names
    assert "carsales/bytes/packed/capsvc" in names
    assert "eval/pipe-async/none/capsvc" in names
    compared = _run("-m", "pyperf", "compare_to", str(results), str(results), "--table")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "eval/pipe/none/capnp" in compared.stdout
    charts = tmp_path / "charts"
    report = _run("-m", "bench.serialization", "report", str(results), "--charts", str(charts))
    assert report.returncode == 0, report.stderr
    assert "| carsales | bytes | packed |" in report.stdout
    for benchmark in ("carsales", "catrank", "eval"):
        png = (charts / f"serialization-{benchmark}.png").read_bytes()
        assert png.startswith(b"\x89PNG")
    assert "catrank/pipe/packed/capnp-direct" in names
    assert "| eval | pipe-async | none |" in report.stdout


def test_pyperf_worker_processes(tmp_path: Path) -> None:
    # Through pyperf's manager: two worker processes per benchmark, each re-executing
    # `python -m bench.serialization run --worker --worker-task=N ...`.
    results = tmp_path / "workers.json"
    done = _run(
        "-m",
        "bench.serialization",
        "run",
        "--smoke",
        "--spawn",
        "--benchmark",
        "eval",
        "--mode",
        "bytes,pipe-async",
        "--format",
        "capnp",
        "--compression",
        "packed",
        "--processes",
        "2",
        "--depth",
        "0",
        "-o",
        str(results),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(results.read_text())
    benchmarks = {bench["metadata"]["name"]: bench for bench in data["benchmarks"]}
    assert sorted(benchmarks) == ["eval/bytes/packed/capnp", "eval/pipe-async/packed/capnp"]
    for bench in benchmarks.values():
        assert len(bench["runs"]) == 2  # one run per worker process
    pipe = benchmarks["eval/pipe-async/packed/capnp"]
    assert pipe["metadata"]["pipe_async_depth"] == "unbounded"
    for run in pipe["runs"]:  # per-run metadata (pyperf hoists values common to all runs)
        assert run["metadata"].get("client_cpu_us", pipe["metadata"].get("client_cpu_us")) > 0


@pytest.mark.parametrize("command", [["report"], ["run", "--mode", "nope"], ["bogus"]])
def test_bad_command_lines_fail(command: list[str]) -> None:
    done = _run("-m", "bench.serialization", *command)
    assert done.returncode != 0
