"""Command line of the serialization suite: ``run`` (pyperf), ``report``, ``sizes``, ``ab``.

    python -m bench.serialization run [--benchmark B] [--mode M] [--format F]
                                      [--compression C] [--depth N] [--smoke] [-o FILE]
                                      [any pyperf Runner option]
    python -m bench.serialization report FILE.json
    python -m bench.serialization sizes [--iterations N]
    python -m bench.serialization ab --benchmark B --mode M [--formats A,B] [--rounds N]
                                     (two formats in alternation: interleave.py)

Theory of operation
-------------------
``run`` builds the list of benchmarks the filters select, in a fixed order, and hands each
to one pyperf ``Runner`` (specs/benchmarks.md §7 maps onto pyperf as follows). pyperf's
manager process re-executes ``python -m bench.serialization run --worker ...`` for every
value-producing process: the worker rebuilds the same list from the same options (which
``_add_worker_args`` passes on), skips to the benchmark whose ``--worker-task`` index it
was given, and runs only that one. So nothing is set up at import or list time: a
benchmark's state (its inputs, its case and codec, its server process in the pipe modes)
is created on the first call of its time function; servers are ended when the run ends.

One pyperf value is one timed *batch*: the first N requests of a fresh generator (§7
fidelity rule), replayed in the benchmark's mode; ``inner_loops`` = N makes every value a
time per iteration. ``loops`` is fixed at 1, so there is no calibration and every process
runs the same batch. The inputs are generated outside the timed region; the ``gen``
pseudo-mode times that generation on its own (the RNG and string building the other
figures exclude). Within a manager run the inputs are generated once per benchmark and
shared with the workers through a temporary directory (marshal files), since catrank's
generation alone costs more than its timed batches.

The cyclic GC is collected before and disabled during every timed batch (the same for
both formats; §10 item 4 suggests tuning it and recording that, see the ``gc`` metadata).
A pyperf hook (:class:`SuiteHook`) adds per-run metadata: the batch's mean size and, for
the pipe modes, the client's and the server's CPU time per iteration (§ "Figures on our machines":
report CPU as well as wall time for pipe modes). CPU placement is pyperf's business:
``--affinity=0`` pins the worker, and the server inherits the pinning.

``--smoke`` runs every selected benchmark once on a tiny batch inside this process
(pyperf's ``--in-process``), which takes a few seconds; add ``--spawn`` to go through real
pyperf worker processes instead.
"""

from __future__ import annotations

import argparse
import gc
import marshal
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.serialization.base import BENCHMARKS, CAPNP_FORMATS, COMPRESSIONS, FORMATS, MODES

__all__ = ["BATCH_ITERATIONS", "SMOKE_ITERATIONS", "Spec", "main", "select_specs"]

PROG = "python -m bench.serialization"
ALL_MODES = ("gen", *MODES)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Iterations per timed batch. The first N requests of a fresh generator average 102.9 cars,
# 502.8 results and 32.8 nodes: within 3% of the population means (99.5, 499.5, 32.9), so
# per-iteration figures compare with upstream's long runs (§2-§4).
BATCH_ITERATIONS = {"carsales": 128, "catrank": 64, "eval": 1000}
SMOKE_ITERATIONS = {"carsales": 3, "catrank": 1, "eval": 20}
# pyperf defaults for a full run: 57 benchmarks x 10 worker processes x (1 warm-up + 4
# values) take about 9 minutes on our 2-vCPU machines (the budget is 20).
FULL_PYPERF = {"processes": 10, "values": 4, "warmups": 1}
SMOKE_PYPERF = {"processes": 1, "values": 1, "warmups": 0}
HOOK_NAME = "capsvc-suite"


