#!/usr/bin/env python3
"""Reference-side Tester client for interop tests: pycapnp (libcapnp's C++ RPC).

Usage:
    python tests/peers/pycapnp_tester_client.py HOST:PORT [--only CHECK] [--fail-any-type]

Drives a Tester bootstrap (tests/schemas/testing.capnp) served by someone else
(capsvc, or pycapnp_server.py for self-checks). Checks, in this order:

  echo           echo("hello") returns "hello"
  pipelining     newCounter(start=5).counter.increment(by=2) without awaiting
                 newCounter first                                     -> 7
  callback       callBack(local Callback, 20): the server calls notify(20)
                 on our object and returns its ack
  holdcaps       holdCaps round trip with a Counter at Holder.cap,
                 inner.cap, caps[0..2], items[0].cap, choice.counter and a
                 Callback at extra.callback (client-hosted and server-hosted
                 caps mixed); every returned capability is called
  reflect        reflect(local Counter) returns a cap that still reaches our
                 Counter (its state changes when called)
  callcounter    callCounter(local Counter, by=3): the server calls us
  sum            sum([server counters and a local counter])
  fail           fail(kind, reason) for failed, overloaded, disconnected and
                 unimplemented; prints an ``info fail ...`` line with what
                 pycapnp reports (type and description) for each
  slow           slow(ms=50) returns true after >= 50 ms
  getself        getSelf().self.echo(...) (pipelined)
  unimplemented  calling Unknown.nothing on the Tester gives UNIMPLEMENTED
  nullpipeline   reflect() with no cap returns cap-free results; a call
                 pipelined on its null field before the Return arrives fails
                 (broken capability) and the connection stays usable
  lastref        callCounter(counter=c, by=2) where the params hold our only
                 reference to c, an import of a server Counter         -> 7
  lastrefpipe    the same with c a pipelined capability of newCounter whose
                 promise we dropped before sending                     -> 3

For ``fail`` the exception type must match the kind, unless --fail-any-type is
given (pycapnp's own Python servers can only raise FAILED, so the self-check
against pycapnp_server.py needs it); the reason text must appear in the
description either way.

Prints ``ok <check>`` per check (plus ``info ...`` lines), exits 0 when all
pass; prints ``FAIL <check>: ...`` and exits 1 at the first failure. The whole
run is bounded by 30 s.
"""

import argparse
import asyncio
import os
import sys
import time
import traceback

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

testing_capnp = capnp.load(os.path.join(ROOT, "tests", "schemas", "testing.capnp"))
Tester = testing_capnp.Tester
Counter = testing_capnp.Counter
Callback = testing_capnp.Callback
Holder = testing_capnp.Holder
Unknown = testing_capnp.Unknown

OVERALL_TIMEOUT = 30.0


class CheckFailed(Exception):
    pass


def expect(check, what, got, want):
    if got != want:
        raise CheckFailed(f"{check}: {what}: got {got!r}, expected {want!r}")


def info(text):
    print(f"info {text}", flush=True)


# ------------------------------------------------------------ local capabilities


class LocalCounter(Counter.Server):
    def __init__(self, start):
        self.value = start
        self.calls = 0

    async def increment(self, by, _context, **kwargs):
        self.calls += 1
        self.value += by
        return self.value

    async def get(self, _context, **kwargs):
        self.calls += 1
        return self.value


class LocalCallback(Callback.Server):
    def __init__(self):
        self.seen = []

    async def notify(self, value, _context, **kwargs):
        self.seen.append(value)
        return value * 2 + 1


# ------------------------------------------------------------------------ checks


async def check_echo(tester):
    reply = (await tester.echo(msg="hello")).reply
    expect("echo", "reply", reply, "hello")
    empty = (await tester.echo(msg="")).reply
    expect("echo", "empty reply", empty, "")


async def check_pipelining(tester):
    counter = tester.newCounter(start=5).counter  # pipelined, not awaited
    value = (await counter.increment(by=2)).value
    expect("pipelining", "increment result", value, 7)
    value = (await counter.get()).value
    expect("pipelining", "get after increment", value, 7)


async def check_callback(tester):
    cb = LocalCallback()
    ack = (await tester.callBack(cb=cb, value=20)).ack
    expect("callback", "ack", ack, 41)
    expect("callback", "values our Callback saw", cb.seen, [20])


