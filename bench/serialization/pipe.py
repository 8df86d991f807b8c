"""The pipe modes, ``pipe`` and ``pipe-async`` (specs/benchmarks.md §6), client side.

Theory of operation
-------------------
Upstream forks: the child is the client, the parent the server, joined by two anonymous
pipes (§6). Here the client is the benchmark process and the server is a separate process,
``python -m bench.serialization.server``, started with its stdin and stdout as the two
pipes (c→s, s→c). :class:`PipeSession` owns that process for as long as a pyperf worker
lives; each timed run is one ``trio.run`` over a batch, and only the loop itself is timed
(trio's start-up and the server's start-up are not).

The streams are ``trio.lowlevel.FdStream`` objects over duplicates of the pipe file
descriptors, so closing them at the end of a batch leaves the pipes open for the next one.
Messages travel as the codec frames them: capsvc's stream framing for unpacked capnp,
length-prefixed packed capnp, bare msgpack (codecs.py).

- ``pipe``: strict ping-pong. Build a request, write it, read until one whole response has
  arrived, check it; one request in flight.
- ``pipe-async``: a sender task builds and writes requests without waiting, pushing each
  expectation onto a FIFO; a receiver task reads responses, pops the expectations and
  checks them in order. Upstream bounds nothing but the pipe buffer; capnp-ocaml allows
  4 in flight. ``depth`` is that window (default 4, 0 = unbounded, §6 "In flight in
  pipe-async"), enforced with a semaphore the receiver releases per checked response.

The server's handshake byte (``R``) tells the client that the server has finished
importing and loading its schema, so no timed run pays for it. If the server dies, the
client sees end-of-file and raises :class:`ServerGone` with the server's exit status.

For the spec's "report CPU time as well as wall time" (§ "Figures on our machines"), each
batch also records the client's CPU time (``time.process_time``) and the server's (its
CPU-time clock; ``/proc/PID/stat`` ticks where there is none) in :data:`CPU_LOG`; the
pyperf hook in cli.py turns the log into run metadata.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import trio

from bench.serialization.base import Case, Codec

__all__ = ["CPU_LOG", "DEFAULT_DEPTH", "PipeSession", "ServerGone"]

DEFAULT_DEPTH = 4  # §6: capnp-ocaml's window; 0 means unbounded like C++
RECEIVE_SIZE = 1 << 20  # more than a pipe ever holds (64 KiB by default on Linux)
READY = b"R"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_TICK = os.sysconf("SC_CLK_TCK")

# (client CPU s, server CPU s, iterations) per timed batch, read by cli.PipeCpuHook.
CPU_LOG: list[tuple[float, float, int]] = []


class ServerGone(RuntimeError):
    """The server process closed its end of the pipe (it crashed or was killed)."""


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid``: its CPU-time clock (the id that
    clock_getcpuclockid(3) gives on Linux, nanoseconds), else /proc's tick count (10 ms:
    a 60 ms batch could not be told from 50 or 70)."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, SCHED)
    except OSError:
        pass
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime (proc(5) fields 14-15)


class PipeSession:
    """A server process on two anonymous pipes, reused by every batch of one worker."""

    def __init__(self, benchmark: str, case: Case, codec: Codec) -> None:
        self.case = case
        self.codec = codec
        env = dict(os.environ)
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = _ROOT if not path else _ROOT + os.pathsep + path
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.serialization.server",
                "--benchmark",
                benchmark,
                "--format",
                codec.format,
                "--compression",
                codec.compression,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
        )
        assert self._proc.stdin is not None
        assert self._proc.stdout is not None
        self._to_server = self._proc.stdin.fileno()
        self._from_server = self._proc.stdout.fileno()
        ready = os.read(self._from_server, 1)  # blocks until the server is set up
        if ready != READY:
            self.close()
            raise ServerGone(f"server failed to start (exit status {self._proc.returncode})")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def run(self, batch: Sequence[Any], depth: int | None) -> float:
        """Run one batch; ``depth`` None is ``pipe``, else ``pipe-async``. Returns seconds."""
        cpu_client = time.process_time()
        cpu_server = _process_cpu(self._proc.pid)
        elapsed: float = trio.run(self._run, batch, depth)
        CPU_LOG.append(
            (
                time.process_time() - cpu_client,
                _process_cpu(self._proc.pid) - cpu_server,
                len(batch),
            )
        )
        return elapsed

    async def _run(self, batch: Sequence[Any], depth: int | None) -> float:
        send = trio.lowlevel.FdStream(os.dup(self._to_server))
        receive = trio.lowlevel.FdStream(os.dup(self._from_server))
        async with send, receive:
            start = time.perf_counter()
            try:
                if depth is None:
                    await self._ping_pong(batch, send, receive)
                else:
                    await self._pipelined(batch, send, receive, depth)
            except trio.BrokenResourceError as error:
                # A server that died before we wrote breaks the pipe (EPIPE); one that died
                # after gives EOF on our read: the same news either way.
                raise self._gone() from error
            return time.perf_counter() - start

    async def _ping_pong(
        self, batch: Sequence[Any], send: trio.lowlevel.FdStream, receive: trio.lowlevel.FdStream
    ) -> None:
        """§6 ``pipe``: one request in flight."""
        setup, check, frame = self.case.setup, self.case.check, self.codec.frame
        decoder = self.codec.response_decoder()
        feed, next_response = decoder.feed, decoder.next
        send_all, receive_some = send.send_all, receive.receive_some
        for inputs in batch:
            request, expectation = setup(inputs)
            await send_all(frame(request))
            while True:
                data = await receive_some(RECEIVE_SIZE)
                if not data:
                    raise self._gone()
                feed(data)
                response = next_response()
                if response is not None:
                    break
            check(response, expectation)

    async def _pipelined(
        self,
        batch: Sequence[Any],
        send: trio.lowlevel.FdStream,
        receive: trio.lowlevel.FdStream,
        depth: int,
    ) -> None:
        """§6 ``pipe-async``: a sender and a receiver task, at most ``depth`` in flight."""
        setup, check, frame = self.case.setup, self.case.check, self.codec.frame
        expectations: collections.deque[Any] = collections.deque()
        slots = trio.Semaphore(depth) if depth > 0 else None

        async def receiver() -> None:
            decoder = self.codec.response_decoder()
            feed, next_response = decoder.feed, decoder.next
            receive_some, pop = receive.receive_some, expectations.popleft
            remaining = len(batch)
            while remaining:
                data = await receive_some(RECEIVE_SIZE)
                if not data:
                    raise self._gone()
                feed(data)
                while (response := next_response()) is not None:
                    check(response, pop())
                    remaining -= 1
                    if slots is not None:
                        slots.release()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receiver)
            send_all, push = send.send_all, expectations.append
            for inputs in batch:
                if slots is not None:
                    await slots.acquire()
                request, expectation = setup(inputs)
                push(expectation)
                await send_all(frame(request))

    def _gone(self) -> ServerGone:
        try:
            status = self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            status = None
        return ServerGone(f"the server closed the pipe (exit status {status})")

    def close(self) -> None:
        """End the server: EOF on its stdin, then wait; a failing server raises."""
        proc = self._proc
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            status = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if status != 0:
            raise ServerGone(f"server exited with status {status}")
