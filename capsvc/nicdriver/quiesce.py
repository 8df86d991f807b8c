"""The 82599's register handshakes that stop and reset it: what ``IxgbeDevice.close``,
its error paths and its exit and signal handlers run (capsvc.nicdriver.ixgbe,
"Stopping").

Theory of operation: each step of the stop sequence is a function that waits on the
device with a bound (:data:`STOP_TIMEOUT`, logged when it runs out) and never raises:
RX off through the security block's handshake, each RX queue's enable polled until the
device clears it (datasheet 4.6.7.1.2: only after its pending memory accesses), TX
drained and its queues stopped, master disable and a device reset, then Bus Master
Enable cleared. :func:`_quiesce` runs the steps not yet confirmed, so a signal handler
or the atexit handler can finish a stop that was interrupted; :func:`_quiet` says whether
the device is known to access no memory any more (then, and only then, the caller frees
its DMA memory).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from capsvc.nicdriver import regs
from capsvc.nicdriver.mmio import Bar
from capsvc.nicdriver.pci import PciFunction

log = logging.getLogger("capsvc.nic")

# Waits, in seconds
POLL_INTERVAL = 0.0005
RESET_DELAY = 0.001  # after writing CTRL.RST, before the first poll
RESET_SETTLE = 0.01  # after the reset completed (ixy)
MASTER_DISABLE_TIMEOUT = 0.08  # STATUS.GIO_MASTER_ENABLE to clear (Linux: 800 x 100 us)
SECRX_TIMEOUT = 0.04  # SECRXSTAT.SECRX_RDY (Linux: 40 x 1 ms, then goes on regardless)
STOP_TIMEOUT = 0.1  # each wait of the stop sequence (queue disables, TX drain, reset)
RX_QUIESCE = 100e-6  # after RXDCTL.ENABLE reads 0, before the ring memory is released


def _poll(bar: Bar, offset: int, mask: int, want: int, timeout: float) -> bool:
    """Poll until ``read32(offset) & mask == want``; False when ``timeout`` ran out."""
    deadline = time.monotonic() + timeout
    while bar.read32(offset) & mask != want:
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_INTERVAL)
    return True


_SECRX_WARNED: set[str] = set()


def _set_rx_enable(bar: Bar, on: bool) -> bool:
    """Change RXCTRL.RXEN with the security RX path stopped [4.6.7]: set SECRXCTRL.RX_DIS,
    wait for SECRXSTAT.SECRX_RDY, change RXEN, clear RX_DIS. Like Linux's ixgbe, a path
    that never reports ready is logged and RXEN changes anyway. Returns readiness."""
    bar.set_flags(regs.SECRXCTRL, regs.SECRXCTRL_RX_DIS)
    ready = _poll(
        bar, regs.SECRXSTAT, regs.SECRXSTAT_SECRX_RDY, regs.SECRXSTAT_SECRX_RDY, SECRX_TIMEOUT
    )
    if not ready:
        level = logging.DEBUG if bar.name in _SECRX_WARNED else logging.WARNING
        _SECRX_WARNED.add(bar.name)
        log.log(
            level,
            "%s: SECRXSTAT.SECRX_RDY did not read 1 within %g ms (register 0x%05X reads "
            "0x%08X); changing RXCTRL.RXEN anyway",
            bar.name,
            SECRX_TIMEOUT * 1000,
            regs.SECRXSTAT,
            bar.read32(regs.SECRXSTAT),
        )
    if on:
        bar.set_flags(regs.RXCTRL, regs.RXCTRL_RXEN)
    else:
        bar.clear_flags(regs.RXCTRL, regs.RXCTRL_RXEN)
    bar.clear_flags(regs.SECRXCTRL, regs.SECRXCTRL_RX_DIS)
    return ready


def _reset(bar: Bar, *, strict: bool) -> bool:
    """Master disable, then device reset; True when the reset's self-clear was seen.

    Master disable [5.2.5.3.2]: set CTRL.GIO_MASTER_DISABLE and wait (bounded) for
    STATUS.GIO_MASTER_ENABLE to read 0, i.e. no master request pending; when it does not,
    the datasheet asks for two consecutive resets. Reset [4.6.3.2]: CTRL.RST | LNK_RST
    (read-modify-write, so master disable stays set meanwhile), wait 1 ms, then poll
    until both bits read 0. ``strict`` (init) raises :class:`DriverTimeout` when the
    reset does not complete; otherwise (stop) it is logged.
    """
    bar.set_flags(regs.CTRL, regs.CTRL_GIO_MASTER_DISABLE)
    quiet = _poll(bar, regs.STATUS, regs.STATUS_GIO_MASTER_ENABLE, 0, MASTER_DISABLE_TIMEOUT)
    if not quiet:
        log.warning(
            "%s: STATUS.GIO_MASTER_ENABLE still set %g ms after master disable (requests "
            "pending); resetting twice (datasheet 5.2.5.3.2)",
            bar.name,
            MASTER_DISABLE_TIMEOUT * 1000,
        )
    for _ in range(1 if quiet else 2):
        bar.write32(regs.CTRL, bar.read32(regs.CTRL) | regs.CTRL_RST_MASK)
        time.sleep(RESET_DELAY)
        what = "CTRL.RST to self-clear (device reset)"
        if strict:
            bar.wait_clear(regs.CTRL, regs.CTRL_RST_MASK, what)
        elif not _poll(bar, regs.CTRL, regs.CTRL_RST_MASK, 0, STOP_TIMEOUT):
            log.warning(
                "%s: timed out after %g s waiting for %s (CTRL reads 0x%08X)",
                bar.name,
                STOP_TIMEOUT,
                what,
                bar.read32(regs.CTRL),
            )
            return False
    return True


def _stop_rx(bar: Bar, queues: Sequence[int]) -> bool:
    """RXEN off, each RXDCTL.ENABLE off and polled until the device clears it (only after
    its pending memory accesses [4.6.7.1.2]), then 100 us more."""
    _set_rx_enable(bar, False)
    for i in queues:
        bar.clear_flags(regs.RXDCTL(i), regs.RXDCTL_ENABLE)
    done = True
    for i in queues:
        if not _poll(bar, regs.RXDCTL(i), regs.RXDCTL_ENABLE, 0, STOP_TIMEOUT):
            done = False
            log.warning(
                "%s: RXDCTL(%d).ENABLE still reads 1 %g s after it was cleared; "
                "resetting the device anyway",
                bar.name,
                i,
                STOP_TIMEOUT,
            )
    time.sleep(RX_QUIESCE)
    return done


def _stop_tx(bar: Bar, queues: Sequence[int]) -> bool:
    """Wait for each TX ring to drain (TDH == TDT), then TXDCTL.ENABLE off and polled."""
    done = True
    for i in queues:
        deadline = time.monotonic() + STOP_TIMEOUT
        while (head := bar.read32(regs.TDH(i))) != (tail := bar.read32(regs.TDT(i))):
            if time.monotonic() > deadline:
                done = False
                log.warning(
                    "%s: TX queue %d did not drain within %g s (TDH %d, TDT %d; no link?); "
                    "disabling it anyway",
                    bar.name,
                    i,
                    STOP_TIMEOUT,
                    head,
                    tail,
                )
                break
            time.sleep(POLL_INTERVAL)
    for i in queues:
        bar.clear_flags(regs.TXDCTL(i), regs.TXDCTL_ENABLE)
    for i in queues:
        if not _poll(bar, regs.TXDCTL(i), regs.TXDCTL_ENABLE, 0, STOP_TIMEOUT):
            done = False
            log.warning("%s: TXDCTL(%d).ENABLE still reads 1; resetting anyway", bar.name, i)
    return done


# The stop sequence, in order. A step that confirmed what it waited for records True.
_STOP_RX = "stop RX"
_STOP_TX = "drain and stop TX"
_STOP_RESET = "reset"
_STOP_BUS_MASTER = "clear bus mastering"


def _quiet(done: dict[str, bool]) -> bool:
    """Does the device access no memory any more (reset completed, or no bus mastering)?"""
    return done.get(_STOP_RESET, False) or done.get(_STOP_BUS_MASTER, False)


def _clear_bus_master(function: PciFunction) -> bool:
    function.disable_bus_master()
    return True


def _quiesce(
    bar: Bar,
    function: PciFunction,
    rx: Sequence[int],
    tx: Sequence[int],
    done: dict[str, bool],
) -> bool:
    """Run the stop steps not yet in ``done`` (step -> confirmed); never raises an error
    of its own: a failing step is logged and the next one runs. A ``KeyboardInterrupt`` or
    ``SystemExit`` raised meanwhile is re-raised after the last step."""
    steps: tuple[tuple[str, Callable[[], bool]], ...] = (
        (_STOP_RX, lambda: _stop_rx(bar, rx)),
        (_STOP_TX, lambda: _stop_tx(bar, tx)),
        (_STOP_RESET, lambda: _reset(bar, strict=False)),
        (_STOP_BUS_MASTER, lambda: _clear_bus_master(function)),
    )
    interrupted: BaseException | None = None
    for name, step in steps:
        if name in done:
            continue
        try:
            done[name] = step()
        except Exception as error:
            done[name] = False  # tried: a later stop (signal, exit) does not repeat it
            log.warning("%s: %s failed while stopping: %r", function.address, name, error)
        except BaseException as error:  # an interrupt: finish the stop, then raise it
            if interrupted is None:
                interrupted = error
    log.debug("%s: stopped (%s)", function.address, done)
    if interrupted is not None:
        raise interrupted
    return _quiet(done)
