"""Fault injection with real processes and sockets (issue 11): what breaks stays contained.

Each case ends with typed errors on the affected calls only, the other connections still
served, and nothing left behind: the tests count this process's open file descriptors
and trio tasks (or the server process's descriptors) before and after.

Timing: real time throughout (the bytes go through the kernel and other processes);
every wait is bounded by ``DEADLINE`` and returns as soon as its event happens.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any

import pytest
import trio

import capsvc
from capsvc.framing import encode_message
from capsvc.rpc import wire
from tests.support.peers import ROOT, capsvc_server, peer_env
from tests.support.tester import Callback, Tester, TesterImpl

#: Real time: bounds a wait for another process or the kernel; a hang fails the test.
DEADLINE = 20.0


def open_fds(pid: int | None = None) -> int:
    return len(os.listdir(f"/proc/{pid or 'self'}/fd"))


def trio_tasks() -> int:
    """Every task of this trio run (walks the task tree from the root)."""
    count = 0
    root = trio.lowlevel.current_root_task()
    assert root is not None
    todo = [root]
    while todo:
        task = todo.pop()
        count += 1
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return count


async def settled(predicate: Any) -> None:
    with trio.fail_after(DEADLINE):
        while not predicate():  # noqa: ASYNC110 (another process's effect: no event)
            await trio.sleep(0.01)  # real time


# ---------------------------------------------------------------------------- the server dies


async def test_server_killed_while_calls_and_capabilities_are_held() -> None:
    """SIGKILL of the server process: the call in flight and every capability held fail
    with Disconnected; nothing of the connection stays in this process."""
    fds, tasks = open_fds(), trio_tasks()
    with capsvc_server("tester") as server:
        async with capsvc.connect(server.address) as conn:
            tester = conn.bootstrap(Tester)
            counter = (await tester.newCounter(start=5)).counter
            assert (await counter.get()).value == 5
            outcome: list[BaseException] = []

            async def slow() -> None:
                try:
                    await tester.slow(ms=60_000)
                except capsvc.RpcError as error:
                    outcome.append(error)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                await trio.sleep(0.2)  # real time: the call reaches the server
                os.kill(server.pid, signal.SIGKILL)
            assert len(outcome) == 1
            assert isinstance(outcome[0], capsvc.Disconnected)
            try:
                await counter.get()
            except capsvc.Disconnected:
                pass
            else:
                raise AssertionError("a call on a dead connection succeeded")
            await settled(lambda: conn.closed)
            assert conn.session.tables_empty()
    await settled(lambda: trio_tasks() == tasks)
    assert open_fds() == fds


class Hang:
    """A method body that never returns, and says when it began and was cancelled."""

    def __init__(self) -> None:
        self.began = trio.Event()
        self.cancelled = trio.Event()

    async def __call__(self) -> None:
        self.began.set()
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled.set()


class HangingCallback(capsvc.Server, interface=Callback):
    """notify() never answers (``hang`` says when it began and was cancelled)."""

    def __init__(self) -> None:
        self.hang = Hang()

    async def notify(self, params: Any, results: Any) -> None:
        await self.hang()


async def test_server_methods_that_raise_or_hang() -> None:
    """Against a server process: a method that raises gives the caller that typed error;
    a method that hangs (waiting on our callback) is cancelled by the caller's
    cancellation, which crosses the server and reaches the callback it waits on here.
    The connection goes on in both cases."""
    with capsvc_server("tester") as server:
        async with capsvc.connect(server.address) as conn:
            tester = conn.bootstrap(Tester)
            for kind, error in (("failed", capsvc.Failed), ("overloaded", capsvc.Overloaded)):
                with pytest.raises(error, match="on purpose"):
                    await tester.fail(kind=kind, reason="on purpose")
            callback = HangingCallback()
            with trio.move_on_after(DEADLINE) as scope:
                async with trio.open_nursery() as nursery:

                    async def call_back() -> None:
                        await tester.callBack(cb=callback, value=1)

                    nursery.start_soon(call_back)
                    await callback.hang.began.wait()  # the server is inside callBack, waiting
                    nursery.cancel_scope.cancel()  # the caller gives up
            assert not scope.cancelled_caught
            with trio.fail_after(DEADLINE):
                await callback.hang.cancelled.wait()  # the Finish went through the server to us
            assert (await tester.echo(msg="still here")).reply == "still here"
            assert not conn.closed


# ---------------------------------------------------------------------------- the client dies

CLIENT_SCRIPT = """
import sys, trio, capsvc
from tests.support.tester import Tester

