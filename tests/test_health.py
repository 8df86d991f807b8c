"""Health over Cap'n Proto (capsvc.health, issue 13 point 3): the serving state, Health
served beside an application's bootstrap, and the ``capsvc health`` client.

- ServingState: its transitions, and the moves it refuses;
- over loopback TCP: the routing bootstrap sends Echo calls to the app and Health calls to
  the HealthServer, whose answer follows the state (notServing while starting, serving,
  notServing once draining); unknown service names; no app at all;
- the C++ reference as the client (pycapnp in a subprocess): ``bootstrap().cast_as(Health)``
  reaches Health on a capsvc server, and ``cast_as(Echo)`` the app, on one capability;
- ``check`` / ``main_health`` against a closed port, a server without Health, something
  that is not Cap'n Proto, and one that never answers: each a HealthCheckError that says so;
- reference counts: the router keeps no reference per call and releases both hooks when
  its last owner lets go; a connection's tables empty once the client drops the bootstrap.
"""

from __future__ import annotations

import gc
import os
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing

import capsvc
import capsvc.testing
from capsvc import typed
from capsvc.errors import LocalProtocolError
from capsvc.generated.echo_capnp import Echo
from capsvc.health import (
    TRANSITIONS,
    Health,
    HealthCheckError,
    HealthRouted,
    HealthServer,
    Serving,
    ServingInput,
    ServingState,
    ServingStatus,
    check,
    main_health,
    with_health,
)
from capsvc.rpc.hooks import LocalServerHook
from tests.support.checks import EMPTY
from tests.support.peers import PYTHON, ROOT, peer_env


class EchoApp(Echo.Server):
    """The application: ``ping`` runs inline (plain def), ``pingData`` in a task."""

    def __init__(self) -> None:
        self.pings = 0

    def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        self.pings += 1
        results.reply = params.msg

    async def pingData(
        self, params: Echo.PingDataParams.Reader, results: Echo.PingDataResults.Builder
    ) -> None:
        await trio.lowlevel.checkpoint()
        results.data = params.data


@asynccontextmanager
async def serving(app: object, health: HealthServer) -> AsyncIterator[str]:
    """Serve ``app`` with Health beside it on loopback for the block; yields the address."""
    async with trio.open_nursery() as nursery:
        address: str = await nursery.start(
            capsvc.serve, "tcp:127.0.0.1:0", HealthRouted(app, health)
        )
        yield address
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ the serving state


def test_the_serving_state_moves_forward_only() -> None:
    state = ServingState()
    assert (state.state, state.name, state.ready) == (Serving.STARTING, "starting", False)
    state.serve()
    assert (state.name, state.ready) == ("serving", True)
    # Back to serving after a drain began: refused, and the state stays as it was.
    state.drain()
    with pytest.raises(LocalProtocolError, match=r"^serving state draining: .* is illegal$"):
        state.serve()
    assert (state.name, state.ready) == ("draining", False)
    state.drain()  # a second SIGTERM: harmless
    state.stop()
    state.stop()
    assert (state.name, state.ready) == ("stopped", False)
    with pytest.raises(LocalProtocolError):
        state.drain()


def test_every_state_has_a_way_to_stop_and_only_serving_is_ready() -> None:
    for current, moves in TRANSITIONS.items():
        assert moves[ServingInput.STOP] is Serving.STOPPED, current
        assert ServingState(current).ready is (current is Serving.SERVING)
    # SERVE only from STARTING.
    assert [s for s, moves in TRANSITIONS.items() if ServingInput.SERVE in moves] == [
        Serving.STARTING
    ]


# ------------------------------------------------------------------ routing, over TCP


