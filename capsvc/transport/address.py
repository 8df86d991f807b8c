"""Transport addresses: the URIs users type (``tcp:HOST:PORT``, ``unix:PATH``, ``capnp://``).

Theory of operation
-------------------
DESIGN.md ("The public API") fixes addresses as URIs of the form ``SCHEME:REST``:

- ``tcp:HOST:PORT``: HOST is a host name, an IPv4 literal or an IPv6 literal in brackets
  (``tcp:[::1]:4000``; a zone such as ``[fe80::1%eth0]`` is allowed). The port is
  decimal, 0-65535; 0 means "let the kernel pick" and only makes sense for listening.
- ``tls:HOST:PORT``: the same host and port, with TLS over the TCP connection. A client
  checks the server's certificate against CAs (a ``ca_file`` or the system's) and its
  host name, as HTTPS does (capsvc.transport.tls).
- ``capnp://sha-256:DIGEST@HOST:PORT[/SERVICE]``: OCaml capnp-rpc's address form
  (capnp-rpc-net capnp_address.ml, auth.ml), so that a URI one of its vats prints works
  here unchanged. TLS, but the server is known by its key, not by a CA: DIGEST is the
  base64url (RFC 4648 §5, no padding) SHA-256 of the server's DER SubjectPublicKeyInfo,
  and the client refuses any other key (``capsvc keygen`` prints a key's fingerprint,
  capsvc.keys). SERVICE is the base64url of a sturdy ref's service ID (Level 2 restore,
  sent in ``Bootstrap.deprecatedObjectId`` by capnp-rpc); it is parsed and kept, but
  capsvc cannot restore one yet, so opening such an address raises ``ValueError``.
- ``capnp://insecure@HOST:PORT[/SERVICE]``: capnp-rpc's plain TCP form, for development
  (``Address.insecure`` is true, ``fingerprint`` is None).
- ``unix:PATH``: the filesystem path of a Unix domain socket, taken verbatim.
- ``nic:...``: the user-space NIC driver (grammar in capsvc.nicdriver.address).
- ``pipe:`` is reserved for a backend that does not exist yet: it raises
  ``ValueError("... not supported yet")``, as do capnp-rpc's Unix-socket form
  ``capnp://...@/PATH`` and hash types other than sha-256. ``memory:`` is not an address at
  all: in-memory streams come in connected pairs from
  :func:`capsvc.transport.memory.memory_stream_pair`.

:func:`parse_address` is pure (no DNS, no filesystem access, no cryptography) and raises
``ValueError`` with a message naming the offending text for anything else. ``str(address)``
gives the canonical URI back, so ``parse_address(str(a)) == a``. An empty service
(``capnp://...@HOST:PORT/``) is no service, as capnp-rpc reads it (the plain bootstrap),
and canonically has no trailing slash.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from dataclasses import dataclass

__all__ = ["FINGERPRINT_PREFIX", "Address", "check_fingerprint", "parse_address"]

_RESERVED = {
    "pipe": "pipe: addresses are not supported yet",
}
_KNOWN = (
    "tcp:HOST:PORT",
    "tls:HOST:PORT",
    "capnp://sha-256:DIGEST@HOST:PORT",
    "capnp://insecure@HOST:PORT",
    "unix:PATH",
    "nic:DEVICE",
)

#: The hash name capnp-rpc writes before a key fingerprint (auth.ml: the only one it knows).
FINGERPRINT_PREFIX = "sha-256:"
_DIGEST_BYTES = 32  # SHA-256
_BASE64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed transport address.

    ``host``/``port`` are set for tcp, tls and capnp, ``path`` for unix and nic;
    ``fingerprint`` (``sha-256:DIGEST``), ``service`` (base64url text) and ``insecure``
    for capnp only (module docstring).
    """

    scheme: str
    host: str | None = None
    port: int | None = None
    path: str | None = None
    fingerprint: str | None = None
    service: str | None = None
    insecure: bool = False

    @classmethod
    def tcp(cls, host: str, port: int) -> Address:
        """A TCP address, validated like a parsed one."""
        return parse_address(f"tcp:{_bracket(host)}:{port}")

    @classmethod
    def tls(cls, host: str, port: int) -> Address:
        """A TLS-over-TCP address (CA verification), validated like a parsed one."""
        return parse_address(f"tls:{_bracket(host)}:{port}")

    @classmethod
    def capnp(cls, host: str, port: int, fingerprint: str | None) -> Address:
        """A ``capnp://`` address pinning ``fingerprint`` (None: ``insecure@``)."""
        return parse_address(f"capnp://{fingerprint or 'insecure'}@{_bracket(host)}:{port}")

    @classmethod
    def unix(cls, path: str) -> Address:
        """A Unix-socket address, validated like a parsed one."""
        return parse_address(f"unix:{path}")

    @property
    def uses_tls(self) -> bool:
        """Whether the bytes go through TLS: ``tls:`` and ``capnp://sha-256:...@``."""
        return self.scheme == "tls" or (self.scheme == "capnp" and not self.insecure)

    def __str__(self) -> str:
        if self.scheme in ("tcp", "tls"):
            return f"{self.scheme}:{_bracket(self.host or '')}:{self.port}"
        if self.scheme == "capnp":
            auth = "insecure" if self.insecure else self.fingerprint
            tail = f"/{self.service}" if self.service else ""
            return f"capnp://{auth}@{_bracket(self.host or '')}:{self.port}{tail}"
        if self.scheme == "unix":
            return f"unix:{self.path}"
        if self.scheme == "nic":
            return f"nic:{self.path}"
        return f"{self.scheme}:"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_address(text: str) -> Address:
    """Parse a transport URI. Raises ``ValueError`` explaining what is wrong."""
    if not isinstance(text, str):
        raise TypeError(f"an address must be a str, not {type(text).__name__}")
    scheme, colon, rest = text.partition(":")
    if not colon or not scheme:
        raise ValueError(f"malformed address {text!r}: expected one of {', '.join(_KNOWN)}")
    scheme = scheme.lower()
    if scheme in ("tcp", "tls"):
        host, port = _parse_host_port(text, rest, scheme)
        return Address(scheme, host=host, port=port)
    if scheme == "capnp":
        return _parse_capnp(text, rest)
    if scheme == "unix":
        return _parse_unix(text, rest)
    if scheme == "nic":
        return _parse_nic(text, rest)
    if scheme in _RESERVED:
        raise ValueError(f"{_RESERVED[scheme]} (in {text!r})")
    if scheme == "memory":
        raise ValueError(
            "memory: is not an address; in-memory streams come in pairs from "
            "capsvc.transport.memory.memory_stream_pair()"
        )
    raise ValueError(f"unknown address scheme {scheme!r} in {text!r}: use {', '.join(_KNOWN)}")


