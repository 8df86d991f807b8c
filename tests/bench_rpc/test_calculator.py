"""The calculator's pipelined-calls benchmark (bench.rpc.calculator) runs both pairings
end to end: each server a real process on 127.0.0.1 (stopped by its PID), each client a
real process whose every reply is checked (add(12, 34) == 46). Seconds-long; figures are
not judged here (speed lives in the benchmark)."""

from __future__ import annotations

import re

import pytest

from bench.rpc import calculator


@pytest.mark.parametrize("pairing", calculator.PAIRINGS)
def test_each_pairing_completes_pipelined_iterations(pairing: str) -> None:
    figures = calculator._measure(pairing, concurrency=2, seconds=0.3)
    assert figures["iterations"] > 0
    assert figures["per_s"] > 0


def test_the_report_has_a_row_per_level() -> None:
    text = calculator.run(rounds=1, seconds=0.2, levels=[1])
    row = re.search(r"^\| 1 \| ([\d,]+) .*\| ([\d,]+) .*\| ([\d.]+) ", text, re.MULTILINE)
    assert row is not None, text
    assert "cpuidle driver" in text
