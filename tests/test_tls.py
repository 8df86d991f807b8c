"""TLS: keys and fingerprints, capnp:// pinning, CA verification, and a server that bad
clients cannot hurt (capsvc.keys, capsvc.transport.tls, capsvc.transport.address).

Every connection is a real socket on 127.0.0.1 carrying real capsvc RPC: the server runs
``capsvc.connection.Connection`` over what ``open_listeners`` accepts, the client
``capsvc.api.open_connection`` over what ``open_stream`` returns.
"""

from __future__ import annotations

import os
import socket as stdlib_socket
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trio.testing

pytest.importorskip("cryptography")

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from capsvc import keys
from capsvc.api import open_connection
from capsvc.connection import Connection
from capsvc.errors import Disconnected
from capsvc.generated.echo_capnp import Echo
from capsvc.structs import _hook_of
from capsvc.transport import (
    Address,
    ClientTls,
    FastSocketStream,
    ServerTls,
    TlsError,
    TlsHandshakeError,
    TlsIdentityError,
    finish_accept,
    listener_address,
    open_listeners,
    open_stream,
    parse_address,
    stream_socket,
)
from capsvc.transport.tls import peer_fingerprint

FP_A = "sha-256:89gIEz_GAPhoUqvK0KKIZ_d1jE-Iv2aKiz06BpNzXqs"  # test_fingerprint_known_key
FP_B = "sha-256:" + "B" * 42 + "A"


class EchoServer(Echo.Server):
    def ping(self, params: Echo.PingParams.Reader, results: Echo.PingResults.Builder) -> None:
        results.reply = "tls:" + params.msg


@dataclass
class Served:
    """A running test server: its bound address, and what its handlers saw."""

    address: str
    handshake_errors: list[TlsError] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    failed: trio.Event = field(default_factory=trio.Event)

    async def handshake_error(self) -> TlsError:
        """The first handshake error a handler saw (it may record it after the client
        already saw the close: wait for it)."""
        with trio.fail_after(10):
            await self.failed.wait()
        return self.handshake_errors[0]


@asynccontextmanager
async def serving(
    tls: ServerTls | None, address: str = "tls:127.0.0.1:0", *, finish: bool = True
) -> AsyncIterator[Served]:
    """Serve EchoServer on ``address`` until the block ends; ``finish``: the handler
    completes the handshake first (finish_accept), else it leaves it to the first read."""
    listeners = await open_listeners(address, tls=tls)
    served = Served(listener_address(listeners[0]))

    async def handle(stream: trio.abc.Stream) -> None:
        if finish:
            try:
                await finish_accept(stream)
            except TlsError as error:
                served.handshake_errors.append(error)
                served.failed.set()
                return
        connection = Connection(stream, _hook_of(EchoServer()), busy_poll=None, served=True)
        served.connections.append(connection)
        await connection.run()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        yield served
        nursery.cancel_scope.cancel()


async def echo(stream: trio.abc.Stream, message: str = "hello") -> str:
    async with open_connection(stream, busy_poll=None) as conn:
        reply: str = (await conn.bootstrap(Echo).ping(msg=message)).reply
        return reply


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "server.key"
    keys.generate_key(path)
    return path


def write_cert(path: Path, key_path: Path) -> Path:
    path.write_bytes(keys.self_signed_certificate(keys.load_private_key(key_path)))
    return path


# -- keys and fingerprints ----------------------------------------------------------------


def test_generate_key_is_private_p256_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "vat.key"
    fingerprint = keys.generate_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = keys.load_private_key(path)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"
    assert fingerprint == keys.fingerprint_of_key_file(path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        keys.generate_key(path)
    assert path.read_bytes() == before


def test_fingerprint_known_key(tmp_path: Path) -> None:
    # A fixed key; FP_A was computed with the openssl command line, independently of capsvc:
    # openssl pkey -pubout -outform DER | openssl dgst -sha256 -binary | base64 (url, no =)
    key = ec.derive_private_key(1234567, ec.SECP256R1())
    path = tmp_path / "fixed.key"
    path.write_bytes(keys.private_key_pem(key))
    assert keys.fingerprint_of_key_file(path) == FP_A
    certificate = keys.self_signed_certificate(key)
    as_der = x509.load_pem_x509_certificate(certificate).public_bytes(serialization.Encoding.DER)
    assert keys.fingerprint_of_certificate(as_der) == FP_A


def test_self_signed_certificate_names_loopback_and_capnp() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = x509.load_pem_x509_certificate(keys.self_signed_certificate(key))
    assert certificate.subject.rfc4514_string() == "CN=capsvc"
    assert certificate.not_valid_after_utc.year == 9999
    sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {"localhost", "capnp"}
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}


