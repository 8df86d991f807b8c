"""Typed errors of the NIC backend, each saying what is missing and how to provide it.

Theory of operation
-------------------
The driver touches things a user must set up by hand (a PCI device unbound from its kernel
driver, huge pages, root rights). When one is missing, the error names the exact thing
(the file, the counter in /proc/meminfo, the capability) and the command that provides it,
so nobody has to read the source to get going (spec nicdriver.md 1.1, 1.2, 4.4).

All errors derive from :class:`NicError`, itself an ``OSError`` so that callers handling
"the transport could not be opened" (the CLI, ``capsvc.connect``) treat a missing NIC like
a refused TCP connection.
"""

from __future__ import annotations

__all__ = [
    "DeviceBusy",
    "DeviceNotAllowed",
    "DeviceNotFound",
    "DmaError",
    "DriverTimeout",
    "HugepagesUnavailable",
    "LinkDown",
    "ModelNotRunning",
    "NicError",
    "PagemapUnavailable",
]


class NicError(OSError):
    """Base class of every NIC backend error."""


class DeviceNotFound(NicError):
    """No such PCI function (or model port)."""


class DeviceNotAllowed(NicError):
    """The PCI function exists but is not an allow-listed 82599 SFP+ physical function
    (other ixgbe boards, the X540 included, need link setup the driver does not have)."""


class DeviceBusy(NicError):
    """Another process drives this device (model ports are locked per process)."""


class HugepagesUnavailable(NicError):
    """No hugetlbfs mount or no free 2 MiB huge pages."""


class PagemapUnavailable(NicError):
    """/proc/self/pagemap reports no page frame numbers (needs CAP_SYS_ADMIN)."""


class DmaError(NicError):
    """A DMA allocation cannot be satisfied (too large, not contiguous)."""


class DriverTimeout(NicError):
    """The device did not reach a state the init sequence waits for (spec 1.4)."""


class LinkDown(NicError):
    """No link after the wait of spec 1.4 step 14."""


class ModelNotRunning(NicError):
    """A model port exists on disk but no model process serves it."""


HUGEPAGE_HOWTO = (
    "reserve 2 MiB huge pages and mount hugetlbfs (as root):\n"
    "    echo 512 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages\n"
    "    mkdir -p /mnt/huge && mount -t hugetlbfs -o pagesize=2M nodev /mnt/huge\n"
    "(ixy's setup-hugetlbfs.sh does the same; `capsvc nic list` shows what is there)"
)

UNBIND_HOWTO = (
    "the driver needs the device's BAR0 (resource0), which only root may map; run as root "
    "on a kernel without lockdown (Secure Boot forbids mapping PCI resources)"
)
