"""PCI discovery through sysfs, the allow-list, where a function may be, and opening
(spec nicdriver.md 1.1; issue 14: crafted sysfs directories cannot bypass the allow-list).

Nothing here writes under the real /sys: the hardware code path runs against a fake tree
that :func:`real_sysfs` installs as the "real" sysfs (``pci._REAL_SYSFS``), and the tests
that aim crafted links at the real /sys run under :func:`no_writes_under_sys`, a tripwire
on ``os.open`` (every write the driver does starts there) that fails the test instead.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from capsvc.nicdriver import pci, regs
from capsvc.nicdriver.errors import DeviceNotAllowed, DeviceNotFound, NicError
from capsvc.nicdriver.modelhost import MODEL_PCI_ADDRESS, PortFiles
from capsvc.nicdriver.pci import (
    MODEL_MARKER,
    canonical_address,
    list_functions,
    open_function,
    probe,
    resolve_function,
)

X520 = "0000:03:00.0"


def fake_function(
    root: Path,
    address: str,
    vendor: int,
    device: int,
    class_code: int,
    driver: str | None = None,
    bar_size: int = regs.BAR0_SIZE,
) -> Path:
    """A function laid out as in the real sysfs: ``bus/pci/devices/ADDR`` is a link to
    ``devices/pci0000:00/ADDR``, ``driver`` a link to ``bus/pci/drivers/NAME``."""
    path = root / "devices" / "pci0000:00" / address
    path.mkdir(parents=True)
    entries = root / "bus" / "pci" / "devices"
    entries.mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../../devices/pci0000:00/{address}", entries / address)
    config = bytearray(256)
    struct.pack_into("<HH", config, 0, vendor, device)
    struct.pack_into("<I", config, 8, class_code << 8)
    (path / "config").write_bytes(bytes(config))
    (path / "resource0").write_bytes(bytes(bar_size))
    if driver is not None:
        drivers = root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        (drivers / "unbind").write_text("")
        os.symlink(f"../../../bus/pci/drivers/{driver}", path / "driver")
    return path


def command_register(config: Path) -> int:
    (command,) = struct.unpack_from("<H", config.read_bytes(), regs.PCI_COMMAND)
    return int(command)


@pytest.fixture
def real_sysfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake tree standing in for the real /sys (and a lock directory beside it)."""
    root = tmp_path / "sys"
    root.mkdir()
    monkeypatch.setattr(pci, "_REAL_SYSFS", str(root))
    monkeypatch.setenv(pci.LOCKDIR_ENV, str(tmp_path / "locks"))
    return root


@pytest.fixture
def sysfs(real_sysfs: Path) -> Path:
    fake_function(real_sysfs, "0000:00:03.0", 0x1AF4, 0x1041, 0x020000, driver="virtio-pci")
    fake_function(real_sysfs, X520, 0x8086, 0x10FB, 0x020000, driver="ixgbe")
    fake_function(real_sysfs, "0000:03:10.0", 0x8086, 0x10ED, 0x020000)  # a VF
    fake_function(real_sysfs, "0000:00:1f.0", 0x8086, 0x1234, 0x060100)  # ISA bridge
    return real_sysfs


