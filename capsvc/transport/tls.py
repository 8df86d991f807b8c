"""TLS over TCP: server and client contexts, key pinning, and bounded handshakes.

Theory of operation
-------------------
Two ways to know the server is the right one (capsvc.transport.address):

- ``capnp://sha-256:DIGEST@HOST:PORT`` pins the server's *key* (OCaml capnp-rpc's vat
  identity, capsvc.keys): no CA is consulted and no name is checked, but after the
  handshake the fingerprint of the key in the certificate the server presented must equal
  the pin, or :class:`TlsIdentityError` is raised and the stream is closed before a single
  byte of RPC goes out. That is sound although OpenSSL verified no chain: the handshake
  itself proves the server holds the private key of the certificate it sent (TLS 1.3
  CertificateVerify, RFC 8446 §4.4.3; TLS 1.2 ServerKeyExchange), which OpenSSL checks
  whatever the verify mode.
- ``tls:HOST:PORT`` is ordinary TLS: the certificate chain must lead to a CA of
  ``ca_file`` (or of the system's store) and name the host (RFC 6125), as for HTTPS.

TLS 1.2 is the oldest version either side accepts (RFC 8996 deprecates 1.0 and 1.1).

:class:`ServerTls` and :class:`ClientTls` build their ``ssl.SSLContext`` once, when they
are made, so that a missing or mismatched file fails at start-up with its name, not at
the first connection. Python's ``ssl`` loads certificates and keys from files only
(``load_cert_chain``), so a certificate made in memory (a self-signed one for a server
given only a key, or a client's identity) is written to a private temporary file (mode
0600, on ``/dev/shm`` when there is one, so it need not reach a disk) and deleted right
after loading.

A client that pins presents a certificate too, when the server asks: capnp-rpc servers
require one (capnp-rpc-net tls_wrapper.ml refuses a client without a certificate). It is
``cert_file``/``key_file`` when given, else a self-signed one for ``key_file``, else an
ephemeral P-256 key made once per process. A capsvc server asks for client certificates
only with ``client_ca_file`` (mutual TLS against that CA): Python's ``ssl`` has no
"accept any certificate, tell me its key" mode, which is how capnp-rpc learns its clients'
keys, so capsvc cannot yet pin clients.

Handshakes. trio's ``SSLStream`` does the handshake lazily, on the first send or receive,
and a ``trio.SSLListener`` hands out streams whose handshake has not begun. A listener
must not do handshakes in ``accept`` (``trio.serve_listeners`` accepts in one loop: a
slow client would hold up every other), so :class:`TlsListener` does not either; the
connection handler, one task per connection, calls :func:`tls_server_handshake` (or
``capsvc.transport.finish_accept``) first: it completes the handshake within
``ServerTls.handshake_timeout`` seconds (default 10), and on any failure (a client that
sends garbage, speaks plain Cap'n Proto, or says nothing) closes the stream forcefully and
raises :class:`TlsHandshakeError`, which only that connection's handler sees. Without it,
the first receive does the handshake and fails with ``trio.BrokenResourceError`` (which
capsvc's Connection treats as a lost connection), so garbage is harmless; but a client
that connects and says nothing holds the connection even past
``Limits.first_message_timeout``, because trio's graceful ``SSLStream.aclose`` completes
the handshake before it sends its close_notify (only ``trio.aclose_forcefully`` does not
wait). So a server must call it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import tempfile
import weakref
from collections.abc import Iterator
from typing import Any, final

import trio

from capsvc.transport.address import check_fingerprint
from capsvc.transport.capabilities import SocketBackedStream
from capsvc.transport.fastsocket import FastSocketStream
from capsvc.transport.tcp import TcpListener

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "ClientTls",
    "ServerTls",
    "TlsError",
    "TlsHandshakeError",
    "TlsIdentityError",
    "TlsListener",
    "default_client",
    "peer_fingerprint",
    "stream_socket",
    "tls_client_stream",
    "tls_server_handshake",
]

#: Seconds a TLS handshake may take, either side (a loopback one takes ~3 ms).
DEFAULT_HANDSHAKE_TIMEOUT = 10.0

_StrPath = str | os.PathLike[str]
_MIN_VERSION = ssl.TLSVersion.TLSv1_2  # RFC 8996: nothing older


class TlsError(ConnectionError):
    """A TLS connection could not be set up."""


class TlsIdentityError(TlsError):
    """The peer is not who the address says: another key than the pinned one, or a
    certificate that does not verify against the CAs (or does not name the host)."""


class TlsHandshakeError(TlsError):
    """The TLS handshake failed (the peer does not speak TLS, or took too long)."""


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_file(path: _StrPath | None, what: str) -> str | None:
    """``path`` as a str, after checking it names a readable file (``ssl`` errors name none)."""
    if path is None:
        return None
    text = os.fspath(path)
    if not os.path.isfile(text):
        raise FileNotFoundError(f"{what} {text!r} does not exist (or is not a file)")
    return text


@contextlib.contextmanager
def _private_file(data: bytes) -> Iterator[str]:
    """A temporary file holding ``data``, readable by us only, removed on exit."""
    directory = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix="capsvc-tls-", suffix=".pem", dir=directory)  # 0600
    try:
        with os.fdopen(fd, "wb") as sink:
            sink.write(data)
        yield path
    finally:
        os.unlink(path)


def _load_chain(context: ssl.SSLContext, cert_file: str | None, key_file: str | None) -> None:
    """Load the certificate chain and key a side presents (module docstring)."""
    from capsvc import keys

    try:
        if cert_file is not None:
            context.load_cert_chain(cert_file, key_file)
        elif key_file is not None:
            certificate = keys.self_signed_certificate(keys.load_private_key(key_file))
            with _private_file(certificate) as path:
                context.load_cert_chain(path, key_file)
        else:
            pem = _ephemeral_identity()
            with _private_file(pem) as path:
                context.load_cert_chain(path)
    except ssl.SSLError as error:
        raise ValueError(
            f"cannot use certificate {cert_file or '(self-signed)'} with key "
            f"{key_file or '(ephemeral)'}: {error.reason or error} (do they belong together?)"
        ) from None


_EPHEMERAL: list[bytes] = []  # this process's ephemeral client identity, made on first use


def _ephemeral_identity() -> bytes:
    """Key and self-signed certificate PEM of this process's throwaway client identity."""
    if not _EPHEMERAL:
        from cryptography.hazmat.primitives.asymmetric import ec

        from capsvc import keys

        key = ec.generate_private_key(ec.SECP256R1())
        _EPHEMERAL.append(keys.private_key_pem(key) + keys.self_signed_certificate(key))
    return _EPHEMERAL[0]


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
        raise ValueError(f"handshake_timeout must be a positive number or None, not {timeout!r}")
    return timeout


