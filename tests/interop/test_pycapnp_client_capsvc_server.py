"""capsvc as the server, the C++ reference (tests/peers/pycapnp_*_client.py) as the client.

- capsvc serves TesterImpl / EchoImpl (tests/support/tester.py) in a subprocess; the pycapnp
  tester client runs every check with strict exception types (capsvc can raise all four), and
  the pycapnp echo client runs a small bounded load. Each must exit 0.
- capsvc serves in the pytest process while the pycapnp tester client runs as a subprocess, so
  the server-side connection tables can be inspected. capsvc offers no hook to reach a
  server's Connection objects, so these tests substitute a recording Connection subclass in
  capsvc.api. Note that once a connection has closed its tables are empty by construction
  (RpcSession.close clears them), so the meaningful checks are made while the client is
  still connected (``--hold``) or on a snapshot taken just before the shutdown.
- tests/support/pycapnp_extra_client.py adds C++-driven checks (call order on one capability,
  C++'s own embargo on a reflected capability, cancellation, re-entrancy, churn).


(Calculator is served by capsvc/demo.py, built elsewhere; it is not tested here.)
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import weakref
from typing import Any

import pytest
import trio

import capsvc
import capsvc.api
from tests.support.checks import EMPTY, poll_until, wait_for_tables
from tests.support.peers import PYTHON, ROOT, PeerProcess, peer_env, peer_script
from tests.support.tester import CounterImpl, EchoImpl, TesterImpl

TESTER_CHECKS = [
    "echo",
    "pipelining",
    "callback",
    "holdcaps",
    "reflect",
    "callcounter",
    "sum",
    "fail",
    "slow",
    "getself",
    "unimplemented",
    "nullpipeline",
    "lastref",
    "lastrefpipe",
]


async def run_peer(args: list[str], *, limit: float = 40.0) -> subprocess.CompletedProcess[bytes]:
    """Run a tests/peers client to completion (killed if it outlives ``limit`` s)."""
    # Real time: the client is another process (its own 30 s timeout comes first); this
    # only bounds a hung one, on a clock that never jumps while we wait for it.
    with trio.fail_after(limit):
        return await trio.run_process(
            [PYTHON, *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=ROOT,
            env=peer_env(),
        )


def describe(done: subprocess.CompletedProcess[bytes], peer: PeerProcess | None = None) -> str:
    text = (
        f"exit status {done.returncode}\nstdout:\n{done.stdout.decode(errors='replace')}"
        f"\nstderr:\n{done.stderr.decode(errors='replace')[-4000:]}"
    )
    if peer is not None:
        text += f"\ncapsvc server stderr:\n{peer.stderr_text()[-4000:]}"
    return text


def ok_lines(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    return [
        line.split()[1]
        for line in done.stdout.decode().splitlines()
        if line.startswith("ok ") and len(line.split()) >= 2
    ]


# ------------------------------------------------------------------ tester client


async def test_tester_client_all_checks(capsvc_tester: PeerProcess) -> None:
    """Every check, in order, on one connection, strict exception types."""
    done = await run_peer([peer_script("pycapnp_tester_client"), capsvc_tester.hostport])
    assert done.returncode == 0, describe(done, capsvc_tester)
    assert ok_lines(done) == TESTER_CHECKS, describe(done, capsvc_tester)


@pytest.mark.parametrize("check", TESTER_CHECKS)
async def test_tester_client_check(capsvc_tester: PeerProcess, check: str) -> None:
    """Each check alone on a fresh connection (so one failure does not hide the others)."""
    done = await run_peer(
        [peer_script("pycapnp_tester_client"), capsvc_tester.hostport, "--only", check]
    )
    assert done.returncode == 0, describe(done, capsvc_tester)
    assert ok_lines(done) == [check], describe(done, capsvc_tester)


async def test_fail_types_are_exact(capsvc_tester: PeerProcess) -> None:
    """capsvc sends all four Exception.Type values; C++ reports each one as sent."""
    done = await run_peer(
        [peer_script("pycapnp_tester_client"), capsvc_tester.hostport, "--only", "fail"]
    )
    assert done.returncode == 0, describe(done, capsvc_tester)
    infos = [line for line in done.stdout.decode().splitlines() if line.startswith("info fail")]
    assert len(infos) == 4, describe(done)
    for kind, line in zip(
        ["failed", "overloaded", "disconnected", "unimplemented"], infos, strict=True
    ):
        assert f"kind={kind} type={kind.upper()} reason_found=True" in line, line


# ------------------------------------------------------------------ echo client


@pytest.mark.parametrize(
    ("concurrency", "method", "payload", "calls"),
    [
        (1, "ping", 16, 200),
        (12, "ping", 16, 200),
        (12, "pingData", 100_000, 30),  # large frames: multi-segment messages, partial reads
    ],
)
async def test_echo_client_load(
    capsvc_echo: PeerProcess, concurrency: int, method: str, payload: int, calls: int
) -> None:
    done = await run_peer(
        [
            peer_script("pycapnp_echo_client"),
            capsvc_echo.hostport,
            "--calls",
            str(calls),
            "--concurrency",
            str(concurrency),
            "--payload",
            str(payload),
            "--method",
            method,
            "--timeout",
            "30",
        ]
    )
    assert done.returncode == 0, describe(done, capsvc_echo)
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert report["errors"] == 0, report
    assert report["calls"] == calls, report


# ------------------------------------------------------------------ in-process server


class RecordingConnection(capsvc.Connection):
    """A Connection that registers itself and snapshots its tables just before shutdown
    (``session.close`` empties the tables, so a check after it proves nothing on its own)."""

    instances: list[RecordingConnection] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sizes_at_close: dict[str, int] | None = None
        self.exports_at_close: list[Any] = []
        RecordingConnection.instances.append(self)

    def _shutdown(self, reason: capsvc.RpcError) -> None:
        if self.sizes_at_close is None:
            self.sizes_at_close = self.session.table_sizes()
            self.exports_at_close = [
                (export_id, export.refcount, type(export.hook).__name__)
                for export_id, export in self.session.exports.entries.items()
            ]
        super()._shutdown(reason)


class TrackingTester(TesterImpl):
    """TesterImpl that keeps weak references to every Counter it creates."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[weakref.ref[CounterImpl]] = []

    async def newCounter(self, params: Any, results: Any) -> None:
        counter = CounterImpl(params.start)
        self.made.append(weakref.ref(counter))
        results.counter = counter

    def alive(self) -> list[CounterImpl]:
        """The Counters still alive after a garbage collection (tracebacks hold cycles)."""
        gc.collect()
        return [counter for ref in self.made if (counter := ref()) is not None]


