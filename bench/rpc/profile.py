"""Where a capsvc call's time goes: per-call costs on both sides, and optional profilers.

Theory of operation
-------------------
``python -m bench.rpc profile`` starts one server (its own process, as in the suite) and
drives it from a client in this process, for a fixed number of calls per concurrency
level. Around the measured calls it reads, for each side:

- CPU time, and its kernel part (``os.times`` here, psutil for the server);
- trio scheduler passes (an instrument counting ``before_io_wait``) and
  ``Connection.writes``: the client's directly, the server's from its ``STATS`` answer
  to SIGUSR1 (bench.rpc.servers), so that nothing in capsvc needs changing;
- system calls (``perf stat`` on the ``syscalls:sys_enter_*`` tracepoints of both
  processes: send, recv, epoll_wait), when perf works here (``--no-syscalls`` skips it).

Divided by the calls they give costs *per call per side*. Optional profilers, run only
around the measured calls: ``--py-spy DIR`` samples both processes (non-blocking; with
``--gil`` only samples that hold the GIL, i.e. Python work, not time in system calls or
preempted) and prints self time per package and function and inclusive time per stage
of a call; ``--cprofile DIR`` runs cProfile in both trio threads (the server toggles it
on SIGUSR2) and prints exclusive time per package and function (inflated by cProfile's
overhead: read the shares). ``--pairing`` profiles another pairing, e.g. the raw
ping-pong or pycapnp, the same way; several comma-separated pairings are measured in turn
(``--rounds N``: N times, alternating), then summarised side by side with each one's CPU
per call against the last one's, round by round. ``--typed-vs-dynamic`` is the echo goal
of issue 9: generated stubs against the dynamic path, on both ends, busy polling off.
The machine's state (CPU, cpuidle driver and governor, haltpoll, load average) is printed
before and after: on a shared VM it decides how much to trust the figures.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.rpc.clients import make_client
from bench.rpc.scenarios import PAIRINGS, SERVER_KINDS, Pairing
from bench.rpc.servers import start_servers, stop_servers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pairing",
        default="capsvc-tcp",
        help=f"one pairing, or several comma-separated, measured in turn ({', '.join(PAIRINGS)})",
    )
    parser.add_argument(
        "--typed-vs-dynamic",
        action="store_true",
        help="the echo goal of issue 9: generated stubs vs the dynamic path, both ends, "
        f"busy polling off (--pairing {','.join(TYPED_VS_DYNAMIC)})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every pairing this many times, alternating (then medians and ranges)",
    )
    parser.add_argument("--calls", type=int, default=20_000, help="measured calls per level")
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--concurrency", default="1,12", help="comma-separated levels")
    parser.add_argument("--payload", type=int, default=16)
    parser.add_argument("--py-spy", metavar="DIR", help="sample both sides with py-spy")
    parser.add_argument(
        "--gil",
        action="store_true",
        help="py-spy: only samples holding the GIL (Python work, not syscalls or preemption)",
    )
    parser.add_argument(
        "--cprofile", metavar="DIR", help="cProfile (CPU time) both sides' trio threads"
    )
    parser.add_argument("--top", type=int, default=15, help="functions shown per side")
    parser.add_argument(
        "--no-syscalls", action="store_true", help="do not count system calls with perf"
    )


#: ``--typed-vs-dynamic``: (generated stubs, dynamic path), each on both ends.
TYPED_VS_DYNAMIC = ("capsvc-tcp-nopoll", "capsvc-tcp-nopoll-dynamic")


def main(args: argparse.Namespace) -> int:
    names = list(TYPED_VS_DYNAMIC) if args.typed_vs_dynamic else args.pairing.split(",")
    if unknown := [n for n in names if n not in PAIRINGS]:
        print(f"unknown pairings {unknown}; known: {', '.join(PAIRINGS)}")
        return 2
    levels = [int(c) for c in args.concurrency.split(",")]
    print(machine_state("before"), flush=True)
    measured: dict[str, list[dict[int, dict[str, float]]]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names:
            if args.rounds > 1:
                print(f"round {round_ + 1}/{args.rounds}: {name}", flush=True)
            measured[name].append(_profile_pairing(PAIRINGS[name], levels, args))
    print("\n" + machine_state("after"))
    if len(names) > 1 or args.rounds > 1:
        _print_summary(measured, levels, args)
    return 0


def machine_state(when: str) -> str:
    """What decides a figure's noise here: the CPU, how idle vCPUs sleep, the load."""

    def read(path: str) -> str:
        try:
            with open(path) as source:
                return source.read().strip()
        except OSError:
            return "n/a"

    model = "n/a"
    for line in read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    idle = "/sys/devices/system/cpu/cpuidle/"
    return (
        f"machine ({when}): CPU {model} x{os.cpu_count()}; cpuidle driver "
        f"{read(idle + 'current_driver')}, governor {read(idle + 'current_governor_ro')}; "
        f"haltpoll guest_halt_poll_ns {read('/sys/module/haltpoll/parameters/guest_halt_poll_ns')}"
        f"; load average {' '.join(read('/proc/loadavg').split()[:3])}"
        f"; capsvc build {_build_name()}"
    )


