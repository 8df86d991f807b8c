"""``capsvc nic ...`` (capsvc/nicdriver/cli.py), run through its own ``main``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from capsvc.nicdriver.cli import add_nic_parser, main
from capsvc.nicdriver.control import Control
from tests.nic.conftest import ROOT, ModelProcess, env
from tests.nic.test_pci import fake_function


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_list_is_read_only_and_explains(
    tmp_path: Path, rundir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_function(tmp_path, "0000:00:03.0", 0x1AF4, 0x1041, 0x020000, driver="virtio-pci")
    fake_function(tmp_path, "0000:03:00.0", 0x8086, 0x10FB, 0x020000, driver="ixgbe")
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    status, out, _ = run(capsys, "list", "--sysfs", str(tmp_path), "--rundir", str(rundir), "--why")
    assert status == 0
    assert "0000:03:00.0  8086:10fb" in out
    assert "[usable]" in out
    assert "0000:00:03.0  1af4:1041" in out
    assert "not an Intel 82599" in out
    assert "model ports in" in out
    assert "huge pages (2 MiB)" in out
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before


def test_status_faults_and_stop_of_a_model_pair(
    rundir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = ModelProcess("c", rundir)
    try:
        status, out, _ = run(capsys, "list", "--rundir", str(rundir))
        assert status == 0
        assert "nic:model:c.0" in out
        assert "nic:model:c.1" in out
        status, out, _ = run(capsys, "status", "model:c.0", "--rundir", str(rundir))
        assert status == 0
        assert "link down" in out  # no driver has opened it
        assert "GPRC" in out
        assert "resets=1" in out
        status, out, _ = run(capsys, "faults", "c", "--loss", "0.25", "--rundir", str(rundir))
        assert status == 0
        control = Control(rundir / "c.1" / "control")
        assert control.fault_rates() == (0.25, 0.0, 0.0)
        control.close()
        status, _, err = run(capsys, "faults", "c", "--dup", "2", "--rundir", str(rundir))
        assert status == 2
        assert "within 0..1" in err
        status, out, _ = run(capsys, "stop", "c", "--rundir", str(rundir))
        assert status == 0
        # Real time: the model host is another process; 10 s only bounds a hang.
        assert host.process.wait(timeout=10) == 0
        assert not (rundir / "c.0").exists()
    finally:
        host.stop()


def test_status_of_missing_things(rundir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "status", "nothere", "--rundir", str(rundir))
    assert status == 1
    assert "start-pair" in err
    status, _, err = run(capsys, "status", "0000:7f:00.0")
    assert status == 1
    assert "capsvc nic list" in err


def test_start_pair_in_the_foreground(rundir: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "capsvc.nicdriver.cli", "start-pair", "fg", "--rundir",
         str(rundir), "--loss", "0.1"],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("READY fg.0 fg.1")
        assert "serve on nic:model:fg.0" in process.stdout.readline()
        control = Control(rundir / "fg.0" / "control")
        assert control.fault_rates()[0] == pytest.approx(0.1)
        control.close()
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0  # real time: a process exiting; bounds a hang
        if process.stdout is not None:
            process.stdout.close()
    assert not (rundir / "fg.0").exists()


def test_the_parser_hooks_into_a_host_cli() -> None:
    parser = argparse.ArgumentParser(prog="capsvc")
    commands = parser.add_subparsers(dest="command")
    add_nic_parser(commands)
    args = parser.parse_args(["nic", "status", "model:x"])
    assert args.handler.__name__ == "cmd_status"
    assert args.device == "model:x"
