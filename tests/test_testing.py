"""The testing helpers: capsvc.testing's in-memory pair, and the pytest plugin's fixtures.

Theory of operation: the in-memory tests run a real server end and client end in this
process (no socket), so they check what a user's unit test would: calls, capabilities both
ways, typed errors, the limits passed through, and what leaving the block does. The plugin
is checked as a user meets it: pytester writes a small test file using ``capsvc_serve`` and
``capsvc_connect`` and runs pytest on it in a subprocess (the entry point registered by the
install, a real loopback port); one test in it fails on purpose, and a later one checks
that the port the fixture served on is closed once its test has ended.
"""

from __future__ import annotations

import gc
import logging
import socket
from functools import cache
from pathlib import Path
from typing import Any, assert_type

import pytest
import trio
import trio.testing

import capsvc
import capsvc.testing
from capsvc import demo
from capsvc.generated.calculator_capnp import Calculator
from capsvc.generated.echo_capnp import Echo

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
EMPTY = {"questions": 0, "answers": 0, "exports": 0, "imports": 0, "embargoes": 0}


class EchoServer(Echo.Server):
    def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        results.reply = params.msg


class Refusing(Echo.Server):
    def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        raise capsvc.Failed(f"no pings today ({params.msg})")


class Buggy(Echo.Server):
    def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        results.reply = str(1 / len(params.msg))


class Stuck(Echo.Server):
    """ping never answers; it notes that it began and that it was cancelled."""

    def __init__(self) -> None:
        self.began = trio.Event()
        self.ended = False

    async def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        self.began.set()
        try:
            await trio.sleep_forever()
        finally:
            self.ended = True  # sleep_forever ends only by cancellation


class Adder(Calculator.Function.Server):
    """A Function the test passes to the server, which calls it back."""

    def __init__(self) -> None:
        self.calls: list[list[float]] = []

    def call(
        self,
        params: Calculator.Function.CallParams.Reader,
        results: Calculator.Function.CallResults.Builder,
    ) -> None:
        self.calls.append(list(params.params))
        results.value = sum(params.params)


@cache
def dynamic(name: str) -> Any:
    """A schema loaded on the dynamic path (once per run: load_schema checks it in a
    subprocess)."""
    return capsvc.load_schema(ROOT / "schemas" / name)


# ------------------------------------------------------------------ generated interfaces
async def test_client_gives_the_typed_client() -> None:
    async with capsvc.testing.client(EchoServer(), Echo) as echo:
        assert_type(echo, Echo.Client)  # to mypy, when it checks this file (no-op at run time)
        assert isinstance(echo, Echo.Client)
        assert (await echo.ping(msg="hello")).reply == "hello"
        replies = []
        async with trio.open_nursery() as nursery:  # several in flight on one connection

            async def ping(text: str) -> None:
                replies.append((await echo.ping(msg=text)).reply)

            for text in ("a", "b", "c"):
                nursery.start_soon(ping, text)
        assert sorted(replies) == ["a", "b", "c"]


async def test_connected_gives_the_client_end() -> None:
    async with capsvc.testing.connected(EchoServer()) as conn:
        assert isinstance(conn, capsvc.Connection)
        echo = conn.bootstrap(Echo)
        assert (await echo.ping(msg="over memory")).reply == "over memory"
    assert conn.closed


async def test_capabilities_both_ways_and_no_table_entry_left() -> None:
    adder = Adder()
    async with capsvc.testing.ends(demo.bootstrap()) as pair:
        calc = pair.client.bootstrap(Calculator)
        first = calc.evaluate_request()
        first.params.init_expression().literal = 2.0
        value = first.send().value  # the server's Value, pipelined (not awaited)
        request = calc.evaluate_request()
        call = request.params.init_expression().call
        call.set_function(adder)  # ours: the server calls it back
        params = call.init_params(2)
        params[0].literal = 1.5
        params[1].set_previousResult(value)  # the server's, passed back to it
        assert (await request.send().value.read()).value == 3.5
        assert adder.calls == [[1.5, 2.0]]
        del calc, first, value, request, call, params
        gc.collect()
        # In memory: once every task is blocked, every Release and Finish has been
        # handled (no socket, no timer), so the tables can be checked exactly.
        await trio.testing.wait_all_tasks_blocked()
        assert pair.client.session.table_sizes() == EMPTY
        assert pair.server.session.table_sizes() == EMPTY


async def test_the_client_end_offers_its_own_bootstrap() -> None:
    class Shouting(Echo.Server):
        def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
            results.reply = params.msg.upper()

    async with capsvc.testing.ends(EchoServer(), bootstrap=Shouting()) as pair:
        assert (await pair.server.bootstrap(Echo).ping(msg="back")).reply == "BACK"
        assert (await pair.client.bootstrap(Echo).ping(msg="forth")).reply == "forth"


