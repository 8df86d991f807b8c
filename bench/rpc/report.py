"""The report: a results directory turned into Markdown tables and PNG charts.

Theory of operation
-------------------
``main_report(results, out)`` reads the directory (bench.rpc.results: every figure per
repetition, then median and range), writes ``out/report.md`` and, when matplotlib is
installed (the ``bench`` extra), four charts next to it:

- ``rpc-calls.png``: calls/s per pairing and load, bars at the median, whiskers min-max;
- ``rpc-latency.png``: latency percentiles (p50 … max) per pairing, one panel per load;
- ``rpc-latency-hist.png``: the per-call latency distributions at 16 B, c1 and c12;
- ``rpc-nagle.png``: the Nagle experiment, every call's latency in call order.

With ``readme=PATH`` the same Markdown (chart links pointing into ``figures/`` beside the
README, where the PNGs are copied) replaces the part of the README between the markers
``<!-- rpc-results:begin -->`` and ``<!-- rpc-results:end -->``.

Busy polling buys latency with CPU and turns itself off on a busy machine, so the headline
is without it (issue 10): every table lists the pairings where neither end polls first
(capsvc's before the reference and the ceilings) and labels the others "(busy polling
on)"; a polling capsvc is compared with the raw ping-pong that polls too.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from bench.rpc.results import (
    GOALS,
    PERCENTILES,
    RepFigures,
    Results,
    Spread,
    percentile,
    spread,
)
from bench.rpc.scenarios import PAIRINGS

BEGIN = "<!-- rpc-results:begin -->"
END = "<!-- rpc-results:end -->"
CHARTS = ("rpc-calls.png", "rpc-latency.png", "rpc-latency-hist.png", "rpc-nagle.png")
LOAD_TITLES = {
    "c1-16B": "c1, 16 B",
    "c12-16B": "c12, 16 B",
    "c1-4KiB": "c1, 4 KiB",
    "c12-4KiB": "c12, 4 KiB",
}
COLOURS = {
    "capsvc-tcp": "#1f77b4",
    "capsvc-unix": "#6baed6",
    "capsvc-tcp-nopoll": "#9ecae1",
    "capsvc-tcp-nopoll-async": "#17becf",
    "capsvc-tcp-dynamic": "#393b79",
    "capsvc-tcp-nopoll-dynamic": "#9c9ede",
    "pycapnp": "#d62728",
    "raw-trio": "#2ca02c",
    "raw-trio-unix": "#98df8a",
    "raw-trio-poll": "#bcbd22",
    "capsvc-to-pycapnp": "#9467bd",
    "pycapnp-to-capsvc": "#ff7f0e",
}


ROLE_ORDER = ("capsvc", "reference", "ceiling", "interop")


def ordered(pairings: list[str]) -> list[str]:
    """Pairings in report order: without busy polling first, then by role, then suite order."""
    suite = list(PAIRINGS)
    return sorted(
        pairings,
        key=lambda p: (PAIRINGS[p].busy_poll, ROLE_ORDER.index(PAIRINGS[p].role), suite.index(p)),
    )


def row_title(pairing: str) -> str:
    """A pairing's row title: those where an end busy-polls say so."""
    p = PAIRINGS[pairing]
    if p.busy_poll and "busy polling" not in p.title:
        return p.title + " (busy polling on)"
    return p.title


def _cell(value: Spread | None, digits: int = 0, scale: float = 1.0, unit: str = "") -> str:
    return "-" if value is None else value.fmt(digits, scale) + unit


def _lat(name: str) -> Any:
    return lambda f: f.latency[name]


def _cost(name: str) -> Any:
    return lambda f: f.costs[name]


def _calls(figures: RepFigures) -> float | None:
    return figures.calls_per_s


def _p99(figures: RepFigures) -> float | None:
    return figures.latency["p99"]


