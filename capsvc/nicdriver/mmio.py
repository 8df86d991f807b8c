"""BAR0 register access: exact aligned 32-bit loads and stores on a memoryview.

Theory of operation
-------------------
Spec nicdriver.md 4.2: BAR0 must be accessed with aligned 32-bit loads and stores only.
:class:`Bar` keeps ``memoryview(mmap).cast('I')`` and indexes it with ``offset >> 2``: CPython
does each item access with a fixed-size 4-byte ``memcpy`` that compilers emit as one ``mov``
on x86-64. Slicing the mmap or ``mmap.read``/``write`` (variable-length copies) are never
used on the BAR. CPython re-reads memory on every access, so polling loops see device
updates; x86-64's store and load ordering (spec 4.3) makes "descriptor stores, then tail
store" and "DD load, then length load" safe without barriers. Other architectures would need
barriers that Python cannot emit: the driver refuses to open real hardware off x86-64.

Hot paths do not call :meth:`Bar.write32` per packet: they take a *doorbell* once
(:meth:`Bar.doorbell`), a callable that stores one tail register.

:class:`ModelBar` is the model-flavoured accessor of spec 2.1 seam 2. Plain shared memory
cannot see a read, so clear-on-read counters are emulated from the model's monotonic totals
in the control file: a read of a 32-bit counter returns "total minus total at the last read"
(never older than the last device reset); for a low/high pair the low read takes the
snapshot and returns the low half, the high read returns the high half and advances the
snapshot. It also gives the model *wake-up hints*: when the model says it sleeps
(``MODEL_SLEEPING`` in the control file), a register write or doorbell pokes the model's
FIFO, and the driver's poll loop may wait on its own FIFO that the model pokes after an RX
write-back. These are the model's stand-in for the MSI-X interrupts that real hardware has
only with VFIO; both sides keep timeouts, so hints only cut latency. RX tail writes never
poke (``doorbell(..., urgent=False)``): returning descriptors needs no immediate action.
An event loop may set :attr:`Bar.deferred`: TX doorbells then only store, and the poke
happens in :meth:`Bar.flush_wakeups`, which the loop calls just before it blocks, so the
process it wakes does not compete with the rest of its own work for a CPU.
:meth:`Bar.service` and :meth:`Bar.next_deadline` let a poll loop run a device that needs
it (the co-located model of :mod:`capsvc.nicdriver.colocated`); for hardware and the
process model they do nothing.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from collections.abc import Callable
from pathlib import Path

from capsvc.nicdriver import control as ctl
from capsvc.nicdriver.control import Control
from capsvc.nicdriver.errors import DriverTimeout
from capsvc.nicdriver.regs import COUNTER_SLOT, HIGH_HALF, PAIR_COUNTERS

__all__ = ["Bar", "ModelBar"]

Doorbell = Callable[[int], None]


class Bar:
    """A mapped BAR0 with 32-bit register access."""

    def __init__(self, mm: mmap.mmap, name: str = "BAR0") -> None:
        self._mm = mm
        self.name = name
        self.regs = memoryview(mm).cast("I")

    # ------------------------------------------------------------------ access
    def read32(self, offset: int) -> int:
        return int(self.regs[offset >> 2])

    def write32(self, offset: int, value: int) -> None:
        self.regs[offset >> 2] = value & 0xFFFFFFFF

    def set_flags(self, offset: int, flags: int) -> None:
        """Read-modify-write: set ``flags``."""
        self.write32(offset, self.read32(offset) | flags)

    def clear_flags(self, offset: int, flags: int) -> None:
        """Read-modify-write: clear ``flags``."""
        self.write32(offset, self.read32(offset) & ~flags)

    def doorbell(self, offset: int, *, urgent: bool = True) -> Doorbell:
        """A callable storing a tail register (one 32-bit store per call).

        ``urgent``: the device should act at once (TX tails); RX tails only return
        descriptors, which a model may pick up at its own pace.
        """
        regs = self.regs
        index = offset >> 2

        def ring(value: int) -> None:
            regs[index] = value

        return ring

    def wait_set(self, offset: int, mask: int, what: str, timeout: float = 2.0) -> None:
        """Poll until all of ``mask`` reads 1 (ixy polls without limit; we give up)."""
        self._wait(offset, mask, mask, what, timeout)

    def wait_clear(self, offset: int, mask: int, what: str, timeout: float = 2.0) -> None:
        """Poll until all of ``mask`` reads 0."""
        self._wait(offset, mask, 0, what, timeout)

    def _wait(self, offset: int, mask: int, want: int, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.read32(offset) & mask != want:
            if time.monotonic() > deadline:
                raise DriverTimeout(
                    f"{self.name}: timed out after {timeout:g} s waiting for {what} "
                    f"(register 0x{offset:05X} reads 0x{self.read32(offset):08X})"
                    + self._timeout_hint()
                )
            time.sleep(0.001)

    def _timeout_hint(self) -> str:
        return ""

    # ------------------------------------------------------------------ idle waiting
    deferred = False  # doorbells leave their wake-up work to flush_wakeups()

    def flush_wakeups(self) -> None:
        """Do the wake-up work that deferred doorbells left (a model's poke or step).

        An event loop calls this just before it blocks: waking another process earlier,
        in the middle of our own work, only makes the two compete for one CPU.
        """
        return None

    def service(self) -> None:
        """Let the device run (a co-located model steps here; hardware runs by itself)."""
        return None

    def next_deadline(self) -> float | None:
        """When :meth:`service` has timed work to do (``time.monotonic`` seconds), if ever."""
        return None

    def idle_fd(self) -> int | None:
        """A file descriptor that becomes readable when RX work may be waiting, or None
        (real hardware without VFIO: poll only)."""
        return None

    def begin_idle(self) -> None:
        """The caller is about to sleep on :meth:`idle_fd`."""

    def end_idle(self, drain: bool = True) -> None:
        """The caller woke up (``drain``: because :meth:`idle_fd` became readable)."""

    def close(self) -> None:
        self.regs.release()
        self._mm.close()


class ModelBar(Bar):
    """BAR0 of a software model: clear-on-read shim and wake-up hints (spec 2.1 seam 2)."""

    def __init__(self, mm: mmap.mmap, port_dir: Path, name: str = "model BAR0") -> None:
        super().__init__(mm, name)
        self.port_dir = port_dir
        self.control = Control(port_dir / "control")
        self._words = self.control.words
        self._last = [0] * len(self.control.counters)
        self._pending: dict[int, tuple[int, int]] = {}  # slot -> (snapshot, high half)
        self._model_fifo = port_dir / "kick-model"
        self._model_fd = -1
        self._driver_fd = -1
        self._words[ctl.W_DRIVER_PID] = os.getpid()

    # ------------------------------------------------------------------ reads
    def read32(self, offset: int) -> int:
        slot = COUNTER_SLOT.get(offset)
        if slot is not None:
            total = int(self.control.counters[slot])
            last = max(self._last[slot], int(self.control.counter_base[slot]))
            delta = total - last
            if offset in _PAIR_LOWS:
                self._pending[slot] = (total, delta >> 32)
            else:
                self._last[slot] = total
            return delta & 0xFFFFFFFF
        slot = HIGH_HALF.get(offset)
        if slot is not None:
            snapshot, high = self._pending.pop(slot, (self._last[slot], 0))
            self._last[slot] = snapshot
            return high & 0xFFFFFFFF
        return int(self.regs[offset >> 2])

    # ------------------------------------------------------------------ writes + hints
    def write32(self, offset: int, value: int) -> None:
        self.regs[offset >> 2] = value & 0xFFFFFFFF
        if self._words[ctl.W_MODEL_SLEEPING]:
            self._poke_model()

    def doorbell(self, offset: int, *, urgent: bool = True) -> Doorbell:
        if not urgent:
            return super().doorbell(offset)
        regs = self.regs
        words = self._words
        index = offset >> 2
        sleeping = ctl.W_MODEL_SLEEPING
        poke = self._poke_model

        def ring(value: int) -> None:
            regs[index] = value
            if self.deferred:
                self._wakeup_pending = True
            elif words[sleeping]:
                poke()

        return ring

    _wakeup_pending = False

    def flush_wakeups(self) -> None:
        if self._wakeup_pending:
            self._wakeup_pending = False
            if self._words[ctl.W_MODEL_SLEEPING]:
                self._poke_model()

    def _poke_model(self) -> None:
        if self._model_fd < 0:
            try:
                self._model_fd = os.open(self._model_fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                return  # no model reading (it died): the driver's timeouts will tell
        try:
            os.write(self._model_fd, b"\0")
        except BlockingIOError:
            pass  # FIFO full: the model has plenty of wake-ups queued already
        except OSError as error:
            if error.errno in (errno.EPIPE, errno.EBADF):
                os.close(self._model_fd)
                self._model_fd = -1

    def _timeout_hint(self) -> str:
        if not self.control.model_alive():
            return f"; no model process serves {self.port_dir} (start one: capsvc nic start-pair)"
        return "; the model process is alive but did not answer"

    # ------------------------------------------------------------------ idle waiting
    def idle_fd(self) -> int | None:
        if self._driver_fd < 0:
            try:
                self._driver_fd = os.open(self.port_dir / "kick-driver", os.O_RDWR | os.O_NONBLOCK)
            except OSError:
                return None
        return self._driver_fd

    def begin_idle(self) -> None:
        self._words[ctl.W_DRIVER_SLEEPING] = 1

    def end_idle(self, drain: bool = True) -> None:
        self._words[ctl.W_DRIVER_SLEEPING] = 0
        if drain and self._driver_fd >= 0:
            try:
                while len(os.read(self._driver_fd, 4096)) == 4096:
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        for fd in (self._model_fd, self._driver_fd):
            if fd >= 0:
                os.close(fd)
        self._model_fd = self._driver_fd = -1
        if self._words[ctl.W_DRIVER_PID] == os.getpid():
            self._words[ctl.W_DRIVER_PID] = 0
            self._words[ctl.W_DRIVER_SLEEPING] = 0
        self.control.close()
        super().close()


_PAIR_LOWS = frozenset(low for low, _ in PAIR_COUNTERS)
