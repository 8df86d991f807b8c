"""bench/stream.py as a smoke run: a real ``capsvc serve`` of the kv example, both ways
of writing (window and returned), every write stored (the server's ``keys`` counts them),
and the report's table and ratio printed. No timing is asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_stream_benchmark_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "stream", "--writes", "300", "--rounds", "1"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,  # real time: a server process and 1,200 calls over TCP
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| window |" in done.stdout
    assert "| returned |" in done.stdout
    assert "window ÷ returned, wall per write:" in done.stdout
    assert "machine (after): CPU" in done.stdout
