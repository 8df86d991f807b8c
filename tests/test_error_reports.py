"""Errors a person can act on (issue 12, point 1), over real loopback TCP.

- an error raised inside ``async with capsvc.connect(...)`` comes out as itself, not as
  an ExceptionGroup of one;
- a server method that raises an unexpected exception: the caller's ``failed`` names the
  method by its schema names and the exception type, the server logs the traceback once
  at WARNING, and the traceback text reaches the caller only if the server class asks.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import pytest
import trio

import capsvc
from capsvc.generated.echo_capnp import Echo
from tests.support.tester import Tester, TesterImpl


class BrokenTester(TesterImpl):
    async def echo(self, params: Any, results: Any) -> None:
        results.reply = str(1 / len(params.msg))  # an empty msg divides by zero


class TellingTester(BrokenTester):
    capsvc_send_tracebacks = True


class BrokenEcho(Echo.Server):
    def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        raise KeyError(params.msg)


async def failure_of(server: Any, interface: Any, call: Any) -> capsvc.Failed:
    """Serve ``server`` on loopback TCP, make ``call(bootstrap)``; the Failed it raised."""
    return await raised_by(server, interface, call, capsvc.Failed)


E = TypeVar("E", bound=capsvc.RpcError)


async def raised_by(server: Any, interface: Any, call: Any, kind: type[E]) -> E:
    """Serve ``server`` on loopback TCP, make ``call(bootstrap)``; the ``kind`` it raised."""
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", server)
        async with capsvc.connect(address) as conn:
            with pytest.raises(kind) as caught:
                await call(conn.bootstrap(interface))
        nursery.cancel_scope.cancel()
    return caught.value


async def test_an_error_in_the_connect_block_comes_out_as_itself() -> None:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", TesterImpl())
        with pytest.raises(capsvc.Overloaded, match="busy"):
            async with capsvc.connect(address) as conn:
                await conn.bootstrap(Tester).fail(kind="overloaded", reason="busy")
        with pytest.raises(ValueError, match="mine"):
            async with capsvc.connect(address):
                raise ValueError("mine")
        nursery.cancel_scope.cancel()


async def test_an_unexpected_exception_names_the_method_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="capsvc")
    failed = await failure_of(BrokenTester(), Tester, lambda tester: tester.echo(msg=""))
    assert failed.reason == "Tester.echo raised ZeroDivisionError: division by zero"
    assert failed.trace == ""  # off by default: a traceback can leak internals
    records = [r for r in caplog.records if "raised" in r.getMessage()]
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert records[0].getMessage() == "Tester.echo raised ZeroDivisionError"
    assert records[0].exc_info is not None
    assert records[0].exc_info[0] is ZeroDivisionError


class KjTester(TesterImpl):
    async def echo(self, params: Any, results: Any) -> None:
        from capsvc.rpc.wire import rpc  # pycapnp's own reader, refusing a bad message

        with rpc.Message.from_bytes(b"\x05\x00\x00\x00\x09\x00\x00\x00") as message:
            results.reply = str(message.which())


async def test_a_pycapnp_error_reaches_the_caller_without_stack_addresses() -> None:
    """pycapnp's (kj's) exceptions end in a line of C++ stack addresses: the caller gets
    the reason, the addresses stay in this process's log."""
    failed = await failure_of(KjTester(), Tester, lambda tester: tester.echo(msg=""))
    assert failed.reason.startswith("Tester.echo raised KjException: capnp/serialize.c++:")
    assert failed.reason.endswith("Message ends prematurely in segment table.")
    assert "stack:" not in failed.reason


async def test_the_traceback_reaches_the_caller_only_when_the_server_asks() -> None:
    failed = await failure_of(TellingTester(), Tester, lambda tester: tester.echo(msg=""))
    assert failed.trace.startswith("Traceback (most recent call last):")
    assert "ZeroDivisionError: division by zero" in failed.trace
    assert "in echo" in failed.trace


async def test_generated_servers_name_their_methods_too() -> None:
    failed = await failure_of(BrokenEcho(), Echo, lambda echo: echo.ping(msg="k"))
    assert failed.reason == "Echo.ping raised KeyError: 'k'"


class PingOnly(Echo.Server):
    def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        results.reply = params.msg


async def unimplemented_of(server: Any, interface: Any, call: Any) -> capsvc.Unimplemented:
    return await raised_by(server, interface, call, capsvc.Unimplemented)


async def test_unimplemented_names_the_method_by_its_schema_names() -> None:
    # A generated server base without one of its methods.
    missing = await unimplemented_of(PingOnly(), Echo, lambda echo: echo.pingData(data=b"x"))
    assert missing.reason == "PingOnly does not implement Echo.pingData"
    # A server asked for an interface it does not serve (both known to this process).
    other = await unimplemented_of(TesterImpl(), Echo, lambda echo: echo.ping(msg="x"))
    assert other.reason == "TesterImpl does not implement Echo.ping; it serves Tester"
    # The same the other way round: a dynamic interface's method on a generated server.
    dynamic = await unimplemented_of(PingOnly(), Tester, lambda tester: tester.echo(msg="x"))
    assert dynamic.reason == "PingOnly does not implement Tester.echo; it serves Echo"


async def test_a_connection_closed_by_us_says_so() -> None:
    # The reader then sees its own stream closed: that is no "connection lost".
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", TesterImpl())
        async with capsvc.connect(address) as conn:
            await conn.bootstrap(Tester).echo(msg="x")
        nursery.cancel_scope.cancel()
    assert isinstance(conn.close_reason, capsvc.Disconnected)
    assert conn.close_reason.reason == "connection closed locally"
