"""``capsvc.Server``: the base class for objects that implement an interface.

Theory of operation: a subclass names its interface (``class Adder(capsvc.Server,
interface=calc.Calculator)``) and defines one ``async def`` per method, taking
``(self, params, results)``: ``params`` reads the call's parameters, ``results`` builds its
results. A method may instead *return* its results: a dict of result fields, or, when the
result struct has exactly one field, that field's value. Methods not defined answer
``unimplemented`` (rpc-protocol.md §4, callee step 2). Raise any ``capsvc.RpcError`` subclass
to choose the exception type the caller sees; any other exception becomes ``failed``.
"""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

from capsvc.rpc.hooks import Hook, LocalServerHook
from capsvc.rpc.payload import BuiltPayload, Payload, new_return_payload
from capsvc.runtime import TrioExecutor, unimplemented
from capsvc.schema import InterfaceInfo, interface_info
from capsvc.structs import wrap_builder, wrap_reader

_EXECUTOR = TrioExecutor()


class Server:
    """Base for capability implementations; see the module docstring."""

    _capsvc_interface: ClassVar[InterfaceInfo | None] = None
    _capsvc_hook: weakref.ref[Hook] | None = None

    def __init_subclass__(cls, interface: Any = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if interface is not None:
            cls._capsvc_interface = interface_info(interface)

    def _new_hook(self) -> Hook:
        """A new reference to the hook for this object (one hook per live object)."""
        current = self._capsvc_hook() if self._capsvc_hook is not None else None
        if current is not None and current.refs > 0:
            return current.add_ref()
        hook = LocalServerHook(self, _EXECUTOR)
        self._capsvc_hook = weakref.ref(hook)
        return hook

    async def _dispatch(self, interface_id: int, method_id: int, params: Payload) -> BuiltPayload:
        info = self._capsvc_interface
        method = info.by_key.get((interface_id, method_id)) if info is not None else None
        implementation = getattr(self, method.name, None) if method is not None else None
        if method is None or implementation is None:
            raise unimplemented(self, interface_id, method_id)
        results = new_return_payload()
        builder = results.payload_builder.content.as_struct(method.result_schema)
        wrapped_results = wrap_builder(builder, method.result_schema, results)
        wrapped_params = wrap_reader(
            params.content(method.param_schema), method.param_schema, params
        )
        returned = await implementation(wrapped_params, wrapped_results)
        if returned is not None:
            _apply_return_value(wrapped_results, method.result_schema, returned)
        return results


def _apply_return_value(results: Any, schema: Any, value: Any) -> None:
    if isinstance(value, dict):
        for name, item in value.items():
            setattr(results, name, item)
        return
    names = list(schema.fieldnames)
    if len(names) != 1:
        raise TypeError(
            f"a method whose results have {len(names)} fields must fill `results` or return a dict"
        )
    setattr(results, names[0], value)
