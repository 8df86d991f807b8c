"""PCI discovery and opening through sysfs: the allow-list, path checks and device ownership.

Theory of operation
-------------------
Spec nicdriver.md 1.1. Every PCI function appears as
``<root>/bus/pci/devices/<dddd:bb:dd.f>/`` with ``config`` (config space), ``resource0``
(BAR0), a ``driver`` link when a kernel driver is bound and an ``iommu_group`` link when
an IOMMU is active. :func:`list_functions` and :func:`probe` read only ``config`` (vendor
u16 at 0x00, device u16 at 0x02, class code in the u32 at 0x08) and the links, under any
root: they never write and are what ``capsvc nic list`` shows.

:func:`open_function` is the one place that changes device state, and it is guarded:

1. the address must be given explicitly (there is no "first NIC found" mode, unlike ixy);
2. :func:`resolve_function` checks *where* the function really is (below) and reads its
   identity from the config space it will write to;
3. the function must be an Intel 82599/X540 *physical* function on the allow-list of
   :data:`capsvc.nicdriver.regs.IXGBE_DEVICE_IDS` with network base class 0x02; anything
   else (this machine's own virtio-net NIC above all) raises :class:`DeviceNotAllowed`;
4. the process takes the device's ownership lock (below); a second driver gets
   :class:`DeviceBusy` naming the holder;
5. only then: unbind the kernel driver (write the address to ``driver/unbind``), set Bus
   Master Enable and Memory Space Enable in the Command register (read-modify-write of
   config offset 0x04), and mmap ``resource0`` shared read/write over its whole size. If
   a step after the unbind fails, Bus Master Enable is cleared again and the lock released
   before the error propagates: a device nobody drives must not do DMA.

Where a function may be
~~~~~~~~~~~~~~~~~~~~~~~
The sysfs root is a parameter (default ``/sys``) so that the same code opens a software
model, but the allow-list is only worth something if the files it checks are the files
that get written. So there are exactly two kinds of function:

- *Real*: the sysfs root is the real ``/sys`` (after ``realpath``). The function directory
  must resolve to ``/sys/devices/.../<address>`` (its own address), ``config`` and
  ``resource0`` must be the plain sysfs files inside it (no links), the ``driver`` link must
  resolve to ``/sys/bus/pci/drivers/<name>``, and every file is opened by its resolved path
  and checked again after opening (``/proc/self/fd``, same filesystem as ``/sys/devices``),
  so a link swapped in between cannot redirect a write.
- *Model*: any other root, and then the function directory must carry the ``ixgbe-model``
  marker that a model port writes (:mod:`~capsvc.nicdriver.modelhost`:
  ``<port>/sysfs/bus/pci/devices/0000:00:10.0/`` with ``config`` a 256-byte plain file
  (8086:10FB, class 0x020000), ``resource0`` a symlink to the port's ``bar`` and the
  marker naming ``port=<port>``). The function directory must lie inside that port
  directory, nothing may resolve under ``/sys`` or ``/proc`` (nor sit on their
  filesystems), ``resource0`` must resolve to a regular file inside the port directory,
  the port's own files (``bar``, ``control``, ``dma``, the FIFOs, the lock) must not be
  symlinks, and there must be no ``driver`` link: a model has no kernel driver, so nothing
  is ever unbound for it. :attr:`PciFunction.port_dir` is the checked port directory.

Anything else (a fake tree outside ``/sys`` without a marker, links from a fake tree into
``/sys``, a marker beside a link to a real BAR, a symlinked function directory into
``/sys/devices``) is refused with a :class:`DeviceNotAllowed` that names the offending
path, before anything is written.

Ownership
~~~~~~~~~
One driver per device: a real function is locked by an exclusive ``flock`` on
``<lock dir>/<dddd:bb:dd.f>.lock`` (lock dir ``$CAPSVC_NIC_LOCKDIR``, else
``/run/capsvc-nic``), a model port by its ``<port>/lock``; the holder's PID is written
into the file, and a refused opener is told that PID and, when ``/proc`` shows it, the
holder's command line. The lock is taken after the read-only checks and before any state
change, and handed to the caller inside the returned :class:`PciFunction`
(:attr:`~PciFunction.lock`, :meth:`~PciFunction.release`); the kernel drops it when the
process exits, whatever way it dies. The lock fd is close-on-exec, but a child made by a
bare ``fork`` shares it (flock semantics) and keeps the device locked until it exits too.
"""