@pytest.fixture
def no_writes_under_sys(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fail any open for writing of a path that resolves under the real /sys."""
    attempts: list[str] = []
    real_open = os.open

    def guarded(path: str | os.PathLike[str], flags: int, *args: int, **kw: int) -> int:
        resolved = os.path.realpath(path)
        writing = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        if writing and (resolved == "/sys" or resolved.startswith("/sys/")):
            attempts.append(resolved)
            raise AssertionError(f"test tripwire: a write open of {resolved}")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", guarded)
    yield attempts
    assert attempts == []


# ---------------------------------------------------------------------------- discovery
@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("0000:03:00.0", "0000:03:00.0"),
        ("03:00.1", "0000:03:00.1"),
        ("ABCD:EF:1F.7", "abcd:ef:1f.7"),
    ],
)
def test_canonical_addresses(text: str, canonical: str) -> None:
    assert canonical_address(text) == canonical


@pytest.mark.parametrize("text", ["", "eth0", "0000:03:00", "03:00.8", "0000:03:20.0", "model:x"])
def test_bad_addresses(text: str) -> None:
    with pytest.raises(ValueError, match="not a PCI address"):
        canonical_address(text)


def test_listing_reads_identity_and_links(sysfs: Path) -> None:
    functions = {f.address: f for f in list_functions(sysfs)}
    assert set(functions) == {"0000:00:03.0", X520, "0000:03:10.0", "0000:00:1f.0"}
    x520 = functions[X520]
    assert x520.allowed
    assert x520.driver == "ixgbe"
    assert "X520" in x520.description
    virtio = functions["0000:00:03.0"]
    assert virtio.is_network
    assert not virtio.allowed
    assert virtio.driver == "virtio-pci"
    assert "virtual function" in functions["0000:03:10.0"].description
    assert not functions["0000:00:1f.0"].is_network


def test_the_allow_list_protects_everything_else(sysfs: Path) -> None:
    for address in ("0000:00:03.0", "0000:03:10.0", "0000:00:1f.0"):
        with pytest.raises(DeviceNotAllowed, match=r"not an Intel 82599|virtual function"):
            open_function(address, sysfs)
    # the virtio NIC's driver was not unbound, and no lock was taken for a refused device
    assert (sysfs / "devices/pci0000:00/0000:00:03.0/driver").is_symlink()
    assert (sysfs / "bus/pci/drivers/virtio-pci/unbind").read_text() == ""
    assert not pci.default_lock_dir().exists()


def test_missing_device_names_the_candidates(sysfs: Path) -> None:
    with pytest.raises(DeviceNotFound, match=r"0000:00:03\.0.*capsvc nic list"):
        probe("0000:05:00.0", sysfs)
    with pytest.raises(DeviceNotFound, match=r"0000:00:03\.0.*capsvc nic list"):
        open_function("0000:05:00.0", sysfs)


def test_real_sysfs_listing_is_read_only() -> None:
    """On this machine: lists without touching anything; its virtio NIC is never allowed."""
    for function in list_functions("/sys"):
        if function.vendor == regs.VIRTIO_VENDOR:
            assert not function.allowed
            assert function.refusal() is not None


def test_the_real_sysfs_passes_the_location_checks() -> None:
    """This machine's own functions resolve as real ones (read-only)."""
    for entry in list_functions("/sys"):
        function = resolve_function(entry.address)
        assert function.path == Path(os.path.realpath(entry.path))
        assert str(function.path).startswith("/sys/devices/")
        assert not function.is_model
        assert (function.vendor, function.device) == (entry.vendor, entry.device)


# ---------------------------------------------------------------------------- opening
def test_opening_locks_unbinds_enables_bus_master_and_maps(sysfs: Path) -> None:
    function, mm = open_function(X520, sysfs)
    try:
        assert len(mm) == regs.BAR0_SIZE
        assert (sysfs / "bus/pci/drivers/ixgbe/unbind").read_text() == X520
        assert function.path == sysfs / "devices/pci0000:00" / X520
        assert command_register(function.path / "config") & 0b110 == 0b110
        assert function.lock is not None
        assert function.lock.path == pci.default_lock_dir() / f"{X520}.lock"
        assert function.lock_fd >= 0
        assert function.lock.path.read_text() == f"{os.getpid()}\n"
    finally:
        mm.close()
        function.release()
    assert function.lock_fd == -1
    function.release()  # idempotent


def test_refusing_to_unbind(sysfs: Path) -> None:
    with pytest.raises(NicError, match="unbind it first"):
        open_function(X520, sysfs, unbind=False)
    assert (sysfs / "bus/pci/drivers/ixgbe/unbind").read_text() == ""


def test_a_failure_after_the_unbind_clears_bus_mastering_again(real_sysfs: Path) -> None:
    path = fake_function(real_sysfs, X520, 0x8086, 0x10FB, 0x020000, "ixgbe", bar_size=4096)
    with pytest.raises(NicError, match="smaller than") as caught:
        open_function(X520, real_sysfs)
    assert (real_sysfs / "bus/pci/drivers/ixgbe/unbind").read_text() == X520
    command = command_register(path / "config")
    assert command & regs.PCI_COMMAND_MASTER == 0
    assert command & regs.PCI_COMMAND_MEMORY  # only bus mastering is taken back
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "disabled again" in notes
    assert f"echo {X520} > /sys/bus/pci/drivers/ixgbe/bind" in notes
    pci.lock_function(X520).release()  # the lock was released


def test_a_tree_that_looks_real_is_refused_elsewhere_than_the_real_sysfs(
    tmp_path: Path,
) -> None:
    """Without the marker, a root other than the real /sys is never hardware."""
    root = tmp_path / "fake"
    path = fake_function(root, X520, 0x8086, 0x10FB, 0x020000, driver="ixgbe")
    before = (path / "config").read_bytes()
    with pytest.raises(DeviceNotAllowed, match=f"has no {MODEL_MARKER} marker"):
        open_function(X520, root)
    assert (root / "bus/pci/drivers/ixgbe/unbind").read_text() == ""
    assert (path / "config").read_bytes() == before


# -- crafted layouts that pretend to be the real sysfs (monkeypatched _REAL_SYSFS)
def test_real_function_entries_must_resolve_to_their_own_devices_directory(
    real_sysfs: Path, tmp_path: Path
) -> None:
    elsewhere = fake_function(tmp_path / "elsewhere", X520, 0x8086, 0x10FB, 0x020000)
    entries = real_sysfs / "bus" / "pci" / "devices"
    entries.mkdir(parents=True)
    os.symlink(elsewhere, entries / X520)
    with pytest.raises(DeviceNotAllowed, match=r"outside .*sys/devices"):
        open_function(X520, real_sysfs)
    other = fake_function(real_sysfs, "0000:03:00.1", 0x8086, 0x10FB, 0x020000)
    os.symlink(other, entries / "0000:04:00.0")
    with pytest.raises(DeviceNotAllowed, match="directory of another address"):
        open_function("0000:04:00.0", real_sysfs)
    assert command_register(other / "config") == 0
    assert command_register(elsewhere / "config") == 0


@pytest.mark.parametrize("name", ["config", "resource0"])
def test_real_function_files_must_not_be_links(real_sysfs: Path, tmp_path: Path, name: str) -> None:
    path = fake_function(real_sysfs, X520, 0x8086, 0x10FB, 0x020000, driver="ixgbe")
    outside = tmp_path / f"outside-{name}"
    os.rename(path / name, outside)
    os.symlink(outside, path / name)
    before = outside.read_bytes()
    with pytest.raises(DeviceNotAllowed, match=f"{name} is a symlink"):
        open_function(X520, real_sysfs)
    assert outside.read_bytes() == before
    assert (real_sysfs / "bus/pci/drivers/ixgbe/unbind").read_text() == ""


def test_a_real_function_driver_link_must_lead_to_a_kernel_driver(
    real_sysfs: Path, tmp_path: Path
) -> None:
    path = fake_function(real_sysfs, X520, 0x8086, 0x10FB, 0x020000)
    evil = tmp_path / "evil-driver"
    evil.mkdir()
    (evil / "unbind").write_text("")
    os.symlink(evil, path / "driver")
    with pytest.raises(DeviceNotAllowed, match="not a driver in"):
        open_function(X520, real_sysfs)
    assert (evil / "unbind").read_text() == ""
    assert command_register(path / "config") == 0


# ---------------------------------------------------------------------------- model ports
@pytest.fixture
def port(rundir: Path) -> PortFiles:
    return PortFiles.create(rundir, "t.0")


def test_a_model_port_opens_and_resolves_inside_its_directory(port: PortFiles) -> None:
    function, mm = open_function(MODEL_PCI_ADDRESS, port.sysfs_root)
    try:
        assert function.is_model
        assert function.port_dir == port.directory.resolve()
        assert function.path == port.pci_dir.resolve()
        assert function.lock is not None
        assert function.lock.path == function.port_dir / pci.MODEL_LOCK
        assert len(mm) == regs.BAR0_SIZE
    finally:
        mm.close()
        function.release()
    function, mm = open_function(MODEL_PCI_ADDRESS, port.sysfs_root, lock_model=False)
    mm.close()
    assert function.lock is None  # for a caller that locks the port itself


def test_a_vanished_model_port_is_named_not_blamed_on_root(port: PortFiles) -> None:
    function, mm = open_function(MODEL_PCI_ADDRESS, port.sysfs_root)
    try:
        (port.pci_dir / "config").unlink()
        with pytest.raises(NicError, match=r"is the model port .* still there") as caught:
            function.disable_bus_master()
        assert "root" not in str(caught.value)
    finally:
        mm.close()
        function.release()


def test_disable_bus_master_clears_bit_2_only(port: PortFiles) -> None:
    config = port.pci_dir / "config"
    image = bytearray(config.read_bytes())
    struct.pack_into("<HH", image, regs.PCI_COMMAND, 0x0401, 0x0010)  # INTx off; status
    image[0x40:0x48] = b"capsvc!!"
    config.write_bytes(bytes(image))
    function, mm = open_function(MODEL_PCI_ADDRESS, port.sysfs_root)
    try:
        assert command_register(config) == 0x0407  # open set bus master and memory space
        function.disable_bus_master()
        expected = bytearray(image)
        struct.pack_into("<H", expected, regs.PCI_COMMAND, 0x0403)
        assert config.read_bytes() == bytes(expected)
        function.disable_bus_master()  # idempotent
        assert config.read_bytes() == bytes(expected)
    finally:
        mm.close()
        function.release()
    with pytest.raises(NicError, match="lock was released"):
        function.disable_bus_master()
    with pytest.raises(NicError, match="only for a function returned by open_function"):
        probe(MODEL_PCI_ADDRESS, port.sysfs_root).disable_bus_master()
    assert config.read_bytes() == bytes(expected)


def real_file() -> str:
    """A file of a real PCI function in this machine's /sys (only linked to, never
    written: the tripwire guards it)."""
    for entry in sorted(Path("/sys/bus/pci/devices").glob("*")):
        for name in ("resource0", "config"):
            if (entry / name).exists():
                return os.path.realpath(entry / name)
    pytest.skip("no PCI function in /sys")


def real_driver() -> str:
    """A kernel driver directory of this machine's /sys, preferably one with no device."""
    drivers = sorted(Path("/sys/bus/pci/drivers").glob("*"))
    if not drivers:
        pytest.skip("no PCI driver in /sys")
    idle = [d for d in drivers if not any(":" in p.name for p in d.iterdir())]
    return os.path.realpath((idle or drivers)[0])


def fake_driver(tmp_path: Path) -> Path:
    driver = tmp_path / "driver-ixgbe"
    driver.mkdir()
    (driver / "unbind").write_text("")
    return driver


@pytest.mark.usefixtures("no_writes_under_sys")
def test_a_marker_beside_a_link_to_a_real_bar_is_refused(port: PortFiles) -> None:
    (port.pci_dir / "resource0").unlink()
    os.symlink(real_file(), port.pci_dir / "resource0")
    before = (port.pci_dir / "config").read_bytes()
    with pytest.raises(DeviceNotAllowed, match=r"resource0 resolves to /sys/.*outside the model"):
        open_function(MODEL_PCI_ADDRESS, port.sysfs_root)
    assert (port.pci_dir / "config").read_bytes() == before


def test_a_model_resource0_outside_its_port_is_refused(port: PortFiles, tmp_path: Path) -> None:
    target = tmp_path / "bar"
    target.write_bytes(b"\xa5" * regs.BAR0_SIZE)
    (port.pci_dir / "resource0").unlink()
    os.symlink(target, port.pci_dir / "resource0")
    with pytest.raises(DeviceNotAllowed, match="outside the model port"):
        open_function(MODEL_PCI_ADDRESS, port.sysfs_root)
    assert target.read_bytes() == b"\xa5" * regs.BAR0_SIZE


@pytest.mark.usefixtures("no_writes_under_sys")
@pytest.mark.parametrize("where", ["fake", "real"])
def test_a_model_with_a_driver_link_is_refused(port: PortFiles, tmp_path: Path, where: str) -> None:
    driver = fake_driver(tmp_path) if where == "fake" else Path(real_driver())
    os.symlink(driver, port.pci_dir / "driver")
    before = (port.pci_dir / "config").read_bytes()
    with pytest.raises(DeviceNotAllowed, match="a model port has no kernel driver"):
        open_function(MODEL_PCI_ADDRESS, port.sysfs_root)
    if where == "fake":
        assert (driver / "unbind").read_text() == ""
    assert (port.pci_dir / "config").read_bytes() == before


@pytest.mark.usefixtures("no_writes_under_sys")
def test_a_model_config_linked_to_a_real_config_is_refused(port: PortFiles) -> None:
    config = port.pci_dir / "config"
    config.unlink()
    os.symlink(real_file(), config)
    with pytest.raises(DeviceNotAllowed, match="config is a symlink"):
        open_function(MODEL_PCI_ADDRESS, port.sysfs_root)


@pytest.mark.usefixtures("no_writes_under_sys")
@pytest.mark.parametrize("name", ["bar", "control", "kick-model", "lock"])
def test_a_model_port_file_linked_elsewhere_is_refused(port: PortFiles, name: str) -> None:
    path = port.directory / name
    if name == "bar":  # resource0 must still resolve inside the port: give it a copy
        (port.directory / "bar-copy").write_bytes(path.read_bytes())
        (port.pci_dir / "resource0").unlink()
        os.symlink(port.directory / "bar-copy", port.pci_dir / "resource0")
    if path.exists():
        path.unlink()
    os.symlink(real_file(), path)
    with pytest.raises(DeviceNotAllowed, match=f"{name} is a symlink"):
        open_function(MODEL_PCI_ADDRESS, port.sysfs_root)


@pytest.mark.parametrize("port_line", ["port=/", "port=relative", "port=/proc", "other"])
def test_a_marker_must_name_the_port_that_holds_it(
    port: PortFiles, tmp_path: Path, port_line: str
) -> None:
    marker = port.pci_dir / MODEL_MARKER
    if port_line == "other":
        (tmp_path / "other").mkdir()
        port_line = f"port={tmp_path / 'other'}"
    marker.write_text(port_line + "\ndma=shm\n")
    with pytest.raises(DeviceNotAllowed, match="port"):
        open_function(MODEL_PCI_ADDRESS, port.sysfs_root)
    assert command_register(port.pci_dir / "config") == 0


@pytest.mark.usefixtures("no_writes_under_sys")
def test_a_fake_tree_linking_into_sys_is_refused(tmp_path: Path) -> None:
    """No marker, links into /sys: refused as not a model, nothing followed."""
    root = tmp_path / "fake"
    path = fake_function(root, X520, 0x8086, 0x10FB, 0x020000)
    (path / "resource0").unlink()
    os.symlink(real_file(), path / "resource0")
    os.symlink(real_driver(), path / "driver")
    with pytest.raises(DeviceNotAllowed, match=f"has no {MODEL_MARKER} marker"):
        open_function(X520, root)
    # and with a marker, the driver link is refused before anything else is looked at
    (path / MODEL_MARKER).write_text(f"port={tmp_path}\n")
    with pytest.raises(DeviceNotAllowed, match="a model port has no kernel driver"):
        open_function(X520, root)
    assert command_register(path / "config") == 0


@pytest.mark.usefixtures("no_writes_under_sys")
def test_a_function_directory_linked_into_sys_devices_is_refused(tmp_path: Path) -> None:
    functions = sorted(Path("/sys/bus/pci/devices").glob("*"))
    if not functions:
        pytest.skip("no PCI function in /sys")
    real = os.path.realpath(functions[0])
    entries = tmp_path / "bus" / "pci" / "devices"
    entries.mkdir(parents=True)
    os.symlink(real, entries / functions[0].name)
    with pytest.raises(DeviceNotAllowed, match="opened only through the sysfs root /sys"):
        open_function(functions[0].name, tmp_path)
    # a symlinked sysfs root into /sys is the real sysfs, with all its checks
    os.symlink("/sys", tmp_path / "sys-link")
    assert not resolve_function(functions[0].name, tmp_path / "sys-link").is_model


def test_the_driver_package_imports_neither_trio_nor_the_rpc_layer() -> None:
    """DESIGN.md: capsvc/nicdriver never imports capsvc.rpc; trio only in the transport."""
    import ast

    package = Path(__file__).resolve().parents[2] / "capsvc" / "nicdriver"
    for module in package.glob("*.py"):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith("trio"), f"{module.name} imports {name}"
                assert not name.startswith("capsvc.rpc"), f"{module.name} imports {name}"
                assert name != "capsvc" or isinstance(node, ast.ImportFrom), module.name
