"""What a hostile peer can make a server hold: RSS per unfinished answer, per export (issue 11).

    python -m bench flood [--counts 5000,50000] [--server capsvc|pycapnp] [--connections 1]
                          [--kind answers|exports] [--serve-arg ARG]...
    python -m bench flood --imports 20000

Theory of operation
-------------------
A server process is started fresh for each count (``capsvc serve`` on the demo, or the
pycapnp reference server of tests/peers with the calculator), on 127.0.0.1 port 0. One
warm-up connection makes one Bootstrap call and finishes it, so imports and first-call
allocations are behind us; then the server's RSS (``/proc/PID/status`` VmRSS) is taken.
The flood connection(s) send ``count`` Bootstrap messages with distinct question IDs, in
batches of 1,000 per write, and never send a Finish: each one is an answer the server must
keep (rpc.capnp: an answer lives until its Finish). The client reads every reply as it
comes (so the server's output never backs up) and counts Returns; when all have arrived,
RSS is taken again. The figure is (after - before) / answers held. A server with an
answer limit aborts the connection instead: then the answers held are the Returns
received before the Abort, and the report says so.

``--kind exports`` measures an export instead: after its Bootstrap, the flood calls the
calculator's ``evaluate`` (a literal) ``count`` times and finishes each call, but never
releases the ``Value`` capability each one returns, so the server keeps one export per
call (and no answer).

``--imports N`` measures an import, in-process: N capabilities the peer sent us
(``senderHosted`` descriptors) taken into a session's import table and held, with the
Python heap they add counted by tracemalloc (an import costs no memory outside it).

The slope between the two counts (bytes per extra answer) is the figure that does not
depend on allocator start-up costs. Bounded: every count is capped at 1,000,000 and every
wait at 120 s; the server is stopped by its PID.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from capsvc.framing import FrameDecoder, encode_messages
from capsvc.rpc import wire

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_COUNT = 1_000_000
WAIT = 120.0
BATCH = 1000


def _bootstrap(question_id: int) -> list[bytes]:
    message = wire.Message.new_message()
    message.init("bootstrap").questionId = question_id
    return [bytes(s) for s in message.to_segments()]


def _finish(question_id: int, *, release_result_caps: bool = True) -> list[bytes]:
    message = wire.Message.new_message()
    finish = message.init("finish")
    finish.questionId = question_id
    finish.releaseResultCaps = release_result_caps  # false: we keep the results' exports
    return [bytes(s) for s in message.to_segments()]


def _evaluate(question_id: int) -> list[bytes]:
    """Calculator.evaluate(literal) on the bootstrap (question 0's answer)."""
    message = wire.Message.new_message()
    call = message.init("call")
    call.questionId = question_id
    call.target.init("promisedAnswer").questionId = 0
    call.interfaceId = _calculator().schema.node.id
    call.methodId = 0
    params = call.init("params").content.as_struct(
        _calculator().schema.methods["evaluate"].param_type
    )
    params.init("expression").literal = float(question_id)
    return [bytes(s) for s in message.to_segments()]


_CALCULATOR: list[object] = []


def _calculator() -> Any:
    if not _CALCULATOR:
        import capnp

        _CALCULATOR.append(capnp.load(os.path.join(ROOT, "schemas", "calculator.capnp")).Calculator)
    return _CALCULATOR[0]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        found = re.search(r"VmRSS:\s+(\d+) kB", status.read())
    if found is None:
        raise RuntimeError(f"no VmRSS for pid {pid}")
    return int(found.group(1)) * 1024


def start_server(kind: str, extra: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    if kind == "capsvc":
        argv = [sys.executable, "-m", "capsvc", "serve", "--listen", "tcp:127.0.0.1:0", *extra]
        pattern = re.compile(rb"listening on tcp:127\.0\.0\.1:(\d+)")
    else:
        peer = os.path.join(ROOT, "tests", "peers", "pycapnp_server.py")
        argv = [sys.executable, peer, "--listen", "127.0.0.1:0", "--bootstrap", "calculator"]
        pattern = re.compile(rb"LISTENING (\d+)")
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ)
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = pattern.search(line)
        if found:
            return proc, int(found.group(1))
    stop(proc)
    raise RuntimeError(f"{kind} server did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


class Flooder:
    """One raw connection that sends Bootstraps and counts the Returns."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder()
        self.returns = 0
        self.aborted: str | None = None
        self.closed = False

    def send(self, messages: list[list[bytes]]) -> None:
        try:
            self.sock.sendall(encode_messages(messages))
        except OSError:
            self.closed = True

    def read_until(self, returns: int) -> None:
        deadline = time.monotonic() + WAIT
        while self.returns < returns and not self.closed and time.monotonic() < deadline:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            self.decoder.feed(data)
            while (segments := self.decoder.next_message()) is not None:
                tag = wire.message_tag(segments)
                if tag == wire.RETURN:
                    self.returns += 1
                elif tag == wire.ABORT:
                    reader = wire.read_message(
                        segments, traversal_limit_words=1 << 20, nesting_limit=64
                    )
                    self.aborted = reader.abort.reason
                    self.closed = True


def flood(
    kind: str, count: int, connections: int, extra: list[str], what: str = "answers"
) -> dict[str, object]:
    proc, port = start_server(kind, extra)
    try:
        warm = Flooder(port)
        warm.send([_bootstrap(0)])
        warm.read_until(1)
        warm.send([_finish(0)])
        time.sleep(0.5)  # real time: let the server handle the Finish before measuring
        before = rss_bytes(proc.pid)
        flooders = [Flooder(port) for _ in range(connections)]
        for flooder in flooders:
            if what == "exports":
                flooder.send([_bootstrap(0)])
                flooder.read_until(1)
                flooder.returns = 0
            for start in range(0, count, BATCH):
                ids = range(start + 1, min(count, start + BATCH) + 1)
                if what == "exports":
                    # The Finish after the Return: one before it would cancel the call.
                    flooder.send([_evaluate(q) for q in ids])
                    flooder.read_until(min(count, start + BATCH))
                    flooder.send([_finish(q, release_result_caps=False) for q in ids])
                else:
                    flooder.send([_bootstrap(q) for q in ids])
                flooder.read_until(min(count, start + BATCH))
                if flooder.closed:
                    break
        time.sleep(0.5)  # real time: the server settles (its last writes) before measuring
        after = rss_bytes(proc.pid)
        held = sum(f.returns for f in flooders)
        aborts = [f.aborted for f in flooders if f.aborted]
        alive = proc.poll() is None
        for flooder in [warm, *flooders]:
            flooder.sock.close()
        return {
            "server": kind,
            "what": what,
            "sent": count * connections,
            "returns": held,
            "aborted": aborts[0] if aborts else None,
            "rss_before": before,
            "rss_after": after,
            "per_answer": (after - before) / held if held else 0.0,
            "server_alive": alive,
        }
    finally:
        stop(proc)


def import_cost(count: int) -> float:
    """Python heap bytes per import held (see the module docstring)."""
    import gc
    import tracemalloc

    from capsvc.limits import Limits
    from capsvc.rpc.session import RpcSession

    session = RpcSession(None, limits=Limits(max_imports=count))
    message = wire.Message.new_message()
    table = message.init("call").init("params").init("capTable", count)
    for index in range(count):
        table[index].senderHosted = index
    descriptors = list(table)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = [session.imports.receive(desc)[0] for desc in descriptors]
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(session.imports.entries) == count
    del held
    return (after - before) / count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench flood", description=__doc__)
    parser.add_argument("--counts", default="5000,50000")
    parser.add_argument("--server", choices=("capsvc", "pycapnp"), default="capsvc")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--kind", choices=("answers", "exports"), default="answers")
    parser.add_argument("--imports", type=int, metavar="N", help="measure an import (see above)")
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="extra argument for capsvc serve"
    )
    args = parser.parse_args(argv)
    if args.imports:
        count = min(MAX_COUNT, args.imports)
        print(f"an import held: {import_cost(count):,.0f} B of Python heap ({count:,} held)")
        return
    counts = [min(MAX_COUNT, int(c)) for c in args.counts.split(",")]
    rows = [flood(args.server, c, args.connections, args.serve_arg, args.kind) for c in counts]
    unit = "answer" if args.kind == "answers" else "export"
    print(f"| server | held | sent | {unit}s held | RSS before | RSS after | per {unit} |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['server']} | {row['what']} | {row['sent']:,} | {row['returns']:,} | "
            f"{row['rss_before'] / 2**20:.1f} MiB | {row['rss_after'] / 2**20:.1f} MiB | "
            f"{row['per_answer']:,.0f} B |"
        )
        if row["aborted"]:
            print(f"  aborted: {row['aborted']}")
        if not row["server_alive"]:
            print("  the server died")
    if len(rows) >= 2 and rows[-1]["returns"] != rows[0]["returns"]:
        a, b = rows[0], rows[-1]
        slope = (int(b["rss_after"]) - int(b["rss_before"])) - (
            int(a["rss_after"]) - int(a["rss_before"])
        )
        slope_per = slope / (int(b["returns"]) - int(a["returns"]))
        print(f"slope: {slope_per:,.0f} B per extra {unit} held")


if __name__ == "__main__":
    main()