# ---------------------------------------------------------------------- markdown
def markdown(results: Results, chart_dir: str | None) -> str:
    m = results.manifest
    pairings = ordered(results.pairings())
    loads = results.loads()
    reps = m.get("reps", 1)
    lines: list[str] = []
    add = lines.append
    host = m.get("host", {})
    capsvc = m.get("capsvc", {})
    state = capsvc.get("commit", "?")
    if capsvc.get("capsvc_modified"):
        state += f" with uncommitted changes to capsvc/ ({capsvc.get('capsvc_diff_stat')})"
    if "build" in capsvc:
        state += f" ({capsvc['build']} build)"
    add(
        f"Run of {m.get('started', '?')}: {reps} repetition(s), rep-major, "
        f"{m.get('seconds', 0) / 60:.1f} min wall; capsvc at {state}; "
        f"Python {host.get('python', '?')}, pyperf {host.get('pyperf', '?')}, "
        f"{host.get('cpus', '?')} CPUs, load average {host.get('load_avg_before', 0):.1f} "
        f"before and {host.get('load_avg_after', 0):.1f} after; pyperf options "
        f"`{' '.join(m.get('pyperf_args', []))}`."
        + (" **Smoke run: figures are meaningless.**" if m.get("smoke") else "")
    )
    add("")
    add(
        "Every cell is the **median (min-max) over the repetitions**; ratios are taken "
        "within each repetition first. The machine is shared with other engineers' heavy "
        "work (2 vCPUs, no isolation), so single figures move by tens of percent between "
        "repetitions: read the ranges."
    )
    add("")
    if pairings:
        add("### Goals")
        add("")
        add("| goal | target | measured | verdict |")
        add("|---|---|---|---|")
        for goal in GOALS:
            value = goal.measure(results)
            if value is None and goal.optional:
                continue
            digits = 2 if goal.target and goal.target < 10 else 0
            target = ("≥ " if goal.at_least else "≤ ") + f"{goal.target:g}"
            add(f"| {goal.text} | {target} | {_cell(value, digits)} | {goal.verdict(value)} |")
        add("")
        _throughput_tables(results, pairings, loads, add)
        _latency_tables(results, pairings, loads, add)
        _cost_table(results, pairings, loads, add)
    if results.nagle_cases():
        _nagle_table(results, add)
    if chart_dir is not None:
        add("### Charts")
        add("")
        for name in CHARTS:
            add(f"![{name[:-4]}]({chart_dir}{name})")
            add("")
    return "\n".join(lines).rstrip() + "\n"


def _throughput_tables(results: Results, pairings: list[str], loads: list[str], add: Any) -> None:
    add("### Echo calls per second")
    add("")
    add("| client → server | " + " | ".join(LOAD_TITLES[load] for load in loads) + " |")
    add("|---|" + "---|" * len(loads))
    for pairing in pairings:
        cells = [_cell(results.figure(pairing, load, _calls)) for load in loads]
        add(f"| {row_title(pairing)} | " + " | ".join(cells) + " |")
    add("")
    on = " (busy polling on)"
    ratios = [
        # Neither end polls: the headline.
        (
            "capsvc→capsvc TCP, busy polling off ÷ pycapnp→pycapnp, calls/s",
            "capsvc-tcp-nopoll",
            "pycapnp",
            _calls,
        ),
        (
            "capsvc→capsvc TCP, busy polling off, async def server ÷ pycapnp→pycapnp, calls/s",
            "capsvc-tcp-nopoll-async",
            "pycapnp",
            _calls,
        ),
        ("capsvc nopoll ÷ raw trio (no polling), calls/s", "capsvc-tcp-nopoll", "raw-trio", _calls),
        ("capsvc nopoll ÷ raw trio (no polling), p99", "capsvc-tcp-nopoll", "raw-trio", _p99),
        ("pycapnp→pycapnp ÷ raw trio (no polling), p99", "pycapnp", "raw-trio", _p99),
        # capsvc polls at one end or both.
        ("capsvc (polling) ÷ raw trio (polling), calls/s", "capsvc-tcp", "raw-trio-poll", _calls),
        ("capsvc (polling) ÷ raw trio (polling), p99", "capsvc-tcp", "raw-trio-poll", _p99),
        ("capsvc busy polling on ÷ off, calls/s", "capsvc-tcp", "capsvc-tcp-nopoll", _calls),
        (f"capsvc→capsvc TCP{on} ÷ pycapnp→pycapnp, calls/s", "capsvc-tcp", "pycapnp", _calls),
        (f"capsvc→capsvc Unix{on} ÷ pycapnp→pycapnp, calls/s", "capsvc-unix", "pycapnp", _calls),
        (
            "capsvc client (→ pycapnp, busy polling on) ÷ pycapnp→pycapnp",
            "capsvc-to-pycapnp",
            "pycapnp",
            _calls,
        ),
        (
            "capsvc server (pycapnp →, busy polling on) ÷ pycapnp→pycapnp",
            "pycapnp-to-capsvc",
            "pycapnp",
            _calls,
        ),
        (
            f"capsvc→capsvc TCP{on} ÷ raw trio (no polling), calls/s",
            "capsvc-tcp",
            "raw-trio",
            _calls,
        ),
        (f"capsvc→capsvc TCP{on} ÷ raw trio (no polling), p99", "capsvc-tcp", "raw-trio", _p99),
    ]
    rows = []
    for title, a, b, pick in ratios:
        if a in pairings and b in pairings:
            cells = [_cell(results.ratio((a, load), (b, load), pick), 2) for load in loads]
            rows.append(f"| {title} | " + " | ".join(cells) + " |")
    if rows:
        add("Ratios (per repetition, then median and range):")
        add("")
        add("| ratio | " + " | ".join(LOAD_TITLES[load] for load in loads) + " |")
        add("|---|" + "---|" * len(loads))
        lines = rows
        for row in lines:
            add(row)
        add("")


