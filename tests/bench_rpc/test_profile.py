"""``python -m bench.rpc profile --typed-vs-dynamic``: the echo goal's command cannot rot.

Theory of operation: a tiny run (a few hundred calls per level) of the command that
measures CPU per call per side through the generated stubs and through the dynamic path;
the test checks what it prints (machine state, both pairings' tables, the summary with
ratios), not the figures, which belong to the machine. The pairings' programs are checked
to be what their names say: generated bases and stubs, or the dynamic path.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import capsvc
import capsvc.typed
from bench.rpc.clients import CapsvcClient, make_client
from bench.rpc.profile import TYPED_VS_DYNAMIC
from bench.rpc.scenarios import PAIRINGS, ROOT, SERVER_KINDS
from bench.rpc.servers import ServerProcess, dynamic_bench_echo, typed_bench_echo


def test_the_pairings_are_typed_and_dynamic_as_named() -> None:
    typed, dynamic = (PAIRINGS[name] for name in TYPED_VS_DYNAMIC)
    assert not SERVER_KINDS[typed.server].busy_poll
    assert not SERVER_KINDS[dynamic.server].busy_poll
    assert "--dynamic" not in ServerProcess(SERVER_KINDS[typed.server], "/tmp").command()
    assert "--dynamic" in ServerProcess(SERVER_KINDS[dynamic.server], "/tmp").command()
    clients = [make_client(p.client, "tcp:127.0.0.1:1", 1, 16) for p in (typed, dynamic)]
    assert all(isinstance(c, CapsvcClient) and not c.busy_poll for c in clients)
    assert [c.dynamic for c in clients if isinstance(c, CapsvcClient)] == [False, True]
    assert isinstance(typed_bench_echo(), capsvc.typed.Server)
    assert isinstance(dynamic_bench_echo(), capsvc.Server)


def test_profile_typed_vs_dynamic_prints_both_sides_and_ratios() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "bench.rpc", "profile", "--typed-vs-dynamic"]
    done = subprocess.run(
        [*command, "--calls", "300", "--warmup", "50", "--no-syscalls"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # real time: servers in subprocesses; bounds a hang
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"machine \(before\): CPU .*cpuidle driver .*load average", out)
    assert "machine (after)" in out
    for name in TYPED_VS_DYNAMIC:
        assert f"\n{PAIRINGS[name].title}, payload 16 B, 300 calls per level\n" in out
    summary = out[out.index("Summary over 1 round(s)") :]
    rows = [line for line in summary.splitlines() if line.startswith("| capsvc")]
    assert len(rows) == 4  # two pairings at c1 and c12
    typed_rows = [r for r in rows if "dynamic" not in r]
    for row in typed_rows:
        ratios = row.split("|")[-3:-1]
        assert all(float(cell) > 0 for cell in ratios), row
