"""The fast Call-header reader agrees with pycapnp, and falls back when it should."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from capsvc.rpc import wire


@given(
    question=st.integers(0, 2**32 - 1),
    interface=st.integers(0, 2**64 - 1),
    method=st.integers(0, 2**16 - 1),
    send_to=st.sampled_from(["caller", "yourself"]),
    imported=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    caps=st.integers(0, 3),
    first_segment_words=st.sampled_from([None, 1, 2, 3, 5, 8]),
)
def test_fast_header_matches_pycapnp(
    question: int,
    interface: int,
    method: int,
    send_to: str,
    imported: int | None,
    caps: int,
    first_segment_words: int | None,
) -> None:
    kwargs = {} if first_segment_words is None else {"num_first_segment_words": first_segment_words}
    message = wire.Message.new_message(**kwargs)
    body = message.init("call")
    body.questionId = question
    body.interfaceId = interface
    body.methodId = method
    setattr(body.sendResultsTo, send_to, None)
    if imported is None:
        body.target.init("promisedAnswer").questionId = 1
    else:
        body.target.importedCap = imported
    params = body.init("params")
    if caps:
        params.init("capTable", caps)
    segments = message.to_segments()
    header = wire.read_call_header(segments)
    if header is None:
        # Only messages with far pointers may need the slow path.
        assert len(segments) > 1
        return
    assert header.question_id == question
    assert header.interface_id == interface
    assert header.method_id == method
    assert header.send_to == (1 if send_to == "yourself" else 0)
    assert header.target_is_import == (imported is not None)
    if imported is not None:
        assert header.imported_cap == imported
    assert header.has_caps == (caps > 0)


def test_garbage_falls_back_instead_of_raising() -> None:
    assert wire.read_call_header([bytes(8)]) is None
    assert wire.read_call_header([b"\xff" * 64]) is None
    assert wire.read_call_header([bytes([0, 0, 0, 0, 1, 0, 1, 0])]) is None


@given(
    answer=st.integers(0, 2**32 - 1),
    which=st.sampled_from(["results", "exception", "canceled", "takeFromOtherQuestion"]),
    release_param_caps=st.booleans(),
    no_finish_needed=st.booleans(),
    caps=st.integers(0, 2),
    first_segment_words=st.sampled_from([None, 1, 2, 3, 5]),
)
def test_fast_return_header_matches_pycapnp(
    answer: int,
    which: str,
    release_param_caps: bool,
    no_finish_needed: bool,
    caps: int,
    first_segment_words: int | None,
) -> None:
    kwargs = {} if first_segment_words is None else {"num_first_segment_words": first_segment_words}
    message = wire.Message.new_message(**kwargs)
    body = message.init("return")
    body.answerId = answer
    body.releaseParamCaps = release_param_caps
    body.noFinishNeeded = no_finish_needed
    if which == "results":
        results = body.init("results")
        if caps:
            results.init("capTable", caps)
    elif which == "exception":
        body.init("exception").reason = "x"
    elif which == "canceled":
        body.canceled = None
    else:
        body.takeFromOtherQuestion = 5
    segments = message.to_segments()
    header = wire.read_return_header(segments)
    if header is None:
        assert len(segments) > 1
        return
    assert header.answer_id == answer
    assert (header.which == 0) == (which == "results")
    assert header.release_param_caps == release_param_caps
    assert header.no_finish_needed == no_finish_needed
    if which == "results":
        assert header.has_caps == (caps > 0)
