"""``python -m bench.serialization ab``: two formats timed in alternation (interleave.py).

Tiny batches and few rounds: these check what the command measures and reports, and that
it leaves no server running, not how fast anything is.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import pytest

from bench.serialization import interleave, pipe


def test_bytes_mode_gives_one_ratio_per_counted_round() -> None:
    result = interleave.measure("eval", "bytes", ["capsvc", "msgpack"], rounds=3, iterations=5)
    times = result["us_per_iteration"]
    assert len(times["capsvc"]) == len(times["msgpack"]) == 3  # (warm-up rounds not counted)
    pairs = zip(times["capsvc"], times["msgpack"], strict=True)
    assert result["ratios"] == [a / b for a, b in pairs]
    assert all(ratio > 0 for ratio in result["ratios"])
    assert result["ratio_median"] == statistics.median(result["ratios"])
    low, middle, high = result["ratio_quartiles"]
    assert low <= middle <= high
    assert "cpu_us_per_iteration" not in result  # in-process: no server to account for
    assert result["machine_before"]["cpu_model"]
    assert result["machine_before"]["capsvc_build"] in ("compiled", "pure")


def test_pipe_async_records_cpu_and_stops_its_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []

    class Recorded(pipe.PipeSession):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            started.append(self)

    monkeypatch.setattr(pipe, "PipeSession", Recorded)
    result = interleave.measure(
        "eval", "pipe-async", ["msgpack", "capsvc"], rounds=2, iterations=20, depth=2
    )
    assert result["depth"] == 2
    assert len(result["ratios"]) == 2
    cpu = result["cpu_us_per_iteration"]
    assert set(cpu) == {"msgpack", "capsvc"}
    assert all(cpu[fmt]["client"] > 0 for fmt in cpu)
    assert len(started) == 2  # one server per format, each stopped by its PID
    for session in started:
        assert session._proc.returncode is not None
        with pytest.raises(ProcessLookupError):
            os.kill(session.pid, 0)


def test_processes_pool_their_rounds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--processes 2`` runs the rounds in two fresh processes (real subprocesses) and
    pools them; the printed figure is the pooled one, and each process's median is shown."""
    output = tmp_path / "ab.json"
    argv = ["--benchmark", "eval", "--mode", "bytes", "--rounds", "2", "--iterations", "3"]
    assert interleave.main([*argv, "--processes", "2", "-o", str(output)]) == 0
    result = json.loads(output.read_text())
    assert result["processes"] == 2
    assert len(result["ratios"]) == 4
    assert len(result["process_medians"]) == 2
    assert result["ratio_median"] == statistics.median(result["ratios"])
    printed = capsys.readouterr().out
    assert "2 process(es) x 2 rounds of 3 iterations" in printed
    assert "each process's median" in printed


@pytest.mark.parametrize(
    "argv",
    [
        ["--benchmark", "eval", "--mode", "bytes", "--formats", "capsvc,capsvc"],
        ["--benchmark", "eval", "--mode", "bytes", "--formats", "capsvc,nope"],
        ["--benchmark", "eval", "--mode", "bytes", "--rounds", "0"],
        ["--benchmark", "eval", "--mode", "bytes", "--processes", "0"],
        ["--benchmark", "eval", "--mode", "bytes", "--iterations", "1000000000"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        interleave.main([*argv, "--processes", "1"] if "--processes" not in argv else argv)
    assert exit_.value.code == 2


def test_options_and_their_values_are_dropped_for_the_worker_processes() -> None:
    argv = ["--benchmark", "eval", "-o", "x.json", "--processes=3", "--rounds", "4"]
    assert interleave._without(argv, ("--processes", "-o")) == [
        "--benchmark",
        "eval",
        "--rounds",
        "4",
    ]