async def check_holdcaps(tester):
    # Eight Counter slots. Even-numbered slots hold client-hosted counters,
    # odd-numbered ones server-hosted counters; each starts at a distinct value.
    starts = [100, 200, 300, 400, 500, 600, 700]
    local = {}
    caps = []
    for i, start in enumerate(starts):
        if i % 2 == 0:
            local[i] = LocalCounter(start)
            caps.append(local[i])
        else:
            caps.append(tester.newCounter(start=start).counter)  # still a promise
    callback = LocalCallback()

    request = tester.holdCaps_request()
    h = request.holder
    h.name = "outer"
    h.cap = caps[0]
    inner = h.init("inner")
    inner.name = "inner"
    inner.cap = caps[1]
    lst = h.init("caps", 3)
    lst[0] = caps[2]
    lst[1] = caps[3]
    lst[2] = caps[4]
    items = h.init("items", 1)
    items[0].name = "item0"
    items[0].cap = caps[5]
    h.choice.counter = caps[6]
    h.extra.number = 42
    h.extra.callback = callback

    holder = (await request.send()).holder

    expect("holdcaps", "name", holder.name, "outer")
    expect("holdcaps", "inner.name", holder.inner.name, "inner")
    expect("holdcaps", "items[0].name", holder.items[0].name, "item0")
    expect("holdcaps", "len(caps)", len(holder.caps), 3)
    expect("holdcaps", "len(items)", len(holder.items), 1)
    expect("holdcaps", "choice", holder.choice.which(), "counter")
    expect("holdcaps", "extra.number", holder.extra.number, 42)

    returned = [
        ("cap", holder.cap),
        ("inner.cap", holder.inner.cap),
        ("caps[0]", holder.caps[0]),
        ("caps[1]", holder.caps[1]),
        ("caps[2]", holder.caps[2]),
        ("items[0].cap", holder.items[0].cap),
        ("choice.counter", holder.choice.counter),
    ]
    for i, (where, cap) in enumerate(returned):
        value = (await cap.increment(by=1)).value
        expect("holdcaps", f"{where}.increment(1)", value, starts[i] + 1)
        if i in local:
            expect(
                "holdcaps", f"{where}: state of our local counter", local[i].value, starts[i] + 1
            )

    ack = (await holder.extra.callback.notify(value=5)).ack
    expect("holdcaps", "extra.callback.notify(5)", ack, 11)
    expect("holdcaps", "values our Callback saw", callback.seen, [5])


async def check_reflect(tester):
    mine = LocalCounter(100)
    back = (await tester.reflect(cap=mine)).cap
    value = (await back.increment(by=5)).value
    expect("reflect", "increment through the reflected cap", value, 105)
    expect("reflect", "state of our local counter", mine.value, 105)
    value = (await back.get()).value
    expect("reflect", "get through the reflected cap", value, 105)
    expect("reflect", "calls that reached our counter", mine.calls, 2)


async def check_callcounter(tester):
    mine = LocalCounter(10)
    value = (await tester.callCounter(counter=mine, by=3)).value
    expect("callcounter", "value", value, 13)
    expect("callcounter", "state of our local counter", mine.value, 13)


async def check_sum(tester):
    remote = [tester.newCounter(start=s).counter for s in (1, 20)]
    mine = LocalCounter(300)
    total = (await tester.sum(counters=remote + [mine])).total
    expect("sum", "total", total, 321)
    empty = (await tester.sum(counters=[])).total
    expect("sum", "total of no counters", empty, 0)


FAIL_KINDS = ["failed", "overloaded", "disconnected", "unimplemented"]


async def check_fail(tester, any_type):
    problems = []
    for kind in FAIL_KINDS:
        reason = f"requested {kind} failure"
        try:
            await tester.fail(kind=kind, reason=reason)
        except capnp.KjException as exc:
            got_type = exc.type
            description = exc.description or ""
            one_line = description.strip().splitlines()[-1] if description.strip() else ""
            info(
                f"fail kind={kind} type={got_type} reason_found={reason in description} "
                f"description_lines={len(description.splitlines())} last_line={one_line!r}"
            )
            if reason not in description:
                problems.append(f"{kind}: reason {reason!r} not in description {description!r}")
            if not any_type and got_type != kind.upper():
                problems.append(f"{kind}: type {got_type}, expected {kind.upper()}")
        else:
            problems.append(f"{kind}: the call returned normally")
    if problems:
        raise CheckFailed("fail: " + "; ".join(problems))


