"""The protocol engine with no I/O: two sessions wired message by message."""

from __future__ import annotations

from capsvc.errors import Disconnected, Overloaded, Unimplemented
from capsvc.rpc import wire
from capsvc.rpc.hooks import LocalServerHook, PromiseHook
from capsvc.rpc.payload import new_return_payload
from tests.engine.pair import (
    COUNTER_ID,
    TESTER_ID,
    Counter,
    FakeTester,
    SessionPair,
    call,
    increment,
    release_all,
    testing,
    value_of,
    with_cap,
)

NEW_COUNTER = 1
REFLECT = 7
FAIL = 4


def new_counter(pair: SessionPair, tester: object, start: int = 0) -> object:
    schema = testing.Tester.schema.methods["newCounter"].param_type

    def fill(params: object) -> None:
        params.payload_builder.content.as_struct(schema).start = start  # type: ignore[attr-defined]

    return call(tester, TESTER_ID, NEW_COUNTER, fill)  # type: ignore[arg-type]


def test_bootstrap_call_return_finish_and_empty_tables() -> None:
    pair = SessionPair(b_bootstrap=FakeTester(executor=None))  # type: ignore[arg-type]
    pair.b.bootstrap_hook.server.executor = pair.b_exec  # type: ignore[union-attr]
    tester = pair.a.bootstrap()
    result = new_counter(pair, tester, start=5)
    counter = result.pipeline((0,))
    bumped = increment(counter, 2)
    pair.pump()
    assert value_of(bumped) == 7
    # Bootstrap and the pipelined calls left before any reply (rpc-protocol.md §6).
    assert pair.kinds("a->b")[:3] == ["bootstrap", "call", "call"]
    assert "return" in pair.kinds("b->a")
    release_all(bumped, counter, result, tester)
    pair.pump()
    assert pair.a.tables_empty(), pair.a.table_sizes()
    assert pair.b.tables_empty(), pair.b.table_sizes()
    # The caller finished every question whose results held capabilities; cap-free
    # results came back with noFinishNeeded.
    assert "release" in pair.kinds("a->b")


def make_pair() -> SessionPair:
    pair = SessionPair()
    tester = FakeTester(executor=pair.b_exec)
    pair.b.bootstrap_hook = LocalServerHook(tester, pair.b_exec)
    return pair


def test_exception_is_typed() -> None:
    pair = make_pair()
    tester = pair.a.bootstrap()
    result = call(tester, TESTER_ID, FAIL)
    pair.pump()
    assert isinstance(result.error, Overloaded)
    assert result.error.reason == "busy"
    release_all(result, tester)
    pair.pump()
    assert pair.a.tables_empty()
    assert pair.b.tables_empty()


def test_unimplemented_travels_as_an_exception_return_of_that_type() -> None:
    """rpc-protocol.md §4 callee step 2: an unknown method is an ordinary Return whose
    exception has type unimplemented, not an ``unimplemented`` message; the caller gets
    Unimplemented and the connection stays up."""
    pair = make_pair()
    tester = pair.a.bootstrap()
    result = call(tester, TESTER_ID, 5)  # slow: FakeTester answers it Unimplemented
    pair.deliver_one_way(pair.a)
    pair.b_exec.run()
    frames = pair.b.take_output()
    returns = [wire.Message.from_segments(_only_message([frame])) for frame in frames]
    exceptions = [
        getattr(m, "return").exception
        for m in returns
        if m.which() == "return" and getattr(m, "return").which() == "exception"
    ]
    assert [e.type for e in exceptions] == ["unimplemented"]
    for frame in frames:
        pair.a.receive(_only_message([frame]))
    assert isinstance(result.error, Unimplemented)
    assert "slow" in result.error.reason
    assert pair.a.closed is None
    assert pair.b.closed is None
    release_all(result, tester)
    pair.pump()
    assert pair.a.tables_empty(), pair.a.table_sizes()
    assert pair.b.tables_empty(), pair.b.table_sizes()


def test_capability_passing_both_ways_and_refcounts() -> None:
    pair = make_pair()
    tester = pair.a.bootstrap()
    ours = Counter()
    hook = LocalServerHook(ours, pair.a_exec)
    reflected = call(tester, TESTER_ID, REFLECT, with_cap("reflect", hook.add_ref()))
    pair.pump()
    back = reflected.pipeline((0,))
    # The capability came back as receiverHosted: it is our own local hook again.
    assert back.shortest() is hook
    bumped = increment(back, 3)
    pair.pump()
    assert value_of(bumped) == 3
    assert ours.seen == [3]
    release_all(bumped, back, reflected, tester, hook)
    pair.pump()
    assert pair.a.tables_empty(), pair.a.table_sizes()
    assert pair.b.tables_empty(), pair.b.table_sizes()