def check_fingerprint(text: str) -> str:
    """Check a key fingerprint, ``sha-256:`` + base64url of 32 bytes; return it.

    The digest must be unpadded (capnp-rpc's ``B64.encode ~pad:false``) and canonical (its
    unused low bits zero), so that two spellings of one key never compare unequal.
    """
    if not isinstance(text, str):
        raise TypeError(f"a fingerprint must be a str, not {type(text).__name__}")
    name, colon, digest = text.partition(":")
    if not colon:
        raise ValueError(
            f"malformed key fingerprint {text!r}: expected sha-256:DIGEST "
            "(as `capsvc keygen` prints)"
        )
    if name != FINGERPRINT_PREFIX[:-1]:
        raise ValueError(
            f"unknown hash type {name!r} in key fingerprint {text!r}: only sha-256 is "
            "supported (as in capnp-rpc)"
        )
    if digest.endswith("="):
        raise ValueError(
            f"malformed key fingerprint {text!r}: the digest is written without '=' padding"
        )
    raw = _decode_base64url(digest)
    if raw is None or len(raw) != _DIGEST_BYTES:
        raise ValueError(
            f"malformed key fingerprint {text!r}: the digest must be the base64url of "
            f"{_DIGEST_BYTES} bytes (43 characters of A-Z a-z 0-9 - _)"
        )
    return text


def _decode_base64url(text: str) -> bytes | None:
    """Unpadded canonical base64url (RFC 4648 §5) to bytes; None if it is not that."""
    if not set(text) <= _BASE64URL or len(text) % 4 == 1:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    # Non-canonical text (stray low bits in the last character) decodes too: refuse it.
    if base64.urlsafe_b64encode(raw).decode().rstrip("=") != text:
        return None
    return raw


