"""Calls and Returns built by generated codecs (capsvc.rpc.payload.new_codec_call/_return).

Theory of operation: each new message starts as a copy of an empty message built once per
content type; the test builds the same message step by step with the generated rpc.capnp
codecs and compares the bytes, fills two messages differently to show they share nothing,
and reads the result back with pycapnp (the reference), capabilities included.
"""

from __future__ import annotations

from typing import Any

import capnp
import pytest

from capsvc.codec.building import init_struct
from capsvc.generated.bench_echo_capnp import BenchEcho
from capsvc.generated.calculator_capnp import Calculator
from capsvc.generated.echo_capnp import Echo
from capsvc.rpc import rpc_capnp, wire
from capsvc.rpc.hooks import BrokenHook, Hook
from capsvc.rpc.payload import new_codec_call, new_codec_return


def step_by_step(content: type, call: bool) -> bytes:
    message = rpc_capnp.Message.new_message()
    if call:
        holder = message.init_call().params
    else:
        holder = message.init_return().results
    init_struct(holder, holder._ptr, content)
    return bytes(message._b.buf)


CONTENTS = [
    Echo.PingParams.Builder,
    Echo.PingResults.Builder,
    BenchEcho.PingCapResults.Builder,
    Calculator.EvaluateParams.Builder,
    Calculator.Value.ReadParams.Builder,  # an empty struct
]


@pytest.mark.parametrize("content", CONTENTS)
@pytest.mark.parametrize("call", [True, False])
def test_an_empty_message_is_what_the_codecs_build(content: type, call: bool) -> None:
    new = new_codec_call if call else new_codec_return
    for _ in range(2):  # the first builds the template, the second copies it
        payload, built = new(content)
        assert type(built) is content
        assert bytes(payload.builder.buf) == step_by_step(content, call)
        assert payload.caps == []
        assert payload.caps is payload.builder.caps
        path = wire.CALL_CONTENT_PATH if call else wire.RETURN_CONTENT_PATH
        assert payload.content_path == path


def test_messages_from_one_template_share_nothing() -> None:
    first, one = new_codec_call(Echo.PingParams.Builder)
    second, two = new_codec_call(Echo.PingParams.Builder)
    one.msg = "first"
    first.header().questionId = 1
    two.msg = "second, longer"
    second.header().questionId = 2
    hook: Hook = BrokenHook(RuntimeError("only a table entry"))
    first.caps.append(hook)
    assert second.caps == []
    assert second.builder.caps is not first.builder.caps
    a, b = (wire.Message.from_segments(p.write(lambda *_: None)) for p in (first, second))
    assert (a.call.questionId, b.call.questionId) == (1, 2)
    assert len(a.call.params.capTable) == 1
    assert len(b.call.params.capTable) == 0
    params = _echo().Echo.schema.methods["ping"].param_type
    assert a.call.params.content.as_struct(params).msg == "first"
    assert b.call.params.content.as_struct(params).msg == "second, longer"
    hook.release()


def _echo() -> Any:
    from capsvc.demo import schema_path

    return capnp.load(str(schema_path("echo.capnp")))
