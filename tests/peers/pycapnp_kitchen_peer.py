#!/usr/bin/env python3
"""Reference-side peer (pycapnp, libcapnp's C++ RPC) for kitchen.capnp's interface
hierarchies: ``Diamond`` (extends Left and Right, which both extend Base) and
``TextStore`` (extends the generic ``Store(Text)``), and for ``Sink``'s streaming method.

Usage:
    python tests/peers/pycapnp_kitchen_peer.py serve 127.0.0.1:0 --bootstrap KIND
    python tests/peers/pycapnp_kitchen_peer.py call HOST:PORT --bootstrap KIND

KIND is diamond, textstore, sink, converter or loud.

``serve`` gives each connection a new bootstrap object of that kind, prints ``LISTENING
<port>`` once bound, and stops on SIGTERM. ``call`` bootstraps the peer, calls every
method of the hierarchy through C++ (also through the base and generic types) and prints
``ok <check>`` per check; a mismatch exits non-zero.

The semantics both sides implement: ``depth`` -> 3; ``left``/``right`` -> side "left"/
"right"; ``tricky`` -> return "self|request|params|unknown|from" and the object itself;
``put(value)`` stores it; ``get`` -> the last value, and a ``Box(Text)`` holding it
labelled "box"; ``size`` -> how many puts there were; ``write(chunk)`` (``-> stream``)
counts the chunk, whose first byte must be its index (writes arrive in order);
``total`` -> the bytes and writes counted (a write out of order fails, and breaks the
sink: every later call fails with its error, as C++ serves ``-> stream`` methods);
``Converter.str(int)`` -> that many "x"s (the ``call`` side expects our server, whose size
limit is lower, to fail the 100 000 one alone); ``Loud.left(volume)`` -> "loud <volume>"
(default inf), its inherited ``Left.left`` -> "left".
"""

import argparse
import asyncio
import os
import signal
import sys

import capnp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCHEMAS = os.path.join(ROOT, "tests", "schemas")
# pycapnp's own directory too: Sink's `-> stream` imports /capnp/stream.capnp.
PYCAPNP = os.path.dirname(os.path.dirname(capnp.__file__))
kitchen = capnp.load(os.path.join(SCHEMAS, "kitchen.capnp"), imports=[SCHEMAS, PYCAPNP])


class DiamondServer(kitchen.Diamond.Server):
    async def depth_context(self, context):
        context.results.depth = 3

    async def left_context(self, context):
        context.results.side = "left"

    async def right_context(self, context):
        context.results.side = "right"

    async def tricky_context(self, context):
        p = context.params
        parts = (p.self, p.request, p.params, p.unknown, getattr(p, "from"))
        setattr(context.results, "return", "|".join(str(x) for x in parts))
        context.results.self = self


class TextStoreServer(kitchen.TextStore.Server):
    def __init__(self):
        self.values = []

    async def put_context(self, context):
        self.values.append(context.params.value)

    async def get_context(self, context):
        last = self.values[-1] if self.values else ""
        context.results.value = last
        context.results.box.value = last
        context.results.box.label = "box"

    async def size_context(self, context):
        context.results.count = len(self.values)


class SinkServer(kitchen.Sink.Server):
    """Counts what is written; a chunk out of order (its first byte is its index) fails."""

    def __init__(self):
        self.bytes = 0
        self.writes = 0

    async def write_context(self, context):
        chunk = context.params.chunk
        if chunk[:1] != bytes([self.writes % 256]):
            raise ValueError(f"chunk {chunk[:1]!r} arrived as write {self.writes}")
        self.writes += 1
        self.bytes += len(chunk)

    async def total_context(self, context):
        context.results.bytes = self.bytes
        context.results.writes = self.writes


class LoudServer(kitchen.Loud.Server):
    """Left's left and Loud's own left: one name in the schema, two methods."""

    async def left_context(self, context):
        if context.params.schema.node.id == kitchen.Loud.schema.methods["left"].param_type.node.id:
            context.results.side = f"loud {context.params.volume}"
        else:
            context.results.side = "left"


class ConverterServer(kitchen.Converter.Server):
    async def str_context(self, context):
        context.results.str = "x" * context.params.int


