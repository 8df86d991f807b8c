"""Start and stop peer processes for interop tests (127.0.0.1 only, stopped by PID).

- ``pycapnp_server(bootstrap)``: tests/peers/pycapnp_server.py (the C++ reference through
  pycapnp) serving ``tester``, ``echo`` or ``calculator``.
- ``capsvc_server(bootstrap)``: capsvc serving ``tester`` or ``echo`` (tests/support/tester.py)
  in a subprocess started with ``python -c`` (no dependency on the capsvc CLI).

Both are context managers yielding a ``PeerProcess`` (``host``, ``port``, ``address``,
``pid``, ``stderr_text()``). Each prints ``LISTENING <port>`` when ready; leaving the block
sends SIGTERM to the PID, then SIGKILL if it has not exited after ``stop_timeout`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERS = os.path.join(ROOT, "tests", "peers")
PYTHON = sys.executable
HOST = "127.0.0.1"

#: The tiny capsvc server script (run with ``python -c``): serves one bootstrap object
#: until SIGTERM/SIGINT, printing ``LISTENING <port>`` once bound.
CAPSVC_SERVER_SCRIPT = """
import signal, sys, trio, capsvc
from tests.support.tester import make_bootstrap

async def main(kind):
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", make_bootstrap(kind))
            print("LISTENING", address.rsplit(":", 1)[1], flush=True)
            async for _ in signals:
                break
        nursery.cancel_scope.cancel()

trio.run(main, sys.argv[1])
"""


def peer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class PeerProcess:
    proc: subprocess.Popen[bytes]
    host: str
    port: int
    stderr_file: tempfile._TemporaryFileWrapper[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def address(self) -> str:
        """As capsvc wants it: ``tcp:HOST:PORT``."""
        return f"tcp:{self.host}:{self.port}"

    @property
    def hostport(self) -> str:
        """As the pycapnp peers want it: ``HOST:PORT``."""
        return f"{self.host}:{self.port}"

    def stderr_text(self) -> str:
        self.stderr_file.flush()
        with open(self.stderr_file.name, "rb") as f:
            return f.read().decode(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None


def stop_pid(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> int:
    """SIGTERM the process by PID, SIGKILL it after ``timeout`` s; returns its exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)
    return proc.returncode


def _read_listening(proc: subprocess.Popen[bytes], timeout: float) -> int:
    assert proc.stdout is not None
    # Real time: a starting interpreter (and libcapnp) on a loaded machine; returns as soon
    # as the line comes, so the limit only bounds a peer that never gets ready.
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no LISTENING line within {timeout} s (got {buffer!r})")
            if not selector.select(remaining):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"peer exited before LISTENING (status {proc.wait()})")
            buffer += chunk
    line = buffer.split(b"\n", 1)[0].decode()
    words = line.split()
    if len(words) != 2 or words[0] != "LISTENING":
        raise RuntimeError(f"unexpected first line from peer: {line!r}")
    return int(words[1])


@contextlib.contextmanager
def listening_process(
    argv: list[str], *, start_timeout: float = 20.0, stop_timeout: float = 5.0
) -> Iterator[PeerProcess]:
    """Run ``argv`` until it prints ``LISTENING <port>``; stop it by PID on exit."""
    stderr_file = tempfile.NamedTemporaryFile(prefix="peer-stderr-", suffix=".txt")
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        cwd=ROOT,
        env=peer_env(),
    )
    try:
        try:
            port = _read_listening(proc, start_timeout)
        except Exception as error:
            stop_pid(proc, stop_timeout)
            stderr_file.flush()
            with open(stderr_file.name, "rb") as f:
                detail = f.read().decode(errors="replace")[-4000:]
            raise RuntimeError(f"{argv!r} did not start: {error}\nstderr:\n{detail}") from error
        yield PeerProcess(proc, HOST, port, stderr_file)
    finally:
        stop_pid(proc, stop_timeout)
        if proc.stdout is not None:
            proc.stdout.close()
        stderr_file.close()


def pycapnp_server(bootstrap: str = "tester") -> contextlib.AbstractContextManager[PeerProcess]:
    """tests/peers/pycapnp_server.py serving ``bootstrap`` (tester, echo or calculator)."""
    script = os.path.join(PEERS, "pycapnp_server.py")
    return listening_process([PYTHON, script, "--listen", f"{HOST}:0", "--bootstrap", bootstrap])


def capsvc_server(bootstrap: str = "tester") -> contextlib.AbstractContextManager[PeerProcess]:
    """capsvc serving ``bootstrap`` (tester or echo) in a ``python -c`` subprocess."""
    return listening_process([PYTHON, "-c", CAPSVC_SERVER_SCRIPT, bootstrap])


def peer_script(name: str) -> str:
    """Path of a tests/peers script (``pycapnp_tester_client`` ...)."""
    return os.path.join(PEERS, f"{name}.py")


def pycapnp_tailcall_server() -> contextlib.AbstractContextManager[PeerProcess]:
    """tests/support/pycapnp_tailcall_server.py: a C++ Tester that tail-calls every method
    back into the client's own bootstrap Tester (sendResultsTo.yourself)."""
    script = os.path.join(ROOT, "tests", "support", "pycapnp_tailcall_server.py")
    return listening_process([PYTHON, script, "--listen", f"{HOST}:0"])
