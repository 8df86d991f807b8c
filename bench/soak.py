"""Load and soak (issue 11): many connections from other processes, every call accounted for.

    python -m bench soak [--clients 10] [--connections 50] [--seconds 60]

Theory of operation
-------------------
A server process (this module with ``--serve``) serves the test Tester
(tests/support/tester.py) on 127.0.0.1 and answers ``status`` lines on its stdin with one
JSON line: RSS, calls served, connections open, and the sizes of every table summed over
its open connections. ``--clients`` client processes (``--client``) each open
``--connections`` connections and drive every one of them for ``--seconds`` with a mix
that exercises the capability moves: an echo; a pipelined call on a capability the
server returns (``newCounter(...).counter.increment`` before the first result arrives);
a capability of the client's passed to the server and called back
(``callCounter``); one reflected back to its owner (``reflect``, then a call on what came
back: embargo territory); and a call that fails on purpose (``fail`` overloaded, an
expected typed error). Each client prints a JSON line: calls made, succeeded, expected
errors, unexpected errors, and lost calls (made, but neither returned nor failed when the
client stopped waiting: must be 0).

The driver samples the server's RSS once a second against the calls it has served;
after warm-up (the first quarter of the run), the least-squares slope of RSS over calls
is reported per 100,000 calls (flat means no growth per call). After the clients leave it
waits for the server to have no connection and reports what of the engine is still
alive in it (connections, sessions, answers, questions, call results, exports, imports,
counted by the garbage collector, against the count before the clients came): nothing
may be. It also reports the server's pymalloc blocks in use (start, near the end, after)
and the most common object types then, to tell a leak from memory the allocator keeps.
Bounded: every wait has a deadline, every process is stopped by its PID.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What a connection's engine is made of: once every client has gone, none may be alive.
ENGINE_OBJECTS = frozenset(
    ("Connection", "RpcSession", "Answer", "Question", "CallResult", "Export", "Import")
)
#: Beyond the run itself, how long to wait for clients to finish and the server to settle.
GRACE = 60.0


# ---------------------------------------------------------------------------- the server


def serve() -> None:
    import trio

    from capsvc.connection import Connection
    from capsvc.transport import listener_address, open_listeners
    from tests.support.tester import TesterImpl

    calls = [0]

    class CountingTester(TesterImpl):
        async def echo(self, params: Any, results: Any) -> None:
            calls[0] += 1
            await super().echo(params, results)

        async def newCounter(self, params: Any, results: Any) -> None:
            calls[0] += 1
            await super().newCounter(params, results)

        async def callCounter(self, params: Any, results: Any) -> None:
            calls[0] += 1
            await super().callCounter(params, results)

        def reflect(self, params: Any, results: Any) -> None:
            calls[0] += 1
            super().reflect(params, results)

        async def fail(self, params: Any, results: Any) -> None:
            calls[0] += 1
            await super().fail(params, results)

    connections: set[Connection] = set()
    hook = CountingTester()._new_hook()

    async def handle(stream: trio.abc.Stream) -> None:
        conn = Connection(stream, hook.add_ref(), served=True)
        connections.add(conn)
        try:
            await conn.run()
        finally:
            connections.discard(conn)

    def status() -> str:
        from bench.flood import rss_bytes

        tables: dict[str, int] = {}
        for conn in connections:
            for name, size in conn.session.table_sizes().items():
                tables[name] = tables.get(name, 0) + size
        gc.collect()
        alive: dict[str, int] = {}
        kinds: dict[str, int] = {}
        for obj in gc.get_objects():
            name = type(obj).__name__
            kinds[name] = kinds.get(name, 0) + 1
            if name in ENGINE_OBJECTS:
                alive[name] = alive.get(name, 0) + 1
        top = sorted(kinds.items(), key=lambda kv: -kv[1])[:12]
        return json.dumps(
            {
                "rss": rss_bytes(os.getpid()),
                "calls": calls[0],
                "connections": len(connections),
                "tables": tables,
                "engine_objects": alive,
                "top": top,
                "blocks": sys.getallocatedblocks(),
            }
        )

    async def main() -> None:
        listeners = await open_listeners("tcp:127.0.0.1:0")
        print("LISTENING", listener_address(listeners[0]), flush=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, handle, listeners)
            stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
            buffer = b""
            while True:
                data = await stdin.receive_some(4096)
                if not data:
                    break
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip() == b"status":
                        print(status(), flush=True)
            nursery.cancel_scope.cancel()

    trio.run(main)


# ---------------------------------------------------------------------------- a client


def client(address: str, connections: int, seconds: float, seed: int) -> None:
    import trio

    import capsvc
    from tests.support.tester import Counter, Tester

    class LocalCounter(capsvc.Server, interface=Counter):
        def __init__(self) -> None:
            self.value = 0

        async def increment(self, params: Any, results: Any) -> int:
            self.value += params.by
            return self.value

        async def get(self, params: Any, results: Any) -> int:
            return self.value

    tally = {"calls": 0, "ok": 0, "expected_errors": 0, "unexpected_errors": 0}
    unexpected: list[str] = []

    async def one_call(tester: Any, local: LocalCounter, rng: random.Random) -> None:
        kind = rng.randrange(5)
        tally["calls"] += 1
        try:
            if kind == 0:
                text = f"soak {rng.random()}"
                assert (await tester.echo(msg=text)).reply == text
            elif kind == 1:
                start = rng.randrange(1000)
                pipelined = tester.newCounter(start=start).counter  # before any result
                assert (await pipelined.increment(by=1)).value == start + 1
            elif kind == 2:
                before = local.value
                assert (await tester.callCounter(counter=local, by=2)).value == before + 2
            elif kind == 3:
                back = (await tester.reflect(cap=local)).cap
                assert (await back.get()).value == local.value
            else:
                try:
                    await tester.fail(kind="overloaded", reason="soak")
                except capsvc.Overloaded:
                    tally["expected_errors"] += 1
                    return
                raise AssertionError("fail() succeeded")
            tally["ok"] += 1
        except (capsvc.RpcError, AssertionError) as error:
            tally["unexpected_errors"] += 1
            unexpected.append(repr(error)[:200])

    async def drive(index: int, deadline: float) -> None:
        rng = random.Random(seed * 1000 + index)
        async with capsvc.connect(address) as conn:
            tester = conn.bootstrap(Tester)
            local = LocalCounter()
            while trio.current_time() < deadline:
                await one_call(tester, local, rng)

    async def main() -> None:
        deadline = trio.current_time() + seconds
        with trio.move_on_after(seconds + GRACE / 2):
            async with trio.open_nursery() as nursery:
                for index in range(connections):
                    nursery.start_soon(drive, index, deadline)

    trio.run(main)
    finished = tally["ok"] + tally["expected_errors"] + tally["unexpected_errors"]
    print(json.dumps({**tally, "lost": tally["calls"] - finished, "examples": unexpected[:5]}))


# ---------------------------------------------------------------------------- the driver


class Server:
    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=ROOT)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.soak", "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().split()
        if len(line) != 2 or line[0] != "LISTENING":
            self.stop()
            raise RuntimeError(f"the soak server did not start: {line!r}")
        self.address = line[1]

    def status(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(b"status\n")
        self.proc.stdin.flush()
        result: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def slope_per_100k(samples: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS (bytes) over calls served, per 100,000 calls."""
    if len(samples) < 2:
        return 0.0
    n = len(samples)
    mean_x = sum(x for x, _ in samples) / n
    mean_y = sum(y for _, y in samples) / n
    var = sum((x - mean_x) ** 2 for x, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((x - mean_x) * (y - mean_y) for x, y in samples)
    return cov / var * 100_000


def run(clients: int, connections: int, seconds: float) -> dict[str, Any]:
    server = Server()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        start = server.status()
        env = dict(os.environ, PYTHONPATH=ROOT)
        for seed in range(clients):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.soak",
                        "--client",
                        server.address,
                        "--connections",
                        str(connections),
                        "--seconds",
                        str(seconds),
                        "--seed",
                        str(seed),
                    ],
                    stdout=subprocess.PIPE,
                    cwd=ROOT,
                    env=env,
                )
            )
        samples: list[tuple[float, int, int]] = []  # (time, calls, rss)
        began = time.monotonic()
        peak_connections = 0
        mid: dict[str, Any] | None = None
        while time.monotonic() - began < seconds + GRACE and any(p.poll() is None for p in procs):
            status = server.status()
            if mid is None and time.monotonic() - began > seconds * 0.9:
                mid = status
            peak_connections = max(peak_connections, status["connections"])
            samples.append((time.monotonic() - began, status["calls"], status["rss"]))
            time.sleep(1.0)  # real time: one RSS sample a second
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=GRACE)
            results.append(json.loads(out.decode().strip().splitlines()[-1]))
        deadline = time.monotonic() + GRACE
        while (end := server.status())["connections"] and time.monotonic() < deadline:
            time.sleep(0.1)  # real time: the server notices the last closes
        warm = [(calls, rss) for t, calls, rss in samples if t >= seconds / 4]
        return {
            "clients": clients,
            "connections": clients * connections,
            "peak_connections": peak_connections,
            "seconds": seconds,
            "calls": sum(r["calls"] for r in results),
            "ok": sum(r["ok"] for r in results),
            "expected_errors": sum(r["expected_errors"] for r in results),
            "unexpected_errors": sum(r["unexpected_errors"] for r in results),
            "lost": sum(r["lost"] for r in results),
            "examples": [e for r in results for e in r["examples"]][:5],
            "server_calls": end["calls"],
            "rss_start": start["rss"],
            "rss_after_warmup": warm[0][1] if warm else start["rss"],
            "rss_end": end["rss"],
            "rss_slope_per_100k_calls": slope_per_100k(warm),
            # (calls served, RSS in MiB), about ten of them over the run
            "rss_samples": [
                (calls, round(rss / 2**20, 1))
                for _, calls, rss in samples[:: max(1, len(samples) // 10)]
            ],
            "connections_left": end["connections"],
            "tables_left": end["tables"],
            # Against the start: the engine's modules hold a few sentinels of their own.
            "blocks": [start["blocks"], mid["blocks"] if mid else 0, end["blocks"]],
            "top_types_end": end["top"],
            "top_types_mid": mid["top"] if mid else [],
            "engine_objects_left": {
                name: count - start["engine_objects"].get(name, 0)
                for name, count in end["engine_objects"].items()
                if count != start["engine_objects"].get(name, 0)
            },
        }
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        server.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--connections", type=int, default=50, help="per client process")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return
    if args.client:
        client(args.client, args.connections, args.seconds, args.seed)
        return
    seconds = min(args.seconds, 3600.0)
    result = run(min(args.clients, 500), min(args.connections, 1000), seconds)
    samples = result.pop("rss_samples")
    print(json.dumps(result, indent=2))
    print("RSS over calls served (MiB):", ", ".join(f"{c:,}: {m}" for c, m in samples))


if __name__ == "__main__":
    main()
