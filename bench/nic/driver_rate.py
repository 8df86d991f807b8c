"""Driver packet rate against batch size, the model's own cost reported apart (pyperf).

    python -m bench.nic.driver_rate [pyperf options, e.g. --fast, -o out.json]
    python -m bench.nic.driver_rate --quick      # no pyperf: one timed pass per batch size

Setup (once per worker process): two model ports wired back to back *in this process*
(PairWire hand-off), both initialised by the real driver (the model runs in a thread for
the init sequence only, then is stepped by hand). ``population`` frames of 64 bytes
(ixy's packet size) circulate in each direction.

One iteration is ixy-fwd in both directions: ``rx_batch(batch)`` on port A, touch one byte
of every packet (ixy-fwd does ``data[1] += 1``), ``tx_batch`` on port B; the same from B to
A; then the models step (A, B, A: each TX engine sends what the driver queued, the peer's
RX engine writes it into the other ring, so every frame is back in a ring for the next
iteration). The driver's calls and the models' steps are timed
separately, so two benchmarks come out per batch size:

- ``nic-driver-fwd-bN``: seconds per forwarded packet spent in the driver (the figure to
  compare with ixy's: spec nicdriver.md 3.1, Python/ixy.py 0.16 Mpps, C about 27 Mpps at
  3.3 GHz, both at batch 32 and above);
- ``nic-model-bN``: seconds per packet spent in the software 82599 (our test harness; a
  real NIC does this in silicon).

At the end the parent prints a table in Mpps with the published figures beside it.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
PUBLISHED_33GHZ = {  # spec nicdriver.md 3.1, bidirectional forwarding, Mpps
    "C": [8.33, 14.31, 20.94, 25.98, 27.44, 27.44, 27.45, 27.44, 27.44],
    "ixy.py": [0.08, 0.08, 0.10, 0.12, 0.14, 0.14, 0.14, 0.16, 0.16],
}


class Rig:
    """Two driven model ports and the forwarding loop."""

    def __init__(self) -> None:
        from pathlib import Path

        from capsvc.nicdriver.ixgbe import IxgbeDevice
        from capsvc.nicdriver.modelhost import MODEL_PCI_ADDRESS, start_pair

        self.rundir = Path(tempfile.mkdtemp(prefix="capsvc-bench-", dir="/dev/shm"))
        self.host = start_pair("bench", rundir=self.rundir, spin=0)
        self.host.start_thread()
        self.a = IxgbeDevice.open(MODEL_PCI_ADDRESS, sysfs_root=self.rundir / "bench.0" / "sysfs")
        self.b = IxgbeDevice.open(MODEL_PCI_ADDRESS, sysfs_root=self.rundir / "bench.1" / "sysfs")
        self.a.reset_and_init()
        self.b.reset_and_init()
        self.host.stop()
        self.ma, self.mb = self.host.models
        self.population = 0

    def fill(self, batch: int) -> None:
        """Put ``population`` frames in flight each way (2 x batch, at most 480)."""
        self.drain()
        self.population = min(2 * batch, 480)
        for model, dst, src in (
            (self.ma, self.a.mac, self.b.mac),
            (self.mb, self.b.mac, self.a.mac),
        ):
            frame = dst + src + b"\x88\xb5" + bytes(46)  # 60 bytes + FCS = 64 on the wire
            for _ in range(self.population):
                model.inject(frame)
            model.step()

    def drain(self) -> None:
        for _ in range(4):
            self.ma.step()
            self.mb.step()
            for device in (self.a, self.b):
                bufs, _ = device.rx_batch(0, 4096)
                device.pools[0].space.free_batch(bufs)

    def run(self, loops: int, batch: int) -> tuple[float, float, int]:
        """``loops`` iterations; returns (driver seconds, model seconds, packets)."""
        rx_a, rx_b = self.a.rx_queues[0], self.b.rx_queues[0]
        tx_a, tx_b = self.a.tx_queues[0], self.b.tx_queues[0]
        mem_a, mem_b = rx_a.pool.mem, rx_b.pool.mem
        base_a, base_b = rx_a.pool.base, rx_b.pool.base
        space = rx_a.pool.space
        step_a, step_b = self.ma.step, self.mb.step
        clock = time.perf_counter
        driver = model = 0.0
        packets = 0
        for _ in range(loops):
            t0 = clock()
            for rx, tx, mem, base in ((rx_a, tx_b, mem_a, base_a), (rx_b, tx_a, mem_b, base_b)):
                bufs, lens = rx.rx_batch(batch)
                if bufs:
                    for buf in bufs:  # touch one byte of every packet, like ixy-fwd
                        i = ((buf - base) << 11) + 65
                        mem[i] = (mem[i] + 1) & 0xFF
                    sent = tx.tx_batch(bufs, lens)
                    packets += sent
                    if sent < len(bufs):
                        space.free_batch(bufs[sent:])
            t1 = clock()
            step_a()
            step_b()  # transmits B's frames into A's inbox ...
            step_a()  # ... which A's RX engine writes into A's ring now
            t2 = clock()
            driver += t1 - t0
            model += t2 - t1
        return driver, model, packets

    def close(self) -> None:
        if self.population < 0:
            return
        self.population = -1
        self.a.close()
        self.b.close()
        self.host.close()
        shutil.rmtree(self.rundir, ignore_errors=True)


_RIG: Rig | None = None


def _rig(batch: int) -> Rig:
    global _RIG
    if _RIG is None:
        _RIG = Rig()
        import atexit

        atexit.register(_RIG.close)
    if _RIG.population != min(2 * batch, 480):
        _RIG.fill(batch)
    return _RIG


def time_driver(loops: int, batch: int) -> float:
    driver, _, packets = _rig(batch).run(loops, batch)
    if packets != loops * 2 * batch:
        raise RuntimeError(f"forwarded {packets} packets, expected {loops * 2 * batch}")
    return driver


def time_model(loops: int, batch: int) -> float:
    _, model, _ = _rig(batch).run(loops, batch)
    return model


def quick(seconds: float) -> list[tuple[int, float, float]]:
    """One timed pass per batch size without pyperf: (batch, driver Mpps, model Mpps)."""
    rows = []
    for batch in BATCHES:
        rig = _rig(batch)
        rig.run(50, batch)  # warm-up
        loops = max(10, int(200_000 / batch))
        driver, model, packets = rig.run(loops, batch)
        while driver + model < seconds / len(BATCHES):
            d, m, p = rig.run(loops, batch)
            driver, model, packets = driver + d, model + m, packets + p
        rows.append((batch, packets / driver / 1e6, packets / model / 1e6))
    return rows


def table(rows: list[tuple[int, float, float]]) -> str:
    lines = [
        "| batch | driver Mpps | model Mpps | driver+model Mpps | ixy.py 3.3 GHz | C 3.3 GHz |",
        "|---|---|---|---|---|---|",
    ]
    for batch, drv, mdl in rows:
        k = BATCHES.index(batch)
        both = 1 / (1 / drv + 1 / mdl)
        lines.append(
            f"| {batch} | {drv:.2f} | {mdl:.3f} | {both:.3f} | "
            f"{PUBLISHED_33GHZ['ixy.py'][k]:.2f} | {PUBLISHED_33GHZ['C'][k]:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    if "--quick" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--quick", action="store_true")
        parser.add_argument("--seconds", type=float, default=10.0)
        args = parser.parse_args()
        print(table(quick(args.seconds)))
        return
    import pyperf

    runner = pyperf.Runner(processes=3, values=3, warmups=1)
    runner.metadata["description"] = "ixy-style forwarding against the software 82599"
    results: dict[tuple[str, int], Any] = {}
    for batch in BATCHES:
        for kind, func in (("driver-fwd", time_driver), ("model", time_model)):
            bench = runner.bench_time_func(
                f"nic-{kind}-b{batch}", func, batch, inner_loops=2 * batch
            )
            if bench is not None and not runner.args.worker:
                results[(kind, batch)] = bench
    if len(results) == 2 * len(BATCHES):
        rows = []
        for batch in BATCHES:
            drv = 1 / statistics.mean(results[("driver-fwd", batch)].get_values()) / 1e6
            mdl = 1 / statistics.mean(results[("model", batch)].get_values()) / 1e6
            rows.append((batch, drv, mdl))
        print()
        print(table(rows))


if __name__ == "__main__":
    main()
