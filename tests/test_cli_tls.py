"""``capsvc keygen`` and ``capsvc serve`` on a capnp:// address (issue 13, point 4), as
real subprocesses: the printed fingerprint is the one the server presents, a client that
pins it gets served, and one that pins another key is refused with both named."""

from __future__ import annotations

from pathlib import Path

import pytest

import capsvc
from capsvc.transport.tls import TlsIdentityError
from tests.support.tester import Tester
from tests.test_cli import PYTHON_M, run, running

OTHER = "sha-256:" + "A" * 43


def keygen(path: Path) -> str:
    made = run("keygen", str(path), command=PYTHON_M)
    assert made.returncode == 0, made.stderr
    fingerprint, advice = made.stdout.splitlines()
    assert fingerprint.startswith("sha-256:"), made.stdout
    assert f"--tls-key {path}" in advice
    return fingerprint


def test_keygen_refuses_to_overwrite_a_key(tmp_path: Path) -> None:
    keygen(tmp_path / "server.key")
    again = run("keygen", str(tmp_path / "server.key"), command=PYTHON_M)
    assert again.returncode == 1
    assert "cannot write" in again.stderr


def test_serve_on_a_capnp_address_needs_a_key() -> None:
    ran = run("serve", "--listen", f"capnp://{OTHER}@127.0.0.1:0", command=PYTHON_M)
    assert ran.returncode == 2
    assert "needs --tls-key FILE" in ran.stderr


async def test_a_pinned_client_is_served_and_another_pin_refused(tmp_path: Path) -> None:
    key = tmp_path / "server.key"
    fingerprint = keygen(key)
    app = "tests.support.tester:TesterImpl"
    listen = "capnp://insecure@127.0.0.1:0".replace("insecure", fingerprint)
    with running(tmp_path, app, "--listen", listen, "--tls-key", str(key)) as server:
        assert server.address.startswith(f"capnp://{fingerprint}@127.0.0.1:")
        async with capsvc.connect(server.address) as conn:
            assert (await conn.bootstrap(Tester).echo(msg="pinned")).reply == "pinned"
        wrong = server.address.replace(fingerprint, OTHER)
        with pytest.raises(TlsIdentityError) as refused:
            async with capsvc.connect(wrong):
                pass
        assert fingerprint in str(refused.value)
        assert OTHER in str(refused.value)
