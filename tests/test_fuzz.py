"""Fuzzing the input path (issue 11): framing decoder and engine, with Hypothesis.

Two properties, over inputs a hostile peer chooses:

- the framing decoder, fed arbitrary bytes split arbitrarily, only ever returns messages
  or raises its typed ``FramingError``;
- the engine, fed arbitrary bytes as messages, or valid rpc.capnp messages of every kind
  (capability descriptors of every kind, transforms, IDs up to 2**32-1) in arbitrary
  order and with bytes mutated, never raises out of ``receive`` (a violation becomes an
  Abort with a reason), keeps every table within its limit while the connection is open,
  and holds nothing once it is closed.

The same target drives the coverage-guided runner (tests/fuzz/atheris_main.py,
``./dev fuzz``); the corpus it keeps (tests/fuzz/corpus/) is replayed here.
``CAPSVC_FUZZ_EXAMPLES`` raises the example count for long local runs.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capsvc.errors import FramingError
from capsvc.framing import FrameDecoder, encode_message
from capsvc.rpc import wire
from capsvc.rpc.session import RpcSession
from tests.engine.pair import COUNTER_ID, TESTER_ID
from tests.fuzz.target import (
    LIMITS,
    SafeExecutor,
    finish,
    new_session,
    one_input,
    run_stream,
    seeds,
)

EXAMPLES = int(os.environ.get("CAPSVC_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ids = st.one_of(st.integers(0, 7), st.sampled_from([2**31 - 1, 2**31, 2**32 - 1]))


# ---------------------------------------------------------------------------- framing


@FUZZ
@given(st.binary(max_size=4096), st.lists(st.integers(1, 64), max_size=32))
def test_framing_decoder_only_raises_framing_errors(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(LIMITS)
    position = 0
    try:
        for size in [*cuts, len(data)]:
            decoder.feed(data[position : position + size])
            position += size
            while (segments := decoder.next_message()) is not None:
                total = sum(len(segment) for segment in segments)
                assert total <= LIMITS.max_message_words * 8
                assert len(segments) <= LIMITS.max_segments
        decoder.feed_eof()
        decoder.next_message()
    except FramingError:
        pass
    assert decoder.buffered <= len(data)


# ---------------------------------------------------------------------------- engine


def feed(session: RpcSession, executor: SafeExecutor, frames: list[bytes]) -> None:
    for frame in frames:
        decoder = FrameDecoder(LIMITS)
        decoder.feed(frame)
        run_stream(session, executor, decoder)
    finish(session, executor)


@FUZZ
@given(st.lists(st.binary(min_size=8, max_size=512), max_size=24))
def test_engine_survives_arbitrary_messages(bodies: list[bytes]) -> None:
    session, executor = new_session()
    frames = []
    for body in bodies:
        body = body[: len(body) // 8 * 8]
        frames.append(encode_message([body]))
    feed(session, executor, frames)


# Valid messages of every kind, built with pycapnp.


@st.composite
def transforms(draw: Any, builder: Any) -> None:
    ops = draw(st.lists(st.one_of(st.none(), st.integers(0, 5)), max_size=3))
    transform = builder.init("transform", len(ops))
    for index, op in enumerate(ops):
        if op is None:
            transform[index].noop = None
        else:
            transform[index].getPointerField = op


def promised(draw: Any, builder: Any) -> None:
    builder.questionId = draw(ids)
    draw(transforms(builder))


def descriptor(draw: Any, desc: Any) -> None:
    kind = draw(
        st.sampled_from(
            [
                "none",
                "senderHosted",
                "senderPromise",
                "receiverHosted",
                "receiverAnswer",
                "thirdPartyHosted",
            ]
        )
    )
    if kind == "none":
        desc.none = None
    elif kind == "receiverAnswer":
        promised(draw, desc.init("receiverAnswer"))
    elif kind == "thirdPartyHosted":
        desc.init("thirdPartyHosted").vineId = draw(ids)
    else:
        setattr(desc, kind, draw(ids))


def target(draw: Any, builder: Any) -> None:
    if draw(st.booleans()):
        builder.importedCap = draw(ids)
    else:
        promised(draw, builder.init("promisedAnswer"))


def payload(draw: Any, builder: Any) -> None:
    count = draw(st.integers(0, 4))
    table = builder.init("capTable", count)
    for index in range(count):
        descriptor(draw, table[index])


@st.composite
def messages(draw: Any) -> bytes:
    message = wire.Message.new_message()
    kind = draw(
        st.sampled_from(
            ["bootstrap", "call", "return", "finish", "release", "resolve", "disembargo"]
        )
    )
    if kind == "bootstrap":
        message.init("bootstrap").questionId = draw(ids)
    elif kind == "call":
        call = message.init("call")
        call.questionId = draw(ids)
        target(draw, call.target)
        call.interfaceId = draw(st.sampled_from([TESTER_ID, COUNTER_ID, 0, 2**64 - 1]))
        call.methodId = draw(st.integers(0, 10))
        payload(draw, call.init("params"))
        if draw(st.booleans()):
            call.sendResultsTo.yourself = None
    elif kind == "return":
        body = message.init("return")
        body.answerId = draw(ids)
        body.releaseParamCaps = draw(st.booleans())
        variant = draw(st.sampled_from(["results", "exception", "canceled", "take", "elsewhere"]))
        if variant == "results":
            payload(draw, body.init("results"))
        elif variant == "exception":
            body.init("exception").reason = "fuzz"
        elif variant == "canceled":
            body.canceled = None
        elif variant == "take":
            body.takeFromOtherQuestion = draw(ids)
        else:
            body.resultsSentElsewhere = None
    elif kind == "finish":
        finish = message.init("finish")
        finish.questionId = draw(ids)
        finish.releaseResultCaps = draw(st.booleans())
    elif kind == "release":
        release = message.init("release")
        release.id = draw(ids)
        release.referenceCount = draw(st.sampled_from([0, 1, 2, 2**32 - 1]))
    elif kind == "resolve":
        resolve = message.init("resolve")
        resolve.promiseId = draw(ids)
        if draw(st.booleans()):
            descriptor(draw, resolve.init("cap"))
        else:
            resolve.init("exception").reason = "fuzz"
    else:
        body = message.init("disembargo")
        target(draw, body.target)
        context = draw(st.sampled_from(["senderLoopback", "receiverLoopback", "accept"]))
        if context == "accept":
            body.context.accept = None
        else:
            setattr(body.context, context, draw(ids))
    frame = encode_message(message.to_segments())
    mutations = draw(st.lists(st.tuples(st.integers(8, 4095), st.integers(0, 255)), max_size=3))
    if mutations:
        mutable = bytearray(frame)
        for position, value in mutations:
            if position < len(mutable):
                mutable[position] = value
        frame = bytes(mutable)
    return frame


@FUZZ
@given(st.lists(messages(), max_size=40))
def test_engine_survives_mutated_valid_messages_in_any_order(frames: list[bytes]) -> None:
    session, executor = new_session()
    feed(session, executor, frames)


def test_a_session_at_its_limits_still_closes_clean() -> None:
    """Deterministic: six Bootstraps fill max_answers exactly, the seventh aborts."""
    session, executor = new_session()
    frames = []
    for question in range(7):
        message = wire.Message.new_message()
        message.init("bootstrap").questionId = question
        frames.append(encode_message(message.to_segments()))
    for frame in frames[:6]:
        decoder = FrameDecoder()
        decoder.feed(frame)
        segments = decoder.next_message()
        assert segments is not None
        session.receive(segments)
    assert len(session.answers.entries) == LIMITS.max_answers
    assert session.closed is None
    feed(session, executor, frames[6:])
    assert session.abort_reason is not None
    assert "Limits.max_answers" in session.abort_reason


def test_the_coverage_guided_corpus_replays() -> None:
    corpus = os.path.join(os.path.dirname(__file__), "fuzz", "corpus")
    names = sorted(os.listdir(corpus))
    assert len(names) > 10  # what coverage-guided runs kept
    for data in seeds().values():
        one_input(data)
    for name in names:
        with open(os.path.join(corpus, name), "rb") as f:
            one_input(f.read())


def test_an_exception_reason_that_is_not_utf8_is_kept_not_raised() -> None:
    """Found by the fuzzer: pycapnp raised UnicodeDecodeError out of ``receive``."""
    session, _ = new_session()
    message = wire.Message.new_message()
    body = message.init("abort")
    body.reason = "fuzz"
    frame = bytearray(encode_message(message.to_segments()))
    frame[frame.index(b"fuzz")] = 0x80
    feed_one = FrameDecoder(LIMITS)
    feed_one.feed(bytes(frame))
    segments = feed_one.next_message()
    assert segments is not None
    session.receive(segments)
    assert session.closed is not None
    assert "(the peer's reason is not valid UTF-8)" in str(session.closed)
