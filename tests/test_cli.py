"""The ``capsvc`` command line, run as real subprocesses on loopback sockets.

Every server process is started by :func:`running` and stopped by PID in its ``finally``
(killed if a test left it running). Servers bind 127.0.0.1 (or a Unix socket in tmp_path).
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

import capsvc
from tests.support.peers import pycapnp_server

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "tests" / "peers"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
}
#: Real time, for every wait on a subprocess below (startup, exit, a whole command): they
#: are other interpreters on a possibly loaded machine, and each wait ends when they do,
#: so this only bounds a hang.
TIMEOUT = 60.0
LISTENING = re.compile(r"listening on (\S+)")

# How to start the command. The console script is not necessarily installed, so it is
# imitated with -P (no script directory or cwd on sys.path, as for an installed script).
PYTHON_M = [sys.executable, "-m", "capsvc"]
PYTHON_M_CLI = [sys.executable, "-m", "capsvc.cli"]
SCRIPT = [sys.executable, "-P", "-c", "import sys; from capsvc.cli import main; sys.exit(main())"]


class Server:
    """A running ``capsvc serve`` process and what it printed."""

    def __init__(self, process: subprocess.Popen[bytes], stderr_path: Path) -> None:
        self.process = process
        self.stderr_path = stderr_path
        self.stdout = b""
        self.address = ""

    def wait_listening(self, timeout: float = TIMEOUT) -> str:
        """Read stdout until the ``listening on ADDR`` line; return ADDR."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            match = LISTENING.search(self.stdout.decode(errors="replace"))
            if match is not None and b"\n" in self.stdout[match.end() :]:
                self.address = match.group(1)
                return self.address
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no 'listening on' line in time: {self.describe()}")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    self.process.wait(timeout=TIMEOUT)
                    raise AssertionError(f"server exited early: {self.describe()}")
                self.stdout += chunk

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, str]:
        """Send ``signum`` and wait for exit: (exit status, all of stdout)."""
        self.process.send_signal(signum)
        rest, _ = self.process.communicate(timeout=TIMEOUT)
        self.stdout += rest
        return self.process.returncode, self.stdout.decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    @property
    def host_port(self) -> str:
        assert self.address.startswith("tcp:"), self.address
        return self.address[len("tcp:") :]

    def describe(self) -> str:
        return f"stdout={self.stdout!r} stderr={self.stderr!r}"


@contextmanager
def running(tmp_path: Path, *args: str, command: list[str] = PYTHON_M) -> Iterator[Server]:
    stderr_path = tmp_path / f"serve-{len(list(tmp_path.glob('serve-*')))}.err"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [*command, "serve", *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=ROOT,
            env=ENV,
        )
    server = Server(process, stderr_path)
    try:
        server.wait_listening()
        yield server
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=TIMEOUT)
        if process.stdout is not None:
            process.stdout.close()


def run(*args: str, command: list[str] = PYTHON_M) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=ENV,
        timeout=TIMEOUT,
        check=False,
    )


