"""RPC over nic: between two processes: the calculator demo and the echo call.

Three processes: the model pair host, a server (tests/nic/nic_server.py) driving port .0,
and this test process driving port .1.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import capsvc
from capsvc import demo
from capsvc.transport.nic import connect_nic
from tests.apps.echo_app import ECHO
from tests.nic.conftest import ROOT, ModelProcess, env


def start_server(host: ModelProcess, app: str) -> subprocess.Popen[str]:
    address = f"nic:model:{host.ports[0]},rundir={host.rundir}"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.nic.nic_server", address, app],
        cwd=ROOT,
        env=env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "LISTENING":
        process.kill()
        raise RuntimeError(f"nic server did not start: {line!r}")
    return process


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)  # real time: a process exiting; bounds a hang
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()


@pytest.fixture(params=["demo", "echo"])
def server(
    request: pytest.FixtureRequest, model_process: ModelProcess
) -> Iterator[tuple[str, str]]:
    """(the app the server process runs, the address of our end of the pair)."""
    process = start_server(model_process, request.param)
    try:
        yield request.param, f"nic:model:{model_process.ports[1]},rundir={model_process.rundir}"
    finally:
        stop(process)


async def test_calculator_tour_and_echo_over_nic(server: tuple[str, str]) -> None:
    app, address = server
    stream = await connect_nic(address)
    async with capsvc.open_connection(stream) as conn:
        if app == "echo":
            echo: Any = conn.bootstrap(ECHO.Echo)
            assert (await echo.ping(msg="over the wire")).reply == "over the wire"
            blob = bytes(range(256)) * 300  # 76 KB: many frames per message
            assert (await echo.pingData(data=blob)).data == blob
            async with trio.open_nursery() as nursery:
                for i in range(50):
                    nursery.start_soon(ping_once, echo, i)
            return
        calc: Any = conn.bootstrap(demo.CALCULATOR)
        lines: list[str] = []
        found = await demo.run_tour(calc, lines.append)
        assert found == {
            "literal": 123.0,
            "add": 46.0,
            "pipelining": 27.0,
            "functions": 1200 + 34 + (2100 + 22) * 2,
            "callback": 19.0,
        }
        assert await demo.evaluate_infix(calc, "2 + 3 * 4 ** 2") == 50.0


async def ping_once(echo: Any, i: int) -> None:
    assert (await echo.ping(msg=f"m{i}")).reply == f"m{i}"