@dataclass(frozen=True)
class Spec:
    """One pyperf benchmark: a benchmark in a mode, format and compression."""

    benchmark: str
    mode: str  # "gen" or one of MODES
    format: str | None = None  # None for gen
    compression: str | None = None  # None for gen, object mode and msgpack

    @property
    def name(self) -> str:
        parts = [self.benchmark, self.mode]
        if self.compression is not None:
            parts.append(self.compression)
        if self.format is not None:
            parts.append(self.format)
        return "/".join(parts)


def select_specs(
    benchmarks: Sequence[str],
    modes: Sequence[str],
    formats: Sequence[str],
    compressions: Sequence[str],
) -> list[Spec]:
    """The benchmarks the filters select, in the suite's fixed order.

    msgpack has no packed form (§6, §8), so it is measured once per mode and is the twin
    of both capnp rows; object mode serializes nothing, so it has no compression and runs
    when ``none`` is selected.
    """
    specs = []
    for benchmark in BENCHMARKS:
        if benchmark not in benchmarks:
            continue
        if "gen" in modes:
            specs.append(Spec(benchmark, "gen"))
        for mode in MODES:
            if mode not in modes:
                continue
            if mode == "object":
                if "none" in compressions:
                    specs.extend(Spec(benchmark, mode, fmt) for fmt in FORMATS if fmt in formats)
                continue
            for fmt in CAPNP_FORMATS:
                if fmt in formats:
                    specs.extend(
                        Spec(benchmark, mode, fmt, c)
                        for c in COMPRESSIONS
                        if c in compressions and (c == "none" or fmt != "capnpy")
                    )  # capnpy has no packed form (peer_capnpy.py)
            if "msgpack" in formats:
                specs.append(Spec(benchmark, mode, "msgpack"))
    return specs


def default_formats() -> tuple[str, ...]:
    """Every format, capnpy only where the optional package is installed."""
    from bench.serialization.peer_capnpy import available

    return FORMATS if available() else tuple(f for f in FORMATS if f != "capnpy")


