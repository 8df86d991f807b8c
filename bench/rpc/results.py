"""Reading a results directory back: per-repetition figures, medians, ranges and goals.

Theory of operation
-------------------
The pyperf files hold raw material only (seconds per call; one latency per call), tagged
with the repetition (``rpc_rep``) that produced them. Every figure in the report is first
computed *per repetition*, then summarised as the median and the min-max range over the
repetitions (``Spread``):

- calls/s of a repetition = 1 / mean(seconds per call over its pyperf values) = calls
  made / time taken (every value covers the same number of loops);
- latency percentiles (nearest rank) over all the per-call latencies of the repetition;
- per-call costs (client CPU, scheduler passes, writes; server CPU) from run metadata,
  weighted by calls;
- ratios (capsvc vs pycapnp, capsvc vs the raw ceiling) are taken within each repetition,
  between figures measured minutes apart, and then summarised. That is what "side by side
  in one run" means on a noisy shared machine.

``GOALS`` are the benchmark issues' targets (issue 10 for calls/s: capsvc's headline is
with busy polling off, against pycapnp and the sleeping raw ceiling; with polling on it is
compared with the polling raw ceiling, and polling must never make it slower); a goal is
*met* when its median meets the target, and the report also says when the range straddles
it. A goal whose scenarios were not run is "not measured".
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyperf

from bench.rpc.scenarios import DEFAULT_LOADS, LOADS, PAIRINGS, bench_name, latency_bench_name

DASH = "\u2013"  # the en dash of the "min-max" ranges
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999))


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class Spread:
    """One figure over the repetitions: median, min, max (and how many)."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    def fmt(self, digits: int = 0, scale: float = 1.0) -> str:
        def one(v: float) -> str:
            return f"{v * scale:,.{digits}f}"

        if len(self.values) == 1:
            return one(self.median)
        return f"{one(self.median)} ({one(self.lo)}{DASH}{one(self.hi)})"


def spread(values: Iterable[float | None]) -> Spread | None:
    items = tuple(v for v in values if v is not None and not math.isnan(v))
    return Spread(items) if items else None


@dataclass
class RepFigures:
    """The figures of one scenario in one repetition."""

    calls_per_s: float | None = None
    latency: dict[str, float] = field(default_factory=dict)  # seconds: p50 .. max, mean
    costs: dict[str, float] = field(default_factory=dict)  # per call
    calls: int = 0


