"""The nic transport: address grammar, trio stream conformance, errors, idle cost.

The model pair runs in its own process (``model_process`` fixture); both ends of every
stream live in the test process, each on its own port of the pair.

Timing: every wait here is real time. Frames cross a real model process (or, co-located,
a real datagram socket) on the OS's schedule, and the stream's own timers (connect,
retransmission, keepalive) run against it; a jumping clock would expire them while the
model is still moving frames. The guards are generous; they only bound a hang.
"""

from __future__ import annotations

import random
import re
import resource
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from capsvc.nicdriver import regs
from capsvc.nicdriver.control import Control
from capsvc.nicdriver.errors import NicError
from capsvc.nicdriver.pci import list_functions
from capsvc.nicdriver.stream import StreamConfig
from capsvc.transport.busypoll import BusyPoll
from capsvc.transport.capabilities import SocketBackedStream
from capsvc.transport.nic import (
    MIN_BUSY_POLL,
    NicListener,
    NicSpec,
    NicStream,
    connect_nic,
    listen_nic,
    parse_nic_spec,
)
from tests.nic.conftest import ModelProcess

# -- addresses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("nic:model:demo.0", NicSpec("model:demo.0")),
        ("model:demo.1", NicSpec("model:demo.1")),
        ("nic:03:00.0", NicSpec("0000:03:00.0")),
        ("nic:0000:03:00.1,sysfs=/tmp/sys", NicSpec("0000:03:00.1", sysfs="/tmp/sys")),
        (
            "nic:model:x,peer=02:00:00:00:00:01,rundir=/r",
            NicSpec("model:x", peer=bytes.fromhex("020000000001"), rundir="/r"),
        ),
    ],
)
def test_address_grammar(text: str, spec: NicSpec) -> None:
    assert parse_nic_spec(text) == spec
    assert parse_nic_spec(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nic:", "malformed nic: address: expected nic:model:NAME or nic:PCI_ADDRESS"),
        ("nic:eth0", "malformed nic: address 'eth0': expected model:NAME or a PCI address"),
        ("nic:model:", "bad model port name '': use letters"),
        ("nic:model:a/b", "bad model port name 'a/b': use letters"),
        ("nic:model:x,peer=zz", "peer=zz is not a MAC address"),
        ("nic:model:x,mtu=9", "unknown nic: option 'mtu=9'"),
    ],
)
def test_bad_addresses(text: str, message: str) -> None:
    # "nic" alone (the old pattern allowed it) is in almost any text: match each reason.
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        parse_nic_spec(text)


async def test_missing_model_port_says_how_to_start_one(rundir: Path) -> None:
    with pytest.raises(NicError, match="capsvc nic start-pair"):
        await connect_nic(f"nic:model:nothere.0,rundir={rundir}")


async def test_missing_pci_device_is_reported() -> None:
    with pytest.raises(NicError, match="capsvc nic list"):
        await connect_nic("nic:0000:7f:1f.7")


def command_register(path: Path) -> int:
    """The PCI Command register (config offset 0x04) of the function at ``path``."""
    (command,) = struct.unpack_from("<H", (path / "config").read_bytes(), 4)
    return int(command)


async def test_the_sandbox_virtio_nic_is_refused() -> None:
    for function in list_functions("/sys"):
        if function.vendor == regs.VIRTIO_VENDOR and function.is_network:
            # What a refusal must leave alone: every function's driver binding (an unbind
            # would take this machine's network away) and this one's Command register (Bus
            # Master / Memory Space; the Status word beside it may change on its own).
            before = (list_functions("/sys"), command_register(function.path))
            assert function.driver is not None, "the virtio NIC has no driver bound to begin with"
            with pytest.raises(NicError, match="not an Intel 82599"):
                await connect_nic(f"nic:{function.address}")
            after = (list_functions("/sys"), command_register(function.path))
            assert after == before
            return
    pytest.skip("no virtio device on this machine")


# -- streams -------------------------------------------------------------------------------


def addresses(host: ModelProcess) -> tuple[str, str]:
    return (
        f"nic:model:{host.ports[0]},rundir={host.rundir}",
        f"nic:model:{host.ports[1]}," + f"rundir={host.rundir}",
    )


async def open_pair(
    listener: NicListener, client_address: str, config: StreamConfig | None = None
) -> tuple[NicStream, NicStream]:
    accepted: list[NicStream] = []

    async def accept() -> None:
        accepted.append(await listener.accept())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept)
        client = await connect_nic(client_address, config=config)
    return client, accepted[0]


def stream_maker(
    host: ModelProcess,
) -> Callable[[], Awaitable[tuple[NicStream, NicStream]]]:
    state: dict[str, NicListener] = {}
    server_address, client_address = addresses(host)

    async def make() -> tuple[NicStream, NicStream]:
        if "listener" not in state:
            (listener,) = await listen_nic(server_address)
            assert isinstance(listener, NicListener)
            state["listener"] = listener
        return await open_pair(state["listener"], client_address)

    return make


