"""The runtime of generated interfaces (``capsvc gen``): typed clients, requests, promises
and pipelines, and the base of typed servers.

Theory of operation:
- A generated ``Iface.Client`` holds one reference to an engine hook, as ``capsvc.Client``
  does; each schema method is a method with keyword-only parameters typed from the params
  struct. A call builds its params with the generated builder straight into a Call message
  built by generated rpc.capnp codecs (capsvc.rpc.payload.CodecPayload), so the call costs
  no pycapnp object; ``*_request()`` gives that builder for params keywords cannot express.
- A call returns the results struct's generated ``Promise``: awaiting it gives the results'
  generated reader (over the received segments, capabilities as typed clients); its
  properties are the results' pipelined fields, usable before the results arrive
  (rpc-protocol.md §6): an interface field gives a typed client of the pipelined
  capability, a struct or group field a deeper ``Pipeline``.
- A generated ``Iface.Server`` is a ``Server`` with one method per schema method, taking
  the params' generated reader and the results' generated builder. A method may be ``def``
  (it runs inline when the connection delivers the call, as with ``capsvc.Server``) or
  ``async def``; a method the subclass does not override answers ``unimplemented``.
  Both kinds of server run through the engine's LocalServerHook, so typed and dynamic
  clients and servers mix freely, locally and across connections.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar, overload

from capsvc.codec.building import StructBuilder
from capsvc.codec.pipeline import StructPipeline
from capsvc.errors import Failed
from capsvc.rpc.hooks import BrokenHook, Hook, LocalServerHook
from capsvc.rpc.hooks import null_hook as _null_hook
from capsvc.rpc.payload import Payload
from capsvc.runtime import TrioExecutor, typed_dispatch
from capsvc.streaming import STREAM_RESULT_ID
from capsvc.streaming import StreamCall as StreamCall
from capsvc.streaming import StreamRequest as StreamRequest
from capsvc.typed_calls import Request as Request

C = TypeVar("C", bound="Client")
C_co = TypeVar("C_co", bound="Client", covariant=True)
F = TypeVar("F", bound=Callable[..., Any])
PB = TypeVar("PB", bound=StructBuilder)
PR = TypeVar("PR", bound=StructPipeline)

_EXECUTOR = TrioExecutor()


class Interface(Generic[C_co]):
    """Base of generated interface classes (``k.Shop``): it tells the type checker which
    typed client ``conn.bootstrap(k.Shop)`` and ``client.cast_as(k.Shop)`` give (its
    nested ``Client`` class)."""


class Client:
    """A capability typed as a generated interface. Close it (or drop it) to release."""

    __slots__ = ("__weakref__", "_hook")

    #: The interface's schema ID and name (set by each generated Client).
    _INTERFACE_ID: ClassVar[int] = 0
    _INTERFACE_NAME: ClassVar[str] = ""

    def __init__(self, hook: Hook) -> None:
        self._hook = hook

    @classmethod
    def _from_table(cls: type[C], caps: Sequence[Any], index: int | None) -> C:
        """The client for entry ``index`` of a message's cap table (None: a null pointer)."""
        if index is None:
            return cls(_null_hook())
        if index >= len(caps) or caps[index] is None:
            return cls(BrokenHook(Failed(f"capability index {index} is outside the capTable")))
        return cls(caps[index].add_ref())

    def _capsvc_hook(self) -> Hook:
        """A new reference to the engine hook (what a message carrying this takes)."""
        return self._hook.add_ref()

    @overload
    def cast_as(self, cls: type[Interface[C]]) -> C: ...
    @overload
    def cast_as(self, cls: type[C]) -> C: ...

    def cast_as(self, cls: Any) -> Any:
        """The same capability, typed as another interface (a new reference): give the
        generated interface (``k.Base``) or its client class (``k.Base.Client``), or an
        interface of ``capsvc.load_schema`` (a dynamic client)."""
        if isinstance(cls, type) and issubclass(cls, Client):
            return cls(self._hook.add_ref())
        client_class = getattr(cls, "Client", None)  # a generated interface's
        if client_class is None:  # pycapnp's interface module (load_schema): dynamic
            from capsvc.client import Client as DynamicClient

            return DynamicClient(self._hook.add_ref(), cls)
        return client_class(self._hook.add_ref())

    #: pycapnp's name for it, on a Capability or AnyPointer field.
    as_interface = cast_as

    def close(self) -> None:
        """Drop this reference now (the peer is told once no reference is left)."""
        hook, self._hook = self._hook, _RELEASED
        if hook is not _RELEASED:
            hook.release()

    def __enter__(self: C) -> C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        hook = getattr(self, "_hook", _RELEASED)
        if hook is not _RELEASED:
            self._hook = _RELEASED
            hook.release()

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} {type(self._hook.shortest()).__name__}>"