def _latency_tables(results: Results, pairings: list[str], loads: list[str], add: Any) -> None:
    names = [name for name, _ in PERCENTILES] + ["max"]
    for load in loads:
        add(f"### Latency per call, {LOAD_TITLES[load]} (µs)")
        add("")
        add("| client → server | " + " | ".join(names) + " | calls measured |")
        add("|---|" + "---|" * (len(names) + 1))
        for pairing in pairings:
            reps = results.reps(pairing, load)
            if not reps:
                continue
            cells = [_cell(results.figure(pairing, load, _lat(n)), 0, 1e6) for n in names]
            calls = sum(f.calls for f in reps.values())
            add(f"| {row_title(pairing)} | " + " | ".join(cells) + f" | {calls:,} |")
        add("")


def _cost_table(results: Results, pairings: list[str], loads: list[str], add: Any) -> None:
    add("### Per-call costs")
    add("")
    add(
        "CPU µs per call of each process (client: its own CPU time over the timed values; "
        "server: psutil, over every call of the benchmark), trio scheduler passes and "
        "`send` calls per call on the client side (capsvc: `Connection.writes`)."
    )
    add("")
    add(
        "| client → server | load | client CPU µs | server CPU µs | client passes | client writes |"
    )
    add("|---|---|---|---|---|---|")
    for pairing in pairings:
        for load in loads:
            if not results.reps(pairing, load):
                continue
            cells = [
                _cell(results.figure(pairing, load, _cost("client_cpu_us"))),
                _cell(results.figure(pairing, load, _cost("server_cpu_us"))),
                _cell(results.figure(pairing, load, _cost("client_passes")), 2),
                _cell(results.figure(pairing, load, _cost("client_writes")), 2),
            ]
            add(f"| {row_title(pairing)} | {LOAD_TITLES[load]} | " + " | ".join(cells) + " |")
    add("")


