"""The fast Call/Return header readers and the re-rooted content reader agree with pycapnp,
and fall back when they should."""

from __future__ import annotations

import os
import struct
from typing import Any

import capnp
from hypothesis import given
from hypothesis import strategies as st

from capsvc.rpc import wire
from capsvc.rpc.payload import ReceivedPayload, reroot

#: The kinds of buffer a segment arrives in: ``bytes`` from capsvc.framing for a
#: one-segment message (read natively), memoryview slices for a multi-segment one, and
#: bytearray from other streams (read through ``struct``): every reader must agree.
_FORMS = (bytes, bytearray, memoryview)


def _fields(header: object) -> dict[str, object] | None:
    if header is None:
        return None
    # dir(), not __slots__: compiled by mypyc, the header classes have no __slots__.
    fields = {name: getattr(header, name) for name in dir(header) if not name.startswith("_")}
    assert "content_word" in fields
    return fields


def _same_in_every_form(read: Any, segments: list[bytes]) -> Any:
    """``read(segments)``, checked to read the same from every buffer form."""
    found = read(segments)
    for form in _FORMS:
        other = read([form(segment) for segment in segments])
        if isinstance(found, int) or found is None:
            assert other == found, form
        else:
            assert _fields(other) == _fields(found), form
    return found


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
    tag = _same_in_every_form(wire.message_tag, segments)
    assert tag == wire.CALL or (tag is None and len(segments) > 1)  # a far root: pycapnp reads it
    header = _same_in_every_form(wire.read_call_header, segments)
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


def _same_tuple_in_every_form(read: Any, segments: list[bytes]) -> Any:
    found = read(segments)
    for form in _FORMS:
        assert read([form(segment) for segment in segments]) == found, form
    return found


@given(
    question=st.integers(0, 2**32 - 1),
    release_result_caps=st.booleans(),
    workaround=st.booleans(),
    count=st.integers(0, 2**32 - 1),
    first_segment_words=st.sampled_from([None, 1, 2, 3, 5]),
)
def test_finish_and_release_read_from_raw_words_match_pycapnp(
    question: int,
    release_result_caps: bool,
    workaround: bool,
    count: int,
    first_segment_words: int | None,
) -> None:
    kwargs = {} if first_segment_words is None else {"num_first_segment_words": first_segment_words}
    finish = wire.Message.new_message(**kwargs)
    body = finish.init("finish")
    body.questionId = question
    body.releaseResultCaps = release_result_caps
    body.requireEarlyCancellationWorkaround = workaround
    found = _same_tuple_in_every_form(wire.read_finish, finish.to_segments())
    assert found == (question, release_result_caps) or (
        found is None and len(finish.to_segments()) > 1  # a far pointer: pycapnp reads it
    )
    release = wire.Message.new_message(**kwargs)
    body = release.init("release")
    body.id = question
    body.referenceCount = count
    found = _same_tuple_in_every_form(wire.read_release, release.to_segments())
    assert found == (question, count) or (found is None and len(release.to_segments()) > 1)


@given(
    question=st.integers(0, 2**32 - 1),
    release_result_caps=st.booleans(),
    count=st.integers(0, 2**32 - 1),
)
def test_finish_and_release_written_from_raw_words_are_what_pycapnp_builds(
    question: int, release_result_caps: bool, count: int
) -> None:
    finish = wire.Message.new_message()
    body = finish.init("finish")
    body.questionId = question
    body.releaseResultCaps = release_result_caps
    body.requireEarlyCancellationWorkaround = False
    assert wire.finish_message(question, release_result_caps) == finish.to_segments()
    release = wire.Message.new_message()
    body = release.init("release")
    body.id = question
    body.referenceCount = count
    assert wire.release_message(question, count) == release.to_segments()


def test_finish_and_release_without_a_data_word_fall_back() -> None:
    # A Finish and a Release whose body has no data section: every field is its default,
    # which the raw readers leave to pycapnp.
    for tag in (wire.FINISH, wire.RELEASE):
        empty_body = struct.pack("<IHHHxxxxxxIHH", 0, 1, 1, tag, 0xFFFFFFFC, 0, 0)
        for read in (wire.read_finish, wire.read_release):
            assert read([empty_body]) is None
        message = wire.read_message([empty_body], traversal_limit_words=64, nesting_limit=8)
        assert message.which() == ("finish" if tag == wire.FINISH else "release")