async def test_app_calls_and_health_share_the_bootstrap() -> None:
    state = ServingState()
    app = EchoApp()
    async with serving(app, HealthServer(state)) as address:
        async with capsvc.connect(address) as conn:
            echo = conn.bootstrap(Echo)
            health = echo.cast_as(Health)
            assert (await health.check()).status is ServingStatus.notServing  # starting
            assert (await echo.ping(msg="hi")).reply == "hi"
            assert (await echo.pingData(data=b"\x00\x01")).data == b"\x00\x01"
            state.serve()
            assert (await health.check(service="")).status is ServingStatus.serving
            # Pipelined on the bootstrap question: both kinds of call reach their target.
            both = conn.bootstrap(Echo)
            reply, status = await echo.ping(msg="again"), await both.cast_as(Health).check()
            assert (reply.reply, status.status) == ("again", ServingStatus.serving)
            state.drain()
            assert (await health.check()).status is ServingStatus.notServing
            assert app.pings == 2
        # The client function sees the same.
        assert await check(address) == "notServing"


async def test_unknown_services_and_named_ones() -> None:
    state = ServingState()
    state.serve()
    async with serving(EchoApp(), HealthServer(state, services=["Echo"])) as address:
        assert await check(address, service="Echo") == "serving"
        assert await check(address, service="Calculator") == "serviceUnknown"
        assert await check(address) == "serving"
        state.drain()
        assert await check(address, service="Echo") == "notServing"
        assert await check(address, service="Calculator") == "serviceUnknown"


async def test_without_an_app_other_calls_are_unimplemented() -> None:
    state = ServingState()
    state.serve()
    async with serving(None, HealthServer(state)) as address:
        async with capsvc.connect(address) as conn:
            echo = conn.bootstrap(Echo)
            with pytest.raises(capsvc.Unimplemented, match=r"^Echo\.ping: .*serves only Health"):
                await echo.ping(msg="hi")
            assert (await echo.cast_as(Health).check()).status is ServingStatus.serving


PYCAPNP_CLIENT = r"""
import asyncio, sys, capnp
health = capnp.load(sys.argv[1])
echo = capnp.load(sys.argv[2])

async def main(host, port):
    stream = await capnp.AsyncIoStream.create_connection(host=host, port=int(port))
    client = capnp.TwoPartyClient(stream)
    boot = client.bootstrap()
    checker = boot.cast_as(health.Health)
    print("first", (await checker.check(service="")).status, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print("then", (await checker.check(service="")).status, flush=True)
    print("other", (await checker.check(service="nope")).status, flush=True)
    print("echo", (await boot.cast_as(echo.Echo).ping(msg="from C++")).reply, flush=True)

asyncio.run(capnp.run(main(*sys.argv[3].rsplit(":", 1))))
"""


