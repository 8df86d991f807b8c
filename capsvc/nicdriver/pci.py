"""PCI discovery and opening through sysfs, with a configurable sysfs root.

Theory of operation
-------------------
Spec nicdriver.md 1.1. Every PCI function appears as
``<root>/bus/pci/devices/<dddd:bb:dd.f>/`` with ``config`` (config space), ``resource0``
(BAR0), a ``driver`` link when a kernel driver is bound and an ``iommu_group`` link when
an IOMMU is active. :func:`list_functions` reads only ``config`` (vendor u16 at 0x00,
device u16 at 0x02, class code in the u32 at 0x08) and the links: it never writes and is
what ``capsvc nic list`` shows.

:func:`open_function` is the one place that changes device state, and it is guarded:

1. the address must be given explicitly (there is no "first NIC found" mode, unlike ixy);
2. the function must be an Intel 82599/X540 *physical* function on the allow-list of
   :data:`capsvc.nicdriver.regs.IXGBE_DEVICE_IDS` with network base class 0x02; anything
   else (this machine's own virtio-net NIC above all) raises :class:`DeviceNotAllowed`;
3. only then: unbind the kernel driver (write the address to ``driver/unbind``), set Bus
   Master Enable and Memory Space Enable in the Command register (read-modify-write of
   config offset 0x04), and mmap ``resource0`` shared read/write over its whole size.

The sysfs root is a parameter (default ``/sys``) so that the same code opens a software
model: a model port builds ``<root>/bus/pci/devices/0000:00:10.0/`` with a ``config`` file
(8086:10FB, class 0x020000), ``resource0`` as a symlink to the model's BAR file and a marker
file ``ixgbe-model`` whose content tells the driver where the model's control file is
(spec 2.1, seam 1). Opening then runs exactly as on hardware.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from capsvc.nicdriver import regs
from capsvc.nicdriver.errors import (
    UNBIND_HOWTO,
    DeviceNotAllowed,
    DeviceNotFound,
    NicError,
)

__all__ = [
    "MODEL_MARKER",
    "PciFunction",
    "canonical_address",
    "list_functions",
    "open_function",
    "probe",
]

MODEL_MARKER = "ixgbe-model"
_ADDRESS = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])$")


def canonical_address(text: str) -> str:
    """``dddd:bb:dd.f`` in lower case; ``bb:dd.f`` gets domain 0000.

    Raises:
        ValueError: ``text`` is not a PCI address.
    """
    match = _ADDRESS.match(text.strip())
    if match is None:
        raise ValueError(
            f"{text!r} is not a PCI address: expected dddd:bb:dd.f such as 0000:03:00.0"
        )
    domain, bus, dev, func = match.groups()
    return f"{(domain or '0000').lower()}:{bus.lower()}:{dev.lower()}.{func}"


@dataclass(frozen=True, slots=True)
class PciFunction:
    """What sysfs says about one PCI function (read-only snapshot)."""

    address: str
    path: Path
    vendor: int
    device: int
    class_code: int  # 24 bits: base class, subclass, programming interface
    driver: str | None
    iommu_group: str | None
    model_marker: Path | None  # the ixgbe-model marker, for software model ports

    @property
    def base_class(self) -> int:
        return self.class_code >> 16

    @property
    def is_network(self) -> bool:
        return self.base_class == regs.NETWORK_CLASS

    @property
    def is_model(self) -> bool:
        return self.model_marker is not None

    @property
    def allowed(self) -> bool:
        """On the allow-list: an Intel 82599/X540 physical function of class 0x02."""
        return (
            self.vendor == regs.INTEL_VENDOR
            and self.device in regs.IXGBE_DEVICE_IDS
            and self.is_network
        )

    @property
    def description(self) -> str:
        if self.vendor == regs.INTEL_VENDOR and self.device in regs.IXGBE_DEVICE_IDS:
            name = f"Intel {regs.IXGBE_DEVICE_IDS[self.device]}"
        elif self.vendor == regs.INTEL_VENDOR and self.device in regs.IXGBE_VF_IDS:
            name = "Intel ixgbe virtual function (not supported)"
        elif self.vendor == regs.VIRTIO_VENDOR:
            name = "virtio device"
        else:
            name = "unknown device"
        if self.is_model:
            name += " [software model]"
        return name

    def refusal(self) -> str | None:
        """Why :func:`open_function` would refuse this function, or None."""
        ident = f"{self.vendor:04x}:{self.device:04x} class {self.class_code:06x}"
        if self.vendor == regs.INTEL_VENDOR and self.device in regs.IXGBE_VF_IDS:
            return f"{self.address} ({ident}) is an ixgbe virtual function: not supported"
        if not self.allowed:
            return (
                f"{self.address} ({ident}, {self.description}) is not an Intel 82599/X540 "
                "physical function; the driver opens only allow-listed devices "
                "(see `capsvc nic list`)"
            )
        return None


def _devices_dir(sysfs_root: str | os.PathLike[str]) -> Path:
    return Path(sysfs_root) / "bus" / "pci" / "devices"


def _read_function(path: Path) -> PciFunction | None:
    try:
        config = (path / "config").read_bytes()[:64]
    except OSError:
        return None
    if len(config) < 12:
        return None
    vendor, device = struct.unpack_from("<HH", config, regs.PCI_VENDOR_ID)
    (class_rev,) = struct.unpack_from("<I", config, regs.PCI_CLASS_REVISION)
    driver_link = path / "driver"
    driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
    group_link = path / "iommu_group"
    group = os.path.basename(os.readlink(group_link)) if group_link.is_symlink() else None
    marker = path / MODEL_MARKER
    return PciFunction(
        address=path.name,
        path=path,
        vendor=vendor,
        device=device,
        class_code=class_rev >> 8,
        driver=driver,
        iommu_group=group,
        model_marker=marker if marker.exists() else None,
    )


def list_functions(sysfs_root: str | os.PathLike[str] = "/sys") -> list[PciFunction]:
    """Every PCI function under ``sysfs_root`` (read-only; unreadable ones are skipped)."""
    directory = _devices_dir(sysfs_root)
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    found = []
    for name in names:
        function = _read_function(directory / name)
        if function is not None:
            found.append(function)
    return found


def probe(address: str, sysfs_root: str | os.PathLike[str] = "/sys") -> PciFunction:
    """The function at ``address`` (read-only).

    Raises:
        DeviceNotFound: nothing at that address under ``sysfs_root``.
    """
    canonical = canonical_address(address)
    path = _devices_dir(sysfs_root) / canonical
    function = _read_function(path) if path.exists() else None
    if function is None:
        network = [f.address for f in list_functions(sysfs_root) if f.is_network]
        hint = f"network functions present: {', '.join(network)}" if network else "none found"
        raise DeviceNotFound(
            f"no PCI device {canonical} under {_devices_dir(sysfs_root)} ({hint}); "
            "`capsvc nic list` shows the candidates"
        )
    return function


def open_function(
    address: str,
    sysfs_root: str | os.PathLike[str] = "/sys",
    *,
    unbind: bool = True,
) -> tuple[PciFunction, mmap.mmap]:
    """Take over an allow-listed function: unbind, enable bus mastering, map BAR0.

    Returns the function and the shared read/write mapping of its whole ``resource0``.

    Raises:
        DeviceNotFound, DeviceNotAllowed: see :func:`probe` and the allow-list.
        NicError: the kernel refused (not root, lockdown, device still bound).
    """
    function = probe(address, sysfs_root)
    refusal = function.refusal()
    if refusal is not None:
        raise DeviceNotAllowed(refusal)
    if function.driver is not None:
        if not unbind:
            raise NicError(
                f"{function.address} is bound to the kernel driver {function.driver!r}; "
                f"unbind it first: echo {function.address} > "
                f"{function.path}/driver/unbind"
            )
        try:
            (function.path / "driver" / "unbind").write_text(function.address)
        except OSError as error:
            raise NicError(
                f"cannot unbind {function.address} from {function.driver!r}: {error}; "
                + UNBIND_HOWTO
            ) from error
    _enable_bus_master(function)
    return function, _map_bar0(function)


def _enable_bus_master(function: PciFunction) -> None:
    """Set Bus Master Enable (bit 2) and Memory Space Enable (bit 1) of the Command register.

    Read-modify-write of the 16-bit register at config offset 0x04 (spec 1.1).
    """
    try:
        with open(function.path / "config", "r+b", buffering=0) as config:
            raw = os.pread(config.fileno(), 2, regs.PCI_COMMAND)
            (command,) = struct.unpack("<H", raw)
            wanted = command | regs.PCI_COMMAND_MASTER | regs.PCI_COMMAND_MEMORY
            if wanted != command:
                os.pwrite(config.fileno(), struct.pack("<H", wanted), regs.PCI_COMMAND)
    except OSError as error:
        raise NicError(
            f"cannot enable bus mastering on {function.address}: {error}; " + UNBIND_HOWTO
        ) from error


def _map_bar0(function: PciFunction) -> mmap.mmap:
    path = function.path / "resource0"
    try:
        fd = os.open(path, os.O_RDWR | os.O_SYNC)
    except OSError as error:
        raise NicError(f"cannot open {path}: {error}; " + UNBIND_HOWTO) from error
    try:
        size = os.fstat(fd).st_size
        if size < regs.BAR0_SIZE:
            raise NicError(
                f"{path} is {size} bytes, smaller than the 82599's 512 KiB BAR0: wrong device?"
            )
        try:
            return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as error:
            raise NicError(f"cannot mmap {path}: {error}; " + UNBIND_HOWTO) from error
    finally:
        os.close(fd)
