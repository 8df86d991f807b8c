"""What-if experiments behind the profiling findings: capsvc with one behaviour patched.

    python -m bench.rpc.experiments recv-cap BYTES   # at most BYTES per socket read
    python -m bench.rpc.experiments spin MICROSECONDS  # poll that long before sleeping

Theory of operation
-------------------
Each experiment monkeypatches ``FastSocketStream.receive_some_fast`` (capsvc's transport)
in *both* processes, the capsvc echo server (this module re-run as ``server``) and the
capsvc client in this process, then measures c1 and c12 echo calls like the profiling
command (calls/s, p50/p99, CPU µs per call per side), unpatched first, patched second.
They answer "how much would this change buy?" without touching capsvc; they are not
part of the suite and break if the patched method changes. The patches:

- ``recv-cap N``: read at most N bytes per ``recv``. With ~144-byte Calls, N=300 means at
  most two messages are delivered per scheduler pass, so the first Returns leave while
  later calls are still being processed: it breaks the c12 lock-step (each side writes
  all 12 messages at once, then waits for all 12 answers).
- ``spin US``: when the socket is empty, run zero-timeout trio passes for up to US
  microseconds before blocking in ``epoll_wait``: a reply that arrives within the window
  is picked up without the sleep/wake-up that costs ~100 µs of latency per message on
  this VM.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

import trio


def apply(patch: str, value: int) -> None:
    """Patch capsvc's socket stream in this process (``none``: leave it alone)."""
    from capsvc.transport import fastsocket

    stream_class: Any = fastsocket.FastSocketStream
    original = stream_class.receive_some_fast
    if patch == "recv-cap":

        async def capped(self: Any, max_bytes: int | None = None) -> bytes:
            return bytes(await original(self, value))

        stream_class.receive_some_fast = capped
    elif patch == "spin":

        async def spinning(self: Any, max_bytes: int | None = None) -> bytes:
            await trio.lowlevel.checkpoint_if_cancelled()
            deadline = time.perf_counter() + value * 1e-6
            while True:
                try:
                    return bytes(self.socket.recv(max_bytes or 65536))
                except BlockingIOError:
                    if time.perf_counter() < deadline:
                        await trio.lowlevel.cancel_shielded_checkpoint()
                    else:
                        await trio.lowlevel.wait_readable(self.socket)

        stream_class.receive_some_fast = spinning
    elif patch != "none":
        raise ValueError(f"unknown patch {patch!r}")


def measure(patch: str, value: int, calls: int, rounds: int) -> list[str]:
    import psutil  # type: ignore[import-untyped]

    from bench.rpc.clients import make_client

    server = subprocess.Popen(
        [sys.executable, "-m", "bench.rpc.experiments", "server", patch, str(value)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    address = server.stdout.readline().split()[1]
    apply(patch, value)
    server_process = psutil.Process(server.pid)
    lines = []
    try:
        for concurrency in (1, 12):
            client = make_client("capsvc", address, concurrency, 16).start()
            try:
                client.run(2000)
                for _ in range(rounds):
                    latencies: list[int] = []
                    cpu = time.process_time()
                    server_cpu = sum(server_process.cpu_times()[:2])
                    seconds = client.run(calls, latencies)
                    cpu = (time.process_time() - cpu) / calls * 1e6
                    server_cpu = (sum(server_process.cpu_times()[:2]) - server_cpu) / calls * 1e6
                    latencies.sort()
                    p50 = latencies[len(latencies) // 2] / 1e3
                    p99 = latencies[int(len(latencies) * 0.99)] / 1e3
                    lines.append(
                        f"| {patch} {value} | {concurrency} | {calls / seconds:,.0f} | {p50:.0f} "
                        f"| {p99:.0f} | {cpu:.0f} | {server_cpu:.0f} |"
                    )
            finally:
                client.close()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return lines


def main(argv: list[str]) -> int:
    if argv[:1] == ["server"]:
        apply(argv[1], int(argv[2]))
        from bench.rpc.servers import run_capsvc_server

        run_capsvc_server("tcp:127.0.0.1:0", nodelay=True, coalesce=True)
        return 0
    if len(argv) < 2 or argv[0] not in ("recv-cap", "spin"):
        print(__doc__.split("Theory of operation")[0].strip())
        return 2
    calls = int(argv[2]) if len(argv) > 2 else 10_000
    rows = []
    for patch, value in (("none", 0), (argv[0], int(argv[1]))):
        # Each measurement in a fresh process: a patch must not leak into the baseline.
        done = subprocess.run(
            [sys.executable, "-m", "bench.rpc.experiments", "measure", patch, str(value),
             str(calls)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.extend(done.stdout.splitlines())
    print("| patch | conc | calls/s | p50 µs | p99 µs | client CPU µs | server CPU µs |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["measure"]:
        print("\n".join(measure(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), rounds=3)))
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