SERVERS = {
    "diamond": DiamondServer,
    "textstore": TextStoreServer,
    "sink": SinkServer,
    "converter": ConverterServer,
    "loud": LoudServer,
}


async def serve(host, port, kind):
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def on_connection(stream):
        bootstrap = SERVERS[kind]()
        try:
            await capnp.TwoPartyServer(stream, bootstrap=bootstrap).on_disconnect()
        except Exception as exc:  # one broken connection must not stop the server
            print(f"connection ended with {type(exc).__name__}: {exc}", file=sys.stderr)

    server = await capnp.AsyncIoStream.create_server(on_connection, host, port)
    print(f"LISTENING {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await stop.wait()


def check(name, got, want):
    if got != want:
        raise SystemExit(f"FAIL {name}: got {got!r}, want {want!r}")
    print("ok", name, flush=True)


async def call(host, port, kind):
    stream = await capnp.AsyncIoStream.create_connection(host=host, port=port)
    client = capnp.TwoPartyClient(stream)
    if kind == "diamond":
        diamond = client.bootstrap().cast_as(kitchen.Diamond)
        check("depth", (await diamond.depth()).depth, 3)
        check("left", (await diamond.left()).side, "left")
        check("right", (await diamond.right()).side, "right")
        base = diamond.cast_as(kitchen.Base)
        check("base", (await base.depth()).depth, 3)
        request = diamond.tricky_request()
        request.self = "s"
        request.request = 1
        request.params = True
        request.unknown = -2
        setattr(request, "from", 7)
        response = await request.send()
        check("tricky", getattr(response, "return"), "s|1|True|-2|7")
        check("self", (await response.self.left()).side, "left")
    elif kind == "loud":
        loud = client.bootstrap().cast_as(kitchen.Loud)
        check("loud", (await loud.left()).side, "loud inf")
        check("volume", (await loud.left(volume=2.5)).side, "loud 2.5")
        check("inherited", (await loud.cast_as(kitchen.Left).left()).side, "left")
    elif kind == "converter":  # the server answers results over its size limit in error
        converter = client.bootstrap().cast_as(kitchen.Converter)
        check("small", (await converter.str(5)).str, "xxxxx")
        try:
            await converter.str(100_000)
        except capnp.KjException as error:
            check("oversized", "Limits.max_message_words" in str(error), True)
        else:
            check("oversized", "results", "an exception")
        check("after", (await converter.str(3)).str, "xxx")
    elif kind == "sink":
        sink = client.bootstrap().cast_as(kitchen.Sink)
        for i in range(50):  # `-> stream` calls, each awaited as pycapnp's flow control allows
            await sink.write(bytes([i]) * (i + 1))
        got = await sink.total()
        check("total", (got.bytes, got.writes), (1275, 50))
        # A write out of order fails, and (C++ LocalClient semantics, which the server must
        # keep too) breaks the sink: every later call on it fails with that write's error.
        try:  # pycapnp awaits a write's Return: this one fails itself, then the next call
            await sink.write(b"\xff")
        except capnp.KjException as error:
            check("failed", "arrived as write 50" in str(error), True)
        try:
            await sink.total()
        except capnp.KjException as error:
            check("broken", "arrived as write 50" in str(error), True)
        else:
            check("broken", "total", "an exception")
    else:
        store = client.bootstrap().cast_as(kitchen.TextStore)
        await store.put("first")
        await store.put("second")
        got = await store.get()
        check("get", got.value, "second")
        check("box", (got.box.value, got.box.label), ("second", "box"))
        check("size", (await store.size()).count, 2)
        generic = store.cast_as(kitchen.Store)
        check("generic", (await generic.get()).value.as_text(), "second")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["serve", "call"])
    parser.add_argument("address", nargs="?", default="127.0.0.1:0")
    parser.add_argument("--bootstrap", choices=sorted(SERVERS), required=True)
    args = parser.parse_args()
    host, _, port = args.address.rpartition(":")
    run = serve if args.mode == "serve" else call
    asyncio.run(capnp.run(run(host, int(port), args.bootstrap)))


if __name__ == "__main__":
    main()
