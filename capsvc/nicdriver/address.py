"""``nic:`` addresses: the grammar of what follows ``nic:`` (pure, no I/O).

Theory of operation
-------------------
::

    nic:DEVICE[,OPTION...]
    DEVICE := model:NAME          a software model port (``capsvc nic start-pair NAME``
                                  creates NAME.0 and NAME.1, wired back to back)
            | dddd:bb:dd.f        a real 82599/X540 by PCI address (``bb:dd.f`` = domain 0)
    OPTION := peer=MAC            connect: send the SYN to MAC rather than to broadcast
            | sysfs=DIR           PCI devices: sysfs root (default /sys)
            | rundir=DIR          model ports: where they live (default $CAPSVC_NIC_RUNDIR,
                                  else /dev/shm/capsvc-nic)
            | link_timeout=SECS   how long opening the device waits for the link (the
                                  driver's ``reset_and_init(link_timeout=...)``, default
                                  10 s); 0 opens without waiting

:func:`parse_nic_spec` validates and canonicalises (PCI addresses get their domain and lower
case); ``str(spec)`` gives the canonical address back, so parsing it again is the identity.
The transport (:mod:`capsvc.transport.nic`) opens what a spec names; :meth:`NicSpec.key`
identifies the device, so that one process opens each device once. This module imports
nothing heavy (no trio, no driver), so address parsing can use it freely.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from capsvc.nicdriver.pci import canonical_address

__all__ = ["NicSpec", "check_name", "parse_nic_spec"]

_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def check_name(name: str) -> str:
    if not name or not set(name) <= _NAME_OK or name.startswith("."):
        raise ValueError(f"bad model port name {name!r}: use letters, digits, '_', '.', '-'")
    return name


@dataclass(frozen=True)
class NicSpec:
    """A parsed ``nic:`` address."""

    device: str  # "model:NAME" or a canonical PCI address
    peer: bytes | None = None
    sysfs: str | None = None
    rundir: str | None = None
    link_timeout: float | None = None  # seconds; None: the driver's default

    @property
    def is_model(self) -> bool:
        return self.device.startswith("model:")

    def __str__(self) -> str:
        options = []
        if self.peer is not None:
            options.append(f"peer={self.peer.hex(':')}")
        if self.sysfs is not None:
            options.append(f"sysfs={self.sysfs}")
        if self.rundir is not None:
            options.append(f"rundir={self.rundir}")
        if self.link_timeout is not None:
            options.append(f"link_timeout={self.link_timeout!r}")
        return ",".join([f"nic:{self.device}", *options])

    def key(self) -> tuple[str, str]:
        """The device (options that only tune how it is opened are not part of it)."""
        if self.is_model:
            return (self.device, os.path.abspath(self.rundir or _default_rundir()))
        return (self.device, os.path.abspath(self.sysfs or "/sys"))


_OPTIONS = ("peer", "sysfs", "rundir", "link_timeout")


def _default_rundir() -> str:
    return os.environ.get("CAPSVC_NIC_RUNDIR", "/dev/shm/capsvc-nic")


def parse_nic_spec(text: str) -> NicSpec:
    """Parse what follows ``nic:`` (a leading ``nic:`` is accepted too).

    Raises:
        ValueError: naming what is malformed.
    """
    if text.lower().startswith("nic:"):
        text = text[4:]
    device, *options = text.split(",")
    if not device:
        raise ValueError("malformed nic: address: expected nic:model:NAME or nic:PCI_ADDRESS")
    if device.startswith("model:"):
        device = "model:" + check_name(device[6:])
    else:
        try:
            device = canonical_address(device)
        except ValueError:
            raise ValueError(
                f"malformed nic: address {text!r}: expected model:NAME or a PCI address "
                "such as 0000:03:00.0"
            ) from None
    values: dict[str, str] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in _OPTIONS or not value:
            raise ValueError(
                f"unknown nic: option {option!r} "
                "(peer=MAC, sysfs=DIR, rundir=DIR, link_timeout=SECONDS)"
            )
        values[key] = value
    peer = None
    if "peer" in values:
        try:
            peer = bytes.fromhex(values["peer"].replace(":", "").replace("-", ""))
        except ValueError:
            peer = b""
        if len(peer) != 6:
            raise ValueError(f"peer={values['peer']} is not a MAC address")
    link_timeout = None
    if "link_timeout" in values:
        try:
            link_timeout = float(values["link_timeout"])
        except ValueError:
            link_timeout = -1.0
        if not 0 <= link_timeout <= 3600:
            raise ValueError(
                f"link_timeout={values['link_timeout']} is not a number of seconds "
                "within 0..3600 (0: do not wait for the link)"
            )
    return NicSpec(device, peer, values.get("sysfs"), values.get("rundir"), link_timeout)