@final
class ServerTls:
    """How a server presents itself: its key, its certificate, whom it lets in.

    ``key_file``: the PEM private key (``capsvc keygen``). ``cert_file``: its certificate
    chain, leaf first; None makes a self-signed one (capsvc.keys). ``client_ca_file``:
    require client certificates issued by these CAs (mutual TLS); None asks for none.
    ``fingerprint`` is the server's key fingerprint, the one its ``capnp://`` address pins.
    """

    def __init__(
        self,
        key_file: _StrPath,
        cert_file: _StrPath | None = None,
        client_ca_file: _StrPath | None = None,
        *,
        handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
    ) -> None:
        from capsvc import keys

        self.key_file = _check_file(key_file, "TLS key file")
        self.cert_file = _check_file(cert_file, "TLS certificate file")
        self.client_ca_file = _check_file(client_ca_file, "TLS client CA file")
        self.handshake_timeout = _check_timeout(handshake_timeout)
        assert self.key_file is not None
        # What clients pin is the key in the certificate presented (the same as the key
        # file's, or load_cert_chain below refuses the pair).
        self.fingerprint = (
            keys.fingerprint_of_certificate_file(self.cert_file)
            if self.cert_file is not None
            else keys.fingerprint_of_key_file(self.key_file)
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _MIN_VERSION
        _load_chain(context, self.cert_file, self.key_file)
        if self.client_ca_file is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.client_ca_file)
        self.context = context

    def __repr__(self) -> str:
        return f"<ServerTls {self.fingerprint} key={self.key_file!r}>"