# --------------------------------------------------------------------- the demo
def test_serve_demo_with_reference_client_and_capsvc_call(tmp_path: Path) -> None:
    with running(tmp_path, "--listen", "tcp:127.0.0.1:0", command=PYTHON_M_CLI) as server:
        assert server.address.startswith("tcp:127.0.0.1:")
        assert not server.address.endswith(":0")
        assert "Calculator demo" in server.stdout.decode()

        # The C++ calculator-client sample's sequence, through libcapnp (pycapnp).
        reference = subprocess.run(
            [sys.executable, str(PEERS / "pycapnp_calc_client.py"), server.host_port],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert reference.returncode == 0, reference.stdout + reference.stderr
        assert reference.stdout.split("\n")[:5] == [
            "ok literal 123",
            "ok add 46",
            "ok pipelining 27",
            "ok functions 5478",
            "ok callback 19",
        ]

        tour = run("call", "--connect", server.address)
        assert tour.returncode == 0, tour.stdout + tour.stderr
        lines = tour.stdout.splitlines()
        assert lines[0] == f"capsvc: calculator tour against {server.address}"
        steps = [re.match(r"\d\. (\w+)\s.* = (\S+)", line) for line in lines[1:]]
        assert [(m.group(1), m.group(2)) for m in steps if m] == [
            ("literal", "123"),
            ("add", "46"),
            ("pipelining", "27"),
            ("functions", "5478"),
            ("callback", "19"),
        ]
        assert "pow called 1 time" in lines[-1]

        one = run("call", "--connect", server.address, "2 + 3 * 4")
        assert one.returncode == 0, one.stderr
        assert one.stdout == "2 + 3 * 4 = 14\n"

        # The alias, and an expression the shell split into words.
        split = run("demo-client", "--connect", server.address, "(1", "+", "2)", "/", "8")
        assert split.returncode == 0, split.stderr
        assert split.stdout == "(1 + 2) / 8 = 0.375\n"

        power = run("call", "--connect", server.address, "2 ** 0.5 ** 2")
        assert power.stdout == "2 ** 0.5 ** 2 = 1.189207115002721\n"

        status, stdout = server.stop(signal.SIGTERM)
        assert status == 0, server.describe()
        assert stdout.splitlines()[-1] == "capsvc: stopped"
        assert "SIGTERM" in server.stderr


def test_sigint_stops_cleanly(tmp_path: Path) -> None:
    with running(tmp_path, "--listen", "tcp:127.0.0.1:0") as server:
        assert run("call", "--connect", server.address, "1 + 1").stdout == "1 + 1 = 2\n"
        status, stdout = server.stop(signal.SIGINT)
        assert status == 0, server.describe()
        assert stdout.splitlines()[-1] == "capsvc: stopped"
        assert "Traceback" not in server.stderr


def test_serve_on_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "calc.sock"
    with running(tmp_path, "--listen", f"unix:{path}") as server:
        assert server.address == f"unix:{path}"
        result = run("call", "--connect", server.address, "6 * 7")
        assert result.stdout == "6 * 7 = 42\n", result.stderr
        assert server.stop()[0] == 0


def test_call_against_the_reference_server() -> None:
    # capsvc's demo client against libcapnp's calculator (tests/peers/pycapnp_server.py),
    # started and stopped by tests.support.peers (bounded wait for its LISTENING line).
    with pycapnp_server("calculator") as peer:
        tour = run("call", "--connect", peer.address)
        assert tour.returncode == 0, tour.stdout + tour.stderr
        assert "= 5478" in tour.stdout
        assert "pow called 1 time" in tour.stdout
        assert run("call", "--connect", peer.address, "2 + 3 * 4").stdout == "2 + 3 * 4 = 14\n"


# ------------------------------------------------------------------------- apps
async def _ping(address: str, message: str) -> str:
    echo = capsvc.load_schema(ROOT / "schemas" / "echo.capnp")
    async with capsvc.connect(address) as conn:
        client = conn.bootstrap(echo.Echo)
        reply = str((await client.ping(msg=message)).reply)
        data = bytes((await client.pingData(data=b"\x00\x01")).data)
        assert data == b"\x00\x01"
        client.close()
        return reply


@pytest.mark.parametrize(
    ("app", "expected"),
    [
        ("tests.apps.echo_app:factory", "hello"),
        ("tests.apps.echo_app:async_factory", "async:hello"),
        ("tests.apps.echo_app:instance", "instance:hello"),
        ("tests.apps.typed_echo_app:factory", "typed:hello"),
    ],
)
def test_serve_an_app(tmp_path: Path, app: str, expected: str) -> None:
    # SCRIPT: like the installed console script, cwd is not on sys.path: --app-dir's
    # default (.) must make tests.apps importable.
    with running(tmp_path, app, "--listen", "tcp:127.0.0.1:0", command=SCRIPT) as server:
        assert "EchoService (Echo)" in server.stdout.decode()  # TypedEchoService too
        assert trio.run(_ping, server.address, "hello") == expected
        status, stdout = server.stop()
        assert status == 0, server.describe()
        assert stdout.endswith("capsvc: stopped\n")


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("no_such_module_xyz:factory", "cannot import 'no_such_module_xyz'"),
        ("tests.apps.echo_app:nothing", "has no attribute 'nothing'"),
        ("tests.apps.echo_app", "APP must look like module:factory"),
        ("tests.apps.echo_app:not_a_server", "neither a capsvc.Server instance nor a factory"),
        ("tests.apps.echo_app:bad_factory", "returned object, not a server object"),
    ],
)
def test_serve_bad_app(app: str, message: str) -> None:
    result = run("serve", app, "--listen", "tcp:127.0.0.1:0")
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert "listening on" not in result.stdout


# ----------------------------------------------------------------------- errors
def test_serve_bad_address() -> None:
    result = run("serve", "--listen", "bogus:1")
    assert result.returncode == 2
    assert "capsvc: error:" in result.stderr
    assert "bogus" in result.stderr


def test_serve_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", "--listen", f"tcp:127.0.0.1:{port}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"cannot listen on tcp:127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_call_nobody_listening() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    result = run("call", "--connect", f"tcp:127.0.0.1:{port}", "1 + 1")
    assert result.returncode == 1
    assert f"cannot connect to tcp:127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("expression", ["2 +", "x * 2", "open('f')", "7 % 2"])
def test_call_bad_expression(expression: str) -> None:
    # Rejected before connecting: nothing listens on the default address in tests.
    result = run("call", "--connect", "tcp:127.0.0.1:9", expression)
    assert result.returncode == 2
    assert "capsvc: error:" in result.stderr
    assert "Traceback" not in result.stderr


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert re.fullmatch(r"capsvc \S+\n", result.stdout)


def test_no_command_prints_help() -> None:
    result = run()
    assert result.returncode == 2
    assert "serve" in result.stderr
    assert "call" in result.stderr


def test_help_lists_the_commands() -> None:
    result = run("--help", command=PYTHON_M_CLI)
    assert result.returncode == 0
    assert "serve" in result.stdout
    assert "demo-client" in result.stdout