def test_embargo_keeps_call_order_when_promise_resolves_to_caller() -> None:
    """rpc-protocol.md §9: calls made before and after the resolution arrive in order."""
    pair = make_pair()
    tester = pair.a.bootstrap()
    ours = Counter()
    hook = LocalServerHook(ours, pair.a_exec)
    reflected = call(tester, TESTER_ID, REFLECT, with_cap("reflect", hook.add_ref()))
    back = reflected.pipeline((0,))
    early = [increment(back, n) for n in range(1, 4)]  # go the long way: a -> b -> a
    # Let b run reflect and send its Return, but do not yet deliver b's forwarded calls.
    pair.deliver_one_way(pair.a)
    pair.b_exec.run()
    kinds = pair.deliver_one_way(pair.b)
    assert "return" in kinds
    # The return resolved `back` to our own object: an embargo is now up.
    assert len(pair.a.embargoes.entries) == 1
    assert len(pair.a_exec.pending) == 3  # the early calls, forwarded back by b
    late = [increment(back, n) for n in range(4, 7)]
    assert len(pair.a_exec.pending) == 3  # the late ones are held by the embargo
    pair.pump()
    assert ours.seen == [1, 2, 3, 4, 5, 6]
    assert "disembargo" in pair.kinds("a->b")
    assert "disembargo" in pair.kinds("b->a")
    release_all(*early, *late, back, reflected, tester, hook)
    pair.pump()
    assert pair.a.tables_empty(), pair.a.table_sizes()
    assert pair.b.tables_empty(), pair.b.table_sizes()


def test_cancel_before_return_sends_finish_and_cancels_callee() -> None:
    pair = make_pair()
    tester = pair.a.bootstrap()
    result = call(tester, TESTER_ID, NEW_COUNTER)
    pair.deliver_one_way(pair.a)  # bootstrap + call reach b; the call waits in b's executor
    assert len(pair.b_exec.pending) == 1
    canceled: list[bool] = []
    pair.b_exec.pending[0][1].result.set_canceller(lambda: canceled.append(True))
    result.release()  # the caller loses interest before the return
    kinds = pair.deliver_one_way(pair.a)
    assert kinds == ["finish"]
    assert canceled == [True]
    pair.pump()
    tester.release()
    pair.pump()
    assert pair.a.tables_empty(), pair.a.table_sizes()
    assert pair.b.tables_empty(), pair.b.table_sizes()
    assert "return" in pair.kinds("b->a")


def test_exported_promise_sends_resolve() -> None:
    """rpc-protocol.md §8: a promise we export settles; the peer is told with a Resolve."""
    promise = PromiseHook()
    pair = SessionPair()
    pair.a.bootstrap_hook = promise.add_ref()
    theirs = pair.b.bootstrap()  # b imports a's bootstrap: a senderPromise
    early = increment(theirs, 1)
    pair.pump()
    assert not early.done  # queued inside a's unresolved promise
    ours = Counter()
    promise.resolve(LocalServerHook(ours, pair.a_exec))
    pair.pump()
    assert "resolve" in pair.kinds("a->b")
    late = increment(theirs, 2)
    pair.pump()
    assert value_of(early) == 1
    assert value_of(late) == 3
    assert ours.seen == [1, 2]
    release_all(early, late, theirs)
    pair.pump()
    pair.a.bootstrap_hook.release()
    promise.release()
    assert pair.a.tables_empty(), pair.a.table_sizes()
    assert pair.b.tables_empty(), pair.b.table_sizes()


def test_call_to_unknown_export_aborts() -> None:
    pair = make_pair()
    message = wire.Message.new_message()
    body = message.init("call")
    body.questionId = 0
    body.target.importedCap = 42
    body.interfaceId = COUNTER_ID
    body.init("params")
    pair.b.receive(message.to_segments())
    [abort] = [wire.Message.from_segments(_only_message([f])) for f in pair.b.take_output()]
    assert pair.b.closed is not None
    assert pair.b.abort_reason == "call to export ID 42, which is not exported"
    assert abort.which() == "abort"
    assert abort.abort.reason == pair.b.abort_reason


def test_unknown_message_is_echoed_as_unimplemented() -> None:
    pair = make_pair()
    message = wire.Message.new_message()
    message.init("obsoleteSave")
    pair.b.receive(message.to_segments())
    frames = pair.b.take_output()
    assert pair.b.closed is None  # b does not understand it: it echoes, it does not abort
    [echo] = [wire.Message.from_segments(_only_message([frame])) for frame in frames]
    assert echo.which() == "unimplemented"
    assert echo.unimplemented.which() == "obsoleteSave"
    # a never sends obsoleteSave: an echo of one is not a resolve, bootstrap or call, so the
    # only safe move is to abort (rpc-protocol.md §11; C++ does the same).
    pair.a.receive(_only_message(frames))
    assert pair.a.abort_reason == "peer did not understand our 'obsoleteSave' message"