async def test_in_process_server_tables(
    monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery
) -> None:
    """capsvc.serve in this process, the pycapnp tester client (all checks, strict) as a
    subprocess. capsvc has no public hook to reach a server's Connection objects, so the
    test records them by substituting a Connection subclass in capsvc.api."""
    RecordingConnection.instances = []
    monkeypatch.setattr(capsvc.api, "Connection", RecordingConnection)
    tester = TrackingTester()
    address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", tester)
    hostport = address.split(":", 1)[1]

    done = await run_peer([peer_script("pycapnp_tester_client"), hostport])
    assert done.returncode == 0, describe(done)
    assert ok_lines(done) == TESTER_CHECKS, describe(done)

    await poll_until(
        lambda: len(RecordingConnection.instances) == 1 and RecordingConnection.instances[0].closed
    )
    conn = RecordingConnection.instances[0]
    # When the client went away it held nothing but the bootstrap: every question, answer
    # and Counter of the checks had been finished and released over the wire. (After the
    # close the tables are empty by construction; that no one refilled them is all the
    # check after it says.)
    assert conn.sizes_at_close == dict(EMPTY, exports=1), conn.exports_at_close
    assert conn.session.tables_empty(), conn.session.table_sizes()
    assert conn.session.abort_reason is None, conn.session.abort_reason
    # The server's objects made for the client are all gone once the connection is.
    assert tester.made, "the checks made no Counter"
    await poll_until(lambda: not tester.alive())
    nursery.cancel_scope.cancel()


HOLD_OPEN_CLIENT = r"""
import asyncio, gc, importlib.util, sys
import capnp
spec = importlib.util.spec_from_file_location("tc", sys.argv[1])
tc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tc)

async def main(host, port):
    stream = await capnp.AsyncIoStream.create_connection(host=host, port=int(port))
    client = capnp.TwoPartyClient(stream)
    tester = client.bootstrap().cast_as(tc.Tester)
    for name in tc.CHECKS:
        if name == "fail":
            await tc.check_fail(tester, False)
        else:
            await tc.CHECKS[name](tester)
        print("ok", name, flush=True)
    gc.collect()
    for _ in range(20):            # let the C++ side send its Releases/Finishes (real time:
        await asyncio.sleep(0.01)  # libcapnp's own event loop; the server waits as well)
    print("CHECKS DONE", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)   # hold the connection open
    print("BYE", flush=True)

asyncio.run(capnp.run(main(*sys.argv[2].rsplit(":", 1))))
"""