async def main(address):
    async with capsvc.connect(address) as conn:
        tester = conn.bootstrap(Tester)
        assert (await tester.echo(msg="up")).reply == "up"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: tester.slow(ms=60_000))
            print("CALLING", flush=True)
            await trio.sleep_forever()

trio.run(main, sys.argv[1])
"""


class WatchedTester(TesterImpl):
    """slow() never answers (``hang`` says when it began and was cancelled)."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = Hang()

    async def slow(self, params: Any, results: Any) -> None:
        await self.hang()


async def test_client_killed_mid_call_cancels_its_call_only() -> None:
    impl = WatchedTester()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", impl)
        async with capsvc.connect(address) as bystander:
            other = bystander.bootstrap(Tester)
            assert (await other.echo(msg="before")).reply == "before"
            fds, tasks = open_fds(), trio_tasks()
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-c", CLIENT_SCRIPT, address],
                cwd=ROOT,
                env=peer_env(),
                stdout=subprocess.DEVNULL,
            )
            try:
                with trio.fail_after(DEADLINE):
                    await impl.hang.began.wait()
                proc.send_signal(signal.SIGKILL)  # stopped by its PID
                with trio.fail_after(DEADLINE):
                    await impl.hang.cancelled.wait()  # the peer vanished: its call is cancelled
            finally:
                proc.kill()
                await proc.wait()
            await settled(lambda: trio_tasks() == tasks and open_fds() == fds)
            assert (await other.echo(msg="after")).reply == "after"  # the others go on
        nursery.cancel_scope.cancel()


# ---------------------------------------------------------------------------- broken streams


def _connect(server: Any) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=DEADLINE)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _bootstrap(question_id: int) -> bytes:
    message = wire.Message.new_message()
    message.init("bootstrap").questionId = question_id
    return encode_message(message.to_segments())


def _slow_call(question_id: int) -> bytes:
    message = wire.Message.new_message()
    call = message.init("call")
    call.questionId = question_id
    call.target.init("promisedAnswer").questionId = 0
    call.interfaceId = Tester.schema.node.id
    call.methodId = 5  # slow
    params = call.init("params").content.as_struct(Tester.schema.methods["slow"].param_type)
    params.ms = 60_000
    return encode_message(message.to_segments())


def _server_serves(server: Any) -> bool:
    with _connect(server) as sock:
        sock.sendall(_bootstrap(0))
        return wire.message_tag([sock.recv(65536)[8:]]) == wire.RETURN


def _wait_fds(pid: int, expected: int) -> None:
    until = time.monotonic() + DEADLINE
    while open_fds(pid) != expected:
        if time.monotonic() > until:
            raise AssertionError(f"server holds {open_fds(pid)} fds, expected {expected}")
        time.sleep(0.02)  # real time: the server process notices the close


def test_half_closed_and_reset_connections_leave_nothing_in_the_server() -> None:
    with capsvc_server("tester") as server:
        baseline = open_fds(server.pid)
        assert _server_serves(server)
        _wait_fds(server.pid, baseline)
        # A peer that sends a call and half-closes (EOF): for Cap'n Proto the end of the
        # stream is the end of the connection, so the call is cancelled and all is freed.
        with _connect(server) as sock:
            sock.sendall(_bootstrap(0) + _slow_call(1))
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass  # the server answers the bootstrap, then closes too
        _wait_fds(server.pid, baseline)
        # A reset in the middle of a large message: half of a 1 MiB frame, then RST.
        with _connect(server) as sock:
            big = wire.Message.new_message()
            echo = big.init("call")
            echo.questionId = 0
            echo.target.importedCap = 0
            echo.interfaceId = Tester.schema.node.id
            echo.methodId = 0
            echo_params = Tester.schema.methods["echo"].param_type
            echo.init("params").content.as_struct(echo_params).msg = "x" * (1 << 20)
            frame = encode_message(big.to_segments())
            sock.sendall(frame[: len(frame) // 2])
            # SO_LINGER on, 0 s: close() sends a reset instead of a FIN.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        _wait_fds(server.pid, baseline)
        assert _server_serves(server)
        assert server.alive()
