#!/usr/bin/env python3
"""More reference-side (pycapnp = libcapnp's C++ RPC) checks against a Tester, beyond
tests/peers/pycapnp_tester_client.py: the ones where the C++ side drives ordering,
embargoes, cancellation and re-entrancy.

Usage:
    python tests/support/pycapnp_extra_client.py HOST:PORT [--only CHECK]... [--hold]

Checks:
  order          30 increments sent at once on one (resolved) Counter: values 1..30 in order
                 (10 rounds, each on a new Counter)
  pipelinedorder 30 increments pipelined on newCounter(0).counter before it returns: 1..30
                 (10 rounds)
  embargo        20 increments pipelined on reflect(our Counter).cap before it returns: C++
                 embargoes them (Disembargo senderLoopback to the server, which must loop it
                 back); our counter must see them in order 1..20
  cancel         slow(ms=3000) abandoned after 0.2 s (C++ sends Finish): the connection still
                 works at once, and the call is answered (canceled) without a 3 s wait
  reentrant      callBack with a Callback that itself calls the Tester (nested calls)
  churn          20 Counters created, used and dropped; 20 local Counters sent and dropped

Prints ``ok <check>`` per check, ``FAIL <check>: ...`` and exit status 1 on the first failure.
With --hold: after the checks, prints ``CHECKS DONE`` and keeps the connection open until a
line arrives on stdin (so the server's tables can be inspected), then prints ``BYE``.
The run is bounded by 30 s (plus the hold).
"""

import argparse
import asyncio
import gc
import os
import sys
import time

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

testing_capnp = capnp.load(os.path.join(ROOT, "tests", "schemas", "testing.capnp"))
Tester = testing_capnp.Tester
Counter = testing_capnp.Counter
Callback = testing_capnp.Callback


class CheckFailed(Exception):
    pass


def expect(check, what, got, want):
    if got != want:
        raise CheckFailed(f"{check}: {what}: got {got!r}, expected {want!r}")


class LocalCounter(Counter.Server):
    def __init__(self, start):
        self.value = start
        self.seen = []

    async def increment(self, by, _context, **kwargs):
        self.seen.append(by)
        self.value += by
        return self.value

    async def get(self, _context, **kwargs):
        return self.value


class ReentrantCallback(Callback.Server):
    def __init__(self, tester):
        self.tester = tester

    async def notify(self, value, _context, **kwargs):
        reply = await self.tester.echo(msg=f"nested {value}")
        return len(reply.reply) + value


ROUNDS = 10


async def check_order(tester):
    for round_ in range(ROUNDS):
        counter = (await tester.newCounter(start=0)).counter
        promises = [counter.increment(by=1) for _ in range(30)]
        values = [r.value for r in await asyncio.gather(*promises)]
        expect("order", f"round {round_}: values in call order", values, list(range(1, 31)))


async def check_pipelinedorder(tester):
    for round_ in range(ROUNDS):
        counter = tester.newCounter(start=0).counter
        promises = [counter.increment(by=1) for _ in range(30)]
        values = [r.value for r in await asyncio.gather(*promises)]
        expect(
            "pipelinedorder", f"round {round_}: values in call order", values, list(range(1, 31))
        )


async def check_embargo(tester):
    mine = LocalCounter(0)
    cap = tester.reflect(cap=mine).cap
    promises = [cap.increment(by=i) for i in range(1, 21)]
    results = await asyncio.gather(*promises)
    expect("embargo", "order our counter saw", mine.seen, list(range(1, 21)))
    expected = [sum(range(1, i + 1)) for i in range(1, 21)]
    expect("embargo", "values", [r.value for r in results], expected)


async def check_cancel(tester):
    # Real time throughout (asyncio here, trio in the server process): the server's
    # slow(3000) answers 3 s after t0, so an echo that waited behind the cancelled call
    # would come back only then; the bounds below (2.7 s for the echo, 2.5 s in all) stay
    # below that and far above a normal run (~0.2 s) on a loaded machine.
    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(tester.slow(ms=3000), 0.2)
    except TimeoutError:
        pass
    else:
        raise CheckFailed("cancel: slow(3000) returned within 0.2 s")
    reply = (await asyncio.wait_for(tester.echo(msg="after cancel"), 2.5)).reply
    expect("cancel", "echo after cancel", reply, "after cancel")
    elapsed = time.perf_counter() - t0
    if elapsed > 2.5:
        raise CheckFailed(f"cancel: took {elapsed:.2f} s")


async def check_reentrant(tester):
    cb = ReentrantCallback(tester)
    ack = (await tester.callBack(cb=cb, value=7)).ack
    expect("reentrant", "ack", ack, len("nested 7") + 7)


async def check_churn(tester):
    for i in range(20):
        counter = (await tester.newCounter(start=i)).counter
        expect("churn", "increment", (await counter.increment(by=1)).value, i + 1)
        del counter
        mine = LocalCounter(i)
        expect("churn", "callCounter", (await tester.callCounter(counter=mine, by=2)).value, i + 2)
        del mine
    gc.collect()


CHECKS = {
    "order": check_order,
    "pipelinedorder": check_pipelinedorder,
    "embargo": check_embargo,
    "cancel": check_cancel,
    "reentrant": check_reentrant,
    "churn": check_churn,
}


async def run_checks(host, port, names):
    stream = await capnp.AsyncIoStream.create_connection(host=host, port=port)
    client = capnp.TwoPartyClient(stream)
    tester = client.bootstrap().cast_as(Tester)
    for name in names:
        try:
            await CHECKS[name](tester)
        except CheckFailed:
            raise
        except Exception as exc:
            raise CheckFailed(f"{name}: {type(exc).__name__}: {exc}") from exc
        print(f"ok {name}", flush=True)
    return client, tester  # kept alive by main() while --hold keeps the connection open


async def main(host, port, names, hold):
    try:
        _client, _tester = await asyncio.wait_for(run_checks(host, port, names), 30.0)
    except CheckFailed as exc:
        print(f"FAIL {exc}", flush=True)
        return 1
    except TimeoutError:
        print("FAIL timeout: the checks did not finish within 30 s", flush=True)
        return 1
    if hold:
        gc.collect()
        for _ in range(20):  # let the C++ side send its Releases and Finishes (real time:
            await asyncio.sleep(0.01)  # libcapnp's loop; the server side waits for them too)
        print("CHECKS DONE", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print("BYE", flush=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", metavar="HOST:PORT")
    parser.add_argument("--only", choices=list(CHECKS), action="append")
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()
    host, _, port = args.address.rpartition(":")
    sys.exit(asyncio.run(capnp.run(main(host, int(port), args.only or list(CHECKS), args.hold))))
