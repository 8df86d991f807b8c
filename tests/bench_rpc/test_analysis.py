"""Unit tests of the RPC benchmark's bookkeeping: scenario selection, figures, ratios, report.

Theory of operation: a results directory is made by hand with pyperf's own API (what the
suite writes, minus the measuring), with known values, so that every figure the report
prints can be checked exactly; no process is started.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyperf
import pytest

from bench.rpc import report, scenarios
from bench.rpc.results import DASH, GOALS, Goal, Results, Spread, percentile


def test_select_defaults_and_patterns() -> None:
    default = scenarios.select(None)
    assert {s.load.name for s in default} == set(scenarios.DEFAULT_LOADS)
    assert len(default) == len(scenarios.PAIRINGS) * len(scenarios.DEFAULT_LOADS)
    ids = [s.id for s in scenarios.select(["capsvc-tcp/*"])]
    assert ids == ["capsvc-tcp/c1-16B", "capsvc-tcp/c12-16B", "capsvc-tcp/c1-4KiB"]
    # A load outside the default set runs when named explicitly.
    assert [s.id for s in scenarios.select(["pycapnp/c12-4KiB"])] == ["pycapnp/c12-4KiB"]
    assert scenarios.unknown_patterns(["capsvc-tcp/*", "nope/*"]) == ["nope/*"]
    assert [s.id for s in scenarios.select(list(scenarios.SMOKE))] == list(scenarios.SMOKE)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 0.999) == 100
    assert percentile([7.0], 0.9) == 7


def test_spread_formatting() -> None:
    assert Spread((3.0, 1.0, 2.0)).fmt() == f"2 (1{DASH}3)"
    assert Spread((1234.5,)).fmt() == "1,234"  # banker's rounding of .5 is fine here
    assert Spread((0.5, 0.25)).fmt(2) == f"0.38 (0.25{DASH}0.50)"


def _timing(pairing: str, load: str, rep: int, per_call: float) -> pyperf.Run:
    return pyperf.Run(
        [per_call] * 3,
        metadata={"name": f"echo-{load}", "unit": "second", "loops": 100, "rpc_rep": rep},
        collect_metadata=False,
    )


def _latency(
    pairing: str, load: str, rep: int, values: list[float], cpu: tuple[float, float] = (100, 90)
) -> pyperf.Run:
    return pyperf.Run(
        values,
        metadata={
            "name": f"echo-{load}-latency",
            "unit": "second",
            "loops": 1,
            "rpc_rep": rep,
            "rpc_client_cpu_us_per_call": cpu[0],
            "rpc_server_cpu_us_per_call": cpu[1],
        },
        collect_metadata=False,
    )


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    # Two reps. capsvc-tcp-nopoll: 1 ms/call then 0.5 ms/call; pycapnp: 2 ms/call both times.
    per_call = {
        "capsvc-tcp-nopoll": (1e-3, 5e-4),
        "pycapnp": (2e-3, 2e-3),
        "raw-trio": (1e-4, 1e-4),
    }
    p99s = {"capsvc-tcp-nopoll": 4e-4, "pycapnp": 8e-4, "raw-trio": 1e-4}
    for pairing, times in per_call.items():
        timing, latency = [], []
        for rep, seconds in enumerate(times, start=1):
            timing.append(_timing(pairing, "c1-16B", rep, seconds))
            values = [p99s[pairing] / 2] * 99 + [p99s[pairing]]
            latency.append(_latency(pairing, "c1-16B", rep, values))
        suite = pyperf.BenchmarkSuite([pyperf.Benchmark(timing), pyperf.Benchmark(latency)])
        suite.dump(str(tmp_path / f"{pairing}.json.gz"))
    (tmp_path / "manifest.json").write_text(json.dumps({"reps": 2, "nagle_cases": []}))
    return tmp_path


def test_figures_and_ratios_per_repetition(results_dir: Path) -> None:
    results = Results(str(results_dir))
    calls = results.figure("capsvc-tcp-nopoll", "c1-16B", lambda f: f.calls_per_s)
    assert calls is not None
    assert calls.values == pytest.approx((1000.0, 2000.0))
    ratio = results.ratio(
        ("capsvc-tcp-nopoll", "c1-16B"), ("pycapnp", "c1-16B"), lambda f: f.calls_per_s
    )
    assert ratio is not None
    assert ratio.values == pytest.approx((2.0, 4.0))  # taken within each rep
    p99 = results.figure("capsvc-tcp-nopoll", "c1-16B", lambda f: f.latency["p99"])
    assert p99 is not None
    assert p99.median == pytest.approx(2e-4)  # nearest rank: the 99th of 100 values
    top = results.figure("capsvc-tcp-nopoll", "c1-16B", lambda f: f.latency["max"])
    assert top is not None
    assert top.median == pytest.approx(4e-4)
    cpu = results.figure("capsvc-tcp-nopoll", "c1-16B", lambda f: f.costs["client_cpu_us"])
    assert cpu is not None
    assert cpu.median == pytest.approx(100.0)


def test_goals_and_markdown(results_dir: Path, tmp_path: Path) -> None:
    results = Results(str(results_dir))
    first = _goal("capsvc→capsvc TCP, busy polling off ÷ pycapnp→pycapnp, calls/s, c1 16 B")
    value = first.measure(results)
    assert value is not None
    assert value.median == pytest.approx(3.0)
    assert first.verdict(value) == "met (every rep)"
    assert first.verdict(Spread((1.0, 1.6, 2.0))) == "met (median; not every rep)"
    assert first.verdict(None) == "not measured"
    out = str(tmp_path / "out")
    text = report.main_report(str(results_dir), out, charts_too=False, quiet=True)
    assert f"| capsvc → capsvc, TCP, busy polling off | 1,500 (1,000{DASH}2,000) |" in text
    assert f"3.00 (2.00{DASH}4.00)" in text


def _goal(text: str) -> Goal:
    (goal,) = (g for g in GOALS if g.text == text)
    return goal


def _write_results(
    directory: Path, calls_per_s: Mapping[str, Mapping[str, Sequence[float]]]
) -> None:
    """A results directory whose pairings reach these calls/s, one figure per repetition."""
    for pairing, loads in calls_per_s.items():
        benchmarks = []
        for load, figures in loads.items():
            timing = [_timing(pairing, load, rep, 1 / c) for rep, c in enumerate(figures, 1)]
            latency = [
                _latency(pairing, load, rep, [1 / c] * 10) for rep, c in enumerate(figures, 1)
            ]
            benchmarks += [pyperf.Benchmark(timing), pyperf.Benchmark(latency)]
        pyperf.BenchmarkSuite(benchmarks).dump(str(directory / f"{pairing}.json.gz"))
    (directory / "manifest.json").write_text(json.dumps({"reps": 2, "nagle_cases": []}))


def test_issue_10_goals_put_busy_polling_off_first_and_compare_like_with_like(
    tmp_path: Path,
) -> None:
    # Two reps; c12-16B of pycapnp, c1-4KiB and c12-4KiB of everything were not run.
    _write_results(
        tmp_path,
        {
            "capsvc-tcp-nopoll": {"c1-16B": (2000, 2000), "c12-16B": (1000, 1000)},
            "capsvc-tcp": {"c1-16B": (3000, 3000), "c12-16B": (800, 1300)},
            "pycapnp": {"c1-16B": (1000, 1000)},
            "raw-trio": {"c1-16B": (4000, 2000)},
            "raw-trio-poll": {"c1-16B": (6000, 6000)},
        },
    )
    results = Results(str(tmp_path))

    def verdict(text: str) -> tuple[tuple[float, ...] | None, str]:
        goal = _goal(text)
        value = goal.measure(results)
        return (None if value is None else value.values), goal.verdict(value)

    # The headline is with busy polling off: 2000 / 1000, not capsvc-tcp's 3000 / 1000.
    off = "capsvc→capsvc TCP, busy polling off"
    values, said = verdict(f"{off} ÷ pycapnp→pycapnp, calls/s, c1 16 B")
    assert values == pytest.approx((2.0, 2.0))
    assert said == "met (every rep)"
    assert verdict(f"{off} ÷ pycapnp→pycapnp, calls/s, c12 16 B") == (None, "not measured")
    # Against the raw ping-pong that does not poll: 0.5 and 1.0, median 0.75 >= 0.6.
    values, said = verdict(f"{off} ÷ raw trio ping-pong (no polling), calls/s, c1 16 B")
    assert values == pytest.approx((0.5, 1.0))
    assert said == "met (median; not every rep)"
    # Polling against polling: 3000 / 6000 is below 0.6 (3000 / 3000 against raw-trio
    # would have met it).
    values, said = verdict(
        "capsvc→capsvc TCP, busy polling on ÷ raw trio ping-pong with busy polling, "
        "calls/s, c1 16 B"
    )
    assert values == pytest.approx((0.5, 0.5))
    assert said == "not met"
    # Busy polling never slower, at every load: faster at c1, slower in one rep at c12.
    never = "busy polling never slower: capsvc→capsvc TCP, polling on ÷ off, calls/s, "
    values, said = verdict(never + "c1 16 B")
    assert values == pytest.approx((1.5, 1.5))
    assert said == "met (every rep)"
    values, said = verdict(never + "c12 16 B")
    assert values == pytest.approx((0.8, 1.3))
    assert said == "met (median; not every rep)"
    assert verdict(never + "c1 4 KiB") == (None, "not measured")
    assert {g.text for g in GOALS if g.text.startswith(never)} == {
        never + load for load in ("c1 16 B", "c12 16 B", "c1 4 KiB", "c12 4 KiB")
    }
    # The report shows the default loads' rows even when not measured, c12-4KiB's only
    # when it was.
    text = report.markdown(results, None)
    assert f"| {never}c1 4 KiB | ≥ 1 | - | not measured |" in text
    assert never + "c12 4 KiB" not in text
    assert "| capsvc→capsvc TCP p99 ÷ raw trio ping-pong p99" not in text  # issue 10: gone


def test_the_echo_goal_compares_cpu_per_call_per_side(tmp_path: Path) -> None:
    # Generated stubs: client 60 then 100 µs, server 70 µs; dynamic path: 100 and 100.
    cpu = {
        "capsvc-tcp-nopoll": [(60, 70), (100, 70)],
        "capsvc-tcp-nopoll-dynamic": [(100, 100)] * 2,
    }
    for pairing, sides in cpu.items():
        timing = [_timing(pairing, "c12-16B", rep, 1e-4) for rep in (1, 2)]
        latency = [
            _latency(pairing, "c12-16B", rep, [1e-4] * 10, cpu=sides[rep - 1]) for rep in (1, 2)
        ]
        suite = pyperf.BenchmarkSuite([pyperf.Benchmark(timing), pyperf.Benchmark(latency)])
        suite.dump(str(tmp_path / f"{pairing}.json.gz"))
    (tmp_path / "manifest.json").write_text(json.dumps({"reps": 2, "nagle_cases": []}))
    results = Results(str(tmp_path))
    goals = {g.text: g for g in GOALS if g.text.startswith("generated stubs")}
    client = goals["generated stubs ÷ dynamic path, client CPU per call, polling off, c12 16B"]
    server = goals["generated stubs ÷ dynamic path, server CPU per call, polling off, c12 16B"]
    measured = client.measure(results)
    assert measured is not None
    assert measured.values == pytest.approx((0.6, 1.0))
    assert client.verdict(measured) == "not met (median; some reps met)"
    assert server.verdict(server.measure(results)) == "met (every rep)"
    c1 = goals["generated stubs ÷ dynamic path, client CPU per call, polling off, c1 16B"]
    assert c1.verdict(c1.measure(results)) == "not measured"


def test_readme_section_is_replaced(results_dir: Path, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n{report.BEGIN}\nold\n{report.END}\ntail\n")
    report.main_report(
        str(results_dir), str(tmp_path / "out"), charts_too=False, readme=str(readme), quiet=True
    )
    content = readme.read_text()
    assert content.startswith("# title\n")
    assert content.endswith(f"{report.END}\ntail\n")
    assert "old" not in content
    assert "### Goals" in content


def test_report_puts_busy_polling_off_first_and_labels_polling_rows(tmp_path: Path) -> None:
    _write_results(
        tmp_path,
        {
            name: {"c1-16B": (1000,)}  # one repetition: cells without ranges
            for name in ("capsvc-tcp", "pycapnp", "raw-trio", "capsvc-tcp-nopoll", "raw-trio-poll")
        }
        | {"capsvc-tcp-nopoll-async": {"c1-16B": (500,)}},
    )
    text = report.markdown(Results(str(tmp_path)), None)
    table = text[text.index("### Echo calls per second") : text.index("Ratios")]
    rows = [line.split(" | ")[0][2:] for line in table.splitlines() if line.startswith("| ")]
    assert rows[1:] == [
        "capsvc → capsvc, TCP, busy polling off",
        "capsvc → capsvc, TCP, busy polling off, async def server",
        "pycapnp → pycapnp, TCP",
        "raw trio ping-pong, TCP",
        "capsvc → capsvc, TCP (busy polling on)",
        "raw trio ping-pong, TCP, busy polling",
    ]
    ratios = text[text.index("Ratios") :]
    titles = [line.split(" | ")[0][2:] for line in ratios.splitlines() if line.startswith("| ")]
    assert titles[1:5] == [
        "capsvc→capsvc TCP, busy polling off ÷ pycapnp→pycapnp, calls/s",
        "capsvc→capsvc TCP, busy polling off, async def server ÷ pycapnp→pycapnp, calls/s",
        "capsvc nopoll ÷ raw trio (no polling), calls/s",
        "capsvc nopoll ÷ raw trio (no polling), p99",
    ]
    assert "| capsvc (polling) ÷ raw trio (polling), calls/s | 1.00 |" in ratios
    assert "| capsvc→capsvc TCP (busy polling on) ÷ pycapnp→pycapnp, calls/s | 1.00 |" in ratios
    async_row = "capsvc→capsvc TCP, busy polling off, async def server ÷ pycapnp→pycapnp"
    assert f"| {async_row}, calls/s | 0.50 |" in ratios
    assert not any("busy polling on" in t for t in titles[1:6])


def test_pairings_say_whether_they_busy_poll() -> None:
    polling = {name for name, p in scenarios.PAIRINGS.items() if p.busy_poll}
    assert polling == {
        "capsvc-tcp",
        "capsvc-unix",
        "capsvc-tcp-dynamic",
        "raw-trio-poll",
        "capsvc-to-pycapnp",
        "pycapnp-to-capsvc",
    }
    assert sorted(report.ordered(list(scenarios.PAIRINGS))) == sorted(scenarios.PAIRINGS)