# ------------------------------------------------------------------------ dynamic path
async def test_a_dynamic_interface() -> None:
    schema = dynamic("echo.capnp")

    class DynamicEcho(capsvc.Server, interface=schema.Echo):
        def ping(self, params: Any, results: Any) -> str:
            return f"<{params.msg}>"

    async with capsvc.testing.client(DynamicEcho(), schema.Echo) as echo:
        assert isinstance(echo, capsvc.Client)
        assert (await echo.ping(msg="dynamic")).reply == "<dynamic>"
        with pytest.raises(capsvc.Unimplemented, match="pingData"):
            await echo.pingData(data=b"x")
    # A dynamic client of a generated server: the two paths mix in one pair.
    async with capsvc.testing.client(EchoServer(), schema.Echo) as echo:
        assert (await echo.ping(msg="mixed")).reply == "mixed"


async def test_a_dynamic_callback() -> None:
    schema = dynamic("calculator.capnp")

    class Square(capsvc.Server, interface=schema.Calculator.Function):
        def call(self, params: Any, results: Any) -> float:
            return float(params.params[0]) ** 2

    async with capsvc.testing.client(demo.bootstrap(), schema.Calculator) as calc:
        request = calc.evaluate_request()
        call = request.params.expression.init("call")
        call.function = Square()
        call.init("params", 1)[0].literal = 3.0
        assert (await request.send().value.read()).value == 9.0


# ----------------------------------------------------------------------------- errors
async def test_a_server_error_is_typed_inside_the_block() -> None:
    async with capsvc.testing.client(Refusing(), Echo) as echo:
        with pytest.raises(capsvc.Failed, match=r"no pings today \(now\)"):
            await echo.ping(msg="now")
        with pytest.raises(capsvc.Unimplemented):  # the connection lives on
            await echo.pingData(data=b"still connected")


async def test_a_server_error_comes_out_of_the_block_as_itself() -> None:
    with pytest.raises(capsvc.RpcError) as caught:
        async with capsvc.testing.client(Refusing(), Echo) as echo:
            await echo.ping(msg="out")
    assert caught.type is capsvc.Failed  # not an ExceptionGroup of one
    assert "no pings today (out)" in str(caught.value)


async def test_any_error_of_the_block_comes_out_as_itself() -> None:
    with pytest.raises(KeyError, match="mine"):
        async with capsvc.testing.ends(EchoServer()):
            raise KeyError("mine")


async def test_a_bug_in_a_server_method_is_failed_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="capsvc")
    async with capsvc.testing.client(Buggy(), Echo) as echo:
        with pytest.raises(capsvc.Failed, match=r"Echo\.ping raised ZeroDivisionError"):
            await echo.ping(msg="")
    logged = [r for r in caplog.records if "raised ZeroDivisionError" in r.getMessage()]
    assert len(logged) == 1
    assert logged[0].levelno == logging.WARNING


# -------------------------------------------------------------------- leaving the block
async def test_leaving_the_block_fails_a_pending_call_and_closes_both_ends() -> None:
    stuck = Stuck()
    async with capsvc.testing.ends(stuck) as pair:
        promise = pair.client.bootstrap(Echo).ping(msg="never answered")
        await stuck.began.wait()
    with pytest.raises(capsvc.Disconnected, match="connection closed locally"):
        await promise
    assert pair.client.closed
    assert pair.server.closed
    await trio.testing.wait_all_tasks_blocked()
    assert stuck.ended  # the server's method was cancelled, not left running


async def test_a_task_waiting_on_a_call_gets_disconnected_when_the_block_ends() -> None:
    stuck = Stuck()
    errors: list[BaseException] = []

    async def wait_for(echo: Echo.Client) -> None:
        try:
            await echo.ping(msg="waiting")
        except capsvc.RpcError as error:
            errors.append(error)

    async with trio.open_nursery() as nursery:
        async with capsvc.testing.client(stuck, Echo) as echo:
            nursery.start_soon(wait_for, echo)
            await stuck.began.wait()
    assert len(errors) == 1
    assert isinstance(errors[0], capsvc.Disconnected)


# ----------------------------------------------------------------------------- limits
async def test_limits_apply_to_the_client_end(autojump_clock: trio.testing.MockClock) -> None:
    limits = capsvc.Limits(idle_timeout=10)
    async with capsvc.testing.ends(EchoServer(), limits=limits) as pair:
        await trio.sleep(9)
        assert not pair.client.closed
        await trio.sleep(2)  # virtual time: idle past 10 s
        assert pair.client.closed
        assert "idle_timeout" in str(pair.client.session.abort_reason)
        assert pair.server.session.abort_reason is None  # its own limits are the defaults
        with pytest.raises(capsvc.Disconnected):
            await pair.client.bootstrap(Echo).ping(msg="too late")


