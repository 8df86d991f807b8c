"""Instructions per bytes-mode iteration, counted by callgrind: the steady figure beside
pyperf's wall times, which move by tens of percent on a shared VM.

    python -m bench.serialization.instructions [--benchmark B]... [--format F]...

Theory of operation: a child Python runs ``n`` and then ``3n`` bytes-mode iterations
(each one request of the benchmark's first batch and its response, after a warm-up of
two) under ``valgrind --tool=callgrind``; the difference over ``2n`` is the cost of one
iteration, with interpreter start-up, imports and input generation cancelled out.
Needs valgrind (Debian's ``valgrind`` package).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

from bench.serialization.base import BENCHMARKS

#: Iterations of the short run, per benchmark (eval's requests are small).
ITERATIONS = {"carsales": 4, "catrank": 4, "eval": 100}

_CHILD = """
import sys
from bench.serialization import modes
from bench.serialization.codecs import make_codec
bench, fmt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
case = modes.make_case(bench, fmt)
codec = make_codec(modes.load_benchmark(bench), fmt, "none")
batch = modes.generate_batch(bench, 64)
modes.run_bytes(case, codec, batch[:2])
for i in range(n):
    modes.run_bytes(case, codec, batch[i % 64 : i % 64 + 1])
"""


def instructions(benchmark: str, fmt: str, iterations: int) -> int:
    """Instructions callgrind counts for the whole child run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=os.getcwd())
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, "-c", _CHILD, benchmark, fmt, str(iterations)],
            env=env, capture_output=True, text=True, timeout=1800, check=True,
        )  # fmt: skip
        found = re.search(r"Collected : (\d+)", run.stderr)
        if found is None:
            raise RuntimeError(f"callgrind printed no total:\n{run.stderr[-2000:]}")
        return int(found.group(1))


def per_iteration(benchmark: str, fmt: str) -> int:
    n = ITERATIONS[benchmark]
    return (instructions(benchmark, fmt, 3 * n) - instructions(benchmark, fmt, n)) // (2 * n)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serialization.instructions")
    parser.add_argument("--benchmark", action="append", choices=BENCHMARKS)
    parser.add_argument("--format", action="append", default=None)
    args = parser.parse_args(argv)
    formats = args.format or ["capsvc", "msgpack"]
    print("| benchmark | " + " | ".join(f"{f} instructions" for f in formats) + " | ratio |")
    print("|---|" + "---:|" * (len(formats) + 1))
    for benchmark in args.benchmark or list(BENCHMARKS):
        counts = [per_iteration(benchmark, fmt) for fmt in formats]
        ratio = f"{counts[0] / counts[-1]:.2f}x" if len(counts) > 1 else "-"
        print(f"| {benchmark} | " + " | ".join(f"{c:,}" for c in counts) + f" | {ratio} |")


if __name__ == "__main__":
    main()