_DESCRIPTORS = st.one_of(
    st.tuples(st.just("none"), st.just(0), st.just(())),
    st.tuples(
        st.sampled_from(["senderHosted", "senderPromise", "receiverHosted"]),
        st.integers(0, 2**32 - 1),
        st.just(()),
    ),
    st.tuples(
        st.just("receiverAnswer"),
        st.integers(0, 2**32 - 1),
        st.lists(st.one_of(st.none(), st.integers(0, 2**16 - 1)), max_size=4).map(tuple),
    ),
)
_KINDS = {
    "none": wire.CAP_NONE,
    "senderHosted": wire.SENDER_HOSTED,
    "senderPromise": wire.SENDER_PROMISE,
    "receiverHosted": wire.RECEIVER_HOSTED,
    "receiverAnswer": wire.RECEIVER_ANSWER,
}


def _fill_promised(promised: Any, question: int, ops: tuple[int | None, ...]) -> None:
    promised.questionId = question
    transform = promised.init("transform", len(ops))
    for op, field in zip(transform, ops, strict=True):
        if field is None:
            op.noop = None
        else:
            op.getPointerField = field


def _expected_entry(kind: str, number: int, ops: tuple[int | None, ...]) -> wire.CapEntry:
    return _KINDS[kind], number, tuple(op for op in ops if op is not None)


@given(
    descriptors=st.lists(_DESCRIPTORS, max_size=5),
    promised_target=st.one_of(
        st.none(),
        st.tuples(
            st.integers(0, 2**32 - 1),
            st.lists(st.one_of(st.none(), st.integers(0, 2**16 - 1)), max_size=3).map(tuple),
        ),
    ),
    first_segment_words=st.sampled_from([None, 1, 4, 16]),
    returned=st.booleans(),
)
def test_cap_tables_and_promised_targets_read_from_raw_words_match_pycapnp(
    descriptors: list[tuple[str, int, tuple[int | None, ...]]],
    promised_target: tuple[int, tuple[int | None, ...]] | None,
    first_segment_words: int | None,
    returned: bool,
) -> None:
    kwargs = {} if first_segment_words is None else {"num_first_segment_words": first_segment_words}
    message = wire.Message.new_message(**kwargs)
    if returned:
        body = message.init("return")
        payload = body.init("results")
    else:
        body = message.init("call")
        if promised_target is None:
            body.target.importedCap = 3
        else:
            _fill_promised(body.target.init("promisedAnswer"), *promised_target)
        payload = body.init("params")
    table = payload.init("capTable", len(descriptors))
    for desc, (kind, number, ops) in zip(table, descriptors, strict=True):
        if kind == "none":
            desc.none = None
        elif kind == "receiverAnswer":
            _fill_promised(desc.init("receiverAnswer"), number, ops)
        else:
            setattr(desc, kind, number)
    segments = message.to_segments()
    header = (wire.read_return_header if returned else wire.read_call_header)(segments)
    if header is None:
        assert len(segments) > 1  # far pointers: pycapnp reads it
        return
    if not returned and promised_target is not None:
        question, ops = promised_target
        assert header.promised in (None, (question, tuple(o for o in ops if o is not None)))
        assert header.promised is not None or len(segments) > 1
    if not header.has_caps:  # (an empty capTable may still have a list pointer)
        assert not descriptors
        return
    entries = wire.read_cap_table(segments, header.content_word)
    for form in _FORMS:
        assert wire.read_cap_table([form(seg) for seg in segments], header.content_word) == entries
    if entries is None:
        assert len(segments) > 1 or not descriptors
        return
    assert entries == [_expected_entry(*desc) for desc in descriptors]


def test_cap_tables_the_raw_reader_leaves_to_pycapnp() -> None:
    # A thirdPartyHosted descriptor (Level 3) and an unknown kind: read by pycapnp, which
    # takes the vine or reports the unknown kind.
    message = wire.Message.new_message()
    body = message.init("call")
    body.target.importedCap = 0
    table = body.init("params").init("capTable", 1)
    table[0].init("thirdPartyHosted").vineId = 9
    segments = message.to_segments()
    header = wire.read_call_header(segments)
    assert header is not None
    assert header.has_caps
    assert wire.read_cap_table(segments, header.content_word) is None
    raw = bytearray(segments[0])
    raw[raw.rindex(struct.pack("<H", 5)) : raw.rindex(struct.pack("<H", 5)) + 2] = struct.pack(
        "<H", 77
    )
    assert wire.read_cap_table([bytes(raw)], header.content_word) is None