async def test_half_closeable_stream_conformance(model_process: ModelProcess) -> None:
    await trio.testing.check_half_closeable_stream(stream_maker(model_process), None)


async def test_connect_without_a_peer_driver_times_out(model_process: ModelProcess) -> None:
    _, client_address = addresses(model_process)
    # Real time: nobody listens, so this always waits out the 0.3 s (a lower bound only).
    with pytest.raises(TimeoutError, match=r"no listener answered within 0\.3 s"):
        await connect_nic(client_address, config=StreamConfig(connect_timeout=0.3))


async def test_connect_to_a_port_without_listener_is_refused(
    model_process: ModelProcess,
) -> None:
    server_address, client_address = addresses(model_process)
    (listener,) = await listen_nic(server_address)
    await listener.aclose()  # the port stays open a moment, not listening
    with pytest.raises(ConnectionRefusedError, match="no listener"):
        await connect_nic(client_address)


async def test_two_connections_at_once_and_big_transfers(model_process: ModelProcess) -> None:
    server_address, client_address = addresses(model_process)
    (listener,) = await listen_nic(server_address)
    assert isinstance(listener, NicListener)
    assert listener.address == server_address
    pairs = [await open_pair(listener, client_address) for _ in range(2)]
    data = [random.Random(i).randbytes(300_000) for i in range(2)]

    async def pump(stream: NicStream, payload: bytes) -> None:
        await stream.send_all(payload)
        await stream.send_eof()

    async def drain(stream: NicStream, expected: bytes) -> None:
        got = bytearray()
        while chunk := await stream.receive_some():
            got += chunk
        assert got == expected

    async with trio.open_nursery() as nursery:
        for (client, server), payload in zip(pairs, data, strict=True):
            nursery.start_soon(pump, client, payload)
            nursery.start_soon(drain, server, payload)
    for client, server in pairs:
        await client.aclose()
        await server.aclose()
    await listener.aclose()


async def test_idle_connection_does_not_burn_a_core(model_process: ModelProcess) -> None:
    server_address, client_address = addresses(model_process)
    (listener,) = await listen_nic(server_address)
    assert isinstance(listener, NicListener)
    client, server = await open_pair(listener, client_address)
    # Real time, necessarily: this measures CPU time used per wall-clock second. First let
    # the connection settle into idle (any busy polling ends within its budget), then
    # measure one second. A spinning poll loop uses most of a core (well over 0.5 s even
    # when sharing a loaded 2-core machine); an idle one a few ms. 0.3 leaves room for a
    # loaded machine's noise and still fails a spinning loop.
    await trio.sleep(0.1)
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.monotonic()
    await trio.sleep(1.0)
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.3 * (time.monotonic() - start), f"idle poll loops used {cpu:.3f} s of CPU"
    # and the connection still works after sleeping
    await client.send_all(b"wake up")
    assert await server.receive_some() == b"wake up"
    await client.aclose()
    await server.aclose()
    await listener.aclose()


async def test_send_from_flusher_serves_the_end_of_pass_flush(model_process: ModelProcess) -> None:
    # capsvc's Connection writes through stream.send_from_flusher() from trio's
    # before_io_wait (capsvc.flusher): a non-blocking send that must get the frame onto the
    # wire from there, without any task running afterwards.
    server_address, client_address = addresses(model_process)
    (listener,) = await listen_nic(server_address)
    assert isinstance(listener, NicListener)
    client, server = await open_pair(listener, client_address, StreamConfig(send_buffer=4096))
    assert not isinstance(client, SocketBackedStream)  # not TCP: no Nagle handling
    assert client.send_from_flusher(b"from a task") == len(b"from a task")
    assert await server.receive_some() == b"from a task"

    sent: list[int] = []

    class Flusher(trio.abc.Instrument):
        def before_io_wait(self, timeout: float) -> None:
            if not sent:
                sent.append(client.send_from_flusher(b"from the hook"))

    hook = Flusher()
    trio.lowlevel.add_instrument(hook)
    try:
        with trio.fail_after(10):  # real time (module docstring): the frame crosses the model
            assert await server.receive_some() == b"from the hook"
    finally:
        trio.lowlevel.remove_instrument(hook)
    assert sent == [len(b"from the hook")]

    # a full send buffer: what fits is taken, then nothing
    with trio.fail_after(10):  # real time: the acks come back through the model process
        while not client.channel.all_acked:  # the room counts unacknowledged bytes
            await client.port.lot.park()  # the poll loop wakes us when the acks came
    assert client.send_nowait(bytes(10_000)) == 4096
    assert client.send_from_flusher(b"more") == 0
    got = 0
    while got < 4096:
        got += len(await server.receive_some())
    await client.aclose()
    with pytest.raises(trio.ClosedResourceError):
        client.send_from_flusher(b"after close")
    await server.aclose()
    await listener.aclose()


