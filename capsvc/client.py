"""Client capabilities, requests and pipelinable promises: what user code holds.

Theory of operation:
- A ``Client`` owns one reference to an engine hook plus the interface it is typed as.
  ``client.method(**fields)`` builds the params in place (inside the Call message that will
  carry them) and sends at once, returning a ``Promise``. ``client.method_request()`` gives
  the params builder for anything ``**fields`` cannot express; ``.send()`` sends it.
- A ``Promise`` is awaitable (the results, as a struct reader) and pipelinable: reading a
  field of the result type gives a Client (interface field) or a deeper pipelined field,
  usable before the call returns (rpc-protocol.md §6). Dropping the last Promise and
  pipelined Client before the return cancels the call (the question's Finish goes out).
- A ``-> stream`` method's call gives a ``StreamCall`` instead, with the flow control of
  the generated path (capsvc.streaming): its ``await`` returns once the capability's
  window has room, not when the call returns.
- References are released when the objects are closed (``close()``, ``with``) or collected;
  CPython collects them as soon as the last reference goes, so tables empty promptly.
"""

from __future__ import annotations

from typing import Any

from capsvc.checked import set_field
from capsvc.errors import Failed
from capsvc.mistakes import check_call
from capsvc.rpc.hooks import BrokenHook, CallResult, Hook, OutgoingCall, Path
from capsvc.rpc.payload import BuiltPayload, new_call_payload
from capsvc.runtime import wait_result
from capsvc.schema import FieldKind, InterfaceInfo, MethodInfo, interface_info, struct_info
from capsvc.streaming import StreamCall, send_stream_call
from capsvc.structs import _hook_of, wrap_builder, wrap_reader


class Client:
    """A capability, typed as ``interface``. Methods of the interface are attributes."""

    __slots__ = ("__weakref__", "_hook", "_info")

    def __init__(self, hook: Hook, interface: Any) -> None:
        self._hook = hook
        self._info = interface_info(interface)

    def __getattr__(self, name: str) -> Any:
        info = self._info
        method = info.by_name.get(name)
        if method is not None:
            return _BoundMethod(self, method)
        if name.endswith("_request"):
            method = info.by_name.get(name[: -len("_request")])
            if method is not None:
                return _BoundMethod(self, method).request
        raise AttributeError(f"interface {info.name} has no method {name!r}")

    @property
    def interface(self) -> InterfaceInfo:
        return self._info

    def cast_as(self, interface: Any) -> Client:
        """The same capability, typed as another interface (a new reference)."""
        return Client(self._hook.add_ref(), interface)

    def close(self) -> None:
        """Drop this reference now (the peer is told once no reference is left)."""
        hook, self._hook = self._hook, _RELEASED
        if hook is not _RELEASED:
            hook.release()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        hook = getattr(self, "_hook", _RELEASED)
        if hook is not _RELEASED:
            self._hook = _RELEASED
            hook.release()

    def __repr__(self) -> str:
        return f"<capsvc.Client {self._info.name} {type(self._hook.shortest()).__name__}>"


_RELEASED: Hook = BrokenHook(Failed("this capability reference was closed"))
_RELEASED.refs = 1 << 60  # never disposed


def capability_client(hook: Hook, interface: Any) -> Any:
    """A client of ``hook``: typed as ``interface``, or, for a ``Capability`` field (no
    interface), a capsvc.typed.Client, which ``cast_as`` retypes (to a load_schema
    interface or a generated one)."""
    if interface is None:
        from capsvc.typed import Client as AnyClient

        return AnyClient(hook)
    return Client(hook, interface)


def null_client(interface: Any) -> Client:
    """A client for a null capability (calls on it fail)."""
    from capsvc.rpc.hooks import null_hook

    return Client(null_hook(), interface)


class _BoundMethod:
    __slots__ = ("_client", "_method")

    def __init__(self, client: Client, method: MethodInfo) -> None:
        self._client = client
        self._method = method

    def __call__(self, *args: Any, **fields: Any) -> Promise | StreamCall:
        method = self._method
        if args or fields:
            # Mistakes are TypeErrors naming the method and its parameters (not pycapnp's
            # C++ text); positional arguments are refused, as on the generated path.
            label = f"{self._client._info.name}.{method.name}"
            check_call(label, method.param_schema, args, fields)
        request = self.request()
        params, schema = request.params, method.param_schema
        for name, value in fields.items():
            set_field(params, schema, name, value)
        return request.send()

    def request(self) -> Request:
        return Request(self._client, self._method)