def test_garbage_falls_back_instead_of_raising() -> None:
    for form in _FORMS:
        assert wire.read_call_header([form(bytes(8))]) is None
        assert wire.read_call_header([form(b"\xff" * 64)]) is None
        assert wire.read_call_header([form(bytes([0, 0, 0, 0, 1, 0, 1, 0]))]) is None
        assert wire.read_return_header([form(b"\xff" * 64)]) is None
        # A root pointing before the segment, and one past its end.
        assert wire.read_call_header([form(struct.pack("<iHH", -8, 1, 1) + bytes(16))]) is None
        assert wire.read_call_header([form(struct.pack("<iHH", 400, 1, 1) + bytes(16))]) is None
        assert wire.message_tag([form(struct.pack("<iHH", 400, 1, 1) + bytes(16))]) is None


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
    tag = _same_in_every_form(wire.message_tag, segments)
    assert tag == wire.RETURN or (tag is None and len(segments) > 1)  # a far root: pycapnp reads it
    header = _same_in_every_form(wire.read_return_header, segments)
    if header is None:
        assert len(segments) > 1
        return
    assert header.answer_id == answer
    assert (header.which == 0) == (which == "results")
    assert header.release_param_caps == release_param_caps
    assert header.no_finish_needed == no_finish_needed
    if which == "results":
        assert header.has_caps == (caps > 0)


# ------------------------------------------------------------------ re-rooted content
_testing = capnp.load(os.path.join(os.path.dirname(__file__), "..", "schemas", "testing.capnp"))
_HOLDER = _testing.Tester.schema.methods["echo"].param_type


@given(
    text=st.text(max_size=300),
    first_segment_words=st.sampled_from([None, 1, 2, 3, 5, 8, 13]),
    kind=st.sampled_from(["call", "return"]),
)
def test_content_read_without_the_message_reader_matches_pycapnp(
    text: str, first_segment_words: int | None, kind: str
) -> None:
    """ReceivedPayload.content re-roots the message at the content pointer that the raw
    header reader found; whatever the segment layout (near or far pointers), it must read
    what pycapnp's walk down Message -> Call/Return -> Payload -> content reads."""
    kwargs = {} if first_segment_words is None else {"num_first_segment_words": first_segment_words}
    message = wire.Message.new_message(**kwargs)
    if kind == "call":
        body = message.init("call")
        body.target.importedCap = 0
        payload_builder = body.init("params")
    else:
        payload_builder = message.init("return").init("results")
    payload_builder.content.as_struct(_HOLDER).msg = text
    segments = message.to_segments()
    if kind == "call":
        header: Any = wire.read_call_header(segments)
        path = wire.CALL_CONTENT_PATH
    else:
        header = wire.read_return_header(segments)
        path = wire.RETURN_CONTENT_PATH
    if header is None:
        return  # a layout the fast reader leaves to pycapnp (far Message body)
    assert header.content_word > 0
    fast = ReceivedPayload(segments, None, path, [], content_word=header.content_word)
    assert fast.content(_HOLDER).msg == text
    slow = ReceivedPayload(segments, None, path, [])  # the pycapnp walk, made lazily
    assert slow.content(_HOLDER).msg == text


def test_reroot_accepts_only_struct_and_far_pointers() -> None:
    word = struct.Struct("<Q").pack
    segment = word(0) + word(4 << 2) + word(1 | (2 << 32)) + word(0) + word(3) + word(6)
    # A near struct pointer at word 1 (offset 4, so the struct is at word 6): the new root
    # at word 0 points at the same struct (offset 5); the rest of the segment is unchanged.
    rerooted = reroot([segment], 1)
    assert rerooted is not None
    assert rerooted[0][:8] == word(5 << 2)
    assert rerooted[0][8:] == segment[8:]
    assert reroot([segment], 2) is None  # a list pointer
    assert reroot([segment], 3) is None  # null
    assert reroot([segment], 4) is None  # a capability pointer (kind 3)
    assert reroot([segment], 0) is None  # the root itself
    assert reroot([segment], 6) is None  # past the end
    far = reroot([segment, segment], 5)  # 6: a far pointer (kind 2), double-far bit set
    assert far is not None
    assert far[0][:8] == word(6)
    assert far[1] is segment