_RELEASED: Hook = BrokenHook(Failed("this capability reference was closed"))
_RELEASED.refs = 1 << 60  # never disposed


class Server:
    """Base of generated ``Iface.Server`` classes; see the module docstring."""

    #: (interface ID, method ordinal) -> (method name, params struct, results struct),
    #: for the interface and every one it extends (set by each generated Server).
    _METHODS: ClassVar[dict[tuple[int, int], tuple[str, Any, Any]]] = {}
    #: The schema name of the interface (set by each generated Server).
    _INTERFACE_NAME: ClassVar[str] = ""
    #: The hook standing for this object while anything wants it; the hook clears this
    #: when its last owner lets go (LocalServerHook._dispose), so the link is no cycle
    #: that outlives them. Not a weak reference: the hook's class is compiled by mypyc,
    #: whose native classes support none.
    _capsvc_live_hook: LocalServerHook | None = None
    _capsvc_inline: ClassVar[dict[tuple[int, int], bool]] = {}
    #: (interface ID, method ordinal) -> (method name, params, results), or None when
    #: the class does not implement it: found once per class, not per call.
    _capsvc_found: ClassVar[dict[tuple[int, int], tuple[str, Any, Any] | None]] = {}
    #: capsvc.runtime dispatches this class's inline calls with ``typed_dispatch`` itself
    #: (what ``_dispatch_inline`` below calls), without that Python frame.
    _capsvc_typed: ClassVar[bool] = True
    _capsvc_streaming: ClassVar[frozenset[tuple[int, int]] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._capsvc_inline = {}
        cls._capsvc_found = {}

    def _new_hook(self) -> Hook:
        """A new reference to the hook for this object (one hook per live object)."""
        current = self._capsvc_live_hook
        if current is not None and current.refs > 0:
            return current.add_ref()
        hook = LocalServerHook(self, _EXECUTOR, type(self)._capsvc_streaming_methods())
        self._capsvc_live_hook = hook
        return hook

    @classmethod
    def _capsvc_streaming_methods(cls) -> frozenset[tuple[int, int]]:
        """The class's ``-> stream`` methods: those whose results are stream.capnp's
        StreamResult, as C++ tells them (found once per class; ``_METHODS`` is set after
        the generated class is made, so not in ``__init_subclass__``)."""
        found = cls.__dict__.get("_capsvc_streaming")
        if found is None:
            found = frozenset(
                key
                for key, (_, _, results) in cls._METHODS.items()
                if getattr(results, "_ID", None) == STREAM_RESULT_ID
            )
            cls._capsvc_streaming = found
        return found

    def _capsvc_forget_hook(self, hook: LocalServerHook) -> None:
        """``hook``'s last owner let go (called by the hook)."""
        if self._capsvc_live_hook is hook:
            self._capsvc_live_hook = None

    def _capsvc_hook(self) -> Hook:
        return self._new_hook()

    # ------------------------------------------------------------------ dispatch
    def _implementation(self, interface_id: int, method_id: int) -> tuple[Any, Any, Any] | None:
        key = (interface_id, method_id)
        found = self._capsvc_found
        if key in found:
            entry = found[key]
        else:
            entry = found[key] = self._find(key)
        if entry is None:
            return None
        name, params, results = entry
        return getattr(self, name), params, results

    @classmethod
    def _find(cls, key: tuple[int, int]) -> tuple[str, Any, Any] | None:
        entry = cls._METHODS.get(key)
        if entry is None:
            return None
        method = getattr(cls, entry[0], None)
        if method is None or getattr(method, "_capsvc_unimplemented", False):
            return None
        return entry

    def _capsvc_method_label(self, interface_id: int, method_id: int) -> str | None:
        """``Interface.method`` (schema names) for errors and logs; None if unknown."""
        entry = self._METHODS.get((interface_id, method_id))
        if entry is None:
            return None
        return f"{entry[1].__qualname__.rpartition('.')[0]}.{entry[0]}"

    def _runs_inline(self, interface_id: int, method_id: int) -> bool:
        key = (interface_id, method_id)
        inline = self._capsvc_inline.get(key)
        if inline is None:
            found = self._implementation(interface_id, method_id)
            inline = found is None or not inspect.iscoroutinefunction(found[0])
            self._capsvc_inline[key] = inline
        return inline

    def _dispatch_inline(
        self, interface_id: int, method_id: int, params: Payload
    ) -> Payload | Awaitable[Payload]:
        return typed_dispatch(self, interface_id, method_id, params)

    async def _dispatch(self, interface_id: int, method_id: int, params: Payload) -> Payload:
        outcome = typed_dispatch(self, interface_id, method_id, params)
        return outcome if isinstance(outcome, Payload) else await outcome


def unknown_parameters(
    method: str,
    unknown: Mapping[str, object],
    known: Sequence[str],
    request: str = "",
    others: Sequence[str] = (),
) -> TypeError:
    """The error for keywords a generated client method has no parameter for; ``others``:
    the params' fields keywords cannot set, which its ``request`` form (``*_request()``)
    sets."""
    names = ", ".join(sorted(unknown))
    what = f"{method}() has no parameter {names}; its parameters are {', '.join(known) or 'none'}"
    if others:
        what += f" ({', '.join(others)}: set them on {request}().params, then send())"
    return TypeError(what)


def nest(owner: type, name: str, cls: type) -> None:
    """Binds ``cls``, a generated class created at module level (``_Nested_Outer_Derived``:
    a nested interface whose bases the classes enclosing it could not see yet), as
    ``owner.name``, and renames it and what it defines after its schema path, so that
    reprs, tracebacks and error messages say ``Outer.Derived.Client.ping``."""
    setattr(owner, name, cls)
    _requalify(cls, cls.__qualname__, f"{owner.__qualname__}.{name}")


def _requalify(cls: type, old: str, new: str) -> None:
    cls.__qualname__ = new + cls.__qualname__[len(old) :]
    cls.__name__ = cls.__qualname__.rpartition(".")[2]
    for value in list(vars(cls).values()):
        if isinstance(value, property):
            found: list[Any] = [value.fget, value.fset, value.fdel]
        elif isinstance(value, staticmethod | classmethod):
            found = [value.__func__]
        else:
            found = [value]
        for item in found:
            qualname = getattr(item, "__qualname__", None)
            if not isinstance(qualname, str) or not qualname.startswith(old + "."):
                continue  # not defined in the class (or already renamed)
            if isinstance(item, type):
                _requalify(item, old, new)
            elif inspect.isfunction(item):
                item.__qualname__ = new + qualname[len(old) :]


def unimplemented(method: F) -> F:
    """Marks a generated server base's method as not implemented (until overridden); the
    type stays the method's, so an override with the wrong signature is a mypy error."""
    method._capsvc_unimplemented = True  # type: ignore[attr-defined]
    return method
