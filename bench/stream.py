"""``-> stream`` calls: what C++'s flow control (capsvc.streaming) buys a stream of writes.

    python -m bench stream [--writes 20000] [--size 1024] [--rounds 3]

Theory of operation
-------------------
``capsvc serve`` runs the kv example (examples/kv) in its own process on 127.0.0.1, port 0;
the client (this process) opens a store and makes ``--writes`` calls of ``Store.load``
(``-> stream``, a value of ``--size`` bytes each), two ways, alternating, ``--rounds``
times each:

- ``window``: each write awaited as a stream call is (``await store.load(...)``): it
  returns once the capability's window has room (C++'s semantics);
- ``returned``: each write's own Return awaited (``await call.returned()``), a round trip
  per write, which is what every call cost before capsvc had flow control.

Each run ends with an ordinary call (``keys``), so its time includes every write's Return.
Printed per way: wall µs per write, the client's CPU µs per write (``time.process_time``),
MB/s of values, and the median ratio of the two ways, side by side in one run, with the
machine's state (CPU, cpuidle, load average). Bounded: the writes and rounds are capped,
each run has a deadline, and the server is stopped by its PID.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import trio

import capsvc
from bench.flood import start_server, stop
from bench.rpc.profile import machine_state
from examples.kv import kv_capnp as kv

MAX_WRITES = 1_000_000
RUN_DEADLINE = 120.0  # seconds, per run


async def _run(address: str, writes: int, size: int, rounds: int) -> dict[str, list[float]]:
    value = b"x" * size
    figures: dict[str, list[float]] = {"window": [], "returned": [], "cpu window": []}
    figures["cpu returned"] = []
    async with capsvc.connect(address) as conn:
        store = conn.bootstrap(kv.Directory).open(name="bench").store
        await store.keys()
        for _ in range(rounds):
            for way in ("returned", "window"):
                with trio.fail_after(RUN_DEADLINE):
                    wall, cpu = time.perf_counter(), time.process_time()
                    for index in range(writes):
                        call = store.load(key=f"k{index}", value=value)
                        if way == "window":
                            await call
                        else:
                            await call.returned()
                    stored = len((await store.keys()).keys)  # after every Return
                    figures[way].append((time.perf_counter() - wall) / writes * 1e6)
                    figures[f"cpu {way}"].append((time.process_time() - cpu) / writes * 1e6)
                    if stored != writes:
                        raise RuntimeError(f"{writes} writes, but the store holds {stored}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024, help="bytes per value")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    writes = max(1, min(args.writes, MAX_WRITES))
    print(machine_state("before"))
    proc, port = start_server("capsvc", ["examples.kv.server:Directory"])
    try:
        figures = trio.run(_run, f"tcp:127.0.0.1:{port}", writes, args.size, args.rounds)
    finally:
        stop(proc)
    print(f"\n{writes} writes of {args.size} B each, {args.rounds} round(s), median (range):\n")
    print("| way | µs per write | client CPU µs per write | MB/s |")
    print("|---|---|---|---|")
    for way in ("window", "returned"):
        wall, cpu = figures[way], figures[f"cpu {way}"]
        rate = args.size / statistics.median(wall)
        print(
            f"| {way} | {statistics.median(wall):.1f} ({min(wall):.1f}-{max(wall):.1f}) | "
            f"{statistics.median(cpu):.1f} | {rate:.1f} |"
        )
    ratios = [w / r for w, r in zip(figures["window"], figures["returned"], strict=True)]
    print(
        f"\nwindow ÷ returned, wall per write: {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f})"
    )
    print(machine_state("after"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
