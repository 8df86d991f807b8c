"""Model ports on disk and the loop that runs models (thread or process).

Theory of operation
-------------------
A *model port* is a directory ``<rundir>/<name>/`` (``rundir`` defaults to
``$CAPSVC_NIC_RUNDIR`` or ``/dev/shm/capsvc-nic``) holding everything a driver process
needs to find and open a modelled 82599 exactly as it would a real one (spec 2.1, 2.2):

- ``bar``: the 512 KiB register file; ``control``: the control block
  (:mod:`capsvc.nicdriver.control`); ``dma``: the DMA arena (a sparse file of 2 MiB pages,
  the portable backend) unless the port uses huge pages;
- ``sysfs/bus/pci/devices/0000:00:10.0/``: ``config`` (8086:10FB, class 0x020000),
  ``resource0`` (a symlink to ``bar``) and the ``ixgbe-model`` marker (``port=`` and
  ``dma=``). The driver opens ``nic:model:NAME`` as PCI address 0000:00:10.0 with sysfs root
  ``<rundir>/<name>/sysfs``;
- ``kick-model``, ``kick-driver``: FIFOs for the wake-up hints; ``lock``: the driver's
  one-process lock.

:class:`ModelHost` runs a set of models: it calls ``step`` on each while there is work,
keeps spinning for ``spin`` seconds after the last work (latency; each idle round yields
the CPU with ``sched_yield``, so a runnable driver on the same CPU goes first), then sets
each model's ``MODEL_SLEEPING`` flag, steps until a round finds nothing (a doorbell may have
raced with the flag, and a frame one model sent may wait in the other's inbox) and sleeps
in ``select`` on the kick FIFOs and the wires' sockets, bounded by the models' timers and
``max_sleep``. An idle host therefore costs nothing measurable, and a driver's register
write wakes it within a system call.

:func:`start_pair` creates two ports wired back to back (in-process hand-off, or two veth
interfaces through AF_PACKET) with optional fault injection and pcap capture; :func:`main`
is the entry point of a host process (``python -m capsvc.nicdriver.modelhost`` and
``capsvc nic start-pair``): it prints one ``READY`` line with the port names when the
ports can be opened, and removes the ports when it stops (SIGINT/SIGTERM).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import select
import shutil
import signal
import struct
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from capsvc.nicdriver import control as ctl
from capsvc.nicdriver import regs
from capsvc.nicdriver.address import check_name
from capsvc.nicdriver.control import Control, Fault
from capsvc.nicdriver.dma import (
    DmaWindow,
    HugepageWindow,
    ShmWindow,
    scattered_page_table,
)
from capsvc.nicdriver.link import (
    FaultyWire,
    PairWire,
    PcapWire,
    SocketWire,
    Wire,
    open_packet_socket,
)
from capsvc.nicdriver.model import IxgbeModel
from capsvc.nicdriver.pci import MODEL_MARKER

__all__ = [
    "MODEL_PCI_ADDRESS",
    "ModelHost",
    "PortFiles",
    "default_rundir",
    "find_port",
    "list_ports",
    "main",
    "start_pair",
]

MODEL_PCI_ADDRESS = "0000:00:10.0"
DEFAULT_DMA_PAGES = 64  # 128 MiB of sparse arena: rings and a 4096-entry pool use 6 pages


def default_rundir() -> Path:
    return Path(os.environ.get("CAPSVC_NIC_RUNDIR", "/dev/shm/capsvc-nic"))


@dataclass(frozen=True)
class PortFiles:
    """The on-disk layout of one model port."""

    directory: Path

    @property
    def name(self) -> str:
        return self.directory.name

    @property
    def bar(self) -> Path:
        return self.directory / "bar"

    @property
    def control(self) -> Path:
        return self.directory / "control"

    @property
    def dma(self) -> Path:
        return self.directory / "dma"

    @property
    def sysfs_root(self) -> Path:
        return self.directory / "sysfs"

    @property
    def pci_dir(self) -> Path:
        return self.sysfs_root / "bus" / "pci" / "devices" / MODEL_PCI_ADDRESS

    @classmethod
    def create(
        cls,
        rundir: Path,
        name: str,
        *,
        dma: str = "shm",
        dma_pages: int = DEFAULT_DMA_PAGES,
        seed: int = 0,
        peer: str | None = None,
    ) -> PortFiles:
        """Create (or re-create) the files of port ``name``.

        ``peer``: the name of the other port of a *co-located* pair (its model then runs in
        the process that opens the port, :mod:`capsvc.nicdriver.colocated`).
        """
        port = cls(rundir / check_name(name))
        if port.directory.exists():
            shutil.rmtree(port.directory)
        port.directory.mkdir(parents=True, mode=0o700)
        with open(port.bar, "wb") as bar:
            bar.truncate(regs.BAR0_SIZE)
        control = Control(port.control, create=True)
        try:
            if dma == "shm":
                if not 1 <= dma_pages <= ctl.MAX_DMA_PAGES:
                    raise ValueError(f"--dma-pages must be within 1..{ctl.MAX_DMA_PAGES}")
                with open(port.dma, "wb") as arena:
                    arena.truncate(dma_pages * 2 * 1024 * 1024)  # sparse
                table = scattered_page_table(dma_pages, seed)
                control.words[ctl.W_DMA_MODE] = ctl.DMA_SHM
                control.words[ctl.W_DMA_PAGES] = dma_pages
                control.words[ctl.W_PAGE_TABLE : ctl.W_PAGE_TABLE + dma_pages] = memoryview(
                    struct.pack(f"<{dma_pages}Q", *table)
                ).cast("Q")
            elif dma == "hugepage":
                control.words[ctl.W_DMA_MODE] = ctl.DMA_HUGEPAGE
            else:
                raise ValueError(f"unknown DMA mode {dma!r} (shm or hugepage)")
            control.words[ctl.W_FAULT_SEED] = seed
        finally:
            control.close()
        for fifo in ("kick-model", "kick-driver"):
            os.mkfifo(port.directory / fifo, 0o600)
        port.pci_dir.mkdir(parents=True)
        config = bytearray(256)
        struct.pack_into("<HH", config, regs.PCI_VENDOR_ID, regs.INTEL_VENDOR, 0x10FB)
        struct.pack_into("<I", config, regs.PCI_CLASS_REVISION, (0x020000 << 8) | 0x01)
        (port.pci_dir / "config").write_bytes(bytes(config))
        os.symlink(port.bar.resolve(), port.pci_dir / "resource0")
        marker = f"port={port.directory.resolve()}\ndma={dma}\n"
        if peer is not None:
            marker += f"mode=colocated\npeer={(rundir / check_name(peer)).resolve()}\n"
        (port.pci_dir / MODEL_MARKER).write_text(marker)
        return port

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def find_port(name: str, rundir: Path | None = None) -> PortFiles:
    """The port called ``name``; raises FileNotFoundError naming what to start."""
    directory = (rundir or default_rundir()) / check_name(name)
    if not (directory / "control").exists():
        running = ", ".join(list_ports(rundir)) or "none"
        raise FileNotFoundError(
            f"no model port {name!r} in {directory.parent} (running: {running}); "
            f"start a pair with: capsvc nic start-pair NAME (ports NAME.0 and NAME.1)"
        )
    return PortFiles(directory)


def list_ports(rundir: Path | None = None) -> list[str]:
    directory = rundir or default_rundir()
    try:
        return sorted(p.name for p in directory.iterdir() if (p / "control").exists())
    except OSError:
        return []


def mac_for(name: str) -> bytes:
    """A stable locally administered unicast MAC for a port name."""
    digest = hashlib.sha256(name.encode()).digest()
    return bytes([0x02]) + digest[:5]


def open_model(
    port: PortFiles, wire: Wire, *, num_queues: int = 4, link_delay: float = 0.01
) -> IxgbeModel:
    """An :class:`IxgbeModel` over the files of ``port``."""
    control = Control(port.control)
    window: DmaWindow
    if control.words[ctl.W_DMA_MODE] == ctl.DMA_HUGEPAGE:
        window = HugepageWindow()
    else:
        # the control file's registry bounds every access to what the driver registered
        window = ShmWindow(port.dma, control.page_table(), control)
    seed = int(control.words[ctl.W_FAULT_SEED])

    def on_fault(kind: str) -> None:
        index = {
            "loss": Fault.INJECTED_LOSS,
            "dup": Fault.INJECTED_DUP,
            "reorder": Fault.INJECTED_REORDER,
        }[kind]
        control.faults[index] += 1

    stable = int.from_bytes(hashlib.sha256(port.name.encode()).digest()[:4], "little")
    faulty = FaultyWire(
        wire,
        control.fault_rates,
        seed=seed ^ stable,
        on_fault=on_fault,
        faultless=control.faultless,
    )
    return IxgbeModel(
        port.bar,
        control,
        window,
        faulty,
        mac=mac_for(port.name),
        num_queues=num_queues,
        link_delay=link_delay,
        name=port.name,
    )


class ModelHost:
    """Runs models: step while busy, spin a little, then sleep until poked."""

    def __init__(
        self,
        models: Sequence[IxgbeModel],
        ports: Sequence[PortFiles] = (),
        *,
        spin: float = 0.0,
        max_sleep: float = 0.05,
    ) -> None:
        self.models = list(models)
        self.ports = list(ports)
        self.spin = spin
        self.max_sleep = max_sleep
        self.stopping = False
        self._thread: threading.Thread | None = None
        self._kick_fds: list[int] = []
        for port in self.ports:
            self._kick_fds.append(os.open(port.directory / "kick-model", os.O_RDWR | os.O_NONBLOCK))

    def step(self) -> int:
        work = 0
        for model in self.models:
            work += model.step()
        return work

    def run(self) -> None:
        """Run until :meth:`stop` (or ``stopping`` is set)."""
        clock = time.perf_counter
        last_work = 0.0
        beat = 0
        models = self.models
        fds = list(self._kick_fds)
        fds += [fd for m in models if (fd := m.wire.fileno()) is not None]
        words = [m.control.words for m in models]
        while not models and not self.stopping:  # a co-located pair: nothing runs here
            time.sleep(0.05)
        while not self.stopping:
            work = 0
            for model in models:
                work += model.step()
            if work:
                last_work = clock()
                if self.spin > 0:
                    continue
            elif clock() - last_work < self.spin:
                os.sched_yield()  # spin politely: a runnable driver on this CPU goes first
                continue
            # going to sleep: say so, then look once more (a doorbell may have raced the
            # flag). After work this look is also the "again" round: a frame one model
            # sent may be waiting in the other's inbox (then the loop goes round again).
            for w in words:
                w[ctl.W_MODEL_SLEEPING] = 1
            if self.step():
                # more work: keep the flag (a doorbell meanwhile only costs a spurious
                # poke) and step until a round finds nothing, then sleep
                while self.step():
                    pass
                last_work = clock()
                if self.spin > 0:
                    for w in words:
                        w[ctl.W_MODEL_SLEEPING] = 0
                    continue
            timeout = self.max_sleep
            mono = time.monotonic()
            for model in models:
                deadline = model.next_deadline()
                if deadline is not None:
                    timeout = min(timeout, max(0.0, deadline - mono))
            beat += 1
            for w in words:
                w[ctl.W_HEARTBEAT] = beat
            if fds:
                ready, _, _ = select.select(fds, [], [], timeout)
                for fd in ready:
                    if fd in self._kick_fds:
                        _drain(fd)
            else:
                time.sleep(timeout)
            for w in words:
                w[ctl.W_MODEL_SLEEPING] = 0

    def start_thread(self) -> None:
        """Run in a daemon thread (GIL-bound; for tests and benchmarks)."""
        self.stopping = False
        self._thread = threading.Thread(target=self.run, name="ixgbe-model", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping = True
        for fd in self._kick_fds:
            try:
                os.write(fd, b"\0")
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def close(self, remove: bool = True) -> None:
        """Stop, close the models and (by default) remove the ports from disk."""
        self.stop()
        for model in self.models:
            model.wire.close()
            model.close()
            model.window.close()
            model.control.close()
        for fd in self._kick_fds:
            os.close(fd)
        self._kick_fds = []
        if remove:
            for port in self.ports:
                port.remove()


def _drain(fd: int) -> None:
    try:
        while len(os.read(fd, 4096)) == 4096:
            pass
    except BlockingIOError:
        pass


def start_pair(
    name: str,
    *,
    rundir: Path | None = None,
    wire: str = "pair",
    loss: float = 0.0,
    dup: float = 0.0,
    reorder: float = 0.0,
    seed: int = 0,
    dma: str = "shm",
    dma_pages: int = DEFAULT_DMA_PAGES,
    pcap_dir: Path | None = None,
    num_queues: int = 4,
    spin: float = 0.0,
) -> ModelHost:
    """Create ports ``NAME.0`` and ``NAME.1`` wired back to back; returns a host (not running).

    ``wire``: ``pair`` (in-process hand-off), ``veth:IF0,IF1`` (AF_PACKET on two existing
    interfaces, e.g. the two ends of a veth pair; needs CAP_NET_RAW) or ``colocated`` (no
    model runs here: each port's model runs in the process that opens it, and the two talk
    over datagram sockets; :mod:`capsvc.nicdriver.colocated`). The host of a co-located
    pair only owns the files.
    """
    rundir = rundir or default_rundir()
    check_name(name)
    names = [f"{name}.0", f"{name}.1"]
    wires: list[Wire]
    if wire == "colocated":
        if pcap_dir is not None:
            raise ValueError("--pcap-dir needs a pair or veth wire")
        ports = []
        try:
            for port_name, peer in zip(names, names[::-1], strict=True):
                port = PortFiles.create(
                    rundir, port_name, dma=dma, dma_pages=dma_pages, seed=seed, peer=peer
                )
                ports.append(port)
                control = Control(port.control)
                control.set_fault_rates(loss, dup, reorder)
                control.words[ctl.W_MODEL_PID] = os.getpid()
                control.words[ctl.W_STATE] = ctl.STATE_RUNNING
                control.close()
        except BaseException:
            for port in ports:
                port.remove()
            raise
        return ModelHost([], ports, spin=spin)
    if wire == "pair":
        wires = list(PairWire.pair())
    elif wire.startswith("veth:"):
        interfaces = wire[5:].split(",")
        if len(interfaces) != 2 or not all(interfaces):
            raise ValueError("veth wire must name two interfaces: veth:IF0,IF1")
        wires = [SocketWire(open_packet_socket(i), interface=i) for i in interfaces]
    else:
        raise ValueError(f"unknown wire {wire!r}: pair, veth:IF0,IF1 or colocated")
    if pcap_dir is not None:
        pcap_dir.mkdir(parents=True, exist_ok=True)
        wires = [PcapWire(w, pcap_dir / f"{n}.pcap") for w, n in zip(wires, names, strict=True)]
    ports = []
    models = []
    try:
        for index, port_name in enumerate(names):
            port = PortFiles.create(rundir, port_name, dma=dma, dma_pages=dma_pages, seed=seed)
            ports.append(port)
            model = open_model(port, wires[index], num_queues=num_queues)
            model.control.set_fault_rates(loss, dup, reorder)
            models.append(model)
    except BaseException:
        for model in models:
            model.close()
        for port in ports:
            port.remove()
        raise
    return ModelHost(models, ports, spin=spin)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a model pair in this process until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m capsvc.nicdriver.modelhost")
    add_pair_arguments(parser)
    args = parser.parse_args(argv)
    return run_pair(args)


def add_pair_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="pair name: ports NAME.0 and NAME.1")
    parser.add_argument(
        "--wire",
        default="pair",
        help="pair (in-process, default), veth:IF0,IF1 (AF_PACKET on two interfaces) or "
        "colocated (each port's model runs inside the process that opens it)",
    )
    parser.add_argument("--loss", type=float, default=0.0, help="frame loss rate 0..1")
    parser.add_argument("--dup", type=float, default=0.0, help="frame duplication rate 0..1")
    parser.add_argument("--reorder", type=float, default=0.0, help="frame reordering rate 0..1")
    parser.add_argument("--seed", type=int, default=0, help="fault and page-table seed")
    parser.add_argument("--dma", choices=["shm", "hugepage"], default="shm")
    parser.add_argument("--dma-pages", type=int, default=DEFAULT_DMA_PAGES)
    parser.add_argument("--pcap-dir", type=Path, help="record each port's frames here")
    parser.add_argument("--rundir", type=Path, help="where ports live (default /dev/shm/...)")
    parser.add_argument(
        "--spin-us",
        type=float,
        default=0.0,
        help="busy-poll this long after work before sleeping (latency vs CPU; default 0)",
    )


def run_pair(args: argparse.Namespace) -> int:
    try:
        host = start_pair(
            args.name,
            rundir=args.rundir,
            wire=args.wire,
            loss=args.loss,
            dup=args.dup,
            reorder=args.reorder,
            seed=args.seed,
            dma=args.dma,
            dma_pages=args.dma_pages,
            pcap_dir=args.pcap_dir,
            spin=args.spin_us / 1e6,
        )
    except (OSError, ValueError) as error:
        print(f"capsvc: error: cannot start the model pair: {error}", file=sys.stderr)
        return 1

    def stop(signum: int, frame: object) -> None:
        host.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    names = " ".join(p.name for p in host.ports)
    print(f"READY {names} rundir={host.ports[0].directory.parent}", flush=True)
    a, b = host.ports
    rundir = "" if args.rundir is None else f",rundir={args.rundir}"
    print(
        f"capsvc: model pair {args.name} running ({args.wire} wire): serve on "
        f"nic:model:{a.name}{rundir}, connect from nic:model:{b.name}{rundir} (Ctrl-C stops)",
        flush=True,
    )
    try:
        host.run()
    finally:
        host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
