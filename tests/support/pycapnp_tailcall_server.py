#!/usr/bin/env python3
"""Reference-side (pycapnp = libcapnp's C++ RPC) Tester that forwards every call back to the
client as a *tail call*, to exercise rpc-protocol.md §6.2 against the C++ implementation.

Usage:
    python tests/support/pycapnp_tailcall_server.py --listen 127.0.0.1:0

Per connection, the server asks the client for *its* bootstrap capability (a Tester), and
serves a Tester whose every method builds the same request on the client's Tester and hands
it to ``context.tail_call``. Because the target lives in the caller's vat, C++ sends the call
back with ``sendResultsTo.yourself`` and answers the original question with
``return.takeFromOtherQuestion`` (rpc.c++, RpcCallContext::directTailCall).

Prints ``LISTENING <port>`` when ready; SIGTERM/SIGINT: exits 0. Diagnostics to stderr.
"""

import argparse
import asyncio
import os
import signal
import sys

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

testing_capnp = capnp.load(os.path.join(ROOT, "tests", "schemas", "testing.capnp"))
Tester = testing_capnp.Tester


def log(*args):
    print("pycapnp_tailcall_server:", *args, file=sys.stderr, flush=True)


def _forward(method, copy):
    async def handler(self, context):
        request = getattr(self.target, f"{method}_request")()
        copy(context.params, request)
        await context.tail_call(request)

    handler.__name__ = f"{method}_context"
    return handler


def _fields(*names):
    def copy(params, request):
        for name in names:
            setattr(request, name, getattr(params, name))

    return copy


class ForwardingTester(Tester.Server):
    """Every method is a tail call to the client's own Tester (``self.target``)."""

    def __init__(self):
        self.target = None

    echo_context = _forward("echo", _fields("msg"))
    newCounter_context = _forward("newCounter", _fields("start"))
    callBack_context = _forward("callBack", _fields("cb", "value"))
    holdCaps_context = _forward("holdCaps", _fields("holder"))
    fail_context = _forward("fail", _fields("kind", "reason"))
    slow_context = _forward("slow", _fields("ms"))
    getSelf_context = _forward("getSelf", _fields())
    reflect_context = _forward("reflect", _fields("cap"))
    callCounter_context = _forward("callCounter", _fields("counter", "by"))
    sum_context = _forward("sum", _fields("counters"))


async def serve(host, port):
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def on_connection(stream):
        forwarding = ForwardingTester()
        try:
            server = capnp.TwoPartyServer(stream, bootstrap=forwarding)
            forwarding.target = server.bootstrap().cast_as(Tester)
            await server.on_disconnect()
        except Exception as exc:
            log(f"connection ended with {type(exc).__name__}: {exc}")
        finally:
            forwarding.target = None

    server = await capnp.AsyncIoStream.create_server(on_connection, host, port)
    print(f"LISTENING {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()
    log("stopping")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    asyncio.run(capnp.run(serve(host, int(port))))


if __name__ == "__main__":
    main()
