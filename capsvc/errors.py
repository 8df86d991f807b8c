"""Every exception capsvc raises, in two families.

Theory of operation:
- ``RpcError`` and its four subclasses are *results*: what a call ended with. Each carries
  the rpc.capnp ``Exception.Type`` it travels as (rpc.capnp, struct Exception), so a server
  may raise any of them and the caller gets the same class back with the remote reason.
- ``ProtocolError`` is a *violation*: ``RemoteProtocolError`` when the peer broke rpc.capnp
  (we abort the connection with its text), ``LocalProtocolError`` when our own user misused
  the API. ``FramingError`` is the remote kind raised by the stream framing, before a
  message even exists.
"""

from __future__ import annotations

import enum


class ExceptionType(enum.IntEnum):
    """rpc.capnp ``Exception.Type``; the values are the wire enumerants."""

    FAILED = 0
    OVERLOADED = 1
    DISCONNECTED = 2
    UNIMPLEMENTED = 3


class CapsvcError(Exception):
    """Base of everything capsvc raises on purpose."""


class RpcError(CapsvcError):
    """A call (or a capability) failed. Subclasses map one-to-one to ExceptionType."""

    type: ExceptionType = ExceptionType.FAILED

    def __init__(self, reason: str = "", *, trace: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.trace = trace

    @staticmethod
    def from_type(kind: int, reason: str, trace: str = "") -> RpcError:
        """The RpcError subclass for a wire ``Exception.Type`` (unknown types are FAILED)."""
        cls = _BY_TYPE.get(kind, Failed)
        return cls(reason, trace=trace)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason!r})"


class Failed(RpcError):
    """``failed``: the method or the capability raised an error."""

    type = ExceptionType.FAILED


class Overloaded(RpcError):
    """``overloaded``: the callee is out of some resource; retry later."""

    type = ExceptionType.OVERLOADED


class Disconnected(RpcError):
    """``disconnected``: the connection carrying the call or the capability is gone."""

    type = ExceptionType.DISCONNECTED


class Unimplemented(RpcError):
    """``unimplemented``: the callee does not know the interface or the method."""

    type = ExceptionType.UNIMPLEMENTED


_BY_TYPE: dict[int, type[RpcError]] = {
    cls.type: cls for cls in (Failed, Overloaded, Disconnected, Unimplemented)
}


class ProtocolError(CapsvcError):
    """rpc.capnp or the stream framing was violated."""


class RemoteProtocolError(ProtocolError):
    """The peer violated the protocol; the connection is aborted with this reason."""


class LimitExceeded(RemoteProtocolError):
    """The peer made its connection exceed one of its ``capsvc.Limits`` (a hard limit):
    the connection is aborted with an Abort of type ``overloaded`` naming the limit."""

    def __init__(self, limit: str, value: int, what: str) -> None:
        super().__init__(f"{what}, over the limit of {value} (Limits.{limit})")
        self.limit = limit
        self.value = value


class LocalProtocolError(ProtocolError):
    """Our own code misused the engine (a bug in the caller, not in the peer)."""


class DecodeError(RemoteProtocolError):
    """A message's content is malformed (a bad or out-of-bounds pointer, a wrong kind of
    object) or exceeds a read limit (traversal, nesting): what a generated reader raises."""


class FramingError(RemoteProtocolError):
    """The byte stream is not valid Cap'n Proto framing, or exceeds a configured limit."""


class SchemaError(CapsvcError):
    """A schema could not be loaded (checked in a subprocess; see capsvc.schema)."""
