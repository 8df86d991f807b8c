"""bench/serving/workers.py: its arguments, the server it runs, and runs small enough for
the test suite (a scaling run, a drain and a kill, about 16 s together)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.serving import cxx_build
from bench.serving.workers import (
    CALL_MS_VARIABLE,
    READY_AGAIN,
    RESTARTING,
    SCALING_APP,
    WARMUP,
    ClientProcess,
    Killed,
    Side,
    WorkersServer,
    client_command,
    parse_args,
    report_kill,
    scaling_cells,
    slow_echo,
)

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_the_documented_run() -> None:
    args = parse_args([])
    assert (args.workers, args.modes) == ([1, 2], ["reuseport", "shared"])
    assert (args.seconds, args.reps, args.clients, args.connections, args.in_flight) == (
        5.0, 3, 4, 16, 1,
    )  # fmt: skip
    assert (args.drain, args.grace, args.client) == (False, 30.0, None)
    assert (args.load, args.cxx_binary) == ("python", None)
    assert scaling_cells(args) == [(1, "reuseport"), (2, "reuseport"), (2, "shared")]


def test_drain_defaults_are_the_documented_run() -> None:
    args = parse_args(["--drain"])
    assert (args.workers, args.modes, args.grace) == ([2], ["reuseport"], 30.0)
    assert (args.call_ms, args.before, args.seconds) == (50.0, 2.0, 42.0)
    assert (args.clients, args.connections, args.in_flight) == (4, 16, 1)


def test_kill_defaults_are_the_documented_run() -> None:
    args = parse_args(["--kill"])
    assert (args.kill, args.drain, args.workers, args.modes) == (True, False, [2], ["reuseport"])
    assert (args.before, args.seconds, args.reps) == (2.0, 5.0, 3)
    assert (args.clients, args.connections, args.in_flight) == (4, 16, 1)
    assert parse_args(["--kill", "--before", "1"]).seconds == 4.0
    assert parse_args(["--kill", "--workers", "3", "--modes", "shared"]).workers == [3]


def test_a_kill_client_is_told_the_mode_and_the_instant() -> None:
    args = parse_args(["--kill", "--before", "1.5", "--seconds", "4"])
    command = client_command(args, "tcp:127.0.0.1:4000")
    assert command[command.index("--client") + 1] == "tcp:127.0.0.1:4000"
    assert "--kill" in command
    assert "--drain" not in command
    assert command[command.index("--before") + 1] == "1.5"
    assert command[command.index("--seconds") + 1] == "4.0"
    client = parse_args(command[3:])
    assert (client.kill, client.before, client.seconds) == (True, 1.5, 4.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "1,x"], "argument --workers: '1,x': expected numbers like 1,2"),
        (["--workers", "0"], "argument --workers: '0': every worker count must be >= 1"),
        (["--workers", "2,2"], "argument --workers: '2,2': a worker count is repeated"),
        (["--modes", "fork"], "argument --modes: 'fork': unknown mode 'fork'"),
        (["--modes", "shared,shared"], "argument --modes: 'shared,shared': a mode is repeated"),
        (["--seconds", "0"], "argument --seconds: '0' must be > 0"),
        (["--reps", "many"], "argument --reps: 'many' is not a number"),
        (["--clients", "0"], "argument --clients: '0' must be > 0"),
        (["--connections", "-1"], "argument --connections: '-1' must be > 0"),
        (["--in-flight", "1.5"], "argument --in-flight: '1.5' is not a number"),
        (["--grace", "-1"], "argument --grace: '-1' must be >= 0"),
        (["--drain", "--call-ms", "slow"], "argument --call-ms: 'slow' is not a number"),
        (["--drain", "--before", "0"], "argument --before: '0' must be > 0"),
        (["--call-ms", "10"], "--call-ms goes with --drain"),
        (["--before", "1"], "--before goes with --drain or --kill"),
        (["--kill", "--drain"], "--kill and --drain exclude each other"),
        (["--kill", "--call-ms", "10"], "--call-ms goes with --drain"),
        (["--kill", "--workers", "1"], "--kill needs --workers >= 2"),
        (["--kill", "--workers", "2,3"], "--kill takes one --workers count"),
        (["--kill", "--modes", "reuseport,shared"], "--kill takes one --modes value"),
        (["--kill", "--before", "3", "--seconds", "2"], "--seconds must be more than --before"),
        (["--kill", "--before", "-1"], "argument --before: '-1' must be > 0"),
        (["--drain", "--workers", "1,2"], "--drain takes one --workers count"),
        (["--drain", "--modes", "reuseport,shared"], "--drain takes one --modes value"),
        (["--drain", "--before", "3", "--seconds", "2"], "--seconds must be more than --before"),
        (["--clients", "64", "--connections", "17"], "--clients x --connections must be <= 1024"),
        (["--client", "tcp:10.0.0.1:4000"], "--client takes a tcp:127.0.0.1:PORT address"),
        (["--load", "rust"], "argument --load: invalid choice: 'rust'"),
        (["--load", "cxx", "--kill"], "--load cxx is for the scaling run only, not with --kill"),
        (["--load", "cxx", "--drain"], "--load cxx is for the scaling run only, not with --drain"),
    ],
)
def test_bad_arguments_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_cxx_client_is_the_cxx_binary_with_its_arguments() -> None:
    args = parse_args(["--load", "cxx", "--connections", "8", "--in-flight", "2"])
    assert args.load == "cxx"
    args.cxx_binary = Path("/somewhere/load")
    command = client_command(args, "tcp:127.0.0.1:4000")
    # HOST PORT CONNECTIONS IN_FLIGHT SECONDS WARMUP_SECONDS
    assert command == ["/somewhere/load", "127.0.0.1", "4000", "8", "2", "5.0", repr(WARMUP)]
    assert parse_args(["--load", "python"]).load == "python"


def test_a_cxx_clients_json_line_reads_as_a_python_clients(tmp_path: Path) -> None:
    line = {"calls": 1200, "errors": 0, "cpu_seconds": 0.25, "wall_seconds": 1.0}
    with open(tmp_path / "client.log", "w+") as log:
        client = ClientProcess(
            [sys.executable, "-c", f"print({json.dumps(json.dumps(line))})"], log, "cxx"
        )
        try:
            result = client.result(30)
        finally:
            client.stop()
    assert result == {"calls": 1200, "errors": 0, "cpu": 0.25, "wall": 1.0, "reasons": {}}
    with pytest.raises(ValueError, match="load 'rust'"):
        ClientProcess([sys.executable, "-c", "pass"], io.StringIO(), "rust")


def test_a_missing_cxx_toolchain_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(cxx_build, "BUILD_DIR", tmp_path)  # no cached binary to fall back on
    monkeypatch.setattr(cxx_build.shutil, "which", lambda tool: None)
    monkeypatch.setattr(cxx_build, "HEADER", tmp_path / "no" / "ez-rpc.h")
    why = cxx_build.missing()
    assert why is not None
    assert "capnp, capnpc-c++, g++" in why
    assert "apt-get install libcapnp-dev capnproto" in why
    with pytest.raises(cxx_build.BuildError, match="apt-get install libcapnp-dev capnproto"):
        cxx_build.build()


def test_the_server_command_is_capsvc_serve_with_workers() -> None:
    server = WorkersServer(2, "shared", SCALING_APP, 7.5, io.StringIO())
    command = server.command()
    assert command[:5] == [sys.executable, "-m", "capsvc", "serve", SCALING_APP]
    text = " ".join(command[5:])
    assert f"--listen tcp:127.0.0.1:{server.port} " in text
    assert "--grace 7.5" in text
    assert "--workers 2" in text
    assert "--shared-socket" in command
    assert "--no-busy-poll" in command
    reuseport = WorkersServer(2, "reuseport", SCALING_APP, 30, io.StringIO()).command()
    assert "--shared-socket" not in reuseport
    assert "--no-busy-poll" in reuseport


def test_slow_echo_reads_its_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CALL_MS_VARIABLE, "5")
    assert type(slow_echo()).__name__ == "SlowBenchEcho"
    monkeypatch.setenv(CALL_MS_VARIABLE, "soon")
    with pytest.raises(ValueError, match="is not a number"):
        slow_echo()


def _run(arguments: str) -> str:
    # A hang is bounded by the limit; the run itself takes seconds.
    done = subprocess.run(
        [sys.executable, "-m", "bench.serving.workers", *arguments.split()],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "command line: python -m bench.serving.workers" in done.stdout
    assert "machine (before): CPU" in done.stdout
    assert "machine (after): CPU" in done.stdout
    return done.stdout


def test_a_tiny_scaling_run_reports_every_cell() -> None:
    out = _run("--workers 1,2 --modes reuseport --reps 1 --seconds 1 --clients 2 --connections 2")
    for cell in ("N=1", "N=2 reuseport"):
        row = re.search(
            rf"^{cell} +([\d,]+) +([\d.]+) +([\d.]+) +[\d,]+ +([\d.]+|inf) +0\b", out, re.M
        )
        assert row is not None, out
        assert int(row.group(1).replace(",", "")) > 0
        assert float(row.group(2)) > 0  # server cores
    scaling = re.search(r"^N=2 reuseport +(\d+\.\d\d) +(\d+\.\d\d) +(\d+\.\d\d) ", out, re.M)
    assert scaling is not None, out
    assert float(scaling.group(1)) > 0
    assert "N=2 shared" not in out


def test_a_tiny_scaling_run_with_the_cxx_load() -> None:
    if shutil.which("g++") is None or not cxx_build.HEADER.exists():
        pytest.skip(f"the C++ client needs g++ and {cxx_build.HEADER} (libcapnp-dev)")
    # Builds the C++ client first (a few seconds) unless build/cxx_load has it already.
    out = _run("--load cxx --reps 1 --seconds 1 --clients 1 --connections 4")
    assert "load: C++ client " in out
    assert "1 C++ (capnp-rpc) client processes x 4 connections (4)" in out
    for cell in ("N=1", "N=2 reuseport", "N=2 shared"):
        row = re.search(
            rf"^{cell} +([\d,]+) +([\d.]+) +([\d.]+) +[\d,]+ +([\d.]+|inf) +(\d+)\b", out, re.M
        )
        assert row is not None, out
        assert int(row.group(1).replace(",", "")) > 0, out  # calls/s
        assert float(row.group(3)) > 0, out  # the C++ client's CPU was counted
        assert row.group(5) == "0", out  # errors


def test_a_tiny_drain_loses_nothing() -> None:
    out = _run(
        "--drain --reps 1 --seconds 8 --before 1 --call-ms 20 --clients 2 --connections 2 "
        "--grace 10"
    )
    total = re.search(r"^total: ok ([\d,]+), refused ([\d,]+), lost 0; exit 0;", out, re.M)
    assert total is not None, out
    assert int(total.group(1).replace(",", "")) > 0
    # Every connection had a 20 ms call in flight most of the time: the SIGTERM found some.
    row = re.search(r"^ +1 +[\d,]+ +[\d,]+ +0 +([\d,]+) +0 +[\d.]+$", out, re.M)
    assert row is not None, out
    assert int(row.group(1)) > 0
    assert "goal (lost 0, exit 0) met" in out


def test_the_supervisor_lines_the_kill_reads() -> None:
    # capsvc/workers.py's wording (its _watch and _read_control).
    exited = RESTARTING.search(
        "12:00:00 WARNING capsvc.workers: worker 1 (pid 4321) exited with status -9 (SIGKILL); "
        "restarting it in 0.1 s"
    )
    assert exited is not None
    assert exited.groups() == ("4321", "0.1")
    ready = READY_AGAIN.search(
        "12:00:01 INFO    capsvc.workers: worker 1 (pid 4400) ready 0.43 s after it was started"
    )
    assert ready is not None
    assert ready.groups() == ("1", "4400", "0.43")


def _killed(survivor_failures: int, respawn: float | None) -> Killed:
    survivor, victim = Side(), Side()
    for failed in range(3):
        error = {"type": "Disconnected", "message": "peer closed", "at": 10.01}
        survivor.add(
            {"ok": 50, "after": 20, "error": error if failed < survivor_failures else None}, 10.0
        )
        victim.add({"ok": 40, "after": 0, "error": error}, 10.0)
    return Killed(
        victim_pid=100, survivor=survivor, victim=victim, unmapped=0, respawn=respawn,
        ready_after=respawn, restart_delay="0.1", log_pid=200, new_pid=200, fresh_ok=8,
        fresh_total=8, fresh_on_new=3, fresh_errors=Counter(),
    )  # fmt: skip


def test_the_kill_report_says_which_goal_is_missed() -> None:
    args = parse_args(["--kill", "--reps", "1"])
    met = report_kill(args, [_killed(0, 0.6)])
    assert "survivor's connections: 0 failed of 3, every repetition at least 60 calls" in met
    assert "victim's connections: 3 failed of 3 (Disconnected x3)" in met
    assert "median 0.60 s, max 0.60 s; goal (<= 2 s) met" in met
    assert "fresh connections after the respawn: 8/8 ok, 3 served by the replacement; met" in met
    assert "fresh connections ok) met" in met
    lost = report_kill(args, [_killed(1, 0.6)])
    assert "goal (0 failures) MISSED" in lost
    assert "survivor failure x1: Disconnected: peer closed" in lost
    slow = report_kill(args, [_killed(0, 2.5)])
    assert "goal (<= 2 s) MISSED" in slow
    never = report_kill(args, [_killed(0, None)])
    assert "never seen; 1 repetition(s) without a replacement; goal (<= 2 s) MISSED" in never


def test_a_tiny_kill_spares_the_other_worker() -> None:
    # 2 x 8 connections: both workers get some (all on one: p = 2 / 2**16).
    out = _run("--kill --reps 1 --clients 2 --connections 8 --before 1 --seconds 3")
    survivor = re.search(
        r"^survivor's connections: 0 failed of (\d+), every repetition at least ([\d,]+) calls "
        r"answered after the kill; goal \(0 failures\) met$",
        out,
        re.M,
    )
    assert survivor is not None, out
    assert int(survivor.group(1)) > 0
    assert int(survivor.group(2).replace(",", "")) > 0
    victim = re.search(r"^victim's connections: (\d+) failed of (\d+) \((.*)\)$", out, re.M)
    assert victim is not None, out
    assert victim.group(1) == victim.group(2) != "0"
    assert "Disconnected" in victim.group(3), out
    respawn = re.search(
        r"^respawn \(SIGKILL to the replacement's ready line in the log\): median [\d.]+ s, "
        r"max ([\d.]+) s; goal",
        out,
        re.M,
    )
    assert respawn is not None, out
    assert float(respawn.group(1)) > 0  # found; how fast is the benchmark's figure
    assert "pid not found" not in out
    assert re.search(r"^fresh connections after the respawn: 8/8 ok, \d+ served", out, re.M), out