@final
class ClientTls:
    """How a client checks the server, and what it presents if asked (module docstring).

    ``fingerprint``: pin the server's key (``sha-256:...``), no CA check; else the server's
    certificate must verify against ``ca_file`` (or the system's CAs) and name
    ``server_hostname`` (default: the host dialled). ``cert_file``/``key_file``: the
    client's own certificate and key, for servers that ask (a key alone gets a self-signed
    certificate). A ``capnp://`` address fills the pin in (:meth:`pinned`).
    """

    def __init__(
        self,
        fingerprint: str | None = None,
        ca_file: _StrPath | None = None,
        cert_file: _StrPath | None = None,
        key_file: _StrPath | None = None,
        server_hostname: str | None = None,
        *,
        handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT,
    ) -> None:
        if fingerprint is not None:
            check_fingerprint(fingerprint)
            if ca_file is not None:
                raise ValueError(
                    "give ClientTls a fingerprint (pin the server's key) or a ca_file "
                    "(verify its certificate), not both"
                )
        self.fingerprint = fingerprint
        self.ca_file = _check_file(ca_file, "TLS CA file")
        self.cert_file = _check_file(cert_file, "TLS certificate file")
        self.key_file = _check_file(key_file, "TLS key file")
        self.server_hostname = server_hostname
        self.handshake_timeout = _check_timeout(handshake_timeout)
        self._contexts: dict[bool, ssl.SSLContext] = {}
        self.context  # noqa: B018 - built now, so that a bad file fails here

    @property
    def context(self) -> ssl.SSLContext:
        """The context for this configuration (pinning or CA-verifying), built once."""
        pinning = self.fingerprint is not None
        context = self._contexts.get(pinning)
        if context is None:
            context = self._contexts[pinning] = self._build(pinning)
        return context

    def _build(self, pinning: bool) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = _MIN_VERSION
        if pinning:
            # The pin replaces chain and name checks (module docstring); it is checked
            # after the handshake, by tls_client_stream.
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            _load_chain(context, self.cert_file, self.key_file)
        else:
            if self.ca_file is not None:
                context.load_verify_locations(cafile=self.ca_file)
            else:
                context.load_default_certs(ssl.Purpose.SERVER_AUTH)
            if self.cert_file is not None or self.key_file is not None:
                _load_chain(context, self.cert_file, self.key_file)
        return context

    def pinned(self, fingerprint: str) -> ClientTls:
        """This configuration pinning ``fingerprint`` (what a ``capnp://`` address asks).

        Shares the contexts already built (one per process for the default client).
        """
        check_fingerprint(fingerprint)
        if self.fingerprint == fingerprint:
            return self
        if self.fingerprint is not None:
            raise ValueError(
                f"the address pins {fingerprint}, but the ClientTls pins {self.fingerprint}"
            )
        if self.ca_file is not None:
            raise ValueError(
                f"the address pins {fingerprint}: a ClientTls with a ca_file cannot pin a key"
            )
        copy = ClientTls.__new__(ClientTls)
        copy.fingerprint = fingerprint
        copy.ca_file = None
        copy.cert_file = self.cert_file
        copy.key_file = self.key_file
        copy.server_hostname = self.server_hostname
        copy.handshake_timeout = self.handshake_timeout
        copy._contexts = self._contexts
        return copy

    def __repr__(self) -> str:
        if self.fingerprint is not None:
            return f"<ClientTls pins {self.fingerprint}>"
        return f"<ClientTls CAs {self.ca_file or '(system)'}>"


_DEFAULT_CLIENT: list[ClientTls] = []


def default_client() -> ClientTls:
    """The ClientTls of ``open_stream`` for a ``capnp://`` or ``tls:`` address given no
    ``tls=``: system CAs, and the process's ephemeral identity when it pins."""
    if not _DEFAULT_CLIENT:
        _DEFAULT_CLIENT.append(ClientTls())
    return _DEFAULT_CLIENT[0]


# ------------------------------------------------------------------ handshakes
async def tls_client_stream(
    stream: trio.abc.Stream, tls: ClientTls, host: str, port: int
) -> trio.SSLStream[trio.abc.Stream]:
    """TLS over a connected ``stream`` to ``host:port``: handshake, then check the pin.

    Raises :class:`TlsIdentityError` (wrong key, or a certificate that does not verify)
    or :class:`TlsHandshakeError`; either way ``stream`` is closed.
    """
    where = _host_port(host, port)
    try:
        # A zone (fe80::1%eth0) is no part of a name a certificate could carry.
        name = tls.server_hostname or host.partition("%")[0]
        ssl_stream = trio.SSLStream(stream, tls.context, server_hostname=name)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    try:
        await _handshake(ssl_stream, tls.handshake_timeout, f"the server at {where}", True)
        if tls.fingerprint is not None:
            presented = peer_fingerprint(ssl_stream)
            if presented != tls.fingerprint:
                raise TlsIdentityError(
                    f"server at {where} presented key {presented or '(none)'}, but the "
                    f"address pins {tls.fingerprint}: refusing it"
                )
    except BaseException:
        await trio.aclose_forcefully(ssl_stream)
        raise
    return ssl_stream


# Handshake timeouts of streams a TlsListener accepted and nobody has handshaken yet.
_ACCEPTED: weakref.WeakKeyDictionary[trio.SSLStream[Any], float | None] = (
    weakref.WeakKeyDictionary()
)


async def tls_server_handshake(stream: trio.SSLStream[Any], peer: str | None = None) -> None:
    """Complete the handshake of a stream a :class:`TlsListener` accepted (module
    docstring), within its ``ServerTls.handshake_timeout``.

    Raises :class:`TlsHandshakeError` (or :class:`TlsIdentityError` for a client
    certificate that does not verify), after closing the stream.
    """
    timeout = _ACCEPTED.pop(stream, DEFAULT_HANDSHAKE_TIMEOUT)
    if peer is None:
        sock = stream_socket(stream)
        try:
            peer = _host_port(*sock.getpeername()[:2]) if sock is not None else "unknown"
        except OSError:
            peer = "unknown"
    try:
        await _handshake(stream, timeout, f"the client at {peer}", False)
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise


