"""PCI discovery through sysfs, the allow-list, and opening (spec nicdriver.md 1.1)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from capsvc.nicdriver import regs
from capsvc.nicdriver.errors import DeviceNotAllowed, DeviceNotFound, NicError
from capsvc.nicdriver.pci import canonical_address, list_functions, open_function, probe


def fake_function(
    root: Path, address: str, vendor: int, device: int, class_code: int, driver: str | None = None
) -> Path:
    path = root / "bus" / "pci" / "devices" / address
    path.mkdir(parents=True)
    config = bytearray(256)
    struct.pack_into("<HH", config, 0, vendor, device)
    struct.pack_into("<I", config, 8, class_code << 8)
    (path / "config").write_bytes(bytes(config))
    (path / "resource0").write_bytes(bytes(regs.BAR0_SIZE))
    if driver is not None:
        drivers = root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True)
        (drivers / "unbind").write_text("")
        os.symlink(drivers, path / "driver")
    return path


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    fake_function(tmp_path, "0000:00:03.0", 0x1AF4, 0x1041, 0x020000, driver="virtio-pci")
    fake_function(tmp_path, "0000:03:00.0", 0x8086, 0x10FB, 0x020000, driver="ixgbe")
    fake_function(tmp_path, "0000:03:10.0", 0x8086, 0x10ED, 0x020000)  # a VF
    fake_function(tmp_path, "0000:00:1f.0", 0x8086, 0x1234, 0x060100)  # ISA bridge
    return tmp_path


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
    assert set(functions) == {"0000:00:03.0", "0000:03:00.0", "0000:03:10.0", "0000:00:1f.0"}
    x520 = functions["0000:03:00.0"]
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
        with pytest.raises(DeviceNotAllowed):
            open_function(address, sysfs)
    # the virtio NIC's driver was not unbound
    assert (sysfs / "bus/pci/devices/0000:00:03.0/driver").is_symlink()
    assert (sysfs / "bus/pci/drivers/virtio-pci/unbind").read_text() == ""


def test_missing_device_names_the_candidates(sysfs: Path) -> None:
    with pytest.raises(DeviceNotFound, match=r"0000:00:03\.0.*capsvc nic list"):
        probe("0000:05:00.0", sysfs)


def test_opening_unbinds_enables_bus_master_and_maps(sysfs: Path) -> None:
    function, mm = open_function("0000:03:00.0", sysfs)
    try:
        assert len(mm) == regs.BAR0_SIZE
        assert (sysfs / "bus/pci/drivers/ixgbe/unbind").read_text() == "0000:03:00.0"
        config = (function.path / "config").read_bytes()
        (command,) = struct.unpack_from("<H", config, 4)
        assert command & 0b110 == 0b110  # bus master and memory space
    finally:
        mm.close()


def test_refusing_to_unbind(sysfs: Path) -> None:
    with pytest.raises(NicError, match="unbind it first"):
        open_function("0000:03:00.0", sysfs, unbind=False)


def test_real_sysfs_listing_is_read_only() -> None:
    """On this machine: lists without touching anything; its virtio NIC is never allowed."""
    for function in list_functions("/sys"):
        if function.vendor == regs.VIRTIO_VENDOR:
            assert not function.allowed
            assert function.refusal() is not None


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
