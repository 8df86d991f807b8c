"""``extends`` (the diamond), a generic bound by ``extends(Store(Text))`` and a streaming
method (``Sink.write @0 (chunk :Data) -> stream``), over TCP on 127.0.0.1 through generated
stubs: typed client and typed server, typed client against the
C++ reference (pycapnp), and the C++ reference's client against typed servers. The
semantics both sides implement are in tests/peers/pycapnp_kitchen_peer.py's docstring.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import trio

import capsvc
from tests.codegen.conftest import Generated
from tests.support.checks import peer_deadline
from tests.support.peers import HOST, PYTHON, PeerProcess, listening_process, peer_env, peer_script


def servers(k: ModuleType) -> tuple[type, type]:
    """Typed servers on the generated bases of the session's kitchen module."""

    class Diamond(k.Diamond.Server):  # type: ignore[misc, name-defined]
        def depth(self, params: Any, results: Any) -> None:
            results.depth = 3

        def left(self, params: Any, results: Any) -> None:
            results.side = "left"

        async def right(self, params: Any, results: Any) -> None:
            await trio.lowlevel.checkpoint()  # an async method among plain ones
            results.side = "right"

        def tricky(self, params: Any, results: Any) -> None:
            parts = (params.self_, params.request, params.params, params.unknown, params.from_)
            results.return_ = "|".join(str(x) for x in parts)
            results.set_self(self)

    class TextStore(k.TextStore.Server):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.values: list[str] = []

        def put(self, params: Any, results: Any) -> None:
            self.values.append(params.value)

        def get(self, params: Any, results: Any) -> None:
            last = self.values[-1] if self.values else ""
            results.value = last
            results.box.value = last
            results.box.label = "box"

        def size(self, params: Any, results: Any) -> None:
            results.count = len(self.values)

    return Diamond, TextStore


def loud_server(k: ModuleType) -> object:
    """Loud extends Left and has a ``left`` of its own: ``left`` answers Left's, ``left_``
    Loud's."""

    class Loud(k.Loud.Server):  # type: ignore[misc, name-defined]
        def left(self, params: Any, results: Any) -> None:
            results.side = "left"

        def left_(self, params: Any, results: Any) -> None:
            results.side = f"loud {params.volume}"

    return Loud()


async def exercise_loud(k: ModuleType, address: str) -> None:
    async with capsvc.connect(address) as conn:
        loud = conn.bootstrap(k.Loud)
        assert (await loud.left_()).side == "loud inf"  # the schema's default, inf
        assert (await loud.left_(volume=2.5)).side == "loud 2.5"
        assert (await loud.left()).side == "left"  # Left's method, inherited
        assert (await loud.cast_as(k.Left).left()).side == "left"
        request = loud.left__request()
        request.params.volume = -1.0
        assert (await request.send()).side == "loud -1.0"


def sink_server(k: ModuleType) -> type:
    """A typed server of the streaming ``Sink``: its ``write`` has StreamResult results."""

    class Sink(k.Sink.Server):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.bytes = 0
            self.writes = 0

        def write(self, params: Any, results: Any) -> None:
            if params.chunk[:1] != bytes([self.writes % 256]):
                raise ValueError(f"chunk {params.chunk[:1]!r} arrived as write {self.writes}")
            self.writes += 1
            self.bytes += len(params.chunk)

        def total(self, params: Any, results: Any) -> None:
            results.bytes = self.bytes
            results.writes = self.writes

    return Sink


@asynccontextmanager
async def local_server(server: object) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", server)
        yield address
        nursery.cancel_scope.cancel()


async def exercise_diamond(k: ModuleType, address: str) -> None:
    async with capsvc.connect(address) as conn:
        diamond = conn.bootstrap(k.Diamond)
        assert (await diamond.depth()).depth == 3  # Base's method, through Left and Right
        assert (await diamond.left()).side == "left"
        assert (await diamond.right()).side == "right"
        promise = diamond.tricky(self_="s", request=1, params=True, unknown=-2, from_=7)
        again = promise.self_  # pipelined: a typed Diamond client before the results
        assert (await again.left()).side == "left"
        assert (await promise).return_ == "s|1|True|-2|7"
        base = diamond.cast_as(k.Base)
        assert (await base.depth()).depth == 3
        with pytest.raises(TypeError, match=r"^Diamond\.tricky\(\) has no parameter self;"):
            diamond.tricky(self="s")