def _choices(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        values = [value.strip() for value in text.split(",") if value.strip()]
        for value in values:
            if value not in allowed:
                raise argparse.ArgumentTypeError(
                    f"invalid choice {value!r} (choose from {', '.join(allowed)})"
                )
        return values

    return parse


def _add_suite_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("serialization suite")
    group.add_argument(
        "--benchmark",
        action="extend",
        type=_choices(BENCHMARKS),
        help="carsales, catrank, eval (repeat or comma-separate; default all)",
    )
    group.add_argument(
        "--mode",
        action="extend",
        type=_choices(ALL_MODES),
        help="gen (input generation alone), object, bytes, pipe, pipe-async (default all)",
    )
    group.add_argument(
        "--format",
        action="extend",
        type=_choices(FORMATS),
        help="capnp (pycapnp), capsvc (generated codecs, rows), capsvc-fields (generated "
        "codecs, a field at a time), capnp-direct (hand-tuned accessors, an upper bound), "
        "capnpy (if installed), msgpack (default: all but capnpy when it is not installed)",
    )
    group.add_argument(
        "--compression",
        action="extend",
        type=_choices(COMPRESSIONS),
        help="none, packed: capnp only; msgpack ignores it (default both)",
    )
    group.add_argument(
        "--depth",
        type=int,
        default=None,
        help="pipe-async: requests in flight, 0 = unbounded (default 4, as capnp-ocaml)",
    )
    group.add_argument(
        "--batch",
        type=int,
        default=None,
        help="iterations per timed batch (default: carsales 128, catrank 64, eval 1000; "
        "smoke 3, 1, 20)",
    )
    group.add_argument("--smoke", action="store_true", help="quick run: tiny batches, 1 value")
    group.add_argument(
        "--spawn",
        action="store_true",
        help="with --smoke: use pyperf worker processes instead of --in-process",
    )
    group.add_argument("--inputs-dir", help=argparse.SUPPRESS)  # manager -> workers


def _suite_options(args: argparse.Namespace) -> list[str]:
    """Our options in canonical form, for the worker command line."""
    options = []
    for name in ("benchmark", "mode", "format", "compression"):
        values = getattr(args, name)
        if values:
            options += [f"--{name}", ",".join(values)]
    if args.depth is not None:
        options += ["--depth", str(args.depth)]
    if args.batch is not None:
        options += ["--batch", str(args.batch)]
    if args.smoke:
        options.append("--smoke")
    if args.inputs_dir:
        options += ["--inputs-dir", args.inputs_dir]
    return options


def _add_worker_args(cmd: list[str], args: argparse.Namespace) -> None:
    cmd.extend(_suite_options(args))


# ------------------------------------------------------------------ the metadata hook

# Per-run facts known only once a benchmark has been set up in its worker (the batch's mean
# size); pyperf takes metadata at bench_time_func time, so the hook adds these afterwards.
_RUN_METADATA: dict[str, Any] = {}


class SuiteHook:
    """pyperf hook: per-run metadata, including pipe-mode CPU time per iteration."""

    def __init__(self) -> None:
        from bench.serialization import pipe

        self._log = pipe.CPU_LOG
        self._start = len(self._log)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    def teardown(self, metadata: dict[str, Any]) -> None:
        metadata.update(_RUN_METADATA)
        entries = self._log[self._start :]
        iterations = sum(entry[2] for entry in entries)
        if not iterations:
            return
        # Called after the warm-ups and again after the values: the values' figures win.
        metadata["client_cpu_us"] = sum(entry[0] for entry in entries) / iterations * 1e6
        metadata["server_cpu_us"] = sum(entry[1] for entry in entries) / iterations * 1e6


class _HookEntry:
    """What pyperf expects of a hook entry point: a name and ``load()``."""

    name = HOOK_NAME

    @staticmethod
    def load() -> type[SuiteHook]:
        return SuiteHook


# ------------------------------------------------------------------ benchmark state


class _Inputs:
    """Batches of generated inputs, shared across processes through marshal files."""

    def __init__(self, directory: str | None) -> None:
        self._directory = directory
        self._memory: dict[tuple[str, int], list[Any]] = {}

    def get(self, benchmark: str, iterations: int) -> list[Any]:
        key = (benchmark, iterations)
        batch = self._memory.get(key)
        if batch is not None:
            return batch
        path = None
        if self._directory:
            path = os.path.join(self._directory, f"{benchmark}-{iterations}.marshal")
            if os.path.exists(path):
                with open(path, "rb") as file:
                    batch = marshal.load(file)
        if batch is None:
            from bench.serialization.modes import generate_batch

            batch = generate_batch(benchmark, iterations)
            if path is not None:
                temporary = f"{path}.{os.getpid()}"
                with open(temporary, "wb") as file:
                    marshal.dump(batch, file)
                os.replace(temporary, path)
        self._memory[key] = batch
        return batch


def _batch_mean_size(benchmark: str, batch: Sequence[Any]) -> float:
    """Cars per lot, results per list or nodes per tree, averaged over the batch."""
    if not batch:
        return 0.0
    if benchmark == "carsales":
        return statistics.fmean(len(cars) for cars in batch)
    if benchmark == "catrank":
        return statistics.fmean(len(results) for results, _good in batch)
    from bench.serialization.eval import count_nodes

    return statistics.fmean(count_nodes(tokens) for tokens, _value in batch)


class _Bench:
    """The lazily built state of one benchmark in one process, and its time function."""

    def __init__(self, spec: Spec, iterations: int, depth: int, inputs: _Inputs) -> None:
        self.spec = spec
        self.iterations = iterations
        self.depth = depth
        self._inputs = inputs
        self._ready = False
        self._runner: Callable[[], float] | None = None

    def _prepare(self) -> None:
        from bench.serialization import modes

        spec = self.spec
        batch = self._inputs.get(spec.benchmark, self.iterations)
        _RUN_METADATA.clear()
        _RUN_METADATA["batch_mean_size"] = round(_batch_mean_size(spec.benchmark, batch), 3)
        gc.collect()
        gc.freeze()  # the inputs live for the whole process: keep them out of every collection
        if spec.mode == "gen":
            self._runner = self._time_generation
            self._ready = True
            return
        assert spec.format is not None
        from bench.serialization.codecs import make_codec

        case = modes.make_case(spec.benchmark, spec.format)
        codec = make_codec(
            modes.load_benchmark(spec.benchmark), spec.format, spec.compression or "none"
        )
        perf_counter = _perf_counter()
        if spec.mode == "object":

            def run_object() -> float:
                start = perf_counter()
                modes.run_object(case, codec, batch)
                return perf_counter() - start

            self._runner = run_object
        elif spec.mode == "bytes":

            def run_bytes() -> float:
                start = perf_counter()
                modes.run_bytes(case, codec, batch)
                return perf_counter() - start

            self._runner = run_bytes
        else:
            session = _pipe_session(spec, case, codec)
            depth = None if spec.mode == "pipe" else self.depth

            def run_pipe() -> float:
                return session.run(batch, depth)  # type: ignore[no-any-return]

            self._runner = run_pipe
        self._ready = True

    def _time_generation(self) -> float:
        from bench.serialization.modes import generate_batch

        perf_counter = _perf_counter()
        start = perf_counter()
        generate_batch(self.spec.benchmark, self.iterations)
        return perf_counter() - start

    def time_func(self, loops: int) -> float:
        if not self._ready:
            self._prepare()
        assert self._runner is not None
        total = 0.0
        for _ in range(loops):
            gc.collect()
            gc.disable()  # §10 item 4: no collections inside the timed batch, either format
            try:
                total += self._runner()
            finally:
                gc.enable()
        return total

    def metadata(self) -> dict[str, Any]:
        spec = self.spec
        meta: dict[str, Any] = {
            "description": _describe(spec, self.depth),
            "suite_benchmark": spec.benchmark,
            "suite_mode": spec.mode,
            "suite_format": spec.format or "harness",
            "suite_compression": spec.compression or "n/a",
            "batch_iterations": self.iterations,
            "gc": "collected before, disabled during each timed batch",
        }
        if spec.mode == "pipe-async":
            meta["pipe_async_depth"] = self.depth if self.depth > 0 else "unbounded"
        if spec.mode in ("pipe", "pipe-async") and spec.format != "msgpack":
            meta["pipe_framing"] = (
                "capnp stream framing"
                if spec.compression == "none"
                else "u32 length prefix + packed message (documented deviation, §6)"
            )
        return meta


# Pipe servers by (benchmark, format, compression): pipe and pipe-async of one codec share a
# server when they run in one process (the smoke run); a worker process runs one benchmark.
_SESSIONS: dict[tuple[str, str, str], Any] = {}


def _pipe_session(spec: Spec, case: Any, codec: Any) -> Any:
    from bench.serialization.pipe import PipeSession

    assert spec.format is not None
    key = (spec.benchmark, spec.format, spec.compression or "none")
    session = _SESSIONS.get(key)
    if session is None:
        session = _SESSIONS[key] = PipeSession(spec.benchmark, case, codec)
    return session


def _close_sessions() -> None:
    while _SESSIONS:
        _key, session = _SESSIONS.popitem()
        session.close()


def _perf_counter() -> Callable[[], float]:
    import time

    return time.perf_counter


def _describe(spec: Spec, depth: int) -> str:
    if spec.mode == "gen":
        return f"{spec.benchmark}: generating the inputs (RNG draws, strings), per iteration"
    what = {
        "object": "in place, no serialization",
        "bytes": "through flat byte strings",
        "pipe": "ping-pong with a server process over two pipes",
        "pipe-async": f"server process over two pipes, {depth or 'unbounded'} in flight",
    }[spec.mode]
    compression = f", {spec.compression}" if spec.compression else ""
    return f"{spec.benchmark} {spec.mode} ({what}), {spec.format}{compression}, per iteration"


def _versions() -> dict[str, str]:
    import importlib.metadata

    import capsvc

    # Which capsvc build ran: mypyc-compiled codec runtime, or pure Python (CAPSVC_PURE=1).
    versions = {"capsvc_build": "compiled" if capsvc.COMPILED else "pure"}
    for package in ("pycapnp", "msgpack", "trio", "pyperf"):
        try:
            versions[f"{package}_version"] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        import capnp.version as capnp_version

        versions["libcapnp_version"] = (
            f"{capnp_version.LIBCAPNP_VERSION_MAJOR}.{capnp_version.LIBCAPNP_VERSION_MINOR}."
            f"{capnp_version.LIBCAPNP_VERSION_MICRO}"
        )
    except ImportError:
        pass
    return versions


# ------------------------------------------------------------------ run


def run(argv: Sequence[str]) -> int:
    import pyperf

    argv = list(argv)
    smoke = "--smoke" in argv
    worker = "--worker" in argv
    if smoke and not worker:
        if "--spawn" not in argv and "--in-process" not in argv:
            argv.append("--in-process")  # a few seconds: no worker processes
        if not {"-v", "--verbose", "-q", "--quiet"} & set(argv):
            argv.append("--quiet")  # one value per benchmark: pyperf's stability warnings are noise
    if HOOK_NAME not in argv and not any(a.startswith("--hook") for a in argv):
        argv += ["--hook", HOOK_NAME]
    defaults = SMOKE_PYPERF if smoke else FULL_PYPERF
    runner = pyperf.Runner(
        loops=1,
        program_args=("-m", "bench.serialization", "run"),
        add_cmdline_args=_add_worker_args,
        metadata=_versions(),
        hooks=[_HookEntry],
        **defaults,
    )
    runner.argparser.prog = f"{PROG} run"
    _add_suite_args(runner.argparser)
    args = runner.parse_args(argv)

    if not args.worker:
        # Workers get a minimal environment from pyperf: pass our import path on.
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = ROOT if not path else ROOT + os.pathsep + path
        if not args.copy_env:
            args.inherit_environ = [*(args.inherit_environ or []), "PYTHONPATH"]

    specs = select_specs(
        args.benchmark or BENCHMARKS,
        args.mode or ALL_MODES,
        args.format or default_formats(),
        args.compression or COMPRESSIONS,
    )
    if not specs:
        print("no benchmark matches the filters", file=sys.stderr)
        return 2
    depth = 4 if args.depth is None else args.depth
    if depth < 0:
        print("--depth must be >= 0", file=sys.stderr)
        return 2

    own_dir = None
    if not args.worker and not args.in_process and not args.inputs_dir:
        own_dir = tempfile.mkdtemp(prefix="capsvc-bench-inputs-")
        args.inputs_dir = own_dir
    inputs = _Inputs(args.inputs_dir)
    sizes = SMOKE_ITERATIONS if args.smoke else BATCH_ITERATIONS
    try:
        for spec in specs:
            iterations = args.batch or sizes[spec.benchmark]
            state = _Bench(spec, iterations, depth, inputs)
            runner.bench_time_func(
                spec.name, state.time_func, inner_loops=iterations, metadata=state.metadata()
            )
    finally:
        _close_sessions()
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
    return 0


# ------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"run": run, "report": _report, "sizes": _sizes, "ab": _ab}
    if not argv or argv[0] not in commands:
        print(__doc__.split("Theory of operation")[0].rstrip(), file=sys.stderr)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return commands[argv[0]](argv[1:])


def _report(argv: Sequence[str]) -> int:
    from bench.serialization.report import main as report_main

    return report_main(argv)


def _ab(argv: Sequence[str]) -> int:
    from bench.serialization.interleave import main as ab_main

    return ab_main(argv)


def _sizes(argv: Sequence[str]) -> int:
    from bench.serialization.report import sizes_main

    return sizes_main(argv)