def test_encrypted_and_garbage_keys_are_refused_clearly(tmp_path: Path) -> None:
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(ValueError, match="encrypted"):
        keys.load_private_key(encrypted)
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a key\n")
    with pytest.raises(ValueError, match="not a PEM private key"):
        keys.load_private_key(garbage)
    with pytest.raises(FileNotFoundError, match=r"nowhere\.key"):
        ServerTls(tmp_path / "nowhere.key")


# -- address forms --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "canonical"),
    [
        ("tls:127.0.0.1:4000", Address("tls", host="127.0.0.1", port=4000), None),
        ("TLS:[::1]:0", Address("tls", host="::1", port=0), "tls:[::1]:0"),
        (
            f"capnp://{FP_A}@127.0.0.1:7000",
            Address("capnp", host="127.0.0.1", port=7000, fingerprint=FP_A),
            None,
        ),
        (
            f"capnp://{FP_A}@[::1]:7000/c2VydmljZQ",
            Address("capnp", host="::1", port=7000, fingerprint=FP_A, service="c2VydmljZQ"),
            None,
        ),
        (
            f"capnp://{FP_A}@host.example:7000/",
            Address("capnp", host="host.example", port=7000, fingerprint=FP_A),
            f"capnp://{FP_A}@host.example:7000",
        ),
        (
            "capnp://insecure@127.0.0.1:7000",
            Address("capnp", host="127.0.0.1", port=7000, insecure=True),
            None,
        ),
    ],
)
def test_parse_tls_forms(text: str, expected: Address, canonical: str | None) -> None:
    address = parse_address(text)
    assert address == expected
    assert str(address) == (canonical or text)
    assert parse_address(str(address)) == address
    assert address.uses_tls is not address.insecure


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls:localhost", "expected tls:HOST:PORT"),
        ("tls://host:1", "without '//'"),
        ("capnp:host:1", "expected capnp://sha-256:DIGEST@HOST:PORT"),
        ("capnp://127.0.0.1:7000", "names the server's key"),
        (f"capnp://{FP_A}@/tmp/vat.sock", "Unix socket .* not supported yet"),
        (f"capnp://{FP_A}@127.0.0.1", "expected capnp://...@HOST:PORT"),
        (f"capnp://{FP_A}@127.0.0.1:99999", "out of range"),
        ("capnp://sha-512:abc@127.0.0.1:1", "unknown hash type 'sha-512'"),
        ("capnp://sha-256@127.0.0.1:1", "expected sha-256:DIGEST"),
        (f"capnp://{FP_A}=@127.0.0.1:1", "without '=' padding"),
        ("capnp://sha-256:c2hvcnQ@127.0.0.1:1", "base64url of 32 bytes"),
        (f"capnp://{FP_A[:-1]}+@127.0.0.1:1", "base64url of 32 bytes"),
        # The last character's unused low bits set: decodes, but is not canonical.
        (f"capnp://{FP_A[:-1]}t@127.0.0.1:1", "base64url of 32 bytes"),
        (f"capnp://{FP_A}@127.0.0.1:1/a/b", "at most one path segment"),
        (f"capnp://{FP_A}@127.0.0.1:1/not+b64", "not base64url"),
        ("https://example.org/", "use tcp:HOST:PORT, tls:HOST:PORT, capnp://sha-256"),
    ],
)
def test_parse_tls_forms_bad(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_address(text)


def test_address_constructors_for_tls() -> None:
    assert str(Address.tls("::1", 5)) == "tls:[::1]:5"
    assert Address.capnp("127.0.0.1", 9, FP_A) == parse_address(f"capnp://{FP_A}@127.0.0.1:9")
    assert Address.capnp("h", 9, None).insecure


# -- connecting -------------------------------------------------------------------------------


async def test_keygen_fingerprint_is_what_the_server_presents(key_file: Path) -> None:
    fingerprint = keys.fingerprint_of_key_file(key_file)
    async with serving(ServerTls(key_file)) as served:
        assert served.address.startswith("tls:127.0.0.1:")
        assert parse_address(served.address).port != 0
        port = parse_address(served.address).port
        stream = await open_stream(f"capnp://{fingerprint}@127.0.0.1:{port}")
        assert isinstance(stream, trio.SSLStream)
        assert peer_fingerprint(stream) == fingerprint
        sock = stream_socket(stream)
        assert sock is not None
        assert sock.getpeername()[:2] == ("127.0.0.1", port)
        assert await echo(stream) == "tls:hello"


async def test_capnp_listener_address_pins_the_server_key(key_file: Path) -> None:
    tls = ServerTls(key_file)
    async with serving(tls, f"capnp://{tls.fingerprint}@127.0.0.1:0") as served:
        assert served.address.startswith(f"capnp://{tls.fingerprint}@127.0.0.1:")
        # The printed address is all a client needs.
        assert await echo(await open_stream(served.address), "pinned") == "tls:pinned"


async def test_wrong_pin_is_refused_naming_both_keys(key_file: Path) -> None:
    tls = ServerTls(key_file)
    async with serving(tls) as served:
        port = parse_address(served.address).port
        with pytest.raises(TlsIdentityError) as caught:
            await open_stream(f"capnp://{FP_B}@127.0.0.1:{port}")
        message = str(caught.value)
        assert f"server at 127.0.0.1:{port} presented key {tls.fingerprint}" in message
        assert f"the address pins {FP_B}: refusing it" in message
        assert isinstance(caught.value, ConnectionError)
        # The server goes on serving, and got no RPC from the refused client.
        assert await echo(await open_stream(f"capnp://{tls.fingerprint}@127.0.0.1:{port}"))
        assert all(c.session.calls_received <= 1 for c in served.connections)
        assert sum(c.session.calls_received for c in served.connections) == 1


async def test_tls_address_checks_cas_and_a_self_signed_server_fails(key_file: Path) -> None:
    async with serving(ServerTls(key_file)) as served:
        with pytest.raises(TlsIdentityError, match="certificate verify failed") as caught:
            await open_stream(served.address)
        assert "self-signed" in str(caught.value)
        assert "capnp://sha-256:DIGEST@HOST:PORT" in str(caught.value)  # the hint


async def test_ca_file_naming_the_self_signed_certificate_works(
    key_file: Path, tmp_path: Path
) -> None:
    certificate = write_cert(tmp_path / "server.pem", key_file)
    async with serving(ServerTls(key_file, certificate)) as served:
        assert await echo(await open_stream(served.address, tls=ClientTls(ca_file=certificate)))
        port = parse_address(served.address).port
        # By name: the certificate's SAN localhost (dialling the IP it listens on).
        by_name = ClientTls(ca_file=certificate, server_hostname="localhost")
        assert await echo(await open_stream(f"tls:127.0.0.1:{port}", tls=by_name))
        # A name the certificate does not carry is refused (RFC 6125).
        elsewhere = ClientTls(ca_file=certificate, server_hostname="example.org")
        with pytest.raises(TlsIdentityError, match=r"[Hh]ostname mismatch"):
            await open_stream(served.address, tls=elsewhere)


async def test_mutual_tls(key_file: Path, tmp_path: Path) -> None:
    server_cert = write_cert(tmp_path / "server.pem", key_file)
    client_key = tmp_path / "client.key"
    keys.generate_key(client_key)
    client_cert = write_cert(tmp_path / "client.pem", client_key)
    tls = ServerTls(key_file, server_cert, client_ca_file=client_cert)
    async with serving(tls) as served:
        ok = ClientTls(ca_file=server_cert, cert_file=client_cert, key_file=client_key)
        stream = await open_stream(served.address, tls=ok)
        assert await echo(stream)
        # A client with no certificate: the server's handshake fails and says why. In TLS
        # 1.3 the client's handshake is over before the server checks (RFC 8446 §4.4.2),
        # so the client may learn it only from its first call.
        with pytest.raises((TlsError, Disconnected)):
            await echo(await open_stream(served.address, tls=ClientTls(ca_file=server_cert)))
        error = await served.handshake_error()
        assert len(served.handshake_errors) == 1
        assert "certificate" in str(error).lower()


async def test_rsa_key_serves_and_pins(tmp_path: Path) -> None:
    # capnp-rpc's default key: RSA-2048, here in the traditional "RSA PRIVATE KEY" PEM.
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / "rsa.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    assert path.read_bytes().startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    assert isinstance(keys.load_private_key(path), rsa.RSAPrivateKey)
    tls = ServerTls(path)
    assert tls.fingerprint == keys.fingerprint_of_public_key(key.public_key())
    async with serving(tls, f"capnp://{tls.fingerprint}@127.0.0.1:0") as served:
        stream = await open_stream(served.address)
        assert isinstance(stream, trio.SSLStream)
        assert peer_fingerprint(stream) == tls.fingerprint
        assert await echo(stream, "rsa") == "tls:rsa"


async def test_generate_rsa_key(tmp_path: Path) -> None:
    fingerprint = keys.generate_key(tmp_path / "rsa.key", rsa_bits=2048)
    assert isinstance(keys.load_private_key(tmp_path / "rsa.key"), rsa.RSAPrivateKey)
    assert fingerprint == ServerTls(tmp_path / "rsa.key").fingerprint
    with pytest.raises(ValueError, match="at least 2048"):
        keys.generate_key(tmp_path / "small.key", rsa_bits=1024)
    assert not (tmp_path / "small.key").exists()


async def test_capnp_insecure_is_plain_tcp() -> None:
    async with serving(None, "capnp://insecure@127.0.0.1:0") as served:
        port = parse_address(served.address).port
        stream = await open_stream(f"capnp://insecure@127.0.0.1:{port}")
        assert isinstance(stream, FastSocketStream)
        assert await echo(stream) == "tls:hello"


async def test_a_server_that_never_answers_times_the_client_out() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:

        async def silent(stream: trio.SocketStream) -> None:
            await stream.receive_some()  # the ClientHello
            await trio.sleep_forever()  # and never a word back

        nursery.start_soon(trio.serve_listeners, silent, listeners)
        # A real 0.3 s wait: the timeout under test.
        patient = ClientTls(fingerprint=FP_A, handshake_timeout=0.3)
        with pytest.raises(TlsHandshakeError, match=r"did not complete within 0\.3 s"):
            await open_stream(f"tls:127.0.0.1:{port}", tls=patient)
        nursery.cancel_scope.cancel()


def test_a_certificate_for_another_key_is_refused(key_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.key"
    keys.generate_key(other)
    with pytest.raises(ValueError, match="do they belong together"):
        ServerTls(key_file, write_cert(tmp_path / "other.pem", other))


# -- refusals before any byte goes out --------------------------------------------------------


async def test_service_ids_are_refused(key_file: Path) -> None:
    with pytest.raises(ValueError, match=r"sturdy-ref service IDs \(Level 2 restore\)"):
        await open_stream(f"capnp://{FP_A}@127.0.0.1:1/c2VydmljZQ")
    with pytest.raises(ValueError, match="sturdy-ref service IDs"):
        await open_stream("capnp://insecure@127.0.0.1:1/c2VydmljZQ")
    with pytest.raises(ValueError, match="no service ID"):
        await open_listeners(f"capnp://{FP_A}@127.0.0.1:0/c2VydmljZQ", tls=ServerTls(key_file))


async def test_tls_options_must_match_the_address(key_file: Path) -> None:
    with pytest.raises(ValueError, match="needs the server's key"):
        await open_listeners("tls:127.0.0.1:0")
    with pytest.raises(ValueError, match="not a TLS address"):
        await open_listeners("tcp:127.0.0.1:0", tls=ServerTls(key_file))
    with pytest.raises(ValueError, match="not a TLS address"):
        await open_stream("tcp:127.0.0.1:1", tls=ClientTls())
    with pytest.raises(ValueError, match="not a TLS address"):
        await open_stream("capnp://insecure@127.0.0.1:1", tls=ClientTls())
    with pytest.raises(ValueError, match=f"the address pins {FP_A}, but the server's key"):
        await open_listeners(f"capnp://{FP_A}@127.0.0.1:0", tls=ServerTls(key_file))
    with pytest.raises(ValueError, match="port 0"):
        await open_stream("tls:127.0.0.1:0")
    with pytest.raises(ValueError, match="not both"):
        ClientTls(fingerprint=FP_A, ca_file=key_file)
    with pytest.raises(ValueError, match=f"the address pins {FP_B}, but the ClientTls pins"):
        ClientTls(fingerprint=FP_A).pinned(FP_B)
    with pytest.raises(ValueError, match="base64url of 32 bytes"):
        ClientTls(fingerprint="sha-256:AAAA")


# -- bad clients ------------------------------------------------------------------------------


async def _plain_client(port: int, data: bytes) -> bytes:
    """Connect without TLS, send ``data``, return all the server sends until it closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        received = b""
        with trio.fail_after(10):
            while True:
                try:
                    chunk = await stream.receive_some()
                except trio.BrokenResourceError:  # a reset is a close too
                    break
                if not chunk:
                    break
                received += chunk
        return received


# What a confused client might send a TLS port: an HTTP request, and capsvc's own plain
# Cap'n Proto (a Bootstrap message's frame header and then some).
GARBAGE = [b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00\x00\x00\x00\x06\x00\x00\x00" + bytes(48)]


@pytest.mark.parametrize("finish", [True, False], ids=["finish_accept", "lazy-handshake"])
@pytest.mark.parametrize("garbage", GARBAGE, ids=["http", "plain-capnp"])
async def test_garbage_client_does_not_hurt_the_server(
    key_file: Path, garbage: bytes, finish: bool
) -> None:
    tls = ServerTls(key_file)
    async with serving(tls, finish=finish) as served:
        port = parse_address(served.address).port
        assert port is not None
        answer = await _plain_client(port, garbage)
        assert not answer.startswith(b"\x00\x00\x00\x00")  # no Cap'n Proto frame came back
        if finish:
            error = await served.handshake_error()
            assert len(served.handshake_errors) == 1
            assert isinstance(error, TlsHandshakeError)
            assert "TLS handshake with the client at 127.0.0.1:" in str(error)
        else:
            (broken,) = served.connections
            assert broken.session.calls_received == 0
        # Another client is served as if nothing happened.
        good = await open_stream(f"capnp://{tls.fingerprint}@127.0.0.1:{port}")
        assert await echo(good, "after") == "tls:after"


async def test_silent_client_is_dropped_after_the_handshake_timeout(key_file: Path) -> None:
    tls = ServerTls(key_file, handshake_timeout=0.3)
    async with serving(tls) as served:
        port = parse_address(served.address).port
        assert port is not None
        began = trio.current_time()
        # Says nothing: the server's handshake times out (a real 0.3 s wait, the point of
        # the test) and closes the connection, which ends our read.
        assert await _plain_client(port, b"") == b""
        assert trio.current_time() - began < 5
        error = await served.handshake_error()
        assert served.handshake_errors == [error]
        assert isinstance(error, TlsHandshakeError)
        assert "did not complete within 0.3 s" in str(error)


def test_stream_socket_of_plain_streams() -> None:
    left, right = stdlib_socket.socketpair()
    try:
        stream = FastSocketStream(left)
        assert stream_socket(stream) is left
        assert stream_socket(trio.testing.memory_stream_pair()[0]) is None
    finally:
        left.close()
        right.close()


def test_key_mode_survives_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        keys.generate_key(tmp_path / "k.key")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k.key").stat().st_mode) == 0o600