async def exercise_store(k: ModuleType, address: str) -> None:
    async with capsvc.connect(address) as conn:
        store = conn.bootstrap(k.TextStore)
        await store.put(value="first")
        await store.put(value="second")
        got = await store.get()
        assert got.value == "second"
        assert (got.box.value, got.box.label) == ("second", "box")
        assert type(got.box) is k.Box_Text.Reader
        assert (await store.size()).count == 2
        with pytest.raises(TypeError, match=r"expected str \(Text\), got int"):
            store.put(value=5)


def any_store(k: ModuleType) -> object:
    """A typed server of the bare generic ``Store`` (its T unbound: AnyPointer), keeping
    what it is given in a message of its own and giving it back, capabilities included."""

    class AnyStore(k.Store.Server):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.kept = k.Box.new_message()

        def put(self, params: Any, results: Any) -> None:
            self.kept.set_value(params.value)  # copied out of the call's params

        def get(self, params: Any, results: Any) -> None:
            kept = self.kept.as_reader().value
            results.set_value(kept)
            results.box.set_value(kept)

    return AnyStore()


async def test_capabilities_travel_in_any_pointers(generated: Generated) -> None:
    """Text and a capability put in an AnyPointer param, kept by the server in its own
    message, returned in an AnyPointer result and in a Box: ``as_interface`` gives a typed
    client of the capability, which still calls the caller's own object."""
    k = generated.kitchen
    diamond, _ = servers(k)
    async with local_server(any_store(k)) as address, capsvc.connect(address) as conn:
        store = conn.bootstrap(k.Store)
        put = store.put_request()
        put.params.set_value("kept text")
        await put.send()
        assert (await store.get()).value.as_text() == "kept text"
        put = store.put_request()
        put.params.set_value(diamond())  # our own object, as a capability
        await put.send()
        got = await store.get()
        returned = got.value.as_interface(k.Diamond.Client)
        assert (await returned.left()).side == "left"
        assert (await got.box.value.as_interface(k.Left.Client).left()).side == "left"
        assert got.value.as_interface(k.Shop.Client) is not None  # a client of any type


async def exercise_sink(k: ModuleType | SimpleNamespace, address: str) -> None:
    """Fifty ``-> stream`` writes, each awaited (flow control: it returns once the window
    has room, not when the write returns), then ``total``; then a write out of order,
    which the server fails, and which breaks the sink: ``total`` fails with its error
    (tests/codegen/test_streaming.py has the rest)."""
    async with capsvc.connect(address) as conn:
        sink = conn.bootstrap(k.Sink)
        for i in range(50):
            await sink.write(chunk=bytes([i]) * (i + 1))
        got = await sink.total()
        assert (got.bytes, got.writes) == (1275, 50)
        with pytest.raises(TypeError, match=r"^Sink\.write\(\) has no parameter data;"):
            sink.write(data=b"x")
        await sink.write(chunk=b"\xff")
        with pytest.raises(capsvc.Failed, match="arrived as write 50"):
            await sink.total()


EXERCISES = {
    "diamond": exercise_diamond,
    "textstore": exercise_store,
    "sink": exercise_sink,
    "loud": exercise_loud,
}


async def cpp_client_checks(address: str, kind: str) -> list[str]:
    """Run the C++ reference's client (tests/peers/pycapnp_kitchen_peer.py ``call``)
    against ``address``; it must exit 0. Returns the names of the checks it passed."""
    with peer_deadline(60):
        done = await trio.run_process(
            [PYTHON, peer_script("pycapnp_kitchen_peer"), "call", address.removeprefix("tcp:")]
            + ["--bootstrap", kind],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=peer_env(),
            cwd=os.getcwd(),
        )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    return [line.split()[1] for line in lines if line.startswith("ok ")]


