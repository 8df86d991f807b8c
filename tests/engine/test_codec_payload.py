"""Calls and Returns built by generated codecs (capsvc.rpc.payload.new_codec_call/_return).

Theory of operation: each new message starts as a copy of an empty message built once per
content type; the test builds the same message step by step with the generated rpc.capnp
codecs and compares the bytes, writes headers into the words and reads them with pycapnp,
fills two messages differently to show they share nothing, and reads the result back
with pycapnp (the reference), capabilities included.
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
        body = message.init_call()
        body.init_target()  # an empty MessageTarget, so that naming an import is word writes
        holder = body.params
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


@pytest.mark.parametrize("import_id", [0, 7, 2**32 - 1])
def test_call_headers_written_into_the_words_read_back_in_pycapnp(import_id: int) -> None:
    payload, params = new_codec_call(Echo.PingParams.Builder)
    params.msg = "hi"
    payload.write_call_header(2**32 - 2, 0xFEDC_BA98_7654_3210, 65535, import_id)
    call = wire.Message.from_segments(payload.write(lambda *_: None)).call
    assert (call.questionId, call.interfaceId, call.methodId) == (
        2**32 - 2,
        0xFEDCBA9876543210,
        65535,
    )
    assert call.target.which() == "importedCap"
    assert call.target.importedCap == import_id
    assert call.sendResultsTo.which() == "caller"
    assert call.params.content.as_struct(capnp_echo().schema.methods["ping"].param_type).msg == "hi"


@pytest.mark.parametrize("no_finish", [True, False])
def test_return_headers_written_into_the_words_read_back_in_pycapnp(no_finish: bool) -> None:
    payload, results = new_codec_return(Echo.PingResults.Builder)
    results.reply = "hello"
    payload.write_return_header(123456, no_finish)
    returned = getattr(wire.Message.from_segments(payload.write(lambda *_: None)), "return")
    assert returned.answerId == 123456
    assert returned.releaseParamCaps is False
    assert returned.noFinishNeeded is no_finish
    assert returned.which() == "results"
    assert (
        returned.results.content.as_struct(capnp_echo().schema.methods["ping"].result_type).reply
        == "hello"
    )


def capnp_echo() -> Any:
    import os

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return capnp.load(os.path.join(here, "schemas", "echo.capnp")).Echo


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