def _nagle_table(results: Results, add: Any) -> None:
    add("### Nagle experiment (TCP_NODELAY off, sequential calls, capsvc ↔ capsvc)")
    add("")
    add(
        "`pingCap` returns a capability, so every call needs a Finish, which capsvc sends "
        "when the caller drops the results: Finish + next Call are one write when "
        "coalescing (as built), two when `coalesce=False` (the documented debug switch, "
        "on both ends). Counts are summed over the repetitions; latencies are medians "
        "(ranges) over them."
    )
    add("")
    add(
        "| case | calls | calls/s | p50 µs | p99 µs | max µs | calls > 10 ms | calls > 30 ms "
        "| client writes/call |"
    )
    add("|---|---|---|---|---|---|---|---|---|")
    for case in results.nagle_cases():
        runs = results.nagle_runs(case)
        meta = [r.get_metadata() for r in runs]
        ordered = [sorted(r.values) for r in runs]
        p50 = spread(percentile(v, 0.5) for v in ordered)
        p99 = spread(percentile(v, 0.99) for v in ordered)
        top = spread(v[-1] for v in ordered)
        calls = sum(int(x["rpc_calls"]) for x in meta)
        over10 = sum(int(x["rpc_over_10ms"]) for x in meta)
        over30 = sum(int(x["rpc_over_30ms"]) for x in meta)
        rate = spread(float(x["rpc_calls_per_s"]) for x in meta)
        writes = spread(float(x["rpc_client_writes_per_call"]) for x in meta)
        add(
            f"| {results.nagle_title(case)} | {calls:,} | {_cell(rate)} | "
            f"{_cell(p50, 0, 1e6)} | {_cell(p99, 0, 1e6)} | {_cell(top, 0, 1e6)} | "
            f"{over10:,} | {over30:,} | {_cell(writes, 2)} |"
        )
    add("")