from __future__ import annotations

import dataclasses
import fcntl
import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from capsvc.nicdriver import regs
from capsvc.nicdriver.errors import (
    UNBIND_HOWTO,
    DeviceBusy,
    DeviceNotAllowed,
    DeviceNotFound,
    NicError,
)

__all__ = [
    "DEFAULT_LOCKDIR",
    "LOCKDIR_ENV",
    "MODEL_LOCK",
    "MODEL_MARKER",
    "DeviceLock",
    "PciFunction",
    "acquire_lock",
    "canonical_address",
    "default_lock_dir",
    "function_lock_path",
    "list_functions",
    "lock_function",
    "lock_holder",
    "lock_model_port",
    "open_function",
    "probe",
    "resolve_function",
]

MODEL_MARKER = "ixgbe-model"
MODEL_LOCK = "lock"  # a model port's lock file, in its port directory
LOCKDIR_ENV = "CAPSVC_NIC_LOCKDIR"
DEFAULT_LOCKDIR = "/run/capsvc-nic"

# The real sysfs: only functions found through it (after realpath) can be hardware. The
# tests point this at a fake tree to run the hardware code path without hardware.
_REAL_SYSFS = "/sys"
# Kernel trees a model port may never reach into (whatever _REAL_SYSFS says).
_KERNEL_TREES = ("/sys", "/proc")
# The files of a model port directory that the driver side opens (modelhost.PortFiles).
_PORT_FILES = ("bar", "control", "dma", "kick-model", "kick-driver", MODEL_LOCK, "wire.sock")

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


# ---------------------------------------------------------------------------- ownership
class DeviceLock:
    """An exclusive ``flock`` on a device's lock file, which holds this process's PID.

    :meth:`release` (idempotent) closes the file and so drops the lock; process exit does
    the same.
    """

    __slots__ = ("_fd", "path", "what")

    def __init__(self, path: Path, fd: int, what: str) -> None:
        self.path = path
        self.what = what
        self._fd = fd

    @property
    def fd(self) -> int:
        """The locked file descriptor, -1 once released."""
        return self._fd

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)

    def __enter__(self) -> DeviceLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = f"fd {self._fd}" if self.held else "released"
        return f"<DeviceLock {self.path} {state}>"


def default_lock_dir() -> Path:
    """``$CAPSVC_NIC_LOCKDIR``, else ``/run/capsvc-nic``: where real functions are locked."""
    return Path(os.environ.get(LOCKDIR_ENV) or DEFAULT_LOCKDIR)


def function_lock_path(address: str, lock_dir: str | os.PathLike[str] | None = None) -> Path:
    """The lock file of the real PCI function at ``address``."""
    directory = Path(lock_dir) if lock_dir is not None else default_lock_dir()
    return directory / f"{canonical_address(address)}.lock"


def lock_function(address: str, lock_dir: str | os.PathLike[str] | None = None) -> DeviceLock:
    """Lock the real PCI function at ``address`` for this process.

    Raises:
        DeviceBusy: another driver holds it (the message names its PID and command line).
        NicError: the lock directory or file cannot be created.
    """
    canonical = canonical_address(address)
    path = function_lock_path(canonical, lock_dir)
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    except OSError as error:
        raise NicError(
            f"cannot create the lock directory {path.parent}: {error}; set {LOCKDIR_ENV} "
            "to a writable directory"
        ) from error
    return acquire_lock(path, f"PCI function {canonical}")


