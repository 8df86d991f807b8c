"""``capsvc nic ...``: inspect and run the NIC backend (real devices and software models).

Theory of operation
-------------------
:func:`add_nic_parser` registers the ``nic`` command and its subcommands on the ``capsvc``
argument parser (``capsvc/cli.py`` calls it from ``build_parser``); every handler takes the
parsed arguments and returns the exit status (0 ok, 1 failure, 2 usage error), like the
other capsvc commands. :func:`main` runs the same parser standalone
(``python -m capsvc.nicdriver.cli``).

- ``list``: read-only. Every PCI network function under the sysfs root with its identity,
  bound kernel driver and IOMMU group, and whether the driver would open it (and if not,
  why); the model ports that exist and whether a model serves them; the huge-page
  situation. Nothing is written, no BAR is mapped.
- ``start-pair NAME``: run a model pair (ports NAME.0 and NAME.1) in the foreground until
  Ctrl-C; options choose the wire (in-process cable or two veth interfaces), fault rates,
  DMA backend and pcap capture.
- ``status DEVICE``: link and counters. For a model port (``model:NAME`` or ``NAME``) it
  reads the control file (liveness, link, MAC, fault rates, the monotonic statistics and
  fault counters), never the BAR, so it does not disturb the driver using the port. For a
  PCI address it shows the identity and, after mapping BAR0 read-only, the LINKS register;
  the statistics registers clear when read, so they are read only with ``--counters``.
- ``faults NAME --loss/--dup/--reorder``: change a running model's fault injection.
- ``stop NAME``: ask the model host serving a port (or pair) to exit.
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from capsvc.nicdriver import control as ctl
from capsvc.nicdriver import regs
from capsvc.nicdriver.control import Control
from capsvc.nicdriver.dma import hugepage_status
from capsvc.nicdriver.errors import HUGEPAGE_HOWTO, NicError
from capsvc.nicdriver.modelhost import (
    PortFiles,
    add_pair_arguments,
    default_rundir,
    find_port,
    list_ports,
    run_pair,
)
from capsvc.nicdriver.pci import (
    canonical_address,
    function_lock_path,
    list_functions,
    lock_holder,
    resolve_function,
)

__all__ = ["add_nic_parser", "main"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


def _say(text: str = "") -> None:
    print(text, flush=True)


def _error(text: str) -> None:
    print(f"capsvc: error: {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- list
def cmd_list(args: argparse.Namespace) -> int:
    """``capsvc nic list``: candidate devices, model ports and huge pages (read-only)."""
    functions = list_functions(args.sysfs)
    shown = [f for f in functions if f.is_network or args.all]
    _say(f"PCI network functions under {args.sysfs}:")
    if not shown:
        _say("  none")
    for f in shown:
        driver = f.driver or "-"
        group = f.iommu_group or "-"
        verdict = "usable" if f.allowed else "not usable"
        holder = lock_holder(function_lock_path(f.address)) if f.allowed else None
        if holder is not None:
            verdict = f"in use: driven by {holder}"
        _say(
            f"  {f.address}  {f.vendor:04x}:{f.device:04x}  {f.description:<32} "
            f"driver={driver} iommu_group={group}  [{verdict}]"
        )
        refusal = f.refusal()
        if refusal is not None and args.verbose_reasons:
            _say(f"      {refusal}")
    if not any(f.allowed for f in functions):
        _say("  (no Intel 82599/X540 here: use a software model, `capsvc nic start-pair`)")
    rundir = args.rundir or default_rundir()
    _say(f"model ports in {rundir}:")
    ports = list_ports(rundir)
    if not ports:
        _say("  none (start a pair: capsvc nic start-pair NAME)")
    for name in ports:
        _say("  " + _port_line(PortFiles(rundir / name)))
    status = hugepage_status()
    mounts = status["mounts"]
    _say(
        f"huge pages (2 MiB): {status.get('nr_hugepages')} reserved, "
        f"{status.get('free_hugepages')} free; hugetlbfs mounts: {mounts or 'none'}"
    )
    free = status.get("free_hugepages")
    if not mounts or not isinstance(free, int) or free == 0:
        _say("  real devices need them: " + HUGEPAGE_HOWTO.replace("\n", "\n  "))
    return EXIT_OK


def _port_line(port: PortFiles) -> str:
    try:
        control = Control(port.control)
    except (OSError, ValueError) as error:
        return f"{port.name:<16} unreadable ({error})"
    try:
        w = control.words
        alive = control.model_alive()
        state = f"model pid {control.model_pid}" if alive else "no model running (stale)"
        link = "up" if w[ctl.W_LINK_UP] else "down"
        driver = int(w[ctl.W_DRIVER_PID])
        used = f"driven by pid {driver}" if driver and _pid_alive(driver) else "no driver"
        return (
            f"{port.name:<16} nic:model:{port.name:<12} mac={control.mac.hex(':')} "
            f"link {link}, {state}, {used}"
        )
    finally:
        control.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---------------------------------------------------------------------------- status
def cmd_status(args: argparse.Namespace) -> int:
    """``capsvc nic status DEVICE``."""
    device: str = args.device
    if device.startswith("nic:"):
        device = device[4:]
    if device.startswith("model:") or not _looks_like_pci(device):
        name = device.removeprefix("model:")
        try:
            port = find_port(name, args.rundir)
        except (FileNotFoundError, ValueError) as error:
            _error(str(error))
            return EXIT_FAILURE
        return _model_status(port)
    return _pci_status(device, args.sysfs, args.counters)


def _looks_like_pci(text: str) -> bool:
    try:
        canonical_address(text)
    except ValueError:
        return False
    return True


def _model_status(port: PortFiles) -> int:
    control = Control(port.control)
    try:
        w = control.words
        _say(_port_line(port))
        loss, dup, reorder = control.fault_rates()
        _say(f"  fault injection: loss {loss:g}, dup {dup:g}, reorder {reorder:g}")
        _say("  statistics (totals since the model started):")
        values = control.counters
        names = _counter_names()
        for slot, name in sorted(names.items()):
            value = int(values[slot])
            if value or name in ("GPRC", "GPTC", "GORC", "GOTC"):
                _say(f"    {name:<10} {value}")
        faults = {k: v for k, v in control.fault_dict().items() if v}
        _say("  model events: " + (", ".join(f"{k}={v}" for k, v in faults.items()) or "none"))
        if not control.model_alive():
            _say("  (no model process: start one with capsvc nic start-pair)")
        return EXIT_OK if w[ctl.W_STATE] != ctl.STATE_STOPPED else EXIT_FAILURE
    finally:
        control.close()


def _counter_names() -> dict[int, str]:
    names: dict[int, str] = {}
    singles = {
        regs.GPRC: "GPRC",
        regs.GPTC: "GPTC",
        regs.CRCERRS: "CRCERRS",
        regs.RUC: "RUC",
        regs.ROC: "ROC",
    }
    for offset, slot in regs.COUNTER_SLOT.items():
        if offset in singles:
            names[slot] = singles[offset]
    for i in range(8):
        names[regs.COUNTER_SLOT[regs.MPC(i)]] = f"MPC({i})"
        names[regs.COUNTER_SLOT[regs.RNBC(i)]] = f"RNBC({i})"
    for i in range(regs.MODEL_QUEUES):
        names[regs.COUNTER_SLOT[regs.QPRC(i)]] = f"QPRC({i})"
        names[regs.COUNTER_SLOT[regs.QPTC(i)]] = f"QPTC({i})"
        names[regs.COUNTER_SLOT[regs.QPRDC(i)]] = f"QPRDC({i})"
    names[regs.SLOT_GORC] = "GORC"
    names[regs.SLOT_GOTC] = "GOTC"
    return names


def _pci_status(address: str, sysfs: str, counters: bool) -> int:
    try:
        function = resolve_function(address, sysfs)  # the checked location, as for opening
    except NicError as error:
        _error(str(error))
        return EXIT_FAILURE
    _say(
        f"{function.address}  {function.vendor:04x}:{function.device:04x}  "
        f"{function.description}  driver={function.driver or '-'}"
    )
    refusal = function.refusal()
    if refusal is not None:
        _say(f"  {refusal}")
        return EXIT_FAILURE
    if not function.is_model:
        holder = lock_holder(function_lock_path(function.address))
        _say(f"  driven by {holder}" if holder else "  no driver process holds it")
    path = function.path / "resource0"
    try:
        with open(path, "rb") as bar:
            mm = mmap.mmap(bar.fileno(), regs.BAR0_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    except OSError as error:
        _error(f"cannot map {path} read-only: {error} (needs root)")
        return EXIT_FAILURE
    view = memoryview(mm).cast("I")
    try:
        links = int(view[regs.LINKS >> 2])
        speed = regs.LINK_SPEEDS_MBIT.get(links & regs.LINKS_SPEED_MASK, 0)
        state = f"up, {speed} Mbit/s" if links & regs.LINKS_UP else "down"
        _say(f"  link {state} (LINKS = 0x{links:08x})")
        if counters:
            _say("  counters since the last read (reading clears them):")
            for name, offset in (("GPRC", regs.GPRC), ("GPTC", regs.GPTC)):
                _say(f"    {name:<10} {int(view[offset >> 2])}")
        else:
            _say("  (statistics clear on read and belong to the driver: add --counters)")
    finally:
        view.release()
        mm.close()
    return EXIT_OK


# ---------------------------------------------------------------------------- faults/stop
def cmd_faults(args: argparse.Namespace) -> int:
    """``capsvc nic faults NAME``: set the fault injection of a running model port."""
    names = _pair_ports(args.name, args.rundir)
    if not names:
        _error(f"no model port or pair {args.name!r} (see capsvc nic list)")
        return EXIT_FAILURE
    for port in names:
        control = Control(port.control)
        try:
            control.set_fault_rates(args.loss, args.dup, args.reorder)
        except ValueError as error:
            _error(str(error))
            return EXIT_USAGE
        finally:
            control.close()
        _say(f"{port.name}: loss {args.loss:g}, dup {args.dup:g}, reorder {args.reorder:g}")
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """``capsvc nic stop NAME``: SIGTERM to the model host serving it."""
    ports = _pair_ports(args.name, args.rundir)
    pids = set()
    for port in ports:
        control = Control(port.control)
        try:
            if control.model_alive():
                pids.add(control.model_pid)
        finally:
            control.close()
    if not pids:
        _error(f"no running model serves {args.name!r}")
        return EXIT_FAILURE
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
        _say(f"stopping model host pid {pid}")
    return EXIT_OK


def _pair_ports(name: str, rundir: Path | None) -> list[PortFiles]:
    name = name.removeprefix("nic:").removeprefix("model:")
    directory = rundir or default_rundir()
    found = [
        PortFiles(directory / n)
        for n in list_ports(rundir)
        if n == name or n.startswith(name + ".")
    ]
    return found


def cmd_start_pair(args: argparse.Namespace) -> int:
    """``capsvc nic start-pair NAME``: run a model pair in the foreground."""
    return run_pair(args)


# ---------------------------------------------------------------------------- parser
def add_nic_parser(commands: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> None:
    """Register ``nic`` and its subcommands on ``commands`` (argparse subparsers)."""
    nic = commands.add_parser(
        "nic",
        parents=list(parents),
        help="inspect and run the NIC backend (82599 driver, software model)",
        description="The user-space 82599 NIC backend: devices, model pairs, link, counters.",
    )
    sub = nic.add_subparsers(dest="nic_command", metavar="SUBCOMMAND")
    nic.set_defaults(handler=lambda args: _help(nic))

    listing = sub.add_parser(
        "list", parents=list(parents), help="candidate devices, model ports, huge pages"
    )
    listing.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    listing.add_argument("--rundir", type=Path, help="model port directory")
    listing.add_argument("--all", action="store_true", help="all PCI functions, not only NICs")
    listing.add_argument(
        "--why", dest="verbose_reasons", action="store_true", help="say why a device is unusable"
    )
    listing.set_defaults(handler=cmd_list)

    pair = sub.add_parser(
        "start-pair",
        parents=list(parents),
        help="run two model ports NAME.0 and NAME.1 wired back to back (Ctrl-C stops)",
    )
    add_pair_arguments(pair)
    pair.set_defaults(handler=cmd_start_pair)

    status = sub.add_parser(
        "status", parents=list(parents), help="link status and counters of a device or model"
    )
    status.add_argument("device", metavar="DEVICE", help="model:NAME, NAME or a PCI address")
    status.add_argument("--sysfs", default="/sys")
    status.add_argument("--rundir", type=Path)
    status.add_argument("--counters", action="store_true", help="PCI: read (and clear) counters")
    status.set_defaults(handler=cmd_status)

    faults = sub.add_parser(
        "faults", parents=list(parents), help="set a running model's loss/dup/reorder rates"
    )
    faults.add_argument("name", help="a port (NAME.0) or a pair (NAME)")
    faults.add_argument("--loss", type=float, default=0.0)
    faults.add_argument("--dup", type=float, default=0.0)
    faults.add_argument("--reorder", type=float, default=0.0)
    faults.add_argument("--rundir", type=Path)
    faults.set_defaults(handler=cmd_faults)

    stop = sub.add_parser("stop", parents=list(parents), help="stop the model host of a pair")
    stop.add_argument("name", help="a port (NAME.0) or a pair (NAME)")
    stop.add_argument("--rundir", type=Path)
    stop.set_defaults(handler=cmd_stop)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m capsvc.nicdriver.cli SUBCOMMAND ...`` (the same as ``capsvc nic ...``)."""
    parser = argparse.ArgumentParser(prog="capsvc")
    commands = parser.add_subparsers(dest="command")
    add_nic_parser(commands)
    args = parser.parse_args(["nic", *(sys.argv[1:] if argv is None else argv)])
    handler = args.handler
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