# ---------------------------------------------------------------------- charts
def charts(results: Results, out: str) -> list[str]:
    """Write the PNGs into ``out``; return their paths (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[str | None] = []
    smoke = " (smoke run)" if results.manifest.get("smoke") else ""
    pairings = ordered(results.pairings())
    loads = results.loads()
    if pairings and loads:
        written.append(_chart_calls(plt, results, pairings, loads, out, smoke))
        written.append(_chart_percentiles(plt, results, pairings, loads, out, smoke))
        written.append(_chart_histograms(plt, results, pairings, out, smoke))
    if results.nagle_cases():
        written.append(_chart_nagle(plt, results, out, smoke))
    return [path for path in written if path]


def _chart_calls(
    plt: Any, results: Results, pairings: list[str], loads: list[str], out: str, smoke: str
) -> str:
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    width = 0.8 / len(pairings)
    for i, pairing in enumerate(pairings):
        xs, ys, lo, hi = [], [], [], []
        for j, load in enumerate(loads):
            value = results.figure(pairing, load, _calls)
            if value is None:
                continue
            xs.append(j - 0.4 + width * (i + 0.5))
            ys.append(value.median)
            lo.append(value.median - value.lo)
            hi.append(value.hi - value.median)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=row_title(pairing),
               color=COLOURS.get(pairing))  # fmt: skip
    ax.set_xticks(range(len(loads)), [LOAD_TITLES[load] for load in loads])
    ax.set_ylabel("calls/s (median, whiskers min-max over reps)")
    ax.set_title("Echo RPC throughput" + smoke)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path = os.path.join(out, "rpc-calls.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def _chart_percentiles(
    plt: Any, results: Results, pairings: list[str], loads: list[str], out: str, smoke: str
) -> str:
    names = [name for name, _ in PERCENTILES] + ["max"]
    fig, axes = plt.subplots(1, len(loads), figsize=(4.2 * len(loads), 4.4), dpi=110,
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, load in zip(axes[0], loads, strict=True):
        for pairing in pairings:
            values = [results.figure(pairing, load, _lat(n)) for n in names]
            if any(v is None for v in values):
                continue
            ax.plot(names, [v.median * 1e6 for v in values if v], marker="o",
                    label=row_title(pairing), color=COLOURS.get(pairing))  # fmt: skip
        ax.set_yscale("log")
        ax.set_title(LOAD_TITLES[load])
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("latency per call, µs (median over reps)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Echo RPC latency percentiles" + smoke)
    fig.tight_layout()
    path = os.path.join(out, "rpc-latency.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def _chart_histograms(
    plt: Any, results: Results, pairings: list[str], out: str, smoke: str
) -> str | None:
    loads = [load for load in ("c1-16B", "c12-16B") if load in results.loads()]
    if not loads:
        return None
    fig, axes = plt.subplots(1, len(loads), figsize=(6 * len(loads), 4.2), dpi=110,
                             squeeze=False)  # fmt: skip
    headline = ("capsvc-tcp-nopoll", "pycapnp", "raw-trio", "capsvc-tcp", "raw-trio-poll")
    shown = [p for p in headline if p in pairings] or pairings
    for ax, load in zip(axes[0], loads, strict=True):
        for pairing in shown:
            values = [v * 1e6 for v in results.latency_values(pairing, load)]
            if len(values) < 2:
                continue
            lo, hi = max(min(values), 1.0), max(values)
            bins = [lo * (hi / lo) ** (i / 80) for i in range(81)] if hi > lo else 10
            ax.hist(values, bins=bins, histtype="step", density=False, linewidth=1.2,
                    weights=[1 / len(values)] * len(values), label=row_title(pairing),
                    color=COLOURS.get(pairing))  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("latency per call, µs (log)")
        ax.set_ylabel("share of calls")
        ax.set_title(LOAD_TITLES[load] + ", all reps pooled")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("Echo RPC latency distribution" + smoke)
    fig.tight_layout()
    path = os.path.join(out, "rpc-latency-hist.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def _chart_nagle(plt: Any, results: Results, out: str, smoke: str) -> str:
    cases = results.nagle_cases()
    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 1.9 * len(cases) + 0.8), dpi=110,
                             sharey=True, squeeze=False)  # fmt: skip
    for ax, case in zip(axes[:, 0], cases, strict=True):
        values: list[float] = []
        boundaries = []
        for run in results.nagle_runs(case):  # every rep, one after the other
            if values:
                boundaries.append(len(values))
            values.extend(v * 1e3 for v in run.values)
        over10 = sum(1 for v in values if v > 10)
        ax.scatter(range(len(values)), values, s=1.5, color="#1f77b4" if over10 == 0 else "#d62728")
        for x in boundaries:
            ax.axvline(x, color="grey", linestyle=":", linewidth=0.8)
        for level in (10, 40):
            ax.axhline(level, color="grey", linestyle="--", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xlim(0, max(len(values), 1))
        ax.set_title(
            f"{results.nagle_title(case)}: {len(values):,} calls, {over10:,} over 10 ms",
            fontsize=9,
        )
        ax.grid(alpha=0.3, which="major")
        ax.set_ylabel("ms")
    axes[-1][0].set_xlabel("call number (repetitions one after the other, dotted lines)")
    fig.suptitle("Nagle experiment, TCP_NODELAY off: latency of every call (dashed: 10 and 40 ms)"
                 + smoke, fontsize=10)  # fmt: skip
    fig.tight_layout()
    path = os.path.join(out, "rpc-nagle.png")
    fig.savefig(path)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------- entry
def main_report(
    results_dir: str,
    out: str,
    *,
    charts_too: bool = True,
    readme: str | None = None,
    quiet: bool = False,
) -> str:
    """Write ``out/report.md`` (+ charts); optionally refresh a README. Returns the text."""
    results = Results(results_dir)
    os.makedirs(out, exist_ok=True)
    written = charts(results, out) if charts_too else []
    text = markdown(results, "" if written else None)
    path = os.path.join(out, "report.md")
    with open(path, "w") as sink:
        sink.write(text)
    if readme is not None:
        figures = os.path.join(os.path.dirname(os.path.abspath(readme)), "figures")
        if written:
            os.makedirs(figures, exist_ok=True)
            for chart in written:
                shutil.copy(chart, figures)
        _replace_section(readme, markdown(results, "figures/" if written else None))
    if not quiet:
        print(text)
        if charts_too and not written:
            print("(no charts: matplotlib is not installed; `pip install matplotlib`)")
        print(f"report: {path}" + (f", charts: {', '.join(written)}" if written else ""))
    return text


def _replace_section(readme: str, text: str) -> None:
    with open(readme) as source:
        content = source.read()
    if BEGIN not in content or END not in content:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} markers")
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(readme, "w") as sink:
        sink.write(head + BEGIN + "\n" + text + END + tail)