def lock_model_port(port_dir: str | os.PathLike[str]) -> DeviceLock:
    """Lock the model port in ``port_dir`` (its ``lock`` file) for this process.

    Raises:
        DeviceBusy: another driver holds it (the message names its PID and command line).
    """
    directory = Path(port_dir)
    return acquire_lock(directory / MODEL_LOCK, f"the model port {directory.name}")


def acquire_lock(path: Path, what: str) -> DeviceLock:
    """Take an exclusive non-blocking ``flock`` on ``path`` and write our PID into it.

    The file is opened without following a final symlink and must be a regular file (a
    lock directory somebody else can write to cannot redirect the PID write).

    Raises:
        DeviceBusy: another open file holds the lock (this process's own included).
        NicError: the file cannot be opened.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as error:
        raise NicError(f"cannot open the lock file {path} of {what}: {error}") from error
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NicError(f"the lock file {path} of {what} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_from_file(fd) or _holder_from_proc_locks(os.fstat(fd))
            raise DeviceBusy(
                f"{what} is already driven by {holder or 'another process'}; "
                f"one driver per device (lock file {path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return DeviceLock(path, fd, what)


def lock_holder(path: str | os.PathLike[str]) -> str | None:
    """Who holds the lock on ``path`` ("pid N (command line)"), or None if nobody does.

    Read-only: it consults ``/proc/locks`` instead of probing with a lock of its own (a
    probe could make a real opener fail), so it may name no one on a kernel without it.
    """
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    return _holder_from_proc_locks(info)


def _holder_from_file(fd: int) -> str | None:
    text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    try:
        pid = int(text.split()[0])
    except (IndexError, ValueError):
        return None
    return _describe_pid(pid)


def _holder_from_proc_locks(info: os.stat_result) -> str | None:
    """The PID ``/proc/locks`` gives for a lock on the file ``info`` describes."""
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 00:1a:5678 0 EOF"; blocked waiters have "->"
        if len(fields) >= 6 and fields[1] != "->" and fields[5] == wanted:
            try:
                return _describe_pid(int(fields[4]))
            except ValueError:
                return None
    return None


def _describe_pid(pid: int) -> str:
    details = []
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return f"pid {pid} (no longer running: a process it forked may still hold the lock)"
    except OSError:
        raw = b""
    command = " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())
    if command:
        details.append(command if len(command) <= 200 else command[:197] + "...")
    if pid == os.getpid():
        details.append("this process")
    return f"pid {pid} ({', '.join(details)})" if details else f"pid {pid}"


# ---------------------------------------------------------------------------- functions
@dataclass(frozen=True, slots=True)
class PciFunction:
    """What sysfs says about one PCI function.

    From :func:`list_functions` / :func:`probe` a read-only snapshot; from
    :func:`open_function` also the checked location (:attr:`path` resolved,
    :attr:`port_dir` for a model), the ownership :attr:`lock` and the means to let go.
    """

    address: str
    path: Path
    vendor: int
    device: int
    class_code: int  # 24 bits: base class, subclass, programming interface
    driver: str | None
    iommu_group: str | None
    model_marker: Path | None  # the ixgbe-model marker, for software model ports
    port_dir: Path | None = None  # a model port's checked directory (resolve_function)
    lock: DeviceLock | None = field(default=None, compare=False, repr=False)
    opened: bool = field(default=False, compare=False)  # returned by open_function

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
        """Why :func:`open_function` would refuse this function's identity, or None."""
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

    # -- for the owner (a function returned by open_function) ------------------------
    @property
    def lock_fd(self) -> int:
        """The ownership lock's file descriptor, -1 if none is held."""
        return self.lock.fd if self.lock is not None else -1

    def release(self) -> None:
        """Drop the ownership lock (idempotent). Call it last, after unmapping BAR0."""
        if self.lock is not None:
            self.lock.release()

    def disable_bus_master(self) -> None:
        """Clear Bus Master Enable (bit 2 of the Command register, config offset 0x04).

        Read-modify-write of that 16-bit register only (Memory Space Enable and the rest
        stay); no write when the bit is already clear. Only for a function returned by
        :func:`open_function` whose lock is still held (after :meth:`release` another
        process may own the device). Call it once the queues are stopped and before the
        DMA memory is freed, on close and on error paths.

        Raises:
            NicError: not an opened function, lock released, or config space not writable.
        """
        if not self.opened:
            raise NicError(
                f"{self.address}: disable_bus_master() is only for a function returned by "
                "open_function()"
            )
        if self.lock is not None and not self.lock.held:
            raise NicError(
                f"{self.address}: the ownership lock was released; another process may "
                "drive the device now, its bus mastering is not ours to change"
            )
        _update_command(self, clear=regs.PCI_COMMAND_MASTER)


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
    """The function at ``address`` (read-only, unchecked location: for listing).

    Raises:
        DeviceNotFound: nothing at that address under ``sysfs_root``.
    """
    canonical = canonical_address(address)
    path = _devices_dir(sysfs_root) / canonical
    function = _read_function(path) if path.exists() else None
    if function is None:
        _not_found(canonical, sysfs_root)
    return function


