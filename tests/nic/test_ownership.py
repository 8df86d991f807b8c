"""One owner per device (issue 14): the ownership lock of real PCI functions and model ports.

A second opener must fail with :class:`DeviceBusy` naming the first one's PID (and its
command line, from /proc), whether the first is this process or another one. Real
functions are locked in a lock directory (``$CAPSVC_NIC_LOCKDIR``, here a temporary
directory); the full open path of a real function runs against the fake "real" sysfs of
``tests/nic/test_pci.py``, never against this machine's /sys.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from capsvc.nicdriver import pci
from capsvc.nicdriver.errors import DeviceBusy, NicError
from capsvc.nicdriver.ixgbe import IxgbeDevice
from capsvc.nicdriver.modelhost import MODEL_PCI_ADDRESS, PortFiles
from capsvc.nicdriver.pci import (
    function_lock_path,
    lock_function,
    lock_holder,
    lock_model_port,
    open_function,
)
from tests.nic.conftest import ROOT, env
from tests.nic.test_pci import X520, command_register, fake_function, real_sysfs  # noqa: F401

HOLDER_TAG = "capsvc-test-lock-holder"

# Holds a lock until its stdin closes; prints one line once it holds it.
HOLDER = f"""# {HOLDER_TAG}
import sys
from pathlib import Path
kind, where = sys.argv[1], sys.argv[2]
if kind == "function":
    from capsvc.nicdriver.pci import lock_function
    held = lock_function(sys.argv[3], where)
else:
    from capsvc.nicdriver.ixgbe import IxgbeDevice
    held = IxgbeDevice.open("0000:00:10.0", sysfs_root=Path(where) / "sysfs")