class Request:
    """A call being prepared: fill ``params`` (or set attributes directly), then ``send()``."""

    __slots__ = ("_client", "_method", "_payload", "params")

    def __init__(self, client: Client, method: MethodInfo) -> None:
        payload = new_call_payload()
        builder = payload.payload_builder.content.as_struct(method.param_schema)
        object.__setattr__(self, "_client", client)
        object.__setattr__(self, "_method", method)
        object.__setattr__(self, "_payload", payload)
        object.__setattr__(self, "params", wrap_builder(builder, method.param_schema, payload))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.params, name)

    def __setattr__(self, name: str, value: Any) -> None:
        set_field(self.params, self._method.param_schema, name, value)

    def init(self, name: str, *args: Any) -> Any:
        return self.params.init(name, *args)

    def send(self) -> Promise | StreamCall:
        """Send the call: its ``Promise``, or for a ``-> stream`` method a ``StreamCall``."""
        method = self._method
        client = self._client
        if method.streaming:
            payload = self._payload
            # The window counts whole Call messages, framed (C++: the message's size).
            size = payload.message.total_size.word_count * 8 + 8
            return send_stream_call(
                client._hook, method.interface_id, method.method_id, payload, size
            )
        result = CallResult()
        call = OutgoingCall(method.interface_id, method.method_id, self._payload, result.add_ref())
        client._hook.call(call)
        return Promise(result, method.result_schema)


def send_payload(hook: Hook, method: MethodInfo, payload: BuiltPayload) -> Promise:
    """Send a prepared params payload to ``hook`` (used by generated stubs and the CLI)."""
    result = CallResult()
    hook.call(OutgoingCall(method.interface_id, method.method_id, payload, result.add_ref()))
    return Promise(result, method.result_schema)


class Promise:
    """The future results of a call: ``await`` it, or pipeline on its fields."""

    __slots__ = ("__weakref__", "_path", "_result", "_schema")

    def __init__(self, result: CallResult, schema: Any, path: Path = ()) -> None:
        self._result = result
        self._schema = schema
        self._path = path

    def __await__(self) -> Any:
        return self._wait().__await__()

    async def _wait(self) -> Any:
        result = self._result
        await wait_result(result, on_cancel=self.cancel)
        payload = result.payload
        reader = payload.content(self._schema) if not self._path else None
        if reader is None:
            raise TypeError("await the call's promise, not a pipelined struct field")
        return wrap_reader(reader, self._schema, payload, keep=_ResultRef(result.add_ref()))

    def __getattr__(self, name: str) -> Any:
        field = struct_info(self._schema).fields.get(name)
        if field is None:
            raise AttributeError(
                f"{name!r} cannot be pipelined: only fields that lead to capabilities can"
            )
        if field.kind is FieldKind.INTERFACE:
            return capability_client(
                self._result.pipeline(self._path + (field.slot,)), field.target
            )
        if field.kind is FieldKind.GROUP:
            return Promise(self._result.add_ref(), field.target, self._path)
        if field.kind is FieldKind.STRUCT:
            return Promise(self._result.add_ref(), field.target, self._path + (field.slot,))
        raise AttributeError(f"{name!r} is a list: lists cannot be pipelined (rpc.capnp §6)")

    def cancel(self) -> None:
        """Give up on the results (sends the Finish if nothing else needs the question)."""
        result, self._result = self._result, _DONE
        if result is not _DONE:
            result.release()

    def __del__(self) -> None:
        result = getattr(self, "_result", _DONE)
        if result is not _DONE:
            self._result = _DONE
            result.release()


_DONE = CallResult()
_DONE.refs = 1 << 60
_DONE.set_error(Failed("this promise was cancelled"))


class _ResultRef:
    """Keeps a call's results (and their capabilities) alive while a reader of them lives."""

    __slots__ = ("_result",)

    def __init__(self, result: CallResult) -> None:
        self._result = result

    def __del__(self) -> None:
        self._result.release()


def capability(value: Any, interface: Any) -> Client:
    """A Client for a Server object (or another Client), typed as ``interface``."""
    hook = _hook_of(value)
    if hook is None:
        return null_client(interface)
    return Client(hook, interface)