async def _handshake(
    stream: trio.SSLStream[Any], seconds: float | None, who: str, client: bool
) -> None:
    """``do_handshake`` within ``seconds``, its failures as TlsError subclasses."""
    try:
        with trio.fail_after(seconds) if seconds is not None else contextlib.nullcontext():
            await stream.do_handshake()
    except trio.TooSlowError:
        raise TlsHandshakeError(
            f"TLS handshake with {who} did not complete within {seconds:g} s"
        ) from None
    except trio.BrokenResourceError as error:
        raise _explain(error, who, client) from error


#: What OpenSSL's terse reasons for the commonest failures mean.
_REASONS = {
    "WRONG_VERSION_NUMBER": "it sent something that is not TLS: does the peer speak TLS?",
    "HTTP_REQUEST": "it sent an HTTP request, not TLS",
    "UNEXPECTED_EOF_WHILE_READING": "the peer closed the connection during the handshake",
    "UNSUPPORTED_PROTOCOL": "the peer offers only TLS versions older than 1.2",
    "TLSV1_ALERT_PROTOCOL_VERSION": "the peer accepts no TLS version we offer (1.2, 1.3)",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the client presented no certificate, and one is required",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the server requires a client certificate",
}


def _explain(error: trio.BrokenResourceError, who: str, client: bool) -> TlsError:
    """Why a handshake broke, in words, from the ``ssl`` error trio chained to it."""
    cause = error.__cause__
    if isinstance(cause, ssl.SSLCertVerificationError):
        hint = (
            " (a capsvc server with a self-signed certificate? pin its key with "
            "capnp://sha-256:DIGEST@HOST:PORT, as `capsvc keygen` prints, or pass ca_file=)"
            # X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT, X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN
            if client and cause.verify_code in (18, 19)
            else ""
        )
        return TlsIdentityError(
            f"could not verify {who}: certificate verify failed ({cause.verify_message}){hint}"
        )
    if isinstance(cause, ssl.SSLError):
        reason = cause.reason or str(cause)
        meaning = _REASONS.get(reason)
        return TlsHandshakeError(
            f"TLS handshake with {who} failed: {reason}{f' ({meaning})' if meaning else ''}"
        )
    if cause is None or isinstance(cause, OSError):
        return TlsHandshakeError(
            f"TLS handshake with {who} failed: the connection closed"
            f"{f' ({cause})' if cause is not None else ''} (does the peer speak TLS?)"
        )
    return TlsHandshakeError(f"TLS handshake with {who} failed: {cause!r}")


def peer_fingerprint(stream: trio.SSLStream[Any]) -> str | None:
    """The fingerprint of the key the peer presented (None: no certificate), after the
    handshake. A server sees one only from clients it asked (``client_ca_file``)."""
    from capsvc import keys

    der = stream.getpeercert(binary_form=True)
    return keys.fingerprint_of_certificate(der) if der else None


def stream_socket(stream: trio.abc.Stream) -> socket.socket | trio.socket.SocketType | None:
    """The OS socket under ``stream`` (through TLS), for peer names in logs; None if it has
    none (in-memory streams, ``nic:``)."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if isinstance(stream, SocketBackedStream | trio.SocketStream):
        return stream.socket
    return None


# ------------------------------------------------------------------ listening
@final
class TlsListener(trio.abc.Listener[trio.abc.Stream]):
    """A TCP listener whose streams are TLS, server side, handshake not yet done (module
    docstring: the handler calls :func:`tls_server_handshake`).

    ``scheme`` is the address form it was opened for (``tls`` or ``capnp``), so that
    ``listener_address`` gives back one of the same form.
    """

    def __init__(self, inner: TcpListener, tls: ServerTls, scheme: str = "tls") -> None:
        self.inner = inner
        self.tls = tls
        self.scheme = scheme

    @property
    def socket(self) -> trio.socket.SocketType:
        """The bound listening socket."""
        return self.inner.socket

    async def accept(self) -> trio.abc.Stream:
        tcp = await self.inner.accept()
        # The TLS records travel over capsvc's socket stream (its shared receive buffer:
        # capsvc.transport.fastsocket), not over trio's.
        stream = trio.SSLStream(FastSocketStream.take_over(tcp), self.tls.context, server_side=True)
        _ACCEPTED[stream] = self.tls.handshake_timeout
        return stream

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __repr__(self) -> str:
        return f"<TlsListener {self.inner!r} {self.tls.fingerprint}>"
