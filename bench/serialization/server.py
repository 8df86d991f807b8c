"""The server half of the pipe modes: ``python -m bench.serialization.server``.

    python -m bench.serialization.server --benchmark eval --format capnp --compression packed

Theory of operation
-------------------
Requests arrive on stdin and responses leave on stdout (the two anonymous pipes of §6 in
specs/benchmarks.md). The loop is upstream's server: read, handle, write, sequentially,
until end-of-file. It runs on trio (``FdStream`` over duplicates of fds 0 and 1). Every
request that a read completes is handled, and the responses of one read leave in a single
write, as capsvc's coalescing writer does; in ``pipe`` mode that is exactly one response
per write.

Once imports and schema loading are done the server writes one handshake byte (``R``), so
the client never times the start-up. Anything printed by mistake would corrupt the stream,
so ``sys.stdout`` is pointed at stderr before the loop starts. An exception (a malformed
request, say) ends the process with a traceback on stderr and a non-zero status; the
client then sees end-of-file and stops the run. The cyclic garbage collector is disabled
for the process's lifetime, as the client disables it while timing (cli.py).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import trio

from bench.serialization.base import BENCHMARKS, COMPRESSIONS, FORMATS
from bench.serialization.codecs import make_codec
from bench.serialization.modes import load_benchmark, make_case
from bench.serialization.pipe import READY, RECEIVE_SIZE

__all__ = ["main", "serve"]


async def serve(benchmark: str, fmt: str, compression: str) -> None:
    case = make_case(benchmark, fmt)
    codec = make_codec(load_benchmark(benchmark), fmt, compression)
    handle, frame = case.handle, codec.frame_response
    decoder = codec.request_decoder()
    feed, next_request = decoder.feed, decoder.next
    receive = trio.lowlevel.FdStream(os.dup(0))
    send = trio.lowlevel.FdStream(os.dup(1))
    async with receive, send:
        await send.send_all(READY)
        receive_some, send_all = receive.receive_some, send.send_all
        while True:
            data = await receive_some(RECEIVE_SIZE)
            if not data:
                break  # the client closed its end: done
            feed(data)
            replies = []
            while (request := next_request()) is not None:
                replies.append(frame(handle(request)))
            if len(replies) == 1:
                await send_all(replies[0])
            elif replies:
                await send_all(b"".join(replies))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serialization.server")
    parser.add_argument("--benchmark", required=True, choices=BENCHMARKS)
    parser.add_argument("--format", required=True, choices=FORMATS)
    parser.add_argument("--compression", default="none", choices=COMPRESSIONS)
    args = parser.parse_args(argv)
    sys.stdout = sys.stderr  # fd 1 carries responses only
    gc.disable()
    trio.run(serve, args.benchmark, args.format, args.compression)


if __name__ == "__main__":
    main()