class Results:
    """A results directory: ``manifest.json`` plus the pyperf files."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        path = os.path.join(directory, "manifest.json")
        self.manifest: dict[str, Any] = {}
        if os.path.exists(path):
            with open(path) as source:
                self.manifest = json.load(source)
        self.suites: dict[str, pyperf.BenchmarkSuite] = {}
        for pairing in PAIRINGS:
            file = os.path.join(directory, f"{pairing}.json.gz")
            if os.path.exists(file):
                self.suites[pairing] = pyperf.BenchmarkSuite.load(file)
        nagle = os.path.join(directory, "nagle.json.gz")
        self.nagle = pyperf.BenchmarkSuite.load(nagle) if os.path.exists(nagle) else None
        self._cache: dict[tuple[str, str], dict[int, RepFigures]] = {}

    # ------------------------------------------------------------------ scenarios
    def pairings(self) -> list[str]:
        return [p for p in PAIRINGS if p in self.suites]

    def loads(self) -> list[str]:
        found = set()
        for suite in self.suites.values():
            found.update(suite.get_benchmark_names())
        return [load for load in LOADS if bench_name(load) in found]

    def reps(self, pairing: str, load: str) -> dict[int, RepFigures]:
        """Figures per repetition (empty when the scenario was not run)."""
        key = (pairing, load)
        if key not in self._cache:
            self._cache[key] = self._compute(pairing, load)
        return self._cache[key]

    def _compute(self, pairing: str, load: str) -> dict[int, RepFigures]:
        suite = self.suites.get(pairing)
        if suite is None or bench_name(load) not in suite.get_benchmark_names():
            return {}
        reps: dict[int, RepFigures] = {}
        timing: dict[int, list[float]] = {}
        for run in suite.get_benchmark(bench_name(load)).get_runs():
            if run.values:
                timing.setdefault(_rep(run), []).extend(run.values)
        for rep, values in timing.items():
            reps.setdefault(rep, RepFigures()).calls_per_s = 1.0 / statistics.fmean(values)
        if latency_bench_name(load) in suite.get_benchmark_names():
            by_rep: dict[int, list[Any]] = {}
            for run in suite.get_benchmark(latency_bench_name(load)).get_runs():
                by_rep.setdefault(_rep(run), []).append(run)
            for rep, runs in by_rep.items():
                figures = reps.setdefault(rep, RepFigures())
                figures.latency, figures.costs, figures.calls = _latency_figures(runs)
        return reps

    def figure(
        self, pairing: str, load: str, pick: Callable[[RepFigures], float | None]
    ) -> Spread | None:
        return spread(_try(pick, f) for f in self.reps(pairing, load).values())

    def ratio(
        self,
        a: tuple[str, str],
        b: tuple[str, str],
        pick: Callable[[RepFigures], float | None],
    ) -> Spread | None:
        """``pick(a) / pick(b)`` per repetition (only repetitions that have both)."""
        ra, rb = self.reps(*a), self.reps(*b)
        ratios = []
        for rep in sorted(set(ra) & set(rb)):
            x, y = _try(pick, ra[rep]), _try(pick, rb[rep])
            if x is not None and y:
                ratios.append(x / y)
        return spread(ratios)

    def latency_values(self, pairing: str, load: str, rep: int | None = None) -> list[float]:
        """All per-call latencies (seconds) of a scenario, or of one repetition."""
        suite = self.suites.get(pairing)
        if suite is None or latency_bench_name(load) not in suite.get_benchmark_names():
            return []
        values: list[float] = []
        for run in suite.get_benchmark(latency_bench_name(load)).get_runs():
            if rep is None or _rep(run) == rep:
                values.extend(run.values)
        return values

    # ------------------------------------------------------------------ nagle
    def nagle_cases(self) -> list[str]:
        return list(self.nagle.get_benchmark_names()) if self.nagle is not None else []

    def nagle_runs(self, case: str) -> list[Any]:
        assert self.nagle is not None
        return list(self.nagle.get_benchmark(case).get_runs())

    def nagle_title(self, case: str) -> str:
        for item in self.manifest.get("nagle_cases", []):
            if item["name"] == case:
                return str(item["title"])
        return case


def _rep(run: Any) -> int:
    return int(run.get_metadata().get("rpc_rep", 1))


def _try(pick: Callable[[RepFigures], float | None], figures: RepFigures) -> float | None:
    try:
        return pick(figures)
    except (KeyError, TypeError):
        return None


def _latency_figures(runs: list[Any]) -> tuple[dict[str, float], dict[str, float], int]:
    values = sorted(v for run in runs for v in run.values)
    latency = {name: percentile(values, q) for name, q in PERCENTILES}
    latency["max"] = values[-1]
    latency["mean"] = statistics.fmean(values)
    costs: dict[str, float] = {}
    for key in (
        "rpc_client_cpu_us_per_call",
        "rpc_server_cpu_us_per_call",
        "rpc_client_passes_per_call",
        "rpc_client_writes_per_call",
    ):
        weighted = [(r.get_metadata()[key], len(r.values)) for r in runs if key in r.get_metadata()]
        if weighted:
            total = sum(n for _, n in weighted)
            costs[key[len("rpc_") : -len("_per_call")]] = sum(v * n for v, n in weighted) / total
    return latency, costs, len(values)


# ---------------------------------------------------------------------- goals
@dataclass(frozen=True)
class Goal:
    text: str
    target: float
    at_least: bool  # True: measured >= target; False: measured <= target
    measure: Callable[[Results], Spread | None]
    # Left out of the report when not measured (a goal at a load outside the default run).
    optional: bool = False

    def verdict(self, value: Spread | None) -> str:
        if value is None:
            return "not measured"

        def ok(v: float) -> bool:
            return v >= self.target if self.at_least else v <= self.target

        if ok(value.lo) and ok(value.hi):
            return "met (every rep)"
        if ok(value.median):
            return "met (median; not every rep)"
        if ok(value.lo) or ok(value.hi):
            return "not met (median; some reps met)"
        return "not met"


def _calls(r: RepFigures) -> float | None:
    return r.calls_per_s


def _nagle_count(case: str, key: str) -> Callable[[Results], Spread | None]:
    def measure(results: Results) -> Spread | None:
        if case not in results.nagle_cases():
            return None
        return spread(float(r.get_metadata()[key]) for r in results.nagle_runs(case))

    return measure


def _load_text(load: str) -> str:
    """``c12-4KiB`` -> ``c12 4 KiB``, as the goals' texts name loads."""
    spec = LOADS[load]
    size = f"{spec.payload // 1024} KiB" if spec.payload >= 1024 else f"{spec.payload} B"
    return f"c{spec.concurrency} {size}"


