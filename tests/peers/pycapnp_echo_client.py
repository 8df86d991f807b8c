#!/usr/bin/env python3
"""Reference-side echo load client for benchmarks: pycapnp (libcapnp's C++ RPC).

Usage:
    python tests/peers/pycapnp_echo_client.py HOST:PORT --calls N --concurrency C --payload BYTES
        [--method ping|pingData] [--warmup W] [--timeout S]

Makes exactly N Echo calls on one connection, from C asyncio tasks that each
loop over ``await echo.ping(...)`` (so at most C calls are outstanding). The
payload is BYTES characters of Text for ping (BYTES bytes of Data for
pingData); every reply is compared with what was sent. W warm-up calls (not
measured) go first. Latency is per call, from just before the request is made
to the decoded reply, measured with time.perf_counter_ns.

Prints one JSON object to stdout:
    {"calls", "concurrency", "payload", "method", "seconds", "calls_per_s",
     "latency_us": {"p50", "p90", "p99", "p99.9", "max", "mean"}, "errors"}
Percentiles use the nearest-rank method. Exits 0 if all calls succeeded, 1 on
any error, mismatched reply or timeout (default 120 s for the whole run).
"""

import argparse
import asyncio
import json
import math
import os
import sys
import time

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

echo_capnp = capnp.load(os.path.join(ROOT, "schemas", "echo.capnp"))
Echo = echo_capnp.Echo


def percentile(sorted_values, fraction):
    """Nearest-rank percentile of an ascending list (fraction in 0..1)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class Load:
    def __init__(self, echo, method, payload, total):
        self.echo = echo
        self.method = method
        self.payload = payload
        self.remaining = total
        self.latencies_ns = []
        self.errors = []

    async def one_call(self):
        if self.method == "ping":
            reply = (await self.echo.ping(msg=self.payload)).reply
        else:
            reply = (await self.echo.pingData(data=self.payload)).data
        if reply != self.payload:
            raise ValueError(f"reply of {len(reply)} units does not match the payload")

    async def worker(self, record):
        perf = time.perf_counter_ns
        while self.remaining > 0:
            self.remaining -= 1
            t0 = perf()
            try:
                await self.one_call()
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                if len(self.errors) >= 10:
                    self.remaining = 0
                continue
            if record:
                self.latencies_ns.append(perf() - t0)

    async def run(self, concurrency, record=True):
        workers = min(concurrency, max(self.remaining, 1))
        await asyncio.gather(*(self.worker(record) for _ in range(workers)))


async def run_load(args):
    host, port = args.address
    stream = await capnp.AsyncIoStream.create_connection(host=host, port=port)
    client = capnp.TwoPartyClient(stream)
    echo = client.bootstrap().cast_as(Echo)
    payload = "x" * args.payload if args.method == "ping" else b"x" * args.payload

    if args.warmup:
        warm = Load(echo, args.method, payload, args.warmup)
        await warm.run(args.concurrency, record=False)
        if warm.errors:
            return {"errors": len(warm.errors), "first_error": warm.errors[0], "phase": "warmup"}

    load = Load(echo, args.method, payload, args.calls)
    t0 = time.perf_counter_ns()
    await load.run(args.concurrency)
    elapsed_s = (time.perf_counter_ns() - t0) / 1e9

    lat = sorted(load.latencies_ns)
    us = lambda ns: None if ns is None else round(ns / 1000.0, 1)  # noqa: E731
    result = {
        "calls": len(lat),
        "concurrency": args.concurrency,
        "payload": args.payload,
        "method": args.method,
        "seconds": round(elapsed_s, 6),
        "calls_per_s": round(len(lat) / elapsed_s, 1) if elapsed_s > 0 else None,
        "latency_us": {
            "p50": us(percentile(lat, 0.50)),
            "p90": us(percentile(lat, 0.90)),
            "p99": us(percentile(lat, 0.99)),
            "p99.9": us(percentile(lat, 0.999)),
            "max": us(lat[-1] if lat else None),
            "mean": us(sum(lat) / len(lat) if lat else None),
        },
        "errors": len(load.errors),
    }
    if load.errors:
        result["first_error"] = load.errors[0]
    return result


async def main(args):
    try:
        result = await asyncio.wait_for(run_load(args), args.timeout)
    except TimeoutError:
        result = {"errors": 1, "first_error": f"timeout after {args.timeout:g} s"}
    except Exception as exc:
        result = {"errors": 1, "first_error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result), flush=True)
    return 0 if result.get("errors") == 0 else 1


def parse_address(text):
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", type=parse_address, metavar="HOST:PORT")
    parser.add_argument("--calls", type=positive_int, required=True)
    parser.add_argument("--concurrency", type=positive_int, default=1)
    parser.add_argument(
        "--payload", type=int, default=16, help="payload size in bytes (characters for ping)"
    )
    parser.add_argument("--method", choices=["ping", "pingData"], default="ping")
    parser.add_argument("--warmup", type=int, default=0, help="unmeasured calls made first")
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="bound on the whole run, seconds"
    )
    args = parser.parse_args()
    if args.payload < 0:
        parser.error("--payload must be >= 0")
    sys.exit(asyncio.run(capnp.run(main(args))))