def test_unimplemented_bootstrap_fails_the_question() -> None:
    """rpc-protocol.md §11: a peer echoing our bootstrap means the question failed."""
    pair = make_pair()
    tester = pair.a.bootstrap()
    inner = _only_message(pair.a.take_output())
    echoed = wire.Message.new_message()
    echoed.unimplemented = wire.Message.from_segments(inner)
    pair.a.receive(echoed.to_segments())
    result = call(tester, TESTER_ID, 0)
    assert isinstance(result.error, Unimplemented)
    release_all(result, tester)
    assert pair.a.tables_empty(), pair.a.table_sizes()


def test_disconnect_fails_pending_calls() -> None:
    pair = make_pair()
    tester = pair.a.bootstrap()
    result = call(tester, TESTER_ID, NEW_COUNTER)
    pair.a.close(Disconnected("gone"))
    assert isinstance(result.error, Disconnected)
    after = call(tester, TESTER_ID, NEW_COUNTER)
    assert isinstance(after.error, Disconnected)
    release_all(result, after, tester)
    assert pair.a.tables_empty()


def test_return_for_unknown_question_aborts() -> None:
    pair = make_pair()
    message = wire.Message.new_message()
    body = message.init("return")
    body.answerId = 9
    body.init("results")
    pair.a.receive(message.to_segments())
    assert pair.a.closed is not None
    assert pair.a.abort_reason == "return for question 9, which is not awaiting one"


def test_release_of_too_many_references_aborts() -> None:
    pair = make_pair()
    tester = pair.a.bootstrap()
    pair.pump()
    message = wire.Message.new_message()
    body = message.init("release")
    body.id = 0
    body.referenceCount = 5
    pair.b.receive(message.to_segments())
    assert pair.b.closed is not None
    assert pair.b.abort_reason == "release of 5 references to export 0, which has 1"
    tester.release()


def test_results_with_no_caps_need_no_finish() -> None:
    pair = make_pair()
    tester = pair.a.bootstrap()
    schema = testing.Tester.schema.methods["echo"].param_type

    def fill(params: object) -> None:
        params.payload_builder.content.as_struct(schema).msg = "hi"  # type: ignore[attr-defined]

    result = call(tester, TESTER_ID, 0, fill)
    pair.pump()
    assert result.payload.content(testing.Tester.schema.methods["echo"].result_type).reply == "hi"
    finishes_before = pair.kinds("a->b").count("finish")
    release_all(result)
    pair.pump()
    assert pair.kinds("a->b").count("finish") == finishes_before
    assert pair.a.questions.entries.keys() <= {0}  # only the bootstrap question may remain
    tester.release()
    pair.pump()
    assert pair.a.tables_empty()
    assert pair.b.tables_empty()


def test_results_payload_is_built_in_place() -> None:
    payload = new_return_payload()
    payload.payload_builder.content.as_struct(testing.Tester.schema.methods["echo"].result_type)
    segments = payload.write(lambda desc, path, hook: None)
    assert wire.message_tag(segments) == wire.RETURN


def _only_message(frames: list[bytes]) -> list[memoryview]:
    from capsvc.framing import FrameDecoder

    decoder = FrameDecoder()
    for frame in frames:
        decoder.feed(frame)
    segments = decoder.next_message()
    assert segments is not None
    return segments


def test_received_abort_fails_everything_with_disconnected() -> None:
    pair = make_pair()
    tester = pair.a.bootstrap()
    pending = call(tester, TESTER_ID, NEW_COUNTER)
    message = wire.Message.new_message()
    body = message.init("abort")
    body.reason = "going away"
    body.type = "failed"
    pair.a.receive(message.to_segments())
    assert isinstance(pending.error, Disconnected)
    assert "going away" in pending.error.reason
    assert pair.a.closed is not None
    release_all(pending, tester)
    assert pair.a.tables_empty()


def test_pipelined_capability_goes_back_as_receiver_answer() -> None:
    """rpc-protocol.md §5: a capability inside one of the peer's unanswered answers is sent
    back as receiverAnswer, and the peer takes it from that answer's pipeline."""
    pair = make_pair()
    tester = pair.a.bootstrap()
    made = new_counter(pair, tester, start=7)
    theirs = made.pipeline((0,))  # not returned yet: a PipelineHook
    reflected = call(tester, TESTER_ID, REFLECT, with_cap("reflect", theirs.add_ref()))
    frames = pair.a.take_output()
    decoded = [wire.Message.from_segments(_only_message([frame])) for frame in frames]
    calls = [m.call for m in decoded if m.which() == "call"]
    new_counter_call, reflect_call = calls[0], calls[-1]
    descriptor = reflect_call.params.capTable[0]
    assert descriptor.which() == "receiverAnswer"
    assert descriptor.receiverAnswer.questionId == new_counter_call.questionId
    for frame in frames:  # now let the conversation happen
        pair.b.receive(_only_message([frame]))
    pair.pump()
    back = reflected.pipeline((0,))
    bumped = increment(back, 1)
    pair.pump()
    assert value_of(bumped) == 8
    release_all(bumped, back, reflected, theirs, made, tester)
    pair.pump()
    assert pair.a.tables_empty(), pair.a.table_sizes()
    assert pair.b.tables_empty(), pair.b.table_sizes()
