"""bench/codec.py, as a smoke run: its two builders make the same bytes, both readers
read the same values, and each timed function runs (a few loops, no timing asserted)."""

from __future__ import annotations

import capsvc
from bench import codec


def test_both_builders_make_the_same_message() -> None:
    assert codec.build_generated() == codec.build_pycapnp() == codec.MESSAGE


def test_both_readers_read_the_same_values() -> None:
    assert codec.read_all_generated(codec.MESSAGE) == codec.read_all_pycapnp(codec.MESSAGE)
    assert codec.read_all_generated_row(codec.MESSAGE) == codec.read_all_pycapnp(codec.MESSAGE)
    assert codec.read_all_generated(codec.MESSAGE) > 0


def test_the_timed_functions_run() -> None:
    reader = codec.gen.Car.from_bytes(codec.MESSAGE)
    with codec.ref.Car.from_bytes(codec.MESSAGE) as ref_reader:
        for _, name in codec.FIELDS:
            assert codec.field_reads(reader, name)(3) >= 0
            assert codec.field_reads(ref_reader, name)(3) >= 0
            assert codec.fast_reads(ref_reader, name)(3) >= 0
    assert codec.calls(codec.build_generated)(2) >= 0
    state = codec.machine_state()
    assert set(state) == {
        "cpu_model",
        "cpuidle_driver",
        "cpuidle_governor",
        "haltpoll_ns",
        "loadavg",
        "capsvc_build",
    }
    assert state["capsvc_build"] == ("compiled" if capsvc.COMPILED else "pure")


def test_the_suite_runs_under_pyperf_workers() -> None:
    """``./dev bench codec`` spawns pyperf workers, which get a minimal environment (no
    PYTHONPATH): each must import ``bench`` by running as ``-m bench.codec`` from the
    repository. (A single value per benchmark: a few seconds.)"""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "codec", "--debug-single-value"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "decode + row" in done.stdout
