"""``capsvc.Server``: the base class for objects that implement an interface.

Theory of operation: a subclass names its interface (``class Adder(capsvc.Server,
interface=calc.Calculator)``) and defines one method per interface method, taking
``(self, params, results)``: ``params`` reads the call's parameters, ``results`` builds its
results. A method may instead *return* its results: a dict of result fields, or, when the
result struct has exactly one field, that field's value. Methods not defined answer
``unimplemented`` (rpc-protocol.md §4, callee step 2). Raise any ``capsvc.RpcError`` subclass
to choose the exception type the caller sees; any other exception becomes ``failed``.

A method is either ``async def`` (it runs as its own trio task, may await anything, and is
cancelled when the caller gives up) or plain ``def``: a plain method that a connection
delivers runs at once, inside the connection's reader, and its Return leaves in the same
scheduler pass: one pass and one task switch less per call. A plain method must not block.
Either way calls *begin* in the order they arrived (rpc-protocol.md §13.1): a plain method
runs inline only when no earlier call to the same object is still waiting to begin.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from capsvc._mypyc import mypyc_attr
from capsvc.rpc.hooks import Hook, LocalServerHook
from capsvc.rpc.payload import BuiltPayload, Payload, new_return_payload
from capsvc.runtime import TrioExecutor, unimplemented
from capsvc.schema import InterfaceInfo, MethodInfo, interface_info
from capsvc.structs import wrap_builder, wrap_reader

_EXECUTOR = TrioExecutor()


# Compiled by mypyc: every user implementation and generated code subclass Server, so it
# must allow interpreted subclasses.
@mypyc_attr(allow_interpreted_subclasses=True)
class Server:
    """Base for capability implementations; see the module docstring."""

    #: Not a test class, whatever a subclass is called: compiled by mypyc, Server has a
    #: ``__new__`` of its own, for which pytest would warn about every ``Test*``-named
    #: server in a test module. A ClassVar, so it is a class attribute there too.
    __test__: ClassVar[bool] = False
    _capsvc_interface: ClassVar[InterfaceInfo | None] = None
    #: Per class: (interface ID, method ID) -> whether the method may run inline.
    _capsvc_inline: ClassVar[dict[tuple[int, int], bool]] = {}
    #: The hook standing for this object while anything wants it; the hook clears this
    #: when its last owner lets go (LocalServerHook._dispose), so the link is no cycle
    #: that outlives them. Not a weak reference: the hook's class is compiled by mypyc,
    #: whose native classes support none.
    _capsvc_live_hook: LocalServerHook | None = None

    def __init_subclass__(cls, interface: Any = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if interface is not None:
            cls._capsvc_interface = interface_info(interface)
        cls._capsvc_inline = {}

    def _new_hook(self) -> Hook:
        """A new reference to the hook for this object (one hook per live object)."""
        current = self._capsvc_live_hook
        if current is not None and current.refs > 0:
            return current.add_ref()
        info = self._capsvc_interface
        hook = LocalServerHook(self, _EXECUTOR, info.streaming if info is not None else frozenset())
        self._capsvc_live_hook = hook
        return hook

    def _capsvc_forget_hook(self, hook: LocalServerHook) -> None:
        """``hook``'s last owner let go (called by the hook)."""
        if self._capsvc_live_hook is hook:
            self._capsvc_live_hook = None

    # ------------------------------------------------------------------ dispatch
    def _capsvc_method_label(self, interface_id: int, method_id: int) -> str | None:
        """``Interface.method`` (schema names) for errors and logs; None if unknown."""
        info = self._capsvc_interface
        method = info.by_key.get((interface_id, method_id)) if info is not None else None
        if info is None or method is None:
            return None
        return f"{method.interface_name or info.name}.{method.name}"

    def _runs_inline(self, interface_id: int, method_id: int) -> bool:
        """True if the method is plain ``def`` (or missing: ``unimplemented`` is immediate)."""
        key = (interface_id, method_id)
        inline = self._capsvc_inline.get(key)
        if inline is None:
            info = self._capsvc_interface
            method = info.by_key.get(key) if info is not None else None
            attribute = getattr(type(self), method.name, None) if method is not None else None
            inline = not inspect.iscoroutinefunction(attribute)
            self._capsvc_inline[key] = inline
        return inline

    def _begin(
        self, interface_id: int, method_id: int, params: Payload
    ) -> tuple[object, Callable[[object], BuiltPayload]]:
        """Call the method: returns what it returned and how to turn that into results."""
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
        returned = implementation(wrapped_params, wrapped_results)
        return returned, _Completion(method, wrapped_results, results)

    def _dispatch_inline(
        self, interface_id: int, method_id: int, params: Payload
    ) -> BuiltPayload | Awaitable[BuiltPayload]:
        """Run a plain method now. If it returned an awaitable after all (e.g. an async
        method behind a decorator), the awaitable that finishes the call is returned."""
        returned, complete = self._begin(interface_id, method_id, params)
        if inspect.isawaitable(returned):
            return _await_then(returned, complete)
        return complete(returned)

    async def _dispatch(self, interface_id: int, method_id: int, params: Payload) -> BuiltPayload:
        returned, complete = self._begin(interface_id, method_id, params)
        if inspect.isawaitable(returned):
            returned = await returned
        return complete(returned)


class _Completion:
    """Turns what a method returned into its results payload."""

    __slots__ = ("method", "payload", "results")

    def __init__(self, method: MethodInfo, results: Any, payload: BuiltPayload) -> None:
        self.method = method
        self.results = results
        self.payload = payload

    def __call__(self, returned: object) -> BuiltPayload:
        if returned is not None:
            _apply_return_value(self.results, self.method.result_schema, returned)
        return self.payload


async def _await_then(
    awaitable: Awaitable[object], complete: Callable[[object], BuiltPayload]
) -> BuiltPayload:
    return complete(await awaitable)


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