print("held", flush=True)
sys.stdin.read()
"""


class Holder:
    """A process holding a device lock (``kind`` function: a real function's lock in a
    lock directory; ``port``: a model port opened by the driver)."""

    def __init__(self, kind: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, kind, *args],
            cwd=ROOT,
            env=env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != "held":
            self.stop()
            raise RuntimeError(f"the lock holder did not start: {line!r}")

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)  # real time: a process exiting; bounds a hang
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    return tmp_path / "locks"


@pytest.fixture
def holder_of_function(lock_dir: Path) -> Iterator[Holder]:
    holder = Holder("function", str(lock_dir), X520)
    try:
        yield holder
    finally:
        holder.stop()


# ---------------------------------------------------------------------------- real functions
def test_a_function_lock_holds_the_pid_and_refuses_a_second_lock(lock_dir: Path) -> None:
    lock = lock_function("03:00.0", lock_dir)
    try:
        assert lock.path == lock_dir / f"{X520}.lock"
        assert lock.path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(DeviceBusy, match=rf"pid {os.getpid()} \(.*this process\)") as busy:
            lock_function(X520, lock_dir)
        assert "one driver per device" in str(busy.value)
        assert str(lock.path) in str(busy.value)
    finally:
        lock.release()
    assert not lock.held
    lock.release()  # idempotent
    lock_function(X520, lock_dir).release()


def test_a_second_process_is_named_with_its_command_line(
    lock_dir: Path, holder_of_function: Holder
) -> None:
    pid = holder_of_function.pid
    with pytest.raises(DeviceBusy, match=rf"PCI function {X520} is already driven by pid {pid} "):
        lock_function(X520, lock_dir)
    with pytest.raises(DeviceBusy, match=HOLDER_TAG):
        lock_function(X520, lock_dir)
    holder = lock_holder(function_lock_path(X520, lock_dir))
    assert holder is not None
    assert holder.startswith(f"pid {pid} ")
    assert HOLDER_TAG in holder
    holder_of_function.stop()  # the lock dies with its process
    assert lock_holder(function_lock_path(X520, lock_dir)) is None
    lock_function(X520, lock_dir).release()


def test_a_stale_lock_file_does_not_lock(lock_dir: Path) -> None:
    lock_dir.mkdir()
    (lock_dir / f"{X520}.lock").write_text("999999999\n")  # a PID that cannot run
    assert lock_holder(lock_dir / f"{X520}.lock") is None
    with lock_function(X520, lock_dir) as lock:
        assert lock.path.read_text() == f"{os.getpid()}\n"


def test_a_symlinked_lock_file_is_not_followed(lock_dir: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    lock_dir.mkdir()
    os.symlink(victim, lock_dir / f"{X520}.lock")
    with pytest.raises(NicError, match="cannot open the lock file"):
        lock_function(X520, lock_dir)
    assert victim.read_text() == "precious\n"


def test_the_lock_directory_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(pci.LOCKDIR_ENV, str(tmp_path / "elsewhere"))
    assert function_lock_path("03:00.0") == tmp_path / "elsewhere" / f"{X520}.lock"
    monkeypatch.delenv(pci.LOCKDIR_ENV)
    assert function_lock_path(X520) == Path(pci.DEFAULT_LOCKDIR) / f"{X520}.lock"


def test_an_unwritable_lock_directory_says_which_variable_to_set(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(NicError, match=pci.LOCKDIR_ENV):
        lock_function(X520, blocker / "locks")


def test_opening_a_locked_function_changes_nothing(real_sysfs: Path) -> None:  # noqa: F811
    """The lock is taken before the unbind: a refused second driver touched nothing."""
    path = fake_function(real_sysfs, X520, 0x8086, 0x10FB, 0x020000, driver="ixgbe")
    holder = Holder("function", str(pci.default_lock_dir()), X520)
    try:
        with pytest.raises(DeviceBusy, match=f"pid {holder.pid} "):
            open_function(X520, real_sysfs)
        assert (real_sysfs / "bus/pci/drivers/ixgbe/unbind").read_text() == ""
        assert command_register(path / "config") == 0
    finally:
        holder.stop()
    function, mm = open_function(X520, real_sysfs)
    try:
        with pytest.raises(DeviceBusy, match=rf"pid {os.getpid()} \(.*this process\)"):
            open_function(X520, real_sysfs)
        assert (real_sysfs / "bus/pci/drivers/ixgbe/unbind").read_text() == X520
    finally:
        mm.close()
        function.release()


# ---------------------------------------------------------------------------- model ports
@pytest.fixture
def port(rundir: Path) -> PortFiles:
    return PortFiles.create(rundir, "own.0")


def test_a_model_port_has_one_driver_per_process(port: PortFiles) -> None:
    device = IxgbeDevice.open(MODEL_PCI_ADDRESS, sysfs_root=port.sysfs_root)
    try:
        with pytest.raises(DeviceBusy, match=f"pid {os.getpid()}.*one driver per device"):
            IxgbeDevice.open(MODEL_PCI_ADDRESS, sysfs_root=port.sysfs_root)
        with pytest.raises(DeviceBusy, match=rf"model port own\.0 .*pid {os.getpid()} \("):
            open_function(MODEL_PCI_ADDRESS, port.sysfs_root, lock_model=True)
    finally:
        device.close()
    device = IxgbeDevice.open(MODEL_PCI_ADDRESS, sysfs_root=port.sysfs_root)  # released
    device.close()


def test_a_model_port_driven_by_another_process_names_it(port: PortFiles) -> None:
    holder = Holder("port", str(port.directory))
    try:
        with pytest.raises(DeviceBusy, match=f"pid {holder.pid}.*one driver per device"):
            IxgbeDevice.open(MODEL_PCI_ADDRESS, sysfs_root=port.sysfs_root)
        with pytest.raises(DeviceBusy, match=f"pid {holder.pid} .*{HOLDER_TAG}"):
            open_function(MODEL_PCI_ADDRESS, port.sysfs_root, lock_model=True)
        assert HOLDER_TAG in (lock_holder(port.directory / pci.MODEL_LOCK) or "")
    finally:
        holder.stop()
    function, mm = open_function(MODEL_PCI_ADDRESS, port.sysfs_root, lock_model=True)
    try:
        assert function.lock is not None
        assert function.lock.path == port.directory / pci.MODEL_LOCK
        assert function.lock.path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(DeviceBusy, match="this process"):
            lock_model_port(port.directory)
    finally:
        mm.close()
        function.release()


def test_capsvc_nic_list_and_status_name_the_driving_process(
    real_sysfs: Path,  # noqa: F811
    rundir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from capsvc.nicdriver.cli import main

    fake_function(real_sysfs, X520, 0x8086, 0x10FB, 0x020000, driver="ixgbe")
    holder = Holder("function", str(pci.default_lock_dir()), X520)
    try:
        assert main(["list", "--sysfs", str(real_sysfs), "--rundir", str(rundir)]) == 0
        out = capsys.readouterr().out
        assert f"[in use: driven by pid {holder.pid} " in out
        main(["status", X520, "--sysfs", str(real_sysfs)])
        assert f"driven by pid {holder.pid} " in capsys.readouterr().out
    finally:
        holder.stop()
    assert main(["list", "--sysfs", str(real_sysfs), "--rundir", str(rundir)]) == 0
    assert "[usable]" in capsys.readouterr().out