async def test_busy_polling_receives_without_sleeping(model_process: ModelProcess) -> None:
    # capsvc's Connection gives every BusyPollingStream the same adaptive
    # policy as TCP's; a reader then polls the device instead of sleeping when replies
    # come within the budget, and gets the same bytes
    server_address, client_address = addresses(model_process)
    (listener,) = await listen_nic(server_address)
    assert isinstance(listener, NicListener)
    client, server = await open_pair(listener, client_address)
    assert client.busy_poll is None  # plain streams sleep
    client.busy_poll = BusyPoll(100e-6)  # TCP's budget would time out before our replies
    assert client.busy_poll.budget == MIN_BUSY_POLL

    class Uncontended(BusyPoll):  # the policy's CPU-contention test is not ours to test
        __slots__ = ()

        def yield_cpu(self) -> bool:
            return True

    # A 50 ms budget of real (perf_counter) time: replies through the model process come
    # well within it, so polls find them (hits); a virtual clock would not apply here.
    poll = client.busy_poll = Uncontended(0.05)

    async def echo() -> None:
        while data := await server.receive_some():
            await server.send_all(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        for i in range(50):
            message = b"ping %d" % i
            await client.send_all(message)
            got = b""
            while len(got) < len(message):
                got += await client.receive_some()
            assert got == message
        await client.send_eof()
    assert poll.hits > 0
    await client.aclose()
    await server.aclose()
    await listener.aclose()


#: The stream's two ways of noticing a dead peer (capsvc.nicdriver.stream): which fires
#: first depends on whether data was in flight when the model died.
DEAD_PEER = (
    r"^(the peer stopped acknowledging \(6 retransmissions\)"
    r"|the peer is silent \(no answer for [0-9.]+ s\))$"
)


async def test_a_dead_model_breaks_the_stream(rundir: Path) -> None:
    host = ModelProcess("d", rundir)
    try:
        server_address, client_address = addresses(host)
        (listener,) = await listen_nic(server_address)
        assert isinstance(listener, NicListener)
        quick = StreamConfig(max_retries=6, keepalive=0.5)
        client, server = await open_pair(listener, client_address, quick)
        host.stop()

        async def send_forever() -> None:
            while True:
                await client.send_all(b"x" * 1000)

        # Real time: the stream's retransmission and keepalive timers must run out against
        # a model that is really gone (6 retries, keepalive 0.5 s: a few seconds).
        with trio.fail_after(30), pytest.raises(trio.BrokenResourceError, match=DEAD_PEER):
            await send_forever()
        await client.aclose()
        await server.aclose()
        await listener.aclose()
    finally:
        host.stop()


@pytest.mark.parametrize(("loss", "dup", "reorder"), [(0.1, 0.05, 0.1), (0.3, 0.2, 0.3)])
async def test_model_injected_faults_lose_and_double_nothing(
    rundir: Path, loss: float, dup: float, reorder: float
) -> None:
    """Loss, duplication and reordering injected by the model's wire (spec 2.6), end to end
    through driver, rings and transport; the rates are set while the pair runs."""
    host = ModelProcess("f", rundir)
    try:
        for port in host.ports:
            control = Control(rundir / port / "control")
            control.set_fault_rates(loss, dup, reorder)
            control.close()
        server_address, client_address = addresses(host)
        (listener,) = await listen_nic(server_address)
        assert isinstance(listener, NicListener)
        client, server = await open_pair(listener, client_address)
        data = random.Random(7).randbytes(150_000)

        async def pump(stream: NicStream, payload: bytes) -> None:
            await stream.send_all(payload)
            await stream.send_eof()

        async def drain(stream: NicStream, expected: bytes) -> None:
            got = bytearray()
            while chunk := await stream.receive_some():
                got += chunk
            assert got == expected

        with trio.fail_after(60):  # real time: retransmissions through the real model
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, client, data)
                nursery.start_soon(drain, server, data)
                nursery.start_soon(pump, server, data[::-1])
                nursery.start_soon(drain, client, data[::-1])
        faults = Control(rundir / host.ports[1] / "control")
        counts = faults.fault_dict()
        faults.close()
        assert counts["injected_loss"] > 0
        assert counts["injected_dup"] > 0
        assert counts["injected_reorder"] > 0
        assert client.channel.retransmits > 0
        await client.aclose()
        await server.aclose()
        await listener.aclose()
    finally:
        host.stop()


async def test_concurrent_opens_share_one_device(model_process: ModelProcess) -> None:
    server_address, client_address = addresses(model_process)
    (listener,) = await listen_nic(server_address)
    assert isinstance(listener, NicListener)
    clients: list[NicStream] = []
    servers: list[NicStream] = []

    async def connect() -> None:
        clients.append(await connect_nic(client_address))

    async def accept() -> None:
        servers.append(await listener.accept())

    with trio.fail_after(10):  # real time (module docstring): handshakes through the model
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(connect)
                nursery.start_soon(accept)
    assert len({client.port for client in clients}) == 1  # one device, opened once
    by_conn = {server.channel.conn: server for server in servers}
    with trio.fail_after(10):  # real time, as above
        for client in clients:
            await client.send_all(b"hello")
            assert await by_conn[client.channel.conn].receive_some() == b"hello"
    for stream in clients + servers:
        await stream.aclose()
    await listener.aclose()