async def test_a_cxx_client_reaches_health_through_the_bootstrap() -> None:
    """pycapnp (the C++ implementation) as the client: Health and the app on one
    bootstrap capability, as schemas/health.capnp tells clients to reach it."""
    state = ServingState()
    async with serving(EchoApp(), HealthServer(state)) as address:
        process = await trio.lowlevel.open_process(
            [
                PYTHON,
                "-c",
                PYCAPNP_CLIENT,
                os.path.join(ROOT, "schemas", "health.capnp"),
                os.path.join(ROOT, "schemas", "echo.capnp"),
                address.removeprefix("tcp:"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=peer_env(),
        )
        assert process.stdin is not None
        assert process.stdout is not None
        output = b""
        # Real time: the client is another process; the limit only bounds a hung one.
        with trio.fail_after(40):
            while b"first" not in output or not output.endswith(b"\n"):
                chunk = await process.stdout.receive_some(4096)
                assert chunk, output
                output += chunk
            state.serve()
            await process.stdin.send_all(b"go\n")
            while chunk := await process.stdout.receive_some(4096):
                output += chunk
            assert await process.wait() == 0, output
    assert output.decode().splitlines() == [
        "first notServing",
        "then serving",
        "other serviceUnknown",
        "echo from C++",
    ]


# ------------------------------------------------------------------ the client's errors


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_an_unreachable_address_is_a_clear_error() -> None:
    address = f"tcp:127.0.0.1:{closed_port()}"
    with pytest.raises(HealthCheckError, match=rf"^{address}: cannot connect: "):
        await check(address)


async def test_a_server_without_health_says_so() -> None:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", EchoApp())
        with pytest.raises(
            HealthCheckError,
            match=r"does not serve Health \(schemas/health\.capnp\) on its bootstrap: "
            r"EchoApp does not implement Health\.check; it serves Echo$",
        ):
            await check(address)
        nursery.cancel_scope.cancel()


async def test_something_that_is_not_capnp_is_a_clear_error() -> None:
    """An HTTP server where a Cap'n Proto one was expected: it answers garbage and hangs up."""

    async def http_reply(stream: trio.SocketStream) -> None:
        await stream.send_all(b"HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, http_reply, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(HealthCheckError) as raised:
            await check(f"tcp:127.0.0.1:{port}")
        nursery.cancel_scope.cancel()
    text = str(raised.value)
    assert text.startswith(
        f"tcp:127.0.0.1:{port}: what answers there does not speak Cap'n Proto RPC: "
    ), text


async def test_a_server_that_never_answers_times_out() -> None:
    accepted = trio.Event()

    async def silent(stream: trio.SocketStream) -> None:
        accepted.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, silent, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(HealthCheckError, match=r": no answer within 0\.3 s$"):
            await check(f"tcp:127.0.0.1:{port}", timeout=0.3)
        assert accepted.is_set()
        nursery.cancel_scope.cancel()


async def test_main_health_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    """0 iff serving, with the status line on stdout; 1 otherwise; 2 for a bad address.
    main_health runs trio itself, so each run is in a thread of its own."""
    state = ServingState()
    async with serving(EchoApp(), HealthServer(state)) as address:
        assert await trio.to_thread.run_sync(main_health, address, "", 5.0) == 1
        state.serve()
        assert await trio.to_thread.run_sync(main_health, address, "", 5.0) == 0
        assert await trio.to_thread.run_sync(main_health, address, "Nope", 5.0) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"{address}: notServing",
        f"{address}: serving",
        f"{address} Nope: serviceUnknown",
    ]
    assert err == ""
    unreachable = f"tcp:127.0.0.1:{closed_port()}"
    assert await trio.to_thread.run_sync(main_health, unreachable, "", 5.0) == 1
    assert await trio.to_thread.run_sync(main_health, "nonsense:here", "", 5.0) == 2
    out, err = capsys.readouterr()
    assert out == ""
    first, second = err.splitlines()
    assert first.startswith(f"capsvc: error: {unreachable}: cannot connect: "), err
    assert second.startswith("capsvc: error: "), err


# ------------------------------------------------------------------ reference counts


def unknown_call(client: Echo.Client) -> Echo.PingResults.Promise:
    """A call to an interface no schema here defines, on ``client``'s capability."""
    return typed.Request(
        client, 0x8000_0000_0000_1234, 0, Echo.PingParams.Builder, Echo.PingResults.Promise
    ).send()


async def test_the_router_keeps_nothing_per_call_and_releases_both_hooks() -> None:
    state = ServingState()
    state.serve()
    app, health = EchoApp(), HealthServer(state)
    router = with_health(app._capsvc_hook(), health._capsvc_hook())
    app_hook, health_hook = app._capsvc_live_hook, health._capsvc_live_hook
    assert isinstance(app_hook, LocalServerHook)
    assert isinstance(health_hook, LocalServerHook)
    assert (router.refs, app_hook.refs, health_hook.refs) == (1, 1, 1)
    # Local calls through the router (not from a peer: each runs in a task), every kind.
    echo = Echo.Client(router.add_ref())
    checker = echo.cast_as(Health)
    for _ in range(3):
        assert (await echo.ping(msg="x")).reply == "x"
        assert (await echo.pingData(data=b"y")).data == b"y"
        assert (await checker.check()).status is ServingStatus.serving
        with pytest.raises(capsvc.Unimplemented):
            await unknown_call(echo)
    gc.collect()  # the exceptions' tracebacks hold the failed calls' promises
    await trio.testing.wait_all_tasks_blocked()
    assert (router.refs, app_hook.refs, health_hook.refs) == (3, 1, 1)  # ours + 2 clients
    echo.close()
    checker.close()
    assert router.refs == 1
    router.release()
    # The last owner let go: both hooks are released and their servers forget them.
    assert (app_hook.refs, health_hook.refs) == (0, 0)
    assert app._capsvc_live_hook is None
    assert health._capsvc_live_hook is None


async def test_a_router_without_an_app_releases_the_health_hook() -> None:
    health = HealthServer(ServingState())
    router = with_health(None, health._capsvc_hook())
    health_hook = health._capsvc_live_hook
    assert health_hook is not None
    with Echo.Client(router.add_ref()) as echo:
        with pytest.raises(capsvc.Unimplemented, match="serves only Health"):
            await echo.ping()
        assert (await echo.cast_as(Health).check()).status is ServingStatus.notServing
    gc.collect()
    assert (router.refs, health_hook.refs) == (1, 1)
    router.release()
    assert health_hook.refs == 0
    assert health._capsvc_live_hook is None


async def test_tables_empty_once_the_client_drops_the_bootstrap() -> None:
    """Over a connection (an in-memory pair: both ends' tables are at hand, and
    wait_all_tasks_blocked says when every message has been handled)."""
    state = ServingState()
    state.serve()
    async with capsvc.testing.ends(HealthRouted(EchoApp(), HealthServer(state))) as pair:
        echo = pair.client.bootstrap(Echo)
        checker = echo.cast_as(Health)
        assert (await echo.ping(msg="x")).reply == "x"
        assert (await echo.pingData(data=b"y")).data == b"y"
        assert (await checker.check()).status is ServingStatus.serving
        with pytest.raises(capsvc.Unimplemented):
            await unknown_call(echo)
        gc.collect()  # the exception's traceback holds the failed call's promise
        await trio.testing.wait_all_tasks_blocked()
        # The client holds the bootstrap, nothing else.
        assert pair.server.session.table_sizes() == dict(EMPTY, exports=1)
        assert pair.client.session.table_sizes() == dict(EMPTY, imports=1)
        echo.close()
        checker.close()
        await trio.testing.wait_all_tasks_blocked()
        assert pair.server.session.table_sizes() == EMPTY
        assert pair.client.session.table_sizes() == EMPTY


async def test_the_router_is_disposed_once_serve_ends() -> None:
    app, health = EchoApp(), HealthServer(ServingState())
    async with serving(app, health) as address:
        async with capsvc.connect(address) as conn:
            assert (await conn.bootstrap(Echo).ping(msg="x")).reply == "x"
    gc.collect()
    assert app._capsvc_live_hook is None
    assert health._capsvc_live_hook is None


# ------------------------------------------------------------------ capsvc.serve's wiring


async def test_serve_moves_its_serving_state_and_answers_health_from_it() -> None:
    """``serve(health=True, serving=state)``: SERVING once bound, DRAINING as soon as the
    shutdown begins (while ``drain_delay`` still accepts), STOPPED when it returned; the
    app's interface name is a known service."""
    state = ServingState()
    shutdown = trio.Event()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            address: str = await nursery.start(
                partial(
                    capsvc.serve,
                    "tcp:127.0.0.1:0",
                    EchoApp(),
                    health=True,
                    serving=state,
                    shutdown=shutdown,
                    # Real time (real sockets): the delay only has to outlast the
                    # connection and two calls below, made at once on loopback.
                    drain_delay=0.5,
                )
            )
            assert state.state is Serving.SERVING
            assert await check(address) == "serving"
            assert await check(address, service="Echo") == "serving"
            assert await check(address, service="Other") == "serviceUnknown"
            shutdown.set()
            await trio.testing.wait_all_tasks_blocked()
            assert state.state is Serving.DRAINING
            # Inside the drain delay: still accepting and serving, but not ready.
            async with capsvc.connect(address) as conn:
                echo = conn.bootstrap(Echo)
                assert (await echo.ping(msg="late")).reply == "late"
                assert (await echo.cast_as(Health).check()).status is ServingStatus.notServing
    assert state.state is Serving.STOPPED


async def test_serve_without_health_routes_nothing() -> None:
    async with trio.open_nursery() as nursery:
        address: str = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", EchoApp())
        with pytest.raises(HealthCheckError, match="does not serve Health"):
            await check(address)
        nursery.cancel_scope.cancel()