def _calls_ratio(a: str, b: str, load: str) -> Callable[[Results], Spread | None]:
    def measure(results: Results) -> Spread | None:
        return results.ratio((a, load), (b, load), _calls)

    return measure


# Issue 10: the headline is capsvc with busy polling off (polling buys latency with CPU,
# and it stops when the machine is busy), against pycapnp and the raw ping-pong that does
# not poll either; capsvc with polling on is held against the raw ping-pong that polls.
GOALS = [
    Goal(
        "capsvc→capsvc TCP, busy polling off ÷ pycapnp→pycapnp, calls/s, c1 16 B",
        1.5,
        True,
        _calls_ratio("capsvc-tcp-nopoll", "pycapnp", "c1-16B"),
    ),
    Goal(
        "capsvc→capsvc TCP, busy polling off ÷ pycapnp→pycapnp, calls/s, c12 16 B",
        2.0,
        True,
        _calls_ratio("capsvc-tcp-nopoll", "pycapnp", "c12-16B"),
    ),
    Goal(
        "capsvc→capsvc TCP, busy polling off ÷ raw trio ping-pong (no polling), calls/s, c1 16 B",
        0.6,
        True,
        _calls_ratio("capsvc-tcp-nopoll", "raw-trio", "c1-16B"),
    ),
    Goal(
        "capsvc→capsvc TCP, busy polling on ÷ raw trio ping-pong with busy polling, "
        "calls/s, c1 16 B",
        0.6,
        True,
        _calls_ratio("capsvc-tcp", "raw-trio-poll", "c1-16B"),
    ),
]
# Busy polling never slower: one row per load (those outside the default run only when
# they were measured).
for _load in LOADS:
    GOALS.append(
        Goal(
            "busy polling never slower: capsvc→capsvc TCP, polling on ÷ off, calls/s, "
            + _load_text(_load),
            1.0,
            True,
            _calls_ratio("capsvc-tcp", "capsvc-tcp-nopoll", _load),
            optional=_load not in DEFAULT_LOADS,
        )
    )
GOALS += [
    Goal(
        "NODELAY off, capsvc as built: calls > 10 ms in 10,000 sequential calls",
        0,
        False,
        _nagle_count("pingcap-nodelay-off", "rpc_over_10ms"),
    ),
]


def _stall_share(results: Results) -> Spread | None:
    case = "pingcap-nodelay-off-nocoalesce"
    if case not in results.nagle_cases():
        return None
    return spread(
        r.get_metadata()["rpc_over_30ms"] / len(r.values) for r in results.nagle_runs(case)
    )


GOALS.append(
    Goal(
        "NODELAY off, coalescing off (ablation): share of calls > 30 ms (the stall shows)",
        0.5,
        True,
        _stall_share,
    )
)


def _cpu(side: str) -> Callable[[RepFigures], float | None]:
    def pick(r: RepFigures) -> float | None:
        return r.costs.get(f"{side}_cpu_us")

    return pick


# Issue 9's echo goal: generated stubs against the dynamic path, both ends, polling off.
for _load in ("c1-16B", "c12-16B"):
    for _side in ("client", "server"):
        GOALS.append(
            Goal(
                f"generated stubs ÷ dynamic path, {_side} CPU per call, polling off, "
                f"{_load.replace('-', ' ')}",
                0.75,
                False,
                lambda r, load=_load, side=_side: r.ratio(
                    ("capsvc-tcp-nopoll", load), ("capsvc-tcp-nopoll-dynamic", load), _cpu(side)
                ),
            )
        )
