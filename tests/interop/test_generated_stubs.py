"""Generated stubs (``capsvc gen``) over real TCP on 127.0.0.1: typed clients against a
server on a generated base, against the C++ reference (pycapnp), and the C++ reference's
client against a server on a generated base. Also typed and dynamic objects mixed.

tests/generated/testing_capnp.py is generated from tests/schemas/testing.capnp (a test
checks it is not stale); tests/support/typed_tester.py is the Tester written on it.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import capsvc
from tests.generated import testing_capnp as t
from tests.support.checks import assert_tables, peer_deadline
from tests.support.peers import PYTHON, PeerProcess, peer_env, peer_script
from tests.support.tester import TesterImpl, testing
from tests.support.typed_tester import TypedCallback, TypedCounter, TypedTester


@asynccontextmanager
async def typed_tester(address: str) -> AsyncIterator[tuple[capsvc.Connection, t.Tester.Client]]:
    async with capsvc.connect(address) as conn:
        yield conn, conn.bootstrap(t.Tester)


@asynccontextmanager
async def local_server(server: Any) -> AsyncIterator[str]:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", server)
        yield address
        nursery.cancel_scope.cancel()


async def exercise_tester(tester: t.Tester.Client, *, any_failure_type: bool) -> None:
    """Every Tester method through the typed client (what both servers must pass)."""
    assert (await tester.echo(msg="héllo")).reply == "héllo"
    counter = tester.newCounter(start=5).counter  # a typed client before the return
    assert (await counter.increment(by=2)).value == 7
    assert (await counter.get()).value == 7
    callback = TypedCallback()
    assert (await tester.callBack(cb=callback, value=20)).ack == 41
    assert callback.seen == [20]
    mine = TypedCounter(100)
    assert (await tester.callCounter(counter=mine, by=3)).value == 103
    back = tester.reflect(cap=mine).cap  # our own object, reflected: an embargo
    first, second = back.increment(by=1), back.increment(by=2)
    assert [(await first).value, (await second).value] == [104, 106]
    assert mine.increments == [3, 1, 2]  # in the order they were made
    remote = [tester.newCounter(start=s).counter for s in (1, 20)]
    assert (await tester.sum(counters=[*remote, TypedCounter(300)])).total == 321
    same = tester.getSelf().self_
    assert (await same.echo(msg="via getSelf")).reply == "via getSelf"
    request = tester.holdCaps_request()
    holder = request.params.holder
    holder.name = "outer"
    holder.set_cap(TypedCounter(10))
    holder.inner.set_cap(counter)  # a capability of the peer's, sent back
    caps = holder.init_caps(2)
    caps[0] = TypedCounter(20)
    caps[1] = remote[0]
    holder.choice.set_counter(TypedCounter(30))
    holder.extra.set_callback(callback)
    echoed = (await request.send()).holder
    assert echoed.name == "outer"
    assert (await echoed.cap.increment(by=1)).value == 11
    assert (await echoed.inner.cap.get()).value == 7
    assert [(await c.get()).value for c in echoed.caps] == [20, 1]
    assert echoed.choice.which() == "counter"
    assert (await echoed.choice.counter.get()).value == 30
    assert (await echoed.extra.callback.notify(value=1)).ack == 3
    for kind, error in (("failed", capsvc.Failed), ("overloaded", capsvc.Overloaded)):
        with pytest.raises(capsvc.RpcError) as info:
            await tester.fail(kind=kind, reason=f"asked for {kind}")
        assert f"asked for {kind}" in info.value.reason
        if not any_failure_type:
            assert type(info.value) is error
    unknown = tester.cast_as(t.Unknown.Client)
    with pytest.raises(capsvc.Unimplemented):
        await unknown.nothing()
    assert (await tester.echo(msg="still here")).reply == "still here"


async def test_typed_client_and_typed_server() -> None:
    server = TypedTester()
    async with local_server(server) as address, typed_tester(address) as (conn, tester):
        with peer_deadline():
            await exercise_tester(tester, any_failure_type=False)
        assert server.counters_made == 3
        del tester
        await assert_tables(conn)


async def test_typed_client_and_the_cpp_reference_server(pycapnp_tester: PeerProcess) -> None:
    async with typed_tester(pycapnp_tester.address) as (conn, tester):
        with peer_deadline():
            await exercise_tester(tester, any_failure_type=True)  # pycapnp raises only FAILED
        del tester
        await assert_tables(conn)


async def test_the_cpp_reference_client_and_a_typed_server(
    capsvc_typed_tester: PeerProcess,
) -> None:
    """Every check of tests/peers/pycapnp_tester_client.py, strict exception types."""
    with peer_deadline(60):
        done = await trio.run_process(
            [PYTHON, peer_script("pycapnp_tester_client"), capsvc_typed_tester.hostport],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=peer_env(),
        )
    output = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 0, output
    checks = [
        line.split()[1] for line in done.stdout.decode().splitlines() if line.startswith("ok ")
    ]
    assert "holdcaps" in checks
    assert "lastrefpipe" in checks
    assert len(checks) == 14, output


async def test_the_demo_client_side_against_the_cpp_calculator(
    pycapnp_calculator: PeerProcess,
) -> None:
    """capsvc.demo's client side (generated stubs: unions of interfaces, lists of structs
    in params, pipelining on results, a client-hosted callback) against the C++ sample."""
    from capsvc import demo

    async with capsvc.connect(pycapnp_calculator.address) as conn:
        calc = conn.bootstrap(demo.CALCULATOR)
        lines: list[str] = []
        with peer_deadline():
            found = await demo.run_tour(calc, lines.append)
            assert await demo.evaluate_infix(calc, "2 ** 3 + (1 - 4) / 2") == 6.5
        assert found == {
            "literal": 123.0,
            "add": 46.0,
            "pipelining": 27.0,
            "functions": 5478.0,
            "callback": 19.0,
        }
        assert lines[-1].endswith("(pow called 1 time)")
        del calc
        await assert_tables(conn)


async def drop_a_message_holding_imports(tester: t.Tester.Client, conn: capsvc.Connection) -> None:
    """Imported capabilities put into a message of its own (``new_message``, a field set
    twice, a list, a reader of it), then every reference dropped: the message releases
    its cap table's references when it is gone, as libcapnp's does, so the imports are
    released and only the bootstrap's is left (rpc-protocol.md §7)."""
    counter = (await tester.newCounter(start=1)).counter
    other = (await tester.newCounter(start=2)).counter
    await assert_tables(conn, imports=3)
    holder = t.Holder.new_message(cap=counter, caps=[counter, other])
    holder.cap = other  # set again: a second cap-table entry, as libcapnp makes
    reader = t.Holder.new_message(inner={"cap": counter}).as_reader()
    del holder
    assert (await reader.inner.cap.get()).value == 1  # the reader keeps its message's
    counter.close()
    other.close()
    del reader
    await assert_tables(conn, imports=1)


