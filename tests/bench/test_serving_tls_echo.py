"""bench/serving/tls_echo.py: its arguments, and a run small enough for the test suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from bench.serving.tls_echo import parse_args

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_the_documented_run() -> None:
    args = parse_args([])
    assert args.concurrency == [1, 12]
    assert (args.reps, args.handshakes, args.key_type) == (3, 50, "ecdsa")
    assert args.server is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "1,x"], "expected numbers like 1,12"),
        (["--concurrency", "0"], "must be >= 1"),
        (["--seconds", "0"], "must be > 0"),
        (["--calls", "many"], "is not a number"),
        (["--key-type", "dsa"], "invalid choice"),
        (["--key", "k.pem"], "--key goes with --server"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_tiny_run_reports_both_transports() -> None:
    # Two server processes and a few hundred calls: about a second; the limit bounds a hang.
    command = "-m bench.serving.tls_echo --quiet --reps 1 --seconds 0.2 --calls 200"
    command += " --warmup 10 --handshakes 2 --concurrency 1"
    done = subprocess.run(
        [sys.executable, *command.split()],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"^c1 +plain +[\d,]+ ", out, re.M)
    ratio = re.search(r"^c1 +tls +[\d,]+ .* (\d\.\d\d) ≥0\.6 (met|MISSED)$", out, re.M)
    assert ratio is not None, out
    assert 0 < float(ratio.group(1)) < 5
    assert re.search(r"connect \(\+ TLS handshake\) \+ close +plain +[\d.]+ / +[\d.]+ +tls", out)
    assert "machine (before): CPU" in out
    assert "cpuidle driver" in out