def _not_found(canonical: str, sysfs_root: str | os.PathLike[str]) -> NoReturn:
    network = [f.address for f in list_functions(sysfs_root) if f.is_network]
    hint = f"network functions present: {', '.join(network)}" if network else "none found"
    raise DeviceNotFound(
        f"no PCI device {canonical} under {_devices_dir(sysfs_root)} ({hint}); "
        "`capsvc nic list` shows the candidates"
    )


# ---------------------------------------------------------------------------- location checks
def _inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it (both already resolved)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _kernel_devices() -> set[int]:
    devices = set()
    for tree in _KERNEL_TREES:
        try:
            devices.add(os.stat(tree).st_dev)
        except OSError:
            pass
    return devices


def _refuse(canonical: str, why: str) -> NoReturn:
    raise DeviceNotAllowed(f"refusing to open {canonical}: {why}")


def _plain_file(canonical: str, path: str) -> None:
    """``path`` exists and is a regular file, not a link."""
    try:
        info = os.lstat(path)
    except OSError as error:
        _refuse(canonical, f"{path} is missing ({error.strerror})")
    if stat.S_ISLNK(info.st_mode):
        _refuse(canonical, f"{path} is a symlink (to {os.path.realpath(path)}), not a plain file")
    if not stat.S_ISREG(info.st_mode):
        _refuse(canonical, f"{path} is not a regular file")


def _real_roots() -> tuple[str, str, str]:
    """The resolved real sysfs, its ``devices`` and its PCI ``drivers`` directories."""
    sysfs = os.path.realpath(_REAL_SYSFS)
    return sysfs, os.path.join(sysfs, "devices"), os.path.join(sysfs, "bus", "pci", "drivers")


def resolve_function(address: str, sysfs_root: str | os.PathLike[str] = "/sys") -> PciFunction:
    """The function at ``address`` after the location checks of the module docstring.

    Read-only. The result's :attr:`~PciFunction.path` is the resolved function directory
    and its identity was read from the config space there; a model's gets
    :attr:`~PciFunction.port_dir`.

    Raises:
        DeviceNotFound: nothing at that address under ``sysfs_root``.
        DeviceNotAllowed: the function is not where a real function or a model port is,
            naming the offending path.
    """
    canonical = canonical_address(address)
    entry = _devices_dir(sysfs_root) / canonical
    if not entry.exists():
        _not_found(canonical, sysfs_root)
    if os.path.realpath(sysfs_root) == _real_roots()[0]:
        function = _resolve_real(canonical, entry)
    else:
        function = _resolve_model(canonical, entry, sysfs_root)
    return function