@pytest.fixture
def cpp_peer(request: pytest.FixtureRequest) -> Iterator[PeerProcess]:
    script = peer_script("pycapnp_kitchen_peer")
    argv = [PYTHON, script, "serve", f"{HOST}:0", "--bootstrap", request.param]
    with listening_process(argv) as peer:
        yield peer


async def test_typed_client_and_typed_servers(generated: Generated) -> None:
    diamond, store = servers(generated.kitchen)
    async with local_server(diamond()) as address:
        await exercise_diamond(generated.kitchen, address)
    async with local_server(store()) as address:
        await exercise_store(generated.kitchen, address)
    async with local_server(sink_server(generated.kitchen)()) as address:
        await exercise_sink(generated.kitchen, address)
    async with local_server(loud_server(generated.kitchen)) as address:
        await exercise_loud(generated.kitchen, address)


@pytest.mark.parametrize("cpp_peer", ["diamond", "textstore", "sink", "loud"], indirect=True)
async def test_typed_client_and_cpp_servers(generated: Generated, cpp_peer: PeerProcess) -> None:
    argv = list(cpp_peer.proc.args)  # type: ignore[arg-type]
    exercise = EXERCISES[argv[-1]]
    with peer_deadline():
        await exercise(generated.kitchen, cpp_peer.address)


@pytest.mark.parametrize("cpp_peer", ["sink"], indirect=True)
async def test_dynamic_stream_client_and_cpp_server(
    generated: Generated, cpp_peer: PeerProcess
) -> None:
    """The same stream exercise through a ``load_schema`` client: its writes are stream
    calls too, and the C++ server's broken sink fails ``total`` the same way."""
    with peer_deadline():
        await exercise_sink(SimpleNamespace(Sink=generated.reference.Sink), cpp_peer.address)


@pytest.mark.parametrize("kind", ["diamond", "textstore", "sink", "loud"])
async def test_cpp_client_and_typed_servers(generated: Generated, kind: str) -> None:
    diamond, store = servers(generated.kitchen)
    k = generated.kitchen
    makers = {"diamond": diamond, "textstore": store, "sink": sink_server(k)}
    server = loud_server(k) if kind == "loud" else makers[kind]()
    async with local_server(server) as address:
        checks = await cpp_client_checks(address, kind)
    assert (
        checks
        == {
            "diamond": ["depth", "left", "right", "base", "tricky", "self"],
            "textstore": ["get", "box", "size", "generic"],
            "sink": ["total", "failed", "broken"],
            "loud": ["loud", "volume", "inherited"],
        }[kind]
    )


async def test_capability_fields_on_the_dynamic_path(generated: Generated) -> None:
    """``Relay.relay (cap :Capability) -> (cap :Capability)`` served and called through
    ``capsvc.load_schema`` objects: a Capability field gives a client of no particular
    interface, which ``cast_as`` (or pycapnp's ``as_interface``) retypes to a dynamic or
    a generated interface; one pipelined on the results works before they arrive."""
    ref = generated.reference

    class DynamicLeft(capsvc.Server, interface=ref.Left):
        def left(self, params: Any, results: Any) -> None:
            results.side = "dynamic left"

    class DynamicRelay(capsvc.Server, interface=ref.Relay):
        async def relay(self, params: Any, results: Any) -> None:
            side = (await params.cap.as_interface(ref.Left).left()).side
            assert side == "dynamic left"
            results.cap = params.cap

    async with local_server(DynamicRelay()) as address, capsvc.connect(address) as conn:
        relay = conn.bootstrap(ref.Relay)
        promise = relay.relay(cap=DynamicLeft())
        pipelined = promise.cap.cast_as(ref.Left)  # before the results arrive
        assert (await pipelined.left()).side == "dynamic left"
        returned = (await promise).cap
        assert (await returned.cast_as(generated.kitchen.Left).left()).side == "dynamic left"