async def hold_open_run(
    argv: list[str], **expected: int
) -> tuple[RecordingConnection, dict[str, Any], str]:
    """Run a pycapnp client that prints ``CHECKS DONE`` and then keeps its connection open
    until a line arrives on stdin. Returns the server connection, a snapshot of its tables
    taken while the client was still connected (once they reached ``expected``, or after
    10 s without), and the client's output. The client is then told to exit; it must exit 0
    and the connection must close."""
    process = await trio.lowlevel.open_process(
        [PYTHON, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=peer_env(),
    )
    output = b""

    async def read_until(marker: bytes, limit: float) -> None:
        nonlocal output
        assert process.stdout is not None
        # Real time: we wait for another process; ``limit`` only bounds a hung one.
        with trio.move_on_after(limit):
            while marker not in output:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    break
                output += chunk
        assert marker in output, output.decode(errors="replace")

    try:
        assert process.stdin is not None
        await read_until(b"CHECKS DONE", 30)
        assert len(RecordingConnection.instances) == 1
        conn = RecordingConnection.instances[0]
        # The client's last Finishes and Releases left before it printed CHECKS DONE, but
        # our reader may not have taken them in yet: wait (real time: they come from the
        # client process through a real socket) until the tables settle where expected.
        await wait_for_tables(conn, within=10, **expected)
        snapshot = {
            "sizes": conn.session.table_sizes(),
            "exports": {
                export_id: (export.refcount, type(export.hook).__name__)
                for export_id, export in conn.session.exports.entries.items()
            },
        }
        await process.stdin.send_all(b"\n")
        await read_until(b"BYE", 10)
        # Real time, both: the client process exits and closes its socket on its own
        # schedule; the limits only bound a hang.
        with trio.fail_after(10):
            status = await process.wait()
        assert status == 0, output.decode(errors="replace")
        with trio.fail_after(10):
            await conn.wait_closed()
        assert conn.session.tables_empty()
    finally:
        if process.returncode is None:
            process.kill()  # by PID (trio.Process.kill)
            with trio.move_on_after(5):  # real time: reaping a killed process
                await process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                await stream.aclose()
    return conn, snapshot, output.decode(errors="replace")


async def test_in_process_server_tables_while_connected(
    monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery
) -> None:
    """As above, but the pycapnp client (running every tester check) keeps its connection
    open after the checks: the server's tables must then hold the bootstrap export alone
    (the client still holds the bootstrap capability) and nothing else."""
    RecordingConnection.instances = []
    monkeypatch.setattr(capsvc.api, "Connection", RecordingConnection)
    address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", TesterImpl())
    hostport = address.split(":", 1)[1]
    _, snapshot, output = await hold_open_run(
        ["-c", HOLD_OPEN_CLIENT, peer_script("pycapnp_tester_client"), hostport], exports=1
    )
    assert snapshot["sizes"] == dict(EMPTY, exports=1), (snapshot, output)
    nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ C++-driven extras

EXTRA_CLIENT = os.path.join(ROOT, "tests", "support", "pycapnp_extra_client.py")
EXTRA_CHECKS = ["order", "pipelinedorder", "embargo", "cancel", "reentrant", "churn"]


async def test_extra_client_self_check(pycapnp_tester: PeerProcess) -> None:
    """The extra client's checks pass against the reference server itself."""
    done = await run_peer([EXTRA_CLIENT, pycapnp_tester.hostport])
    assert done.returncode == 0, describe(done)
    assert ok_lines(done) == EXTRA_CHECKS, describe(done)


@pytest.mark.parametrize("check", EXTRA_CHECKS)
async def test_extra_client_check(capsvc_tester: PeerProcess, check: str) -> None:
    # "order" and "pipelinedorder" check that calls on one capability start in arrival order.
    done = await run_peer([EXTRA_CLIENT, capsvc_tester.hostport, "--only", check])
    assert done.returncode == 0, describe(done, capsvc_tester)
    assert ok_lines(done) == [check], describe(done, capsvc_tester)


async def test_extra_client_in_process_tables(
    monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery
) -> None:
    """The C++-driven extras (minus the ordering ones, tested above) against capsvc.serve in
    this process: the cancelled slow() call was really cancelled on the server, and with
    the client still connected only the bootstrap export remains."""
    RecordingConnection.instances = []
    monkeypatch.setattr(capsvc.api, "Connection", RecordingConnection)
    tester = TesterImpl()
    address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", tester)
    hostport = address.split(":", 1)[1]
    argv = [EXTRA_CLIENT, hostport, "--hold"]
    for check in ("embargo", "cancel", "reentrant", "churn"):
        argv += ["--only", check]
    _, snapshot, output = await hold_open_run(argv, exports=1)
    assert snapshot["sizes"] == dict(EMPTY, exports=1), (snapshot, output)
    assert tester.slow_started == 1
    assert tester.slow_cancelled == 1, "the server did not cancel slow() on the Finish"
    nursery.cancel_scope.cancel()


VANISHING_CLIENT = r"""
import asyncio, os, sys, capnp
testing = capnp.load(sys.argv[1])

async def main(host, port):
    stream = await capnp.AsyncIoStream.create_connection(host=host, port=int(port))
    client = capnp.TwoPartyClient(stream)
    tester = client.bootstrap().cast_as(testing.Tester)
    assert (await tester.echo(msg="hi")).reply == "hi"
    counter = (await tester.newCounter(start=1)).counter
    assert (await counter.increment(by=1)).value == 2
    pending = tester.slow(ms=60_000)
    print("CALLING", flush=True)
    # the test answers once slow() runs on the server
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print("VANISHING", flush=True)
    os._exit(0)   # no Finish, no Release: the socket just closes

asyncio.run(capnp.run(main(*sys.argv[2].rsplit(":", 1))))
"""


async def test_in_process_server_client_vanishes_mid_call(
    monkeypatch: pytest.MonkeyPatch, nursery: trio.Nursery
) -> None:
    """The C++ client disappears with a call running and capabilities held: the server
    cancels the running call, drops everything the connection held, and keeps serving."""
    RecordingConnection.instances = []
    monkeypatch.setattr(capsvc.api, "Connection", RecordingConnection)
    tester = TrackingTester()
    address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", tester)
    hostport = address.split(":", 1)[1]
    schema = os.path.join(ROOT, "tests", "schemas", "testing.capnp")
    process = await trio.lowlevel.open_process(
        [PYTHON, "-c", VANISHING_CLIENT, schema, hostport],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=peer_env(),
    )
    try:
        assert process.stdin is not None
        assert process.stdout is not None
        # Real time (poll_until): the client is another process. Once its slow() call runs
        # here, tell it to vanish, so the disconnect always comes with a call running.
        await poll_until(lambda: tester.slow_started == 1, within=30)
        await process.stdin.send_all(b"\n")
        with trio.fail_after(10):  # real time: the client process exits on its own schedule
            assert await process.wait() == 0
        said = b""
        while chunk := await process.stdout.receive_some(4096):
            said += chunk
        assert said == b"CALLING\nVANISHING\n", said
    finally:
        if process.returncode is None:
            process.kill()  # by PID (trio.Process.kill)
            with trio.move_on_after(5):  # real time: reaping a killed process
                await process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                await stream.aclose()
    await poll_until(
        lambda: bool(RecordingConnection.instances) and RecordingConnection.instances[0].closed
    )
    await poll_until(lambda: tester.slow_cancelled >= 1)
    conn = RecordingConnection.instances[0]
    assert conn.sizes_at_close is not None
    # At the moment of the disconnect the client held the bootstrap and the counter
    # (exports), and had the slow call running (an answer; pycapnp may also not have
    # finished newCounter's question yet, as its client object keeps the response alive).
    assert conn.sizes_at_close["exports"] == 2, conn.sizes_at_close
    assert conn.sizes_at_close["answers"] in (1, 2), conn.sizes_at_close
    assert conn.session.tables_empty()
    assert tester.slow_started == 1
    assert tester.slow_cancelled == 1
    await poll_until(lambda: not tester.alive())
    # The server still serves.
    done = await run_peer([peer_script("pycapnp_tester_client"), hostport, "--only", "echo"])
    assert done.returncode == 0, describe(done)
    nursery.cancel_scope.cancel()


async def test_echo_in_process_server(nursery: trio.Nursery) -> None:
    """The echo client against capsvc.serve in this process (same trio loop as the test)."""
    address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", EchoImpl())
    hostport = address.split(":", 1)[1]
    done = await run_peer(
        [peer_script("pycapnp_echo_client"), hostport, "--calls", "200", "--concurrency", "12"]
    )
    assert done.returncode == 0, describe(done)
    nursery.cancel_scope.cancel()