def _resolve_real(canonical: str, entry: Path) -> PciFunction:
    _, devices, _ = _real_roots()
    real_dir = os.path.realpath(entry)
    if not _inside(real_dir, devices) or real_dir == devices:
        _refuse(canonical, f"{entry} resolves to {real_dir}, outside {devices}")
    if os.path.basename(real_dir) != canonical:
        _refuse(canonical, f"{entry} resolves to {real_dir}, the directory of another address")
    sysfs_device = os.stat(devices).st_dev
    if os.stat(real_dir).st_dev != sysfs_device:
        _refuse(canonical, f"{real_dir} is not on the filesystem of {devices}")
    _plain_file(canonical, os.path.join(real_dir, "config"))
    resource0 = os.path.join(real_dir, "resource0")
    if os.path.lexists(resource0):
        _plain_file(canonical, resource0)
    if os.path.lexists(os.path.join(real_dir, "driver")):
        # Only the link is checked here: resolving is read-only, and some kernels (VM
        # sandboxes among them) give a driver no ``unbind`` file; ``_unbind_path`` checks
        # that file when an unbind is actually about to be written.
        _driver_dir(canonical, Path(real_dir))
    function = _read_function(Path(real_dir))
    if function is None:
        raise NicError(f"cannot read the config space of {canonical} in {real_dir}")
    return function


def _driver_dir(canonical: str, real_dir: Path) -> str:
    """The directory of the kernel driver bound to a real function (its link checked)."""
    _, _, drivers = _real_roots()
    link = real_dir / "driver"
    if not link.is_symlink():
        _refuse(canonical, f"{link} is not a link to a kernel driver")
    target = os.path.realpath(link)
    if os.path.dirname(target) != drivers:
        _refuse(
            canonical, f"its driver link {link} resolves to {target}, not a driver in {drivers}"
        )
    return target


def _unbind_path(canonical: str, real_dir: Path) -> str:
    """The ``unbind`` file of the kernel driver bound to a real function (checked)."""
    unbind = os.path.join(_driver_dir(canonical, real_dir), "unbind")
    _plain_file(canonical, unbind)
    return unbind


