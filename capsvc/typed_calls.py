"""A typed call being prepared: ``Request``, what a generated client method builds and sends.

It lives apart from capsvc.typed (which generated code subclasses, so it stays
interpreted) because every call of a generated client makes one: compiled (capsvc/_build.py),
its construction and ``send`` cost no Python frame. The params are built by the generated
builder straight into a Call message of generated rpc.capnp codecs
(capsvc.rpc.payload.new_codec_call); ``send`` hands the call to the client's hook and
returns the results' generated promise.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from capsvc.codec.building import StructBuilder
from capsvc.rpc.hooks import CallResult, OutgoingCall
from capsvc.rpc.payload import new_codec_call

PB = TypeVar("PB", bound=StructBuilder)
PR = TypeVar("PR")

__all__ = ["Request"]


class Request(Generic[PB, PR]):
    """A call being prepared: fill ``params`` (the params' generated builder), then
    ``send()``, which returns the results' promise."""

    def __init__(
        self,
        client: Any,
        interface_id: int,
        method_id: int,
        params: type[PB],
        promise: type[PR],
    ) -> None:
        self._hook = client._hook
        self._interface = interface_id
        self._method = method_id
        self._payload, self.params = new_codec_call(params)
        self._promise: Any = promise

    def send(self) -> PR:
        result = CallResult()
        call = OutgoingCall(self._interface, self._method, self._payload, result.add_ref())
        self._hook.call(call)
        promise: PR = self._promise(result, ())
        return promise