async def test_a_dropped_message_releases_its_imports() -> None:
    async with local_server(TypedTester()) as address, typed_tester(address) as (conn, tester):
        with peer_deadline():
            await drop_a_message_holding_imports(tester, conn)


async def test_a_dropped_message_releases_the_cpp_servers_imports(
    pycapnp_tester: PeerProcess,
) -> None:
    async with typed_tester(pycapnp_tester.address) as (conn, tester):
        with peer_deadline():
            await drop_a_message_holding_imports(tester, conn)


async def test_typed_and_dynamic_objects_mix() -> None:
    """A typed client of a dynamic server, and a dynamic client of a typed server."""
    async with local_server(TesterImpl()) as address, typed_tester(address) as (_, tester):
        assert (await tester.newCounter(start=2).counter.increment(by=3)).value == 5
        mine = TypedCounter(1)
        assert (await tester.callCounter(counter=mine, by=1)).value == 2
    async with local_server(TypedTester()) as address, capsvc.connect(address) as conn:
        dynamic = conn.bootstrap(testing.Tester)
        assert (await dynamic.newCounter(start=2).counter.increment(by=3)).value == 5
        assert (await dynamic.echo(msg="x")).reply == "x"


async def test_a_method_not_overridden_answers_unimplemented_per_class() -> None:
    """What a typed server class implements is found once per class: a subclass that adds
    a method implements it, its base still does not."""

    class OnlyGet(t.Counter.Server):
        def get(
            self, params: t.Counter.GetParams.Reader, results: t.Counter.GetResults.Builder
        ) -> None:
            results.value = 7

    class Both(OnlyGet):
        def increment(
            self,
            params: t.Counter.IncrementParams.Reader,
            results: t.Counter.IncrementResults.Builder,
        ) -> None:
            results.value = params.by

    for round_ in range(2):  # the second round answers from what the first found
        for server, incremented in ((OnlyGet(), None), (Both(), 5)):
            async with local_server(server) as address, capsvc.connect(address) as conn:
                counter = conn.bootstrap(t.Counter)
                assert (await counter.get()).value == 7, round_
                if incremented is None:
                    with pytest.raises(capsvc.Unimplemented, match="does not implement"):
                        await counter.increment(by=5)
                else:
                    assert (await counter.increment(by=5)).value == incremented


async def test_mistakes_are_python_errors_naming_the_schema() -> None:
    async with local_server(TypedTester()) as address, typed_tester(address) as (_, tester):
        with pytest.raises(
            TypeError, match=r"^Tester\.echo\(\) has no parameter kee; its parameters are msg$"
        ):
            tester.echo(kee="x")  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="positional"):
            tester.echo("x")  # type: ignore[misc]
        with pytest.raises(
            TypeError,
            match=r"^Tester\.newCounter\$Params\.start: expected an int \(Int64\), got str$",
        ):
            tester.newCounter(start="five")  # type: ignore[arg-type]
        assert (await tester.echo(msg="fine")).reply == "fine"


#: The project's own schemas (schemas/), generated into capsvc/generated.
OWN_SCHEMAS = ("calculator.capnp", "echo.capnp", "bench_echo.capnp", "health.capnp")


def test_checked_in_generated_modules_are_fresh() -> None:
    """tests/generated, capsvc/generated (the project's own schemas, and pycapnp's
    stream.capnp) and capsvc/rpc/rpc_capnp.py are what capsvc gen makes now."""
    import os

    import capnp

    from tests.support.peers import ROOT

    pkg = os.path.dirname(capnp.__file__)
    own = [os.path.join(ROOT, "schemas", name) for name in OWN_SCHEMAS]
    for schemas, out, extra in (
        ([os.path.join(ROOT, "tests", "schemas", "testing.capnp")], "tests/generated", []),
        (own, "capsvc/generated", []),
        ([os.path.join(pkg, "rpc.capnp")], "capsvc/rpc", ["-I", os.path.dirname(pkg)]),
        # StreamResult, which every `-> stream` method's generated code imports.
        ([os.path.join(pkg, "stream.capnp")], "capsvc/generated", ["-I", os.path.dirname(pkg)]),
    ):
        done = subprocess.run(
            [
                os.path.join(os.path.dirname(PYTHON), "capsvc"),
                "gen",
                *schemas,
                "-o",
                out,
                "--check",
                *extra,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