def _read_marker(canonical: str, path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as marker:
            text = marker.read(4096).decode(errors="replace")
    except OSError as error:
        _refuse(canonical, f"cannot read the model marker {path}: {error.strerror}")
    entries = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            entries[key.strip()] = value.strip()
    return entries


def _resolve_model(canonical: str, entry: Path, sysfs_root: str | os.PathLike[str]) -> PciFunction:
    real_dir = os.path.realpath(entry)
    kernel = _kernel_devices()
    for tree in _KERNEL_TREES:
        if _inside(real_dir, tree):
            _refuse(
                canonical,
                f"{entry} resolves to {real_dir}; a function under {tree} is opened only "
                f"through the sysfs root {_REAL_SYSFS}, not {sysfs_root}",
            )
    marker = os.path.join(real_dir, MODEL_MARKER)
    if not os.path.lexists(marker):
        _refuse(
            canonical,
            f"the sysfs root {sysfs_root} is not {_REAL_SYSFS}, and {real_dir} has no "
            f"{MODEL_MARKER} marker: only a software model port may be opened outside "
            f"{_REAL_SYSFS}",
        )
    _plain_file(canonical, marker)
    if os.path.basename(real_dir) != canonical:
        _refuse(canonical, f"{entry} resolves to {real_dir}, the directory of another address")
    port = _read_marker(canonical, marker).get("port", "")
    if not os.path.isabs(port):
        _refuse(canonical, f"the model marker {marker} names no absolute port= directory")
    port_dir = os.path.realpath(port)
    if port_dir == "/" or any(_inside(port_dir, tree) for tree in _KERNEL_TREES):
        _refuse(canonical, f"the model marker {marker} names the port directory {port_dir}")
    if not os.path.isdir(port_dir):
        _refuse(canonical, f"the model port directory {port_dir} (from {marker}) is missing")
    if not _inside(real_dir, port_dir) or real_dir == port_dir:
        _refuse(canonical, f"{real_dir} lies outside its model port directory {port_dir}")
    driver = os.path.join(real_dir, "driver")
    if os.path.lexists(driver):
        _refuse(
            canonical,
            f"a model port has no kernel driver, but {driver} exists (resolving to "
            f"{os.path.realpath(driver)}); it is not followed and nothing is unbound",
        )
    config = os.path.join(real_dir, "config")
    _plain_file(canonical, config)
    resource0 = os.path.join(real_dir, "resource0")
    if not os.path.lexists(resource0):
        _refuse(canonical, f"the model port has no {resource0}")
    bar = os.path.realpath(resource0)
    if not _inside(bar, port_dir) or bar == port_dir:
        _refuse(canonical, f"{resource0} resolves to {bar}, outside the model port {port_dir}")
    for name in _PORT_FILES:
        path = os.path.join(port_dir, name)
        if os.path.islink(path):
            _refuse(
                canonical,
                f"{path} is a symlink (to {os.path.realpath(path)}); a model port's files "
                "are its own",
            )
    for path in (real_dir, config, bar):
        try:
            info = os.stat(path)
        except OSError as error:
            _refuse(canonical, f"{path}: {error.strerror}")
        if info.st_dev in kernel:
            _refuse(canonical, f"{path} lies on a kernel filesystem ({', '.join(_KERNEL_TREES)})")
    if not stat.S_ISREG(os.stat(bar).st_mode):
        _refuse(canonical, f"{resource0} resolves to {bar}, which is not a regular file")
    function = _read_function(Path(real_dir))
    if function is None:
        raise NicError(f"cannot read the config space of the model port in {real_dir}")
    return dataclasses.replace(function, port_dir=Path(port_dir))


def _allowed_root(function: PciFunction) -> str:
    """Where every file opened for ``function`` must be: its port, or the real devices."""
    if function.port_dir is not None:
        return str(function.port_dir)
    return _real_roots()[1]


def _open_checked(
    function: PciFunction, path: str | os.PathLike[str], flags: int, root: str
) -> int:
    """Open ``path`` by its resolved name and check what was opened.

    The opened file (``/proc/self/fd``) must be a regular file inside ``root``; for a
    real function on the filesystem of the real devices tree, for a model on none of the
    kernel filesystems.
    """
    target = os.path.realpath(path)
    fd = os.open(target, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        try:
            opened = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            opened = target
        why = None
        if not stat.S_ISREG(info.st_mode):
            why = f"{path} opened as {opened}, not a regular file"
        elif not _inside(opened, root):
            why = f"{path} opened as {opened}, outside {root}"
        elif function.is_model and info.st_dev in _kernel_devices():
            why = f"{path} opened as {opened}, on a kernel filesystem"
        elif not function.is_model and info.st_dev != os.stat(root).st_dev:
            why = f"{path} opened as {opened}, not on the filesystem of {root}"
        if why is not None:
            _refuse(function.address, why)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ---------------------------------------------------------------------------- opening
def open_function(
    address: str,
    sysfs_root: str | os.PathLike[str] = "/sys",
    *,
    unbind: bool = True,
    lock_dir: str | os.PathLike[str] | None = None,
    lock_model: bool = True,
) -> tuple[PciFunction, mmap.mmap]:
    """Take over an allow-listed function: lock, unbind, enable bus mastering, map BAR0.

    Returns the function (with :attr:`~PciFunction.lock` held: the caller releases it
    with :meth:`~PciFunction.release` after unmapping) and the shared read/write mapping
    of its whole ``resource0``.

    A real function is always locked (``lock_dir``, default :func:`default_lock_dir`),
    a model port by its ``<port>/lock`` unless ``lock_model=False`` (for a caller that
    locks the port itself: a second lock on the same file from the same process would
    refuse the port to its own driver).

    Raises:
        DeviceNotFound, DeviceNotAllowed: see :func:`resolve_function` and the allow-list.
        DeviceBusy: another driver owns the device.
        NicError: the kernel refused (not root, lockdown, device still bound).
    """
    function = resolve_function(address, sysfs_root)
    refusal = function.refusal()
    if refusal is not None:
        raise DeviceNotAllowed(refusal)
    if function.driver is not None and not unbind:
        raise NicError(
            f"{function.address} is bound to the kernel driver {function.driver!r}; "
            f"unbind it first: echo {function.address} > {function.path}/driver/unbind"
        )
    lock: DeviceLock | None = None
    if function.port_dir is not None:
        if lock_model:
            lock = lock_model_port(function.port_dir)
    else:
        lock = lock_function(function.address, lock_dir)
    function = dataclasses.replace(function, lock=lock, opened=True)
    owned = False  # the device is out of the kernel driver's hands: ours to clean up
    try:
        if function.driver is not None:
            _unbind(function)
        owned = True
        _update_command(function, set_=regs.PCI_COMMAND_MASTER | regs.PCI_COMMAND_MEMORY)
        mm = _map_bar0(function)
    except BaseException as error:
        if owned:
            try:
                _update_command(function, clear=regs.PCI_COMMAND_MASTER)
                error.add_note(f"bus mastering on {function.address} was disabled again")
            except OSError as cleanup:
                error.add_note(f"and disabling bus mastering again failed: {cleanup}")
            if function.driver is not None:
                error.add_note(
                    f"{function.address} stays unbound from {function.driver!r}; to give it "
                    f"back: echo {function.address} > "
                    f"/sys/bus/pci/drivers/{function.driver}/bind"
                )
        function.release()
        raise
    return function, mm


def _unbind(function: PciFunction) -> None:
    unbind = _unbind_path(function.address, function.path)
    try:
        fd = _open_checked(function, unbind, os.O_WRONLY, os.path.dirname(unbind))
        try:
            os.write(fd, function.address.encode())
        finally:
            os.close(fd)
    except NicError:
        raise
    except OSError as error:
        raise NicError(
            f"cannot unbind {function.address} from {function.driver!r}: {error}; " + UNBIND_HOWTO
        ) from error


def _update_command(function: PciFunction, *, set_: int = 0, clear: int = 0) -> None:
    """Read-modify-write of the 16-bit Command register at config offset 0x04 (spec 1.1)."""
    what = "enable bus mastering on" if set_ else "disable bus mastering on"
    try:
        fd = _open_checked(function, function.path / "config", os.O_RDWR, _allowed_root(function))
        try:
            raw = os.pread(fd, 2, regs.PCI_COMMAND)
            if len(raw) != 2:
                raise NicError(f"{function.path / 'config'} is too short for a Command register")
            (command,) = struct.unpack("<H", raw)
            wanted = (command | set_) & ~clear & 0xFFFF
            if wanted != command:
                os.pwrite(fd, struct.pack("<H", wanted), regs.PCI_COMMAND)
        finally:
            os.close(fd)
    except NicError:
        raise
    except OSError as error:
        raise NicError(f"cannot {what} {function.address}: {error}{_howto(function)}") from error


def _howto(function: PciFunction) -> str:
    if function.port_dir is not None:
        return f"; is the model port {function.port_dir} still there? (`capsvc nic list`)"
    return "; " + UNBIND_HOWTO


def _map_bar0(function: PciFunction) -> mmap.mmap:
    path = function.path / "resource0"
    try:
        fd = _open_checked(function, path, os.O_RDWR | os.O_SYNC, _allowed_root(function))
    except NicError:
        raise
    except OSError as error:
        raise NicError(f"cannot open {path}: {error}{_howto(function)}") from error
    try:
        size = os.fstat(fd).st_size
        if size < regs.BAR0_SIZE:
            raise NicError(
                f"{path} is {size} bytes, smaller than the 82599's 512 KiB BAR0: wrong device?"
            )
        try:
            return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as error:
            raise NicError(f"cannot mmap {path}: {error}{_howto(function)}") from error
    finally:
        os.close(fd)
