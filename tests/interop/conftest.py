"""Fixtures for interop tests: reference (pycapnp) and capsvc peers in subprocesses.

Every server process is session-scoped (one start per run), listens on 127.0.0.1 only and is
stopped by PID (SIGTERM, then SIGKILL) at the end of the session. The per-test fixtures check
that the peer survived the test, so one test that crashes a peer is reported where it happened.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.peers import (
    PeerProcess,
    capsvc_server,
    pycapnp_server,
    pycapnp_tailcall_server,
)


def _session_peer(factory, bootstrap: str) -> Iterator[PeerProcess]:  # type: ignore[no-untyped-def]
    with factory(bootstrap) as peer:
        yield peer


@pytest.fixture(scope="session")
def _pycapnp_tester() -> Iterator[PeerProcess]:
    yield from _session_peer(pycapnp_server, "tester")


@pytest.fixture(scope="session")
def _pycapnp_calculator() -> Iterator[PeerProcess]:
    yield from _session_peer(pycapnp_server, "calculator")


@pytest.fixture(scope="session")
def _capsvc_tester() -> Iterator[PeerProcess]:
    yield from _session_peer(capsvc_server, "tester")


@pytest.fixture(scope="session")
def _capsvc_echo() -> Iterator[PeerProcess]:
    yield from _session_peer(capsvc_server, "echo")


def _checked(peer: PeerProcess) -> Iterator[PeerProcess]:
    assert peer.alive(), f"peer process died earlier:\n{peer.stderr_text()[-4000:]}"
    yield peer
    assert peer.alive(), f"peer process died during the test:\n{peer.stderr_text()[-4000:]}"


@pytest.fixture
def pycapnp_tester(_pycapnp_tester: PeerProcess) -> Iterator[PeerProcess]:
    """pycapnp_server.py --bootstrap tester (the C++ reference)."""
    yield from _checked(_pycapnp_tester)


@pytest.fixture
def pycapnp_calculator(_pycapnp_calculator: PeerProcess) -> Iterator[PeerProcess]:
    """pycapnp_server.py --bootstrap calculator (the C++ reference)."""
    yield from _checked(_pycapnp_calculator)


@pytest.fixture
def capsvc_tester(_capsvc_tester: PeerProcess) -> Iterator[PeerProcess]:
    """capsvc serving TesterImpl in a subprocess."""
    yield from _checked(_capsvc_tester)


@pytest.fixture(scope="session")
def _capsvc_typed_tester() -> Iterator[PeerProcess]:
    yield from _session_peer(capsvc_server, "typed-tester")


@pytest.fixture
def capsvc_typed_tester(_capsvc_typed_tester: PeerProcess) -> Iterator[PeerProcess]:
    """capsvc serving the Tester written on generated bases, in a subprocess."""
    yield from _checked(_capsvc_typed_tester)


@pytest.fixture
def capsvc_echo(_capsvc_echo: PeerProcess) -> Iterator[PeerProcess]:
    """capsvc serving EchoImpl in a subprocess."""
    yield from _checked(_capsvc_echo)


@pytest.fixture
def pycapnp_tailcall() -> Iterator[PeerProcess]:
    """A fresh tests/support/pycapnp_tailcall_server.py per test: pycapnp 2.2.4 aborts the
    whole process ('Inner node returned empty value') after some tail calls, even against
    pycapnp itself, so a server is never shared between tests."""
    with pycapnp_tailcall_server() as peer:
        yield peer
