"""PNG charts of a serialization run: capnp (pycapnp and direct) next to msgpack.

Theory of operation: one chart per benchmark; for every mode and compression a group of
bars (pycapnp, direct, msgpack), the height the median time per iteration from the pyperf
results, on a log scale because modes differ by orders of magnitude. msgpack has no packed
form, so the same msgpack figure stands beside both capnp compressions (as in the tables).
"""

from __future__ import annotations

import os
from typing import Any

from bench.serialization.report import _BENCHMARKS, _MODES, _collect

_FORMATS = (
    ("capnp", "pycapnp"),
    ("capsvc", "capsvc"),
    ("capsvc-fields", "capsvc fields"),
    ("capnp-direct", "direct"),
    ("capnpy", "capnpy"),
    ("msgpack", "msgpack"),
)


def write_charts(suite: Any, out_dir: str) -> list[str]:
    """Write one PNG per benchmark into ``out_dir``; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = _collect(suite)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for benchmark in _BENCHMARKS:
        groups: list[str] = []
        values: dict[str, list[float]] = {label: [] for _, label in _FORMATS}
        for mode in _MODES:
            for compression in ("none", "packed"):
                if mode == "object" and compression == "packed":
                    continue
                capnp_compression = "n/a" if mode == "object" else compression
                row = []
                for fmt, _ in _FORMATS:
                    key = (benchmark, mode, fmt, "n/a" if fmt == "msgpack" else capnp_compression)
                    bench = found.get(key)
                    row.append(bench.median() * 1e6 if bench is not None else float("nan"))
                if all(value != value for value in row):  # all NaN: not measured
                    continue
                groups.append(mode if mode == "object" else f"{mode}\n{compression}")
                for (_, label), value in zip(_FORMATS, row, strict=True):
                    values[label].append(value)
        if not groups:
            continue
        figure, axes = plt.subplots(figsize=(10, 4.2))
        width = 0.27
        for index, (_, label) in enumerate(_FORMATS):
            positions = [group + (index - 1) * width for group in range(len(groups))]
            axes.bar(positions, values[label], width, label=label)
        axes.set_xticks(range(len(groups)), groups)
        axes.set_yscale("log")
        axes.set_ylabel("µs per iteration (median, log scale)")
        axes.set_title(f"{benchmark}: Cap'n Proto vs msgpack, every mode (lower is better)")
        axes.legend()
        axes.grid(axis="y", alpha=0.3)
        figure.tight_layout()
        path = os.path.join(out_dir, f"serialization-{benchmark}.png")
        figure.savefig(path, dpi=90)
        plt.close(figure)
        written.append(path)
    return written
