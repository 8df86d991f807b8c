"""Transport addresses: the URIs users type (``tcp:HOST:PORT``, ``unix:PATH``).

Theory of operation
-------------------
DESIGN.md ("The public API") fixes addresses as URIs of the form ``SCHEME:REST``:

- ``tcp:HOST:PORT``: HOST is a host name, an IPv4 literal or an IPv6 literal in brackets
  (``tcp:[::1]:4000``; a zone such as ``[fe80::1%eth0]`` is allowed). The port is
  decimal, 0-65535; 0 means "let the kernel pick" and only makes sense for listening.
- ``unix:PATH``: the filesystem path of a Unix domain socket, taken verbatim.
- ``pipe:`` and ``nic:`` are reserved for backends that do not exist yet: they raise
  ``ValueError("... not supported yet")``. ``memory:`` is not an address at all: in-memory
  streams come in connected pairs from :func:`capsvc.transport.memory.memory_stream_pair`.

:func:`parse_address` is pure (no DNS, no filesystem access) and raises ``ValueError``
with a message naming the offending text for anything else. ``str(address)`` gives the
canonical URI back, so ``parse_address(str(a)) == a``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

__all__ = ["Address", "parse_address"]

_RESERVED = {
    "pipe": "pipe: addresses are not supported yet",
}
_KNOWN = ("tcp:HOST:PORT", "unix:PATH", "nic:DEVICE")


@dataclass(frozen=True, slots=True)
class Address:
    """A parsed transport address. ``host``/``port`` are set for tcp, ``path`` for unix."""

    scheme: str
    host: str | None = None
    port: int | None = None
    path: str | None = None

    @classmethod
    def tcp(cls, host: str, port: int) -> Address:
        """A TCP address, validated like a parsed one."""
        return parse_address(f"tcp:{_bracket(host)}:{port}")

    @classmethod
    def unix(cls, path: str) -> Address:
        """A Unix-socket address, validated like a parsed one."""
        return parse_address(f"unix:{path}")

    def __str__(self) -> str:
        if self.scheme == "tcp":
            return f"tcp:{_bracket(self.host or '')}:{self.port}"
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
    if scheme == "tcp":
        return _parse_tcp(text, rest)
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


def _parse_tcp(text: str, rest: str) -> Address:
    if rest.startswith("//"):
        raise ValueError(f"malformed address {text!r}: write tcp:HOST:PORT, without '//'")
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
            raise ValueError(f"malformed address {text!r}: expected tcp:HOST:PORT")
        if ":" in host:
            raise ValueError(
                f"malformed address {text!r}: an IPv6 host must be in brackets, "
                f"e.g. tcp:[{host}]:{port_text}"
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
    return Address("tcp", host=host, port=port)


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
