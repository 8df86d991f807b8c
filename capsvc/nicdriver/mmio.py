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

:class:`ModelBar` is the model-flavoured accessor of spec 2.1 seam 2, the model's half of
the BAR seam (the driver code is the same for hardware). It gives two kinds of register
device semantics that plain shared memory lacks:

- Clear-on-read counters, emulated from the model's monotonic totals in the control file:
  a read of a 32-bit counter returns "total minus total at the last read *by any reader*"
  (never older than the last device reset) and records the total as read in the control
  file, so the read clears the counter for every accessor of the port, as on hardware
  (issue 14, point 8). For a low/high pair the low read takes the snapshot and returns the
  low half, the high read returns the high half and clears the counter up to the snapshot
  (the pending high half is per reader).
- RXDCTL(n)/TXDCTL(n).ENABLE (issue 14, point 1; datasheet 4.6.7.1, 4.6.8.1): the BAR word
  holds what the driver wrote, so an ENABLE written there is a *request*; a read returns
  that word with ENABLE replaced by the device's state, which only the model writes (a
  bitmask per direction in the control file). So the bit reads 1 only once the model has
  latched a valid ring (an invalid ring leaves it 0 and counts ``bad_ring``: the driver's
  ``wait_set`` times out naming the register), and after the driver writes 0 it reads 1
  until the model has walked the queues again, which it does only between steps, i.e. after
  the DMA of the step that was running (a descriptor write-back, a frame being stored,
  a TX buffer being read) is complete; then 0. A driver that frees ring or buffer memory
  before it has read 0 may be hit by that DMA (the model records a ``dma_violation``).
  Each write of one of these registers also bumps the queue's write count in the control
  file, so enabling a queue again after the device dropped it (a DMA fault) is seen even
  though the BAR word does not change. Read-modify-writes (``set_flags``) see the device's
  ENABLE, as on hardware: writing another field of a queue whose enable is still pending
  writes ENABLE = 0.

It also gives the model *wake-up hints*: when the model says it sleeps
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
from capsvc.nicdriver import regs as _regs
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
    """BAR0 of a software model: clear-on-read counters, queue-enable semantics and
    wake-up hints (spec 2.1 seam 2)."""

    def __init__(self, mm: mmap.mmap, port_dir: Path, name: str = "model BAR0") -> None:
        super().__init__(mm, name)
        self.port_dir = port_dir
        self.control = Control(port_dir / "control")
        self._words = self.control.words
        self._pending: dict[int, tuple[int, int]] = {}  # slot -> (snapshot, high half)
        self._model_fifo = port_dir / "kick-model"
        self._model_fd = -1
        self._driver_fd = -1
        self._words[ctl.W_DRIVER_PID] = os.getpid()

    # ------------------------------------------------------------------ reads
    def read32(self, offset: int) -> int:
        special = _SPECIAL.get(offset)
        if special is None:
            return int(self.regs[offset >> 2])
        kind, arg = special
        if kind == _QCTL:
            word, bit = divmod(arg, 64)  # word: W_RXQ_ENABLED or W_TXQ_ENABLED
            value = int(self.regs[offset >> 2]) & ~_ENABLE
            return (value | _ENABLE) if self._words[word] >> bit & 1 else value
        c = self.control
        if kind == _HIGH:
            snapshot, high = self._pending.pop(arg, (0, 0))
            if snapshot > c.counter_taken[arg]:
                c.counter_taken[arg] = snapshot
            return high & 0xFFFFFFFF
        total = int(c.counters[arg])
        delta = total - max(int(c.counter_taken[arg]), int(c.counter_base[arg]))
        if kind == _LOW:
            self._pending[arg] = (total, delta >> 32)
        else:
            c.counter_taken[arg] = total  # cleared for every reader of this port
        return delta & 0xFFFFFFFF

    # ------------------------------------------------------------------ writes + hints
    def _store(self, offset: int, value: int) -> None:
        """The register store itself; a queue-control write also counts as a request."""
        self.regs[offset >> 2] = value & 0xFFFFFFFF
        gen = _QGEN.get(offset)
        if gen is not None:
            # after the store (the model reads the counts before the BAR words)
            words = self._words
            words[gen] += 1
            words[ctl.W_QCTL_WRITES] += 1

    def write32(self, offset: int, value: int) -> None:
        self._store(offset, value)
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


_SINGLE, _LOW, _HIGH, _QCTL = range(4)
_ENABLE = _regs.RXDCTL_ENABLE
assert _ENABLE == _regs.TXDCTL_ENABLE
_PAIR_LOWS = frozenset(low for low, _ in PAIR_COUNTERS)
# offset -> (kind, slot) for counters; (_QCTL, status word * 64 + queue) for queue enables
_SPECIAL: dict[int, tuple[int, int]] = {}
for _offset, _slot in COUNTER_SLOT.items():
    _SPECIAL[_offset] = (_LOW if _offset in _PAIR_LOWS else _SINGLE, _slot)
for _offset, _slot in HIGH_HALF.items():
    _SPECIAL[_offset] = (_HIGH, _slot)
_QGEN: dict[int, int] = {}  # queue-control offset -> its write-count word
for _q in range(64):
    _SPECIAL[_regs.RXDCTL(_q)] = (_QCTL, ctl.W_RXQ_ENABLED * 64 + _q)
    _SPECIAL[_regs.TXDCTL(_q)] = (_QCTL, ctl.W_TXQ_ENABLED * 64 + _q)
    _QGEN[_regs.RXDCTL(_q)] = ctl.W_QGEN_RX + _q
    _QGEN[_regs.TXDCTL(_q)] = ctl.W_QGEN_TX + _q
