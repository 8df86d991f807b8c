"""OpenTelemetry spans (capsvc.otel, issue 12 point 2), with the SDK's in-memory exporter.

Two services, each served on loopback TCP: a caller's span calls Front.hello, whose method
calls Back.greet; both params carry ``traceparent`` (tests/schemas/traced.capnp). The spans
must form one trace: CLIENT and SERVER spans on each hop, the SERVER span of Front current
inside its method (so the hop to Back is its child), names and attributes by schema names,
and a failing call's spans marked ERROR with the exception's type.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import capsvc
import capsvc.otel
from tests.support.tester import ROOT

traced = capsvc.load_schema(os.path.join(ROOT, "tests", "schemas", "traced.capnp"))


class Back(capsvc.Server, interface=traced.Back):
    def greet(self, params: Any, results: Any) -> None:
        results.greeting = f"hello, {params.name}"

    def fail(self, params: Any, results: Any) -> None:
        raise capsvc.Overloaded("back is busy")


class Front(capsvc.Server, interface=traced.Front):
    def __init__(self, back: Any) -> None:
        self.back = back

    async def hello(self, params: Any, results: Any) -> None:
        reply = await self.back.greet(name=params.name, traceparent=capsvc.otel.traceparent())
        results.greeting = reply.greeting


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    capsvc.otel.instrument(provider)
    yield exporter
    capsvc.otel.uninstrument()
    provider.shutdown()


def by_kind(spans: tuple[ReadableSpan, ...], name: str, kind: SpanKind) -> ReadableSpan:
    (found,) = [span for span in spans if span.name == name and span.kind is kind]
    return found


async def test_spans_on_both_sides_form_one_trace(exporter: InMemorySpanExporter) -> None:
    tracer = TracerProvider().get_tracer("test")  # the caller's own span: not exported
    async with trio.open_nursery() as nursery:
        back_address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", Back())
        async with capsvc.connect(back_address) as to_back:
            front = Front(to_back.bootstrap(traced.Back))
            front_address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", front)
            async with capsvc.connect(front_address) as to_front:
                with tracer.start_as_current_span("the caller") as caller:
                    reply = await to_front.bootstrap(traced.Front).hello(
                        name="otel", traceparent=capsvc.otel.traceparent()
                    )
                assert reply.greeting == "hello, otel"
        nursery.cancel_scope.cancel()

    spans = exporter.get_finished_spans()
    assert sorted((span.name, span.kind.name) for span in spans) == [
        ("Back/greet", "CLIENT"),
        ("Back/greet", "SERVER"),
        ("Front/hello", "CLIENT"),
        ("Front/hello", "SERVER"),
    ]
    caller_context = caller.get_span_context()
    front_client = by_kind(spans, "Front/hello", SpanKind.CLIENT)
    front_server = by_kind(spans, "Front/hello", SpanKind.SERVER)
    back_client = by_kind(spans, "Back/greet", SpanKind.CLIENT)
    back_server = by_kind(spans, "Back/greet", SpanKind.SERVER)
    assert {span.context.trace_id for span in spans} == {caller_context.trace_id}
    assert front_client.parent is not None
    assert front_server.parent is not None
    assert front_client.parent.span_id == caller_context.span_id  # where the call was made
    assert front_server.parent.span_id == caller_context.span_id  # from the traceparent field
    # Front's SERVER span is current in its method: the hop to Back is its child.
    assert back_client.parent is not None
    assert back_server.parent is not None
    assert back_client.parent.span_id == front_server.context.span_id
    assert back_server.parent.span_id == front_server.context.span_id
    attributes = front_server.attributes or {}
    assert attributes["rpc.system"] == "capnproto"
    assert attributes["rpc.service"] == "Front"
    assert attributes["rpc.method"] == "hello"
    assert attributes["network.peer.address"] == "127.0.0.1"
    assert all(span.status.status_code is StatusCode.UNSET for span in spans)


async def test_a_failing_call_marks_both_spans(exporter: InMemorySpanExporter) -> None:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", Back())
        async with capsvc.connect(address) as conn:
            with pytest.raises(capsvc.Overloaded):
                await conn.bootstrap(traced.Back).fail()
        nursery.cancel_scope.cancel()
    spans = exporter.get_finished_spans()
    for kind in (SpanKind.CLIENT, SpanKind.SERVER):
        span = by_kind(spans, "Back/fail", kind)
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "overloaded: back is busy"
        assert (span.attributes or {})["rpc.capnproto.exception_type"] == "overloaded"
    # Without a traceparent field the SERVER span starts a trace of its own.
    assert by_kind(spans, "Back/fail", SpanKind.SERVER).parent is None


async def test_nothing_is_observed_unless_instrumented() -> None:
    async with trio.open_nursery() as nursery:
        address = await nursery.start(capsvc.serve, "tcp:127.0.0.1:0", Back())
        async with capsvc.connect(address) as conn:
            assert conn.session.observer is None  # one `is None` test per call, no more
            await conn.bootstrap(traced.Back).greet(name="x")
        nursery.cancel_scope.cancel()