def _build_name() -> str:
    """mypyc-compiled or pure Python, as this process (and its children) run capsvc."""
    import capsvc

    return "compiled" if capsvc.COMPILED else "pure (CAPSVC_PURE=1 or no compiled build)"


def _profile_pairing(
    pairing: Pairing, levels: list[int], args: argparse.Namespace
) -> dict[int, dict[str, float]]:
    """One pairing at every level (a fresh server): prints its table, returns the figures."""
    scratch = tempfile.mkdtemp(prefix="capsvc-profile-")
    env = {}
    if args.cprofile:
        os.makedirs(args.cprofile, exist_ok=True)
        env["BENCH_RPC_CPROFILE"] = os.path.abspath(os.path.join(args.cprofile, "server.prof"))
    servers = start_servers([SERVER_KINDS[pairing.server]], scratch, env=env)
    server = servers[pairing.server]
    rows: dict[int, dict[str, float]] = {}
    calls_rows: list[tuple[int, list[dict[str, int]]]] = []
    try:
        for level in levels:
            client = make_client(pairing.client, server.address, level, args.payload).start()
            try:
                client.run(args.warmup)
                spies = _start_spies(args.py_spy, server.pid, f"{pairing.name}-c{level}", args.gil)
                counters = [] if args.no_syscalls else _start_perf([os.getpid(), server.pid])
                profiles = _start_cprofile(args.cprofile, client, server)
                before = _snapshot(client, server)
                seconds = client.run(args.calls)
                after = _snapshot(client, server)
                tag = f"{pairing.name}-c{level}"
                _stop_cprofile(profiles, args.cprofile, client, server, tag)
                syscalls = _stop_perf(counters)
                _stop_spies(spies)
            finally:
                client.close()
            if args.cprofile:
                for side in ("client", "server"):
                    path = os.path.join(args.cprofile, f"{tag}-{side}.prof")
                    if os.path.exists(path):
                        _print_cprofile(
                            f"{pairing.name} c{level} {side}", path, args.calls, args.top
                        )
            rows[level] = _figures(args.calls, seconds, before, after)
            if syscalls:
                calls_rows.append((level, syscalls))
            for side, path in spies:
                _print_top(f"{pairing.name} c{level} {side}", path, args.top)
    finally:
        stop_servers(servers)
        shutil.rmtree(scratch, ignore_errors=True)
    _print_table(pairing, rows, calls_rows, args)
    return rows


def _print_table(
    pairing: Pairing,
    rows: dict[int, dict[str, float]],
    calls_rows: list[tuple[int, list[dict[str, int]]]],
    args: argparse.Namespace,
) -> None:
    print(f"\n{pairing.title}, payload {args.payload} B, {args.calls:,} calls per level\n")
    header = (
        "| conc | calls/s | client CPU µs | server CPU µs | of which kernel: client "
        "| server | client passes | server passes | client writes | server writes |"
    )
    print(header)
    print("|---|---|---|---|---|---|---|---|---|---|")
    for level, figures in rows.items():
        print(f"| {level} | " + " | ".join(_formatted(figures)) + " |")
    if calls_rows:
        print("\nSystem calls per call (perf stat tracepoints, whole processes):\n")
        names = sorted({n for _, sides in calls_rows for side in sides for n in side})
        print("| conc | side | " + " | ".join(names) + " |")
        print("|---|---|" + "---|" * len(names))
        for level, sides in calls_rows:
            for side, counts in zip(("client", "server"), sides, strict=False):
                cells = [f"{counts.get(n, 0) / args.calls:.2f}" for n in names]
                print(f"| {level} | {side} | " + " | ".join(cells) + " |")


