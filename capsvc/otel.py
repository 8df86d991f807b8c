"""OpenTelemetry tracing: a span per call on both sides (``pip install capsvc[otel]``).

Theory of operation: :func:`instrument` adds an instrumentation (capsvc.observe) that
gives every connection opened afterwards a call observer with a tracer from
opentelemetry-api. A call we make is a CLIENT span, child of the span current where the
call was made, ended when its results or error arrive. A call the peer makes is a SERVER
span, current while the method runs (the runtime enters it in the method's task, so spans
and calls the method makes are its children), ended when the method's results or error
are ready. Both are named ``Interface/method`` (schema names) and carry the RPC semantic
conventions' attributes; a call that fails sets the span's status to ERROR with the
exception's type and reason.

Cap'n Proto has no per-call headers (capnproto#432), so a trace crosses the wire only
where the application's schema carries it: when a method's params struct has a Text field
``traceparent``, the SERVER span's parent is the W3C trace context read from it, and the
caller fills it with :func:`traceparent` (the current span's context; it is the caller's
span, so the server's span is its child, beside the CLIENT span). Without that field the
SERVER span starts a trace of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as error:  # pragma: no cover - depends on what is installed
    raise ImportError("capsvc.otel needs opentelemetry-api: pip install 'capsvc[otel]'") from error

from capsvc import names
from capsvc.observe import (
    ConnectionInfo,
    add_instrumentation,
    exception_type,
    outcome,
    remove_instrumentation,
)
from capsvc.rpc.hooks import CallResult, Canceled, ObservedCall
from capsvc.rpc.payload import Payload

#: The params field that carries a W3C trace context (see the module docstring).
TRACEPARENT_FIELD = "traceparent"
_PROPAGATOR = TraceContextTextMapPropagator()
_INSTRUMENTED: list[_Instrumentation] = []


def instrument(tracer_provider: trace.TracerProvider | None = None) -> None:
    """Trace every connection opened from now on (with the global tracer provider unless
    one is given). Calling it again replaces the provider."""
    uninstrument()
    instrumentation = _Instrumentation(trace.get_tracer("capsvc", tracer_provider=tracer_provider))
    _INSTRUMENTED.append(instrumentation)
    add_instrumentation(instrumentation)


def uninstrument() -> None:
    """Stop tracing connections opened from now on."""
    while _INSTRUMENTED:
        remove_instrumentation(_INSTRUMENTED.pop())


def traceparent() -> str:
    """The current span's W3C ``traceparent`` ("" when no span is current): what a caller
    puts in a params field named ``traceparent`` so the server's span joins its trace."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


class _Instrumentation:
    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def __call__(self, connection: ConnectionInfo) -> _Tracing:
        return _Tracing(self.tracer, connection)


class _Tracing:
    """The call observer of one connection (capsvc.rpc.hooks.CallObserver)."""

    __slots__ = ("attributes", "connection", "tracer")

    def __init__(self, tracer: trace.Tracer, connection: ConnectionInfo) -> None:
        self.tracer = tracer
        self.connection = connection
        self.attributes = _peer_attributes(connection.peer)

    def received(self, interface_id: int, method_id: int, params: Payload) -> ObservedCall:
        service, method = _names(interface_id, method_id)
        parent = None
        carried = _traceparent_of(interface_id, method_id, params)
        if carried:
            parent = _PROPAGATOR.extract({"traceparent": carried})
        span = self.tracer.start_span(
            f"{service}/{method}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=self._attributes(service, method),
        )
        return _SpanEnd(span, self.connection)

    def sent(self, interface_id: int, method_id: int) -> Callable[[CallResult], None]:
        service, method = _names(interface_id, method_id)
        span = self.tracer.start_span(
            f"{service}/{method}",
            kind=SpanKind.CLIENT,
            attributes=self._attributes(service, method),
        )
        return _SpanEnd(span, self.connection)

    def _attributes(self, service: str, method: str) -> dict[str, Any]:
        return {
            "rpc.system": "capnproto",
            "rpc.service": service,
            "rpc.method": method,
            **self.attributes,
        }


class _SpanEnd:
    """Ends one call's span when its result settles; makes it current around a method."""

    __slots__ = ("connection", "span")

    def __init__(self, span: trace.Span, connection: ConnectionInfo) -> None:
        self.span = span
        self.connection = connection

    def enter(self) -> object:
        return otel_context.attach(trace.set_span_in_context(self.span))

    def exit(self, token: object) -> None:
        otel_context.detach(token)  # type: ignore[arg-type]

    def __call__(self, result: CallResult) -> None:
        error = result.error
        span = self.span
        if error is not None:
            ended = outcome(result, self.connection)
            kind = ended if isinstance(error, Canceled) else exception_type(error)
            span.set_attribute("rpc.capnproto.exception_type", kind)
            span.set_status(Status(StatusCode.ERROR, ended))
        span.end()


def _names(interface_id: int, method_id: int) -> tuple[str, str]:
    """(interface, method) by schema names, or the numbers for an unknown one."""
    label = names.schema_method_name(interface_id, method_id)
    if label is None:
        return f"{interface_id:#x}", str(method_id)
    service, _, method = label.rpartition(".")
    return service, method


def _peer_attributes(peer: str) -> dict[str, Any]:
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        return {"network.peer.address": peer}
    return {"network.peer.address": host.strip("[]"), "network.peer.port": int(port)}


#: (interface ID, method ordinal) -> how to read its params' traceparent, or None.
_READERS: dict[tuple[int, int], Callable[[Payload], object] | None] = {}


def _traceparent_of(interface_id: int, method_id: int, params: Payload) -> str:
    key = (interface_id, method_id)
    if key not in _READERS:
        _READERS[key] = names.params_reader(interface_id, method_id, TRACEPARENT_FIELD)
    read = _READERS[key]
    if read is None:
        return ""
    try:
        value = getattr(read(params), TRACEPARENT_FIELD)
    except Exception:  # a hostile or mistyped field must not fail the call over tracing
        return ""
    return value if isinstance(value, str) else ""