def _parse_host_port(text: str, rest: str, scheme: str) -> tuple[str, int]:
    """``HOST:PORT`` of a tcp:, tls: or capnp:// address (the rules of the docstring)."""
    form = "capnp://...@HOST:PORT" if scheme == "capnp" else f"{scheme}:HOST:PORT"
    if rest.startswith("//"):
        raise ValueError(f"malformed address {text!r}: write {scheme}:HOST:PORT, without '//'")
    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise ValueError(f"malformed address {text!r}: missing ']' after the IPv6 host")
        host = rest[1:close]
        after = rest[close + 1 :]
        if not after.startswith(":"):
            raise ValueError(f"malformed address {text!r}: expected ':PORT' after ']'")
        port_text = after[1:]
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError("not IPv6")
        except ValueError:
            raise ValueError(
                f"malformed address {text!r}: {host!r} in brackets is not an IPv6 address"
            ) from None
    else:
        host, colon, port_text = rest.rpartition(":")
        if not colon:
            raise ValueError(f"malformed address {text!r}: expected {form}")
        if ":" in host:
            raise ValueError(
                f"malformed address {text!r}: an IPv6 host must be in brackets, "
                f"e.g. {scheme}:[{host}]:{port_text}"
            )
        if not host:
            raise ValueError(
                f"malformed address {text!r}: missing host (use 0.0.0.0 or [::] for any)"
            )
        if any(c.isspace() or c in "[]/@?#" for c in host):
            raise ValueError(f"malformed address {text!r}: invalid host {host!r}")
    if not (port_text.isascii() and port_text.isdigit()):
        raise ValueError(f"malformed address {text!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"malformed address {text!r}: port {port} is out of range 0-65535")
    return host, port


def _parse_capnp(text: str, rest: str) -> Address:
    """``capnp://AUTH@HOST:PORT[/SERVICE]``, AUTH ``sha-256:DIGEST`` or ``insecure``."""
    if not rest.startswith("//"):
        raise ValueError(
            f"malformed address {text!r}: expected capnp://sha-256:DIGEST@HOST:PORT "
            "or capnp://insecure@HOST:PORT"
        )
    authority, _, service = rest[2:].partition("/")
    auth, at, host_port = authority.rpartition("@")
    if not at:
        raise ValueError(
            f"malformed address {text!r}: a capnp:// address names the server's key, "
            "capnp://sha-256:DIGEST@HOST:PORT (`capsvc keygen` prints it), or says "
            "capnp://insecure@HOST:PORT for plain TCP"
        )
    if not host_port:
        # capnp-rpc's capnp://AUTH@/PATH form (capnp_address.ml, no host and no port).
        raise ValueError(
            f"capnp:// over a Unix socket (capnp://...@/PATH) is not supported yet (in {text!r})"
        )
    host, port = _parse_host_port(text, host_port, "capnp")
    if "?" in service or "#" in service or "/" in service:
        raise ValueError(
            f"malformed address {text!r}: expected at most one path segment, the service ID"
        )
    if service and _decode_base64url(service) is None:
        raise ValueError(
            f"malformed address {text!r}: the service ID {service!r} is not base64url "
            "without padding (A-Z a-z 0-9 - _)"
        )
    if auth == "insecure":
        return Address("capnp", host=host, port=port, service=service or None, insecure=True)
    try:
        fingerprint = check_fingerprint(auth)
    except ValueError as error:
        raise ValueError(f"{error} (in {text!r})") from None
    return Address("capnp", host=host, port=port, fingerprint=fingerprint, service=service or None)


def _parse_unix(text: str, rest: str) -> Address:
    if not rest:
        raise ValueError(f"malformed address {text!r}: expected unix:PATH")
    if "\0" in rest:
        raise ValueError(f"malformed address {text!r}: a path cannot contain NUL")
    return Address("unix", path=rest)


def _parse_nic(text: str, rest: str) -> Address:
    """``nic:model:NAME`` or ``nic:PCI-ADDRESS``, with ``,key=value`` options
    (grammar in capsvc.nicdriver.address)."""
    from capsvc.nicdriver.address import parse_nic_spec  # pure: no trio, no driver

    try:
        spec = parse_nic_spec(rest)
    except ValueError as error:
        raise ValueError(f"malformed address {text!r}: {error}") from None
    return Address("nic", path=str(spec).removeprefix("nic:"))
