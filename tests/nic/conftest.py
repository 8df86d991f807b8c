"""Fixtures for the NIC backend: model ports in temporary run directories.

- ``rundir``: a fresh directory under /dev/shm, removed afterwards.
- ``pair``: two initialised drivers on an in-process model pair. The model runs in a thread
  during init (the driver's waits need a concurrent device) and is then stopped, so tests
  step it by hand and stay deterministic; it runs again while the drivers close.
- ``model_process``: a model-pair host in a subprocess (real concurrency), for transport
  tests, once per mode (host process, co-located); yields the port names and run directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from capsvc.nicdriver.ixgbe import IxgbeDevice
from capsvc.nicdriver.model import IxgbeModel
from capsvc.nicdriver.modelhost import MODEL_PCI_ADDRESS, ModelHost, start_pair

ROOT = Path(__file__).resolve().parents[2]


def shm_tempdir() -> Path:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    return Path(tempfile.mkdtemp(prefix="capsvc-nic-test-", dir=base))


@pytest.fixture
def rundir() -> Iterator[Path]:
    path = shm_tempdir()
    try:
        yield path
    finally:
        for _ in range(3):  # a model process may still be removing its ports
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                break
            time.sleep(0.05)  # real time: another process is deleting files; cleanup only


@dataclass
class Pair:
    host: ModelHost
    a: IxgbeDevice
    b: IxgbeDevice
    rundir: Path

    @property
    def ma(self) -> IxgbeModel:
        return self.host.models[0]

    @property
    def mb(self) -> IxgbeModel:
        return self.host.models[1]

    def step(self, times: int = 1) -> int:
        return sum(self.host.step() for _ in range(times))


def open_port(rundir: Path, name: str, **options: int) -> IxgbeDevice:
    return IxgbeDevice.open(MODEL_PCI_ADDRESS, sysfs_root=rundir / name / "sysfs", **options)


@pytest.fixture
def pair(rundir: Path) -> Iterator[Pair]:
    host = start_pair("p", rundir=rundir, spin=0)
    host.start_thread()
    devices: list[IxgbeDevice] = []
    try:
        for name in ("p.0", "p.1"):
            device = open_port(rundir, name, rx_ring_size=256, tx_ring_size=256)
            devices.append(device)
            device.reset_and_init(link_timeout=5)  # real time: the model thread raises it
        host.stop()
        yield Pair(host, devices[0], devices[1], rundir)
    finally:
        host.stop()
        # the model runs while the drivers close: a driver's stop sequence waits for the
        # device (queue enables to read 0, TX to drain, the reset to self-clear)
        host.start_thread()
        for device in devices:
            device.close()
        host.close()


def env() -> dict[str, str]:
    environment = dict(os.environ)
    environment["PYTHONPATH"] = str(ROOT) + os.pathsep + environment.get("PYTHONPATH", "")
    return environment


class ModelProcess:
    """A model-pair host in its own process."""

    def __init__(self, name: str, rundir: Path, *extra: str) -> None:
        self.name = name
        self.rundir = rundir
        command = [sys.executable, "-m", "capsvc.nicdriver.modelhost", name]
        command += ["--rundir", str(rundir), *extra]
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("READY"):
            self.stop()
            raise RuntimeError(f"model host did not start: {line!r}")
        self.ports = [f"{name}.0", f"{name}.1"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)  # real time: a process exiting; bounds a hang
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture(params=["pair", "colocated"])
def model_process(rundir: Path, request: pytest.FixtureRequest) -> Iterator[ModelProcess]:
    """A model pair: run by a host process (``pair``), or ``colocated`` (each port's model
    runs in the process that opens the port; the host process only owns the files)."""
    host = ModelProcess("m", rundir, "--wire", request.param)
    try:
        yield host
    finally:
        host.stop()
