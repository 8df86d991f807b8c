"""The RPC benchmark's pairings run the programs their names say (issue 10's additions).

Theory of operation: no benchmark is run. The server commands and clients of the
``raw-trio-poll`` and ``capsvc-tcp-nopoll-async`` pairings are checked to carry the
switches they are named for, and the raw ping-pong's receive function is driven over a
socket pair: with busy polling it keeps polling (``sched_yield`` between polls, no sleep)
while the budget lasts and sleeps once it has run out; without, it is the stream's own.
``os.sched_yield`` and ``trio.lowlevel.wait_readable`` are wrapped to count the calls; the
budgets are far from the delays (5 s against 20 ms, 1 ms against 50 ms), so the outcome
does not depend on the machine's speed.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest
import trio

from bench.rpc.clients import CapsvcClient, RawClient, make_client
from bench.rpc.scenarios import PAIRINGS, SERVER_KINDS
from bench.rpc.servers import ServerProcess, raw_receiver, typed_bench_echo


def _command(pairing: str) -> list[str]:
    return ServerProcess(SERVER_KINDS[PAIRINGS[pairing].server], "/tmp").command()


def test_raw_trio_poll_polls_on_both_ends_and_raw_trio_on_neither() -> None:
    assert "--no-busy-poll" not in _command("raw-trio-poll")
    assert "--no-busy-poll" in _command("raw-trio")
    assert "--no-busy-poll" in _command("raw-trio-unix")
    polling = make_client(PAIRINGS["raw-trio-poll"].client, "tcp:127.0.0.1:1", 1, 16)
    sleeping = make_client(PAIRINGS["raw-trio"].client, "tcp:127.0.0.1:1", 1, 16)
    assert isinstance(polling, RawClient)
    assert isinstance(sleeping, RawClient)
    assert polling.busy_poll
    assert not sleeping.busy_poll
    assert polling.sizes == sleeping.sizes  # the same frames


def test_the_async_pairing_serves_async_def_methods_without_polling() -> None:
    command = _command("capsvc-tcp-nopoll-async")
    assert "--async-methods" in command
    assert "--no-busy-poll" in command
    client = make_client(PAIRINGS["capsvc-tcp-nopoll-async"].client, "tcp:127.0.0.1:1", 1, 16)
    assert isinstance(client, CapsvcClient)
    assert not client.busy_poll
    assert not client.dynamic
    asynchronous, plain = type(typed_bench_echo(async_methods=True)), type(typed_bench_echo())
    for method in ("ping", "pingData", "pingCap"):
        assert inspect.iscoroutinefunction(getattr(asynchronous, method))
        assert not inspect.iscoroutinefunction(getattr(plain, method))
    assert asynchronous.__mro__[1] is plain.__mro__[1]  # the same generated base


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of ``os.sched_yield`` (polls that found nothing) and of sleeps."""
    counts = {"yields": 0, "sleeps": 0}
    sched_yield, wait_readable = os.sched_yield, trio.lowlevel.wait_readable

    def counting_yield() -> None:
        counts["yields"] += 1
        sched_yield()

    async def counting_wait(sock: Any) -> None:
        counts["sleeps"] += 1
        await wait_readable(sock)

    monkeypatch.setattr(os, "sched_yield", counting_yield)
    monkeypatch.setattr(trio.lowlevel, "wait_readable", counting_wait)
    return counts


async def _receive_late(budget: float, delay: float) -> bytes:
    """Receive (busy polling with ``budget``) what the peer sends after ``delay``."""
    a, b = trio.socket.socketpair()
    async with trio.SocketStream(a) as receiving, trio.SocketStream(b) as sending:
        with raw_receiver(receiving, True, budget) as receive:
            async with trio.open_nursery() as nursery:

                async def send_late() -> None:
                    await trio.sleep(delay)
                    await sending.send_all(b"pong")

                nursery.start_soon(send_late)
                data = await receive(65536)
        # The receiver let go of the descriptor, the stream still owns it.
        await sending.send_all(b"again")
        assert await receiving.receive_some(65536) == b"again"
        await sending.send_eof()
        assert await receiving.receive_some(65536) == b""
    return data


async def test_busy_polling_finds_data_within_the_budget_without_sleeping(
    counted: dict[str, int],
) -> None:
    assert await _receive_late(budget=5.0, delay=0.02) == b"pong"
    assert counted["yields"] > 0
    assert counted["sleeps"] == 0


async def test_busy_polling_sleeps_once_the_budget_has_passed(counted: dict[str, int]) -> None:
    assert await _receive_late(budget=1e-3, delay=0.05) == b"pong"
    assert counted["yields"] > 0
    assert counted["sleeps"] == 1


async def test_waiting_data_and_eof_need_no_poll(counted: dict[str, int]) -> None:
    a, b = trio.socket.socketpair()
    async with trio.SocketStream(a) as receiving, trio.SocketStream(b) as sending:
        with raw_receiver(receiving, True) as receive:
            await sending.send_all(b"ping")
            assert await receive(65536) == b"ping"
            await sending.send_eof()
            assert await receive(65536) == b""
        with raw_receiver(receiving, False) as receive:
            assert receive == receiving.receive_some
    assert counted == {"yields": 0, "sleeps": 0}