async def test_server_limits_apply_to_the_server_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits = capsvc.Limits(idle_timeout=10)
    async with capsvc.testing.ends(EchoServer(), server_limits=limits) as pair:
        await trio.sleep(11)  # virtual time
        assert pair.server.closed
        assert "idle_timeout" in str(pair.server.session.abort_reason)
        assert pair.client.session.abort_reason is None
        with pytest.raises(capsvc.Disconnected, match="idle_timeout"):
            await pair.client.bootstrap(Echo).ping(msg="too late")


# ---------------------------------------------------------------------- the pytest plugin
USER_TESTS = """
import socket
from pathlib import Path

import pytest

import capsvc
from capsvc.generated.calculator_capnp import Calculator
from capsvc.generated.echo_capnp import Echo
from capsvc.testing import Connect, Serve

RECORD = Path(__file__).with_name("address.txt")
HELD = []


class EchoServer(Echo.Server):
    def ping(self, params, results):
        results.reply = params.msg


@pytest.mark.trio
async def test_serves_on_loopback(capsvc_serve: Serve) -> None:
    address = await capsvc_serve(EchoServer())
    assert address.startswith("tcp:127.0.0.1:")
    assert not address.endswith(":0")
    RECORD.write_text(address)
    async with capsvc.connect(address) as conn:
        assert (await conn.bootstrap(Echo).ping(msg="hi")).reply == "hi"


@pytest.mark.trio
async def test_a_wrong_assertion_fails(capsvc_serve: Serve) -> None:
    address = await capsvc_serve(EchoServer())
    async with capsvc.connect(address) as conn:
        assert (await conn.bootstrap(Echo).ping(msg="hi")).reply == "bye"


def test_the_port_is_closed_once_its_test_ended() -> None:
    host, port = RECORD.read_text().removeprefix("tcp:").rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=10).close()


@pytest.mark.trio
async def test_an_app_by_name_and_a_held_connection(
    capsvc_serve: Serve, capsvc_connect: Connect
) -> None:
    address = await capsvc_serve("echo_app:make", limits=capsvc.Limits(max_answers=100))
    conn = await capsvc_connect(address)
    HELD.append(conn)
    assert (await conn.bootstrap(Echo).ping(msg="by name")).reply == "BY NAME"
    calc = (await capsvc_connect(await capsvc_serve("capsvc.demo:bootstrap"))).bootstrap(
        Calculator
    )
    request = calc.evaluate_request()
    request.params.init_expression().literal = 4.0
    assert (await request.send().value.read()).value == 4.0


def test_the_held_connection_was_closed_at_teardown() -> None:
    assert len(HELD) == 1
    assert HELD[0].closed


@pytest.mark.trio
async def test_a_bad_app_name_says_so(capsvc_serve: Serve) -> None:
    with pytest.raises(Exception, match="has no attribute 'nothing'"):
        await capsvc_serve("echo_app:nothing")
"""

ECHO_APP = """
from capsvc.generated.echo_capnp import Echo


class Shouting(Echo.Server):
    def ping(self, params, results):
        results.reply = params.msg.upper()


async def make():
    return Shouting()
"""


def run_user_tests(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_user=USER_TESTS, echo_app=ECHO_APP)
    # Real time: a pytest subprocess serving on loopback; the timeout bounds a hang.
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)


def test_the_plugin_serves_on_a_real_port_and_stops_at_teardown(
    pytester: pytest.Pytester,
) -> None:
    result = run_user_tests(pytester)
    result.assert_outcomes(passed=5, failed=1)
    result.stdout.fnmatch_lines(["*FAILED test_user.py::test_a_wrong_assertion_fails*"])
    result.stdout.fnmatch_lines(["*AssertionError*"])
    address = (pytester.path / "address.txt").read_text()
    host, port = address.removeprefix("tcp:").rsplit(":", 1)
    # The subprocess has exited, so this adds little to the check inside it
    # (test_the_port_is_closed_once_its_test_ended, while the process still ran).
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=10).close()


def test_the_plugin_is_registered_and_documents_its_fixtures(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--fixtures", "-p", "no:cacheprovider", timeout=120)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*capsvc_serve*", "*serves on a real loopback port*"])
    result.stdout.fnmatch_lines(["*capsvc_connect*", "*closed at teardown*"])


def test_the_plugin_can_be_turned_off(pytester: pytest.Pytester) -> None:
    result = run_user_tests(pytester, "-p", "no:capsvc", "-k", "serves_on_loopback")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'capsvc_serve' not found*"])


def test_loading_the_plugin_imports_nothing_of_capsvc(pytester: pytest.Pytester) -> None:
    # The plugin is loaded in every pytest run where capsvc is installed: it must not
    # import capsvc (which picks its build) or trio until a fixture is used.
    pytester.makepyfile(
        test_untouched="""
        import sys

        def test_untouched():
            assert "capsvc_pytest" in sys.modules  # loaded, as an entry point
            assert not [name for name in sys.modules if name.split(".")[0] == "capsvc"]
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=1)
