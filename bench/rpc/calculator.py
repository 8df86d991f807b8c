"""The calculator's pipelined calls, capsvc against pycapnp (issue 10: "the calculator's
pipelined calls get the same treatment").

    python -m bench.rpc.calculator [--rounds R] [--seconds S] [--concurrency 1,12]

Theory of operation
-------------------
One *iteration* is the calculator-client sample's "add" step: ``getOperator(add)``, then
``evaluate(add(12, 34))`` naming the operator's still-unresolved ``func``, then ``read()``
on the evaluated ``value``, also unresolved. Three calls reach the server with nothing
awaited before the final read: one round trip, which is what promise pipelining is for.
Every reply is checked (46).

Pairings, each server a process of its own on 127.0.0.1, started for each round and
stopped by its PID:

- ``capsvc``: the generated typed client against the built-in demo (``capsvc serve``).
  Busy polling is off on both ends; the demo's ``evaluate`` is an ``async def``, as
  pycapnp's server methods are.
- ``pycapnp``: pycapnp's client against tests/peers/pycapnp_server.py
  ``--bootstrap calculator`` (libcapnp's C++ RPC on both ends).

The client is a child process too (``--client``), so both clients pay the same start-up
and nothing of one stays in the other's process. It connects, warms up for a quarter of
the time, then runs the loop in ``concurrency`` tasks on its one connection for
``--seconds``. It prints iterations, wall time and its CPU time. The pairings alternate
round by round; figures are medians (min-max) over rounds, and ratios are taken within a
round first. Every loop is bounded by time and the whole child by a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any

from bench.flood import start_server, stop
from bench.rpc.profile import machine_state

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = os.path.join(ROOT, "schemas", "calculator.capnp")
PAIRINGS = ("capsvc", "pycapnp")
EXPECTED = 46.0  # add(12, 34)


# ---------------------------------------------------------------------- clients
async def _capsvc_loop(address: str, concurrency: int, seconds: float) -> tuple[int, float]:
    import trio

    import capsvc
    from capsvc.generated.calculator_capnp import Calculator

    async with capsvc.connect(address, busy_poll=None) as connection:
        calc = connection.bootstrap(Calculator)

        async def once() -> None:
            add = calc.getOperator(op=Calculator.Operator.add).func
            request = calc.evaluate_request()
            request.params.init_expression().assign(
                call={"function": add, "params": [{"literal": 12.0}, {"literal": 34.0}]}
            )
            value = (await request.send().value.read()).value
            if value != EXPECTED:
                raise AssertionError(f"add(12, 34) gave {value}")

        return await _timed(once, concurrency, seconds, trio.current_time, _trio_gather)


async def _trio_gather(workers: list[Any]) -> None:
    import trio

    async with trio.open_nursery() as nursery:
        for worker in workers:
            nursery.start_soon(worker)


async def _pycapnp_loop(address: str, concurrency: int, seconds: float) -> tuple[int, float]:
    import capnp

    calc_capnp = capnp.load(SCHEMA)
    host, port = address.rsplit(":", 1)
    stream = await capnp.AsyncIoStream.create_connection(host, int(port))
    client = capnp.TwoPartyClient(stream)
    calc = client.bootstrap().cast_as(calc_capnp.Calculator)

    async def once() -> None:
        add = calc.getOperator(op="add").func
        request = calc.evaluate_request()
        call = request.expression.init("call")
        call.function = add
        params = call.init("params", 2)
        params[0].literal = 12.0
        params[1].literal = 34.0
        value = (await request.send().value.read()).value
        if value != EXPECTED:
            raise AssertionError(f"add(12, 34) gave {value}")

    async def gather(workers: list[Any]) -> None:
        await asyncio.gather(*(worker() for worker in workers))

    return await _timed(once, concurrency, seconds, time.monotonic, gather)


async def _timed(
    once: Any, concurrency: int, seconds: float, now: Any, gather: Any
) -> tuple[int, float]:
    """Warm up for a quarter of ``seconds``, then count iterations for ``seconds``."""
    done = 0
    deadline = 0.0

    async def worker() -> None:
        nonlocal done
        while now() < deadline:
            await once()
            done += 1

    deadline = now() + seconds / 4
    await gather([worker] * concurrency)
    done = 0
    began = time.perf_counter()
    deadline = now() + seconds
    await gather([worker] * concurrency)
    return done, time.perf_counter() - began


def client_main(pairing: str, address: str, concurrency: int, seconds: float) -> None:
    cpu = time.process_time()
    if pairing == "capsvc":
        import trio

        done, wall = trio.run(_capsvc_loop, address, concurrency, seconds)
    else:
        import capnp

        done, wall = asyncio.run(capnp.run(_pycapnp_loop(address, concurrency, seconds)))
    print(f"iterations {done} wall {wall:.6f} cpu {time.process_time() - cpu:.6f}", flush=True)


# ---------------------------------------------------------------------- servers
def _start_server(pairing: str) -> tuple[subprocess.Popen[bytes], str]:
    """The pairing's calculator server on 127.0.0.1 (bench.flood starts the same two) and
    the address its client dials."""
    server, port = start_server(pairing, ["--no-busy-poll", "--no-health"])
    return server, f"tcp:127.0.0.1:{port}" if pairing == "capsvc" else f"127.0.0.1:{port}"


def _measure(pairing: str, concurrency: int, seconds: float) -> dict[str, float]:
    server, address = _start_server(pairing)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bench.rpc.calculator", "--client", pairing,
             "--address", address, "--concurrency", str(concurrency),
             "--seconds", str(seconds)],
            cwd=ROOT, capture_output=True, text=True, timeout=seconds * 2 + 60, check=True,
            env=dict(os.environ, PYTHONPATH=ROOT),
        )  # fmt: skip
    finally:
        stop(server)
    found = re.search(r"iterations (\d+) wall ([\d.]+) cpu ([\d.]+)", done.stdout)
    if found is None:
        raise RuntimeError(f"the {pairing} client printed no result:\n{done.stderr[-2000:]}")
    iterations, wall = int(found.group(1)), float(found.group(2))
    return {"per_s": iterations / wall, "iterations": iterations}


# ---------------------------------------------------------------------- report
def _cell(values: list[float], digits: int = 0) -> str:
    spec = f",.{digits}f"
    return (
        f"{format(statistics.median(values), spec)} "
        f"({format(min(values), spec)}-{format(max(values), spec)})"
    )


def run(rounds: int, seconds: float, levels: list[int]) -> str:
    lines = [machine_state("before"), ""]
    rows = ["| concurrency | capsvc iterations/s | pycapnp iterations/s | capsvc ÷ pycapnp |",
            "|---|---|---|---|"]  # fmt: skip
    for concurrency in levels:
        ours: list[float] = []
        theirs: list[float] = []
        for round_ in range(rounds):
            order = PAIRINGS if round_ % 2 == 0 else PAIRINGS[::-1]
            got = {pairing: _measure(pairing, concurrency, seconds) for pairing in order}
            ours.append(got["capsvc"]["per_s"])
            theirs.append(got["pycapnp"]["per_s"])
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        rows.append(f"| {concurrency} | {_cell(ours)} | {_cell(theirs)} | {_cell(ratios, 2)} |")
    lines += rows + ["", machine_state("after")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rpc.calculator", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per measure")
    parser.add_argument("--concurrency", default="1,12")
    parser.add_argument("--client", choices=PAIRINGS, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        client_main(args.client, args.address, int(args.concurrency), args.seconds)
        return 0
    levels = [int(level) for level in args.concurrency.split(",")]
    print(
        f"Calculator pipelined add (3 calls, 1 round trip), {args.rounds} round(s) of "
        f"{args.seconds:g} s per pairing and level:\n"
    )
    print(run(args.rounds, args.seconds, levels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