def _print_summary(
    measured: dict[str, list[dict[int, dict[str, float]]]],
    levels: list[int],
    args: argparse.Namespace,
) -> None:
    """Medians (ranges) over the rounds, and each pairing's CPU per call against the last
    pairing's, round by round (the pairings of a round ran minutes apart at most)."""
    names = list(measured)
    base = names[-1]
    print(f"\nSummary over {args.rounds} round(s), payload {args.payload} B, CPU µs per call:")
    print(f"(ratios: against {PAIRINGS[base].title}, per round, then median and range)\n")
    print(
        "| pairing | conc | calls/s | client CPU µs | server CPU µs "
        "| client ÷ base | server ÷ base |"
    )
    print("|---|---|---|---|---|---|---|")
    for level in levels:
        for name in names:
            rounds = [r[level] for r in measured[name]]
            cells = [_spread([r["calls_per_s"] for r in rounds], "{:,.0f}")]
            for key in ("client_cpu", "server_cpu"):
                cells.append(_spread([r[key] for r in rounds], "{:.1f}"))
            for key in ("client_cpu", "server_cpu"):
                ratios = [
                    r[level][key] / b[level][key]
                    for r, b in zip(measured[name], measured[base], strict=True)
                    if b[level].get(key)
                ]
                cells.append(_spread(ratios, "{:.2f}") if name != base else "1")
            print(f"| {PAIRINGS[name].title} | {level} | " + " | ".join(cells) + " |")


def _spread(values: list[float], fmt: str) -> str:
    if not values or any(math.isnan(v) for v in values):
        return "-"
    middle = statistics.median(values)
    if len(values) == 1:
        return fmt.format(middle)
    return f"{fmt.format(middle)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _start_cprofile(directory: str | None, client: Any, server: Any) -> Any:
    if directory is None:
        return None
    import cProfile

    profiler = None
    if hasattr(client, "profile"):
        profiler = cProfile.Profile()
        client.profile(profiler, True)
    if server.kind.impl in ("capsvc", "raw"):
        server.toggle_profiler()
    return profiler


def _stop_cprofile(
    profiler: Any, directory: str | None, client: Any, server: Any, tag: str
) -> None:
    if directory is None:
        return
    if profiler is not None:
        client.profile(profiler, False)
        profiler.dump_stats(os.path.join(directory, f"{tag}-client.prof"))
    if server.kind.impl in ("capsvc", "raw"):
        answer = server.toggle_profiler()
        if answer.startswith("PROFILED "):
            os.replace(answer.split(None, 1)[1], os.path.join(directory, f"{tag}-server.prof"))


def _print_cprofile(title: str, path: str, calls: int, top: int) -> None:
    """Time per echo call by package and by function: cProfile's own (exclusive) time, wall
    clock, minus the time asleep in ``epoll.poll`` (inflated by cProfile's overhead: read
    the shares, and the real CPU totals in the table)."""
    import pstats

    stats: Any = pstats.Stats(path)
    packages: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for (filename, line, name), (_, _, tottime, _, _) in stats.stats.items():
        if name == "<method 'poll' of 'select.epoll' objects>":
            continue  # asleep (mostly): not work
        where = f"{filename}:{line}"
        packages[_package(where if filename != "~" else name)] += tottime
        short = filename.split("site-packages/")[-1].split("/work/main/")[-1]
        functions[f"{name} ({short}:{line})"] += tottime
    total = sum(packages.values())
    scale = 1e6 / calls
    print(f"\n{title}: cProfile {total * scale:.0f} µs/call busy (with profiling overhead)")
    for package, seconds in packages.most_common():
        print(f"  {seconds * scale:6.1f} µs  {seconds / total:6.1%}  {package}")
    print(f"{title}: top {top} functions by own time")
    for function, seconds in functions.most_common(top):
        print(f"  {seconds * scale:6.1f} µs  {seconds / total:6.1%}  {function}")


