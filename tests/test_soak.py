"""The short soak (issue 11): ``bench/soak.py`` with 2 client processes of 5 connections
for 3 s against a server process, every call accounted for. The long run is a benchmark
command (``./dev bench soak``), not a test; its figures are in bench/README.md."""

from __future__ import annotations

from bench import soak


def test_short_soak_loses_nothing_and_leaves_nothing() -> None:
    result = soak.run(clients=2, connections=5, seconds=3.0)
    assert result["peak_connections"] == 10
    assert result["calls"] > 100
    assert result["lost"] == 0
    assert result["unexpected_errors"] == 0, result["examples"]
    assert result["expected_errors"] > 0  # the deliberate failures came back typed
    assert result["ok"] + result["expected_errors"] == result["calls"]
    assert result["server_calls"] == result["calls"]  # each reached the server once
    assert result["connections_left"] == 0
    assert result["engine_objects_left"] == {}
