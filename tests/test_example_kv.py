"""The README's "Generating typed stubs" example (examples/kv/), as a user runs it: the
checked-in kv_capnp.py is what ``capsvc gen`` makes now, the example passes ``mypy
--strict``, and ``capsvc serve examples.kv.server:Directory`` answers the example client
over TCP on 127.0.0.1 (both real subprocesses, stopped by PID)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.test_cli import ENV, ROOT, TIMEOUT, running


def python(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in the repository, as a user runs it (a real subprocess)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_generated_module_is_fresh() -> None:
    done = python("-m", "capsvc", "gen", "examples/kv/kv.capnp", "-o", "examples/kv", "--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_example_passes_mypy_strict() -> None:
    done = python("-m", "mypy", "--strict", "examples/kv", timeout=TIMEOUT * 3)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues found in 4 source files" in done.stdout


def test_serve_the_example_and_run_its_client(tmp_path: Path) -> None:
    with running(tmp_path, "examples.kv.server:Directory", "--listen", "tcp:127.0.0.1:0") as server:
        client = python("-m", "examples.kv.client", server.address)
        status, _ = server.stop()
    assert client.returncode == 0, client.stdout + client.stderr
    assert client.stdout.splitlines() == [
        "watcher: ada = b'Lovelace'",
        "watcher: ada = b'King'",
        "replaced=True found=True value=b'King'",
        "keys: ['ada']",
        "after the load: 1001 keys, the last user999",
    ]
    assert status == 0
    assert "serving Directory (Directory)" in server.stderr + server.stdout.decode()


MISTAKES = """
from examples.kv import kv_capnp as kv


async def client(users: kv.Store.Client) -> None:
    users.get(kee="ada")
    users.get("ada")
    users.put(key=1)


class Server(kv.Store.Server):
    def get(self, params: kv.Store.PutParams.Reader, results: kv.Store.GetResults.Builder) -> None:
        pass


def fill(results: kv.Store.GetResults.Builder) -> None:
    results.found = 3
"""


def _readme_mistakes() -> list[tuple[str, str]]:
    """(what mypy says, what Python raises) per row of the README's mistakes table."""
    text = (ROOT / "README.md").read_text()
    table = text.split("| mistake | mypy says | at run time |", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in table.strip().splitlines()[1:]:
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        rows.append((cells[1], cells[2]))
    return rows


def test_the_readme_mistakes_table_is_what_mypy_and_python_say(tmp_path: Path) -> None:
    from capsvc.rpc.hooks import null_hook
    from examples.kv import kv_capnp as kv

    rows = _readme_mistakes()
    assert len(rows) == 5
    path = ROOT / "examples" / "kv" / "_mistakes_under_test.py"
    path.write_text(MISTAKES)
    try:
        done = python("-m", "mypy", "--strict", str(path.relative_to(ROOT)), timeout=TIMEOUT * 3)
    finally:
        path.unlink()
    raised = []
    users = kv.Store.Client(null_hook())
    for mistake in (
        lambda: users.get(kee="ada"),  # type: ignore[call-arg]
        lambda: users.get("ada"),  # type: ignore[misc]
        lambda: users.put(key=1),  # type: ignore[arg-type]
        lambda: setattr(kv.Store.GetResults.new_message(), "found", 3),
    ):
        try:
            mistake()
        except TypeError as error:
            raised.append(f"TypeError: {error}")
    for says, raises in rows:
        assert says in done.stdout, (says, done.stdout)
        if raises:
            assert raises in raised, (raises, raised)