SYSCALLS = (
    "sendto", "sendmsg", "write", "writev", "recvfrom", "recvmsg", "read",
    "epoll_wait", "epoll_pwait",
)  # fmt: skip


def _start_perf(pids: list[int]) -> list[subprocess.Popen[str]]:
    """``perf stat`` counting socket/epoll system calls of each pid (if perf works here)."""
    perf = shutil.which("perf")
    if perf is None:
        return []
    events = ",".join(f"syscalls:sys_enter_{name}" for name in SYSCALLS)
    counters = [
        subprocess.Popen(
            [perf, "stat", "-x", ",", "-e", events, "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in pids
    ]
    time.sleep(0.5)  # perf attaches
    return counters


def _stop_perf(counters: list[subprocess.Popen[str]]) -> list[dict[str, int]]:
    results = []
    for counter in counters:
        counter.send_signal(signal.SIGINT)
    for counter in counters:
        try:
            _, err = counter.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            counter.kill()
            continue
        counts = {}
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2].startswith("syscalls:sys_enter_"):
                if fields[0].isdigit() and int(fields[0]):
                    counts[fields[2][len("syscalls:sys_enter_") :]] = int(fields[0])
        results.append(counts)
    return results


def _snapshot(client: Any, server: Any) -> dict[str, Any]:
    times = os.times()
    snap: dict[str, Any] = {"client_cpu": time.process_time(), "client": client.stats()}
    snap["client"] |= {"user": times.user, "sys": times.system}
    if server.kind.impl in ("capsvc", "raw"):
        snap["server"] = server.stats()
    else:
        snap["server"] = {"cpu": server.cpu_seconds()}
    user, system = server.cpu_split()
    snap["server"] |= {"user": user, "sys": system}
    return snap


def _figures(
    calls: int, seconds: float, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, float]:
    """Per-call costs between two snapshots (NaN where a side does not count it)."""

    def per_call(side: str, key: str, scale: float = 1.0) -> float:
        a, b = before[side], after[side]
        if key not in a or key not in b:
            return math.nan
        return float((b[key] - a[key]) / calls * scale)

    return {
        "calls_per_s": calls / seconds,
        "client_cpu": (after["client_cpu"] - before["client_cpu"]) / calls * 1e6,
        "server_cpu": per_call("server", "cpu", 1e6),
        "client_sys": per_call("client", "sys", 1e6),
        "server_sys": per_call("server", "sys", 1e6),
        "client_passes": per_call("client", "passes"),
        "server_passes": per_call("server", "passes"),
        "client_writes": per_call("client", "writes"),
        "server_writes": per_call("server", "writes"),
    }


def _formatted(figures: dict[str, float]) -> list[str]:
    def cell(key: str, digits: int) -> str:
        value = figures[key]
        return "-" if math.isnan(value) else f"{value:,.{digits}f}"

    return [
        cell("calls_per_s", 0),
        *(cell(k, 0) for k in ("client_cpu", "server_cpu", "client_sys", "server_sys")),
        *(cell(k, 2) for k in ("client_passes", "server_passes")),
        *(cell(k, 2) for k in ("client_writes", "server_writes")),
    ]


# ---------------------------------------------------------------------- py-spy
def _start_spies(directory: str | None, server_pid: int, tag: str, gil: bool = False) -> list[Any]:
    if directory is None:
        return []
    exe = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    os.makedirs(directory, exist_ok=True)
    spies = []
    for side, pid in (("client", os.getpid()), ("server", server_pid)):
        path = os.path.join(directory, f"{tag}-{side}.txt")
        process = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--format", "raw", "--nonblocking",
             "--rate", "500", "--output", path, *(["--gil"] if gil else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        spies.append((side, path, process))
    time.sleep(1.0)  # py-spy attaches
    return spies


def _stop_spies(spies: list[Any]) -> list[tuple[str, str]]:
    for _, _, process in spies:
        process.send_signal(signal.SIGINT)
    for _, _, process in spies:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    spies[:] = [(side, path) for side, path, _ in spies]
    return spies


PACKAGES = (
    ("capsvc/rpc/rpc_capnp", "generated codecs (capsvc/generated, rpc_capnp)"),
    ("capsvc/generated/", "generated codecs (capsvc/generated, rpc_capnp)"),
    ("capsvc/codec/", "capsvc.codec (runtime of generated code)"),
    ("capsvc/typed", "capsvc.typed (typed clients, servers)"),
    ("capsvc/rpc/", "capsvc.rpc (engine)"),
    ("capsvc/connection", "capsvc.connection"),
    ("capsvc/flusher", "capsvc.flusher"),
    ("capsvc/framing", "capsvc.framing"),
    ("capsvc/transport", "capsvc.transport"),
    ("capsvc/runtime", "capsvc.runtime"),
    ("capsvc/", "capsvc (API: client, server, structs)"),
    ("bench/", "benchmark harness"),
    ("trio/", "trio"),
    ("capnp/", "pycapnp"),
    ("asyncio/", "asyncio"),
    ("selectors", "selectors"),
    ("threading", "threading"),
    ("<method '", "builtins, C methods (socket, pycapnp, ...)"),
    ("<built-in", "builtins, C methods (socket, pycapnp, ...)"),
)


def _package(frame: str) -> str:
    for needle, name in PACKAGES:
        if needle in frame:
            return name
    return "other"


# Stages of a call, as (label, substrings of py-spy frames "function (file:line)"): a sample
# counts for a stage when a frame matching one of them is anywhere on its stack (inclusive
# time; stages overlap, e.g. the engine runs inside the reader and the server dispatch).
STAGES = (
    ("socket send (end-of-pass flush)", ("Connection.flush_at_end_of_pass", "send_all_fast")),
    ("socket receive", ("FastSocketStream.receive_some",)),
    ("epoll wait (trio)", ("EpollIOManager.get_events",)),
    ("engine (capsvc/rpc/)", ("capsvc/rpc/",)),
    ("client API (client.py, structs.py)", ("capsvc/client.py", "capsvc/structs.py")),
    ("typed API (typed.py, codec/pipeline.py)", ("capsvc/typed.py", "capsvc/codec/pipeline.py")),
    (
        "generated codecs and their runtime",
        ("capsvc/codec/building", "capsvc/codec/reading", "capsvc/generated/", "rpc_capnp"),
    ),
    (
        "pycapnp payloads (dynamic: payload, structs)",
        ("new_call_payload", "new_return_payload", "BuiltPayload", "ReceivedPayload.content"),
    ),
    ("server dispatch (server.py, runtime.py)", ("capsvc/server.py", "capsvc/runtime.py")),
    ("framing (framing.py)", ("capsvc/framing.py",)),
)


def _print_top(title: str, path: str, top: int) -> None:
    """Self time per function and per package from py-spy's raw (collapsed) output."""
    if not os.path.exists(path):
        print(f"\n{title}: no py-spy output ({path})")
        return
    own: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    stages: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path) as source:
        for line in source:
            stack, _, count_text = line.rstrip().rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = stack.split(";")
            leaf = frames[-1]
            if "idle" in frames[0] or "(idle)" in leaf:
                continue
            total += count
            own[leaf] += count
            packages[_package(leaf)] += count
            for label, needles in STAGES:
                if any(needle in frame for frame in frames for needle in needles):
                    stages[label] += count
    if not total:
        print(f"\n{title}: no busy samples")
        return
    print(f"\n{title}: {total} busy samples; self time by package")
    for name, count in packages.most_common():
        print(f"  {count / total:6.1%}  {name}")
    print(f"{title}: inclusive time of the stages of a call")
    for label, _ in STAGES:
        if stages[label]:
            print(f"  {stages[label] / total:6.1%}  {label}")
    print(f"{title}: top {top} functions by self time")
    for name, count in own.most_common(top):
        print(f"  {count / total:6.1%}  {name}")
