"""The in-process control of the RPC benchmark (bench.rpc.inprocess) runs each kind it
compares: real calls (every reply is checked inside ``measure``) and real round trips of
the raw ping-pong, over a socket pair on one trio loop. Seconds-long; figures are not
judged here (speed lives in the benchmark, not in tests)."""

from __future__ import annotations

import pytest

from bench.rpc import inprocess


@pytest.mark.parametrize("kind", inprocess.KINDS)
def test_each_path_makes_its_calls(kind: str) -> None:
    seconds = inprocess.measure(kind, {1: 20, 12: 24}, warmup=5)
    assert set(seconds) == {1, 12}
    assert all(value > 0 for value in seconds.values())


def test_the_raw_ping_pong_completes_its_round_trips() -> None:
    # Frames of capsvc's own Call and Return sizes (bench.rpc.clients.frame_sizes): a size
    # it got wrong leaves a reader waiting for bytes never sent (measure_raw then fails
    # after its time bound).
    assert inprocess.measure_raw(40, warmup=5) > 0