async def check_slow(tester):
    t0 = time.perf_counter()
    done = (await tester.slow(ms=50)).done
    elapsed = time.perf_counter() - t0
    expect("slow", "done", done, True)
    if elapsed < 0.049:
        raise CheckFailed(f"slow: returned after {elapsed * 1000:.1f} ms, expected >= 50 ms")
    info(f"slow took {elapsed * 1000:.1f} ms")


async def check_getself(tester):
    same = tester.getSelf().self  # pipelined
    reply = (await same.echo(msg="via getSelf")).reply
    expect("getself", "reply", reply, "via getSelf")


async def check_unimplemented(tester):
    unknown = tester.cast_as(Unknown)
    try:
        await unknown.nothing()
    except capnp.KjException as exc:
        info(f"unimplemented type={exc.type} description={exc.description!r}")
        expect("unimplemented", "exception type", exc.type, "UNIMPLEMENTED")
    else:
        raise CheckFailed("unimplemented: Unknown.nothing() returned normally")
    # The connection must still work afterwards.
    expect(
        "unimplemented",
        "echo afterwards",
        (await tester.echo(msg="still here")).reply,
        "still here",
    )


async def check_nullpipeline(tester):
    field = tester.reflect().cap  # pipelined on results that will carry no capability
    try:
        await field.increment(by=1)
    except capnp.KjException as exc:
        info(f"nullpipeline type={exc.type} description={exc.description!r}")
        expect("nullpipeline", "exception type", exc.type, "FAILED")
    else:
        raise CheckFailed("nullpipeline: a call on a null capability returned normally")
    expect(
        "nullpipeline",
        "echo afterwards",
        (await tester.echo(msg="still here")).reply,
        "still here",
    )


async def check_lastref(tester):
    counter = (await tester.newCounter(start=5)).counter
    request = tester.callCounter_request()
    request.counter = counter
    request.by = 2
    del counter  # the request holds our only reference to the import
    value = (await request.send()).value
    expect("lastref", "value", value, 7)


async def check_lastrefpipe(tester):
    promise = tester.newCounter(start=1)
    counter = promise.counter
    del promise  # only the pipelined capability wants the question now
    request = tester.callCounter_request()
    request.counter = counter
    request.by = 2
    del counter  # ...and now only the request
    value = (await request.send()).value
    expect("lastrefpipe", "value", value, 3)


CHECKS = {
    "echo": check_echo,
    "pipelining": check_pipelining,
    "callback": check_callback,
    "holdcaps": check_holdcaps,
    "reflect": check_reflect,
    "callcounter": check_callcounter,
    "sum": check_sum,
    "fail": check_fail,
    "slow": check_slow,
    "getself": check_getself,
    "unimplemented": check_unimplemented,
    "nullpipeline": check_nullpipeline,
    "lastref": check_lastref,
    "lastrefpipe": check_lastrefpipe,
}


async def run_checks(host, port, names, any_type):
    stream = await capnp.AsyncIoStream.create_connection(host=host, port=port)
    client = capnp.TwoPartyClient(stream)
    tester = client.bootstrap().cast_as(Tester)
    for name in names:
        try:
            if name == "fail":
                await check_fail(tester, any_type)
            else:
                await CHECKS[name](tester)
        except CheckFailed:
            raise
        except Exception as exc:
            raise CheckFailed(f"{name}: {type(exc).__name__}: {exc}") from exc
        print(f"ok {name}", flush=True)


async def main(host, port, names, any_type):
    try:
        await asyncio.wait_for(run_checks(host, port, names, any_type), OVERALL_TIMEOUT)
    except CheckFailed as exc:
        print(f"FAIL {exc}", flush=True)
        return 1
    except TimeoutError:
        print(f"FAIL timeout: the checks did not finish within {OVERALL_TIMEOUT:g} s", flush=True)
        return 1
    except Exception as exc:
        traceback.print_exc()
        print(f"FAIL error: {type(exc).__name__}: {exc}", flush=True)
        return 1
    return 0


def parse_address(text):
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", type=parse_address, metavar="HOST:PORT")
    parser.add_argument(
        "--only",
        choices=list(CHECKS),
        action="append",
        help="run only this check (may be repeated)",
    )
    parser.add_argument(
        "--fail-any-type",
        action="store_true",
        help="for the fail check, accept any exception type (pycapnp servers raise only FAILED)",
    )
    args = parser.parse_args()
    names = args.only or list(CHECKS)
    sys.exit(asyncio.run(capnp.run(main(*args.address, names, args.fail_any_type))))
