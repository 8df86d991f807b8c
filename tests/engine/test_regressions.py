"""One test per protocol bug and lesser defect of the lifecycle review, in the engine pair.

Each test drives the exact interleaving that went wrong, message by message, and asserts
what rpc.capnp (and C++) require. The same bugs reached through the public API and against
the C++ reference are in tests/test_protocol_regressions.py and tests/interop/.
"""

from __future__ import annotations

from typing import Any

import pytest

from capsvc.errors import Failed, LocalProtocolError
from capsvc.framing import FrameDecoder
from capsvc.rpc import wire
from capsvc.rpc.hooks import (
    BrokenHook,
    CallResult,
    Hook,
    LocalServerHook,
    OutgoingCall,
    PromiseHook,
)
from capsvc.rpc.payload import new_return_payload
from capsvc.rpc.session import GONE_ANSWER, RpcSession
from tests.engine.pair import (
    COUNTER_ID,
    TESTER_ID,
    Counter,
    FakeTester,
    ManualExecutor,
    SessionPair,
    call,
    increment,
    release_all,
    testing,
    value_of,
    with_cap,
)

NEW_COUNTER, REFLECT, CALL_COUNTER = 1, 7, 8


def make_pair() -> tuple[SessionPair, FakeTester, Hook]:
    pair = SessionPair()
    fake = FakeTester(executor=pair.b_exec)
    pair.b.bootstrap_hook = LocalServerHook(fake, pair.b_exec)
    return pair, fake, pair.a.bootstrap()


def new_counter(tester: Hook) -> CallResult:
    schema = testing.Tester.schema.methods["newCounter"].param_type

    def fill(params: Any) -> None:
        params.payload_builder.content.as_struct(schema).start = 0

    return call(tester, TESTER_ID, NEW_COUNTER, fill)


def call_counter(tester: Hook, counter: Hook, by: int) -> CallResult:
    """Tester.callCounter(counter, by); ownership of ``counter`` passes to the params."""
    schema = testing.Tester.schema.methods["callCounter"].param_type

    def fill(params: Any) -> None:
        params.payload_builder.content.as_struct(schema).by = by
        params.set_cap((0,), counter)

    return call(tester, TESTER_ID, CALL_COUNTER, fill)


def decode(frames: list[bytes]) -> list[Any]:
    messages = []
    for frame in frames:
        decoder = FrameDecoder()
        decoder.feed(frame)
        segments = decoder.next_message()
        assert segments is not None
        messages.append(wire.Message.from_segments(segments))
    return messages


def assert_quiet_and_empty(pair: SessionPair) -> None:
    pair.pump()
    assert pair.a.closed is None, pair.a.closed
    assert pair.b.closed is None, pair.b.closed
    assert pair.a.tables_empty(), pair.a.table_sizes()
    assert pair.b.tables_empty(), pair.b.table_sizes()


# ---------------------------------------------------------------------- the four bugs
def test_bug1_pipelining_on_a_cap_free_answer_fails_the_call_not_the_connection() -> None:
    """rpc-protocol.md §13.11: the callee forgot the answer (noFinishNeeded); a call the
    caller pipelined on it before seeing the Return gets a broken capability (C++ text)."""
    pair, _, tester = make_pair()
    reflected = call(tester, TESTER_ID, REFLECT, with_cap("reflect", None))  # type: ignore[arg-type]
    pair.deliver_one_way(pair.a)
    pair.b_exec.run()  # b returns cap-free results with noFinishNeeded: the answer is gone
    assert pair.b.answers.entries.keys() == {0}  # only the bootstrap answer remains
    field = reflected.pipeline((0,))
    early = increment(field, 1)  # a has not seen the Return: this goes to promisedAnswer
    pair.pump()
    assert pair.b.closed is None, pair.b.abort_reason
    assert isinstance(early.error, Failed)
    assert early.error.reason == GONE_ANSWER
    late = increment(reflected.pipeline((0,)), 2)  # after the Return: a null capability
    assert isinstance(late.error, Failed)
    assert late.error.reason == "called a null capability"
    release_all(early, late, field, reflected, tester)
    assert_quiet_and_empty(pair)


def test_bug2_release_of_an_import_passed_as_the_last_reference_follows_the_call() -> None:
    """rpc-protocol.md §13.10: the Call carrying our last reference to an import is queued
    before the Release that dropping it causes."""
    pair, fake, tester = make_pair()
    made = new_counter(tester)
    pair.pump()
    counter = made.payload.cap_at((0,))
    assert counter is not None
    made.release()
    pair.pump()  # now `counter` is our only reference to the import
    result = call_counter(tester, counter, 3)
    assert pair.deliver_one_way(pair.a) == ["call", "release"]
    pair.pump()
    assert value_of(result) == 3
    assert fake.made[0].seen == [3]
    release_all(result, tester)
    assert_quiet_and_empty(pair)


def test_bug3_finish_of_a_dropped_promise_follows_the_call_naming_its_answer() -> None:
    """rpc-protocol.md §13.10: a pipelined capability whose promise we dropped goes into the
    params as our last reference; the Finish(releaseResultCaps) it causes must follow the
    Call that names it as receiverAnswer, even when the callee has already returned."""
    pair, fake, tester = make_pair()
    made = new_counter(tester)
    counter = made.pipeline((0,))
    made.release()
    pair.deliver_one_way(pair.a)
    pair.b_exec.run()  # the callee returned; its Return is still on the way to us
    result = call_counter(tester, counter, 4)
    assert pair.deliver_one_way(pair.a) == ["call", "finish"]
    pair.pump()
    assert value_of(result) == 4
    assert fake.made[0].seen == [4]
    release_all(result, tester)
    assert_quiet_and_empty(pair)


def test_bug4_embargo_when_the_peer_reflects_a_promise_that_resolved_back_to_it() -> None:
    """rpc-protocol.md §9 and rpc.c++ RequireEmbargoWrapper: our pipelined capability
    settles to receiverHosted, one of our exports: a promise that meanwhile resolved to a
    capability of the peer. A call made through the pipeline before it settled is still on
    its way back to us; one made after must not overtake it."""
    pair, fake, tester = make_pair()
    made = new_counter(tester)
    theirs = made.pipeline((0,))
    pair.pump()  # theirs is now b's Counter
    promise = PromiseHook()
    reflected = call(tester, TESTER_ID, REFLECT, with_cap("reflect", promise.add_ref()))
    back = reflected.pipeline((0,))
    pair.deliver_one_way(pair.a)
    pair.b_exec.run()  # b returns our promise to us: receiverHosted
    first = increment(back, 1)  # pipelined: b forwards it to our promise export
    pair.deliver_one_way(pair.a)
    promise.resolve(theirs.add_ref())  # our promise now leads back to b's Counter
    assert pair.deliver_one_way(pair.b, 1) == ["return"]  # b's Return; `first` still on b's side
    assert len(pair.a.embargoes.entries) == 1
    second = increment(back, 2)
    pair.pump()
    assert fake.made[0].seen == [1, 2]
    assert value_of(second) == 3
    release_all(first, second, back, reflected, theirs, made, tester, promise)
    assert_quiet_and_empty(pair)


def test_calls_through_an_export_repointed_at_an_embargoed_promise_keep_their_order() -> None:
    """Found by the random sequences: our promise A is reflected back to us and a call
    (1) comes through it; A then resolves to our pipelined capability P, which is under an
    embargo, so call 1 waits in P's embargo. A's export is repointed to what the Resolve
    described; a later call (3) through the export must wait in the same queue, not go
    round the embargo to P's target (C++ makes the embargo a local promise: so do we)."""
    from tests.engine.test_random_sequences import run_world

    run_world(
        [
            ("reflect_promise", 0, 0),
            ("increment", 0, 0),
            ("reflect_promise", 0, 0),
            ("increment", 0, 0),
            ("increment", 1, 3),
            ("resolve_caller_promise", 21, 0),
        ]
    )


def test_a_call_sent_by_a_pinned_export_is_not_overtaken_by_its_promise() -> None:
    """Found by the random sequences (2026-12-05): call 1 goes out pipelined on our
    question q1, whose answer is our promise export A (reflected), so q1's pipeline is
    embargoed. A then resolves to q2's pipelined answer: A's export is pinned to it (the
    Tribble rule), and q2 settles locally with no call made through it. Call 1 comes back
    to A's export and goes out again by the pin, the long way round; when q1's embargo
    lifts, call 2 goes A -> q2 -> the counter directly. It must wait behind call 1: the
    pinned send embargoes q2's promise afresh (remote.RemotePromise.sent_by_pin)."""
    from tests.engine.test_random_sequences import run_world

    run_world(
        [
            ("reflect_promise", 0, 0),
            ("reflect_promise", 0, 0),
            ("resolve_caller_promise", 2, 5),
            ("increment", 1, 5),
            ("resolve_caller_promise", 0, 0),
            ("increment", 1, 0),
        ]
    )


def test_a_resolve_for_a_broken_capability_follows_the_call_that_exports_it() -> None:
    """rpc-protocol.md §5: a broken capability is sent as a promise resolved at once; the
    Resolve must follow the message that introduces the promise (found by this review: it
    used to go first, the peer ignored it, and the promise never settled)."""
    pair, _, tester = make_pair()
    pair.pump()
    result = call_counter(tester, BrokenHook(Failed("gone for good")), 5)
    assert pair.deliver_one_way(pair.a) == ["call", "resolve"]
    pair.pump()
    assert isinstance(result.error, Failed)
    assert result.error.reason == "gone for good"
    release_all(result, tester)
    assert_quiet_and_empty(pair)


# ---------------------------------------------------------------------- lesser defects
def test_no_finish_after_no_finish_needed_even_when_nobody_wants_the_results() -> None:
    """rpc-protocol.md §13.8: the Return said noFinishNeeded and the results were unwanted
    by then (only a pipelined capability held the question): no Finish goes out."""
    pair, _, tester = make_pair()
    pair.pump()
    reflected = call(tester, TESTER_ID, REFLECT, with_cap("reflect", None))  # type: ignore[arg-type]
    field = reflected.pipeline((0,))
    reflected.release()
    finishes = pair.kinds("a->b").count("finish")
    pair.pump()
    field.release()
    pair.pump()
    assert pair.kinds("a->b").count("finish") == finishes
    tester.release()
    assert_quiet_and_empty(pair)


class TailCallPeer:
    """A session whose peer is played by the test, message by message (§6.2)."""

    def __init__(self) -> None:
        self.executor = ManualExecutor()
        self.ours = Counter()
        self.session = RpcSession(LocalServerHook(self.ours, self.executor))
        self.give_bootstrap()
        self.theirs = self.session.bootstrap()
        [question] = self.sent()
        reply = new_return_payload()
        getattr(reply.message, "return").answerId = question.bootstrap.questionId
        reply.set_cap((), LocalServerHook(Counter(), self.executor))
        self.give_segments(reply.write(lambda desc, path, hook: setattr(desc, "senderHosted", 5)))
        self.sent()

    def give_bootstrap(self) -> None:
        message = wire.Message.new_message()
        message.init("bootstrap").questionId = 0
        self.give(message)
        self.sent()

    def give(self, message: Any) -> None:
        self.give_segments(message.to_segments())

    def give_segments(self, segments: Any) -> None:
        self.session.receive(segments)

    def sent(self) -> list[Any]:
        return decode(self.session.take_output())

    def yourself_call(self, answer_id: int) -> None:
        """The peer tail-calls increment(1) back to our Counter (export 0)."""
        message = wire.Message.new_message()
        body = message.init("call")
        body.questionId = answer_id
        body.target.importedCap = 0
        body.interfaceId = COUNTER_ID
        body.methodId = 0
        body.sendResultsTo.yourself = None
        body.init("params").content.as_struct(
            testing.Counter.schema.methods["increment"].param_type
        ).by = 1
        self.give(message)

    def take_return(self, question_id: int, answer_id: int) -> None:
        message = wire.Message.new_message()
        body = message.init("return")
        body.answerId = question_id
        body.takeFromOtherQuestion = answer_id
        self.give(message)


def test_take_from_other_question_takes_each_answer_once() -> None:
    peer = TailCallPeer()
    first = increment(peer.theirs, 1)
    second = increment(peer.theirs, 2)
    q1, q2 = (m.call.questionId for m in peer.sent())
    peer.yourself_call(7)
    peer.take_return(q1, 7)
    assert peer.session.closed is None
    peer.take_return(q2, 7)
    assert peer.session.abort_reason == (
        "takeFromOtherQuestion for answer 7, which is running, results taken"
    )
    release_all(first, second, peer.theirs)


def test_take_for_a_finished_question_cancels_the_other_call() -> None:
    """rpc-protocol.md §6.2: our question was finished (cancelled) before its Return took
    its results from our answer 7: that call never runs, and its Return still goes out."""
    peer = TailCallPeer()
    result = increment(peer.theirs, 1)
    [question] = peer.sent()
    result.release()
    [finish] = peer.sent()
    assert finish.finish.releaseResultCaps is True
    peer.yourself_call(7)  # waits in our executor: not started
    peer.take_return(question.call.questionId, 7)
    peer.executor.run()
    assert peer.ours.seen == []  # the tail call was cancelled before it began
    returns = [getattr(m, "return") for m in peer.sent() if m.which() == "return"]
    assert [(r.answerId, r.which()) for r in returns] == [(7, "resultsSentElsewhere")]
    assert peer.session.closed is None
    peer.theirs.release()


def test_a_disembargo_aimed_at_an_unresolved_local_promise_waits_for_it() -> None:
    """rpc.c++ handleDisembargo: wait for the target to resolve, then reflect."""
    promise = PromiseHook()
    session = RpcSession(promise.add_ref())
    bootstrap = wire.Message.new_message()
    bootstrap.init("bootstrap").questionId = 0
    session.receive(bootstrap.to_segments())
    theirs = session.bootstrap()
    [answer, question] = decode(session.take_output())
    export_id = getattr(answer, "return").results.capTable[0].senderPromise
    reply = new_return_payload()
    getattr(reply.message, "return").answerId = question.bootstrap.questionId
    reply.set_cap((), LocalServerHook(Counter(), ManualExecutor()))
    session.receive(reply.write(lambda desc, path, hook: setattr(desc, "senderHosted", 9)))
    session.take_output()
    disembargo = wire.Message.new_message()
    body = disembargo.init("disembargo")
    body.target.importedCap = export_id
    body.context.senderLoopback = 3
    session.receive(disembargo.to_segments())
    assert session.closed is None, session.abort_reason
    assert session.take_output() == []  # nothing yet: the promise has not resolved
    promise.resolve(theirs.add_ref())  # to the peer's own capability (import 9)
    sent = decode(session.take_output())
    assert [m.which() for m in sent] == ["resolve", "disembargo"]
    assert sent[1].disembargo.context.receiverLoopback == 3
    assert sent[1].disembargo.target.importedCap == 9
    release_all(theirs, promise)


def test_results_that_cannot_be_written_fail_the_call_instead_of_raising() -> None:
    """A Return that cannot be built (a capability where the results have no pointer) must
    not raise into whoever settled the result (a trio task of the runtime): the caller gets
    an exception Return, and the exports its cap table counted are given back."""
    pair, _, tester = make_pair()
    pair.pump()
    result = call(tester, TESTER_ID, 0)  # echo, answered by hand below
    pair.deliver_one_way(pair.a)
    [(_, incoming)] = pair.b_exec.pending
    pair.b_exec.pending.clear()
    bad = new_return_payload()
    bad.payload_builder.content.as_struct(testing.Tester.schema.methods["echo"].result_type)
    bad.set_cap((0,), LocalServerHook(Counter(), pair.b_exec))  # fine: becomes an export
    bad.set_cap((5,), LocalServerHook(Counter(), pair.b_exec))  # no pointer 5 in the struct
    incoming.result.set_result(bad)  # must not raise
    incoming.params.release()
    assert pair.b.exports.entries.keys() == {0}  # only the bootstrap: the rollback worked
    pair.pump()
    assert isinstance(result.error, Failed)
    assert result.error.reason.startswith("results could not be sent: no pointer at capability")
    release_all(result, tester)
    assert_quiet_and_empty(pair)


def test_a_finish_stops_a_call_that_has_not_started() -> None:
    """rpc-protocol.md §4 callee step 4: the call waits to run when its Finish arrives: it
    never starts, and the Return says canceled."""
    pair, fake, tester = make_pair()
    pair.pump()
    result = new_counter(tester)
    pair.deliver_one_way(pair.a)
    assert len(pair.b_exec.pending) == 1
    result.release()
    assert pair.deliver_one_way(pair.a) == ["finish"]
    pair.b_exec.run()
    assert fake.made == []  # newCounter never ran
    frames = pair.b.take_output()
    assert [getattr(m, "return").which() for m in decode(frames)] == ["canceled"]
    pair.in_flight[id(pair.b)] = frames
    pair.deliver_one_way(pair.b)
    tester.release()
    assert_quiet_and_empty(pair)


def test_an_illegal_local_input_is_a_local_protocol_error() -> None:
    """The lifecycle tables reject local events that cannot happen (engine bugs)."""
    pair, _, tester = make_pair()
    [question] = pair.a.questions.entries.values()
    from capsvc.rpc.lifecycle import QuestionInput

    with pytest.raises(LocalProtocolError, match="the answer we take results from settled"):
        pair.a.questions.advance(question, QuestionInput.TAKE_SETTLED)
    tester.release()


def test_outgoing_call_delivered_from_the_wire_is_marked_from_peer_only_while_handed_over() -> None:
    seen: list[bool] = []

    class Recorder:
        def start(self, hook: LocalServerHook, call: OutgoingCall) -> None:
            seen.append(call.from_peer)
            call.result.release()
            hook.pending.popleft().params.release()

    pair = SessionPair()
    pair.b.bootstrap_hook = LocalServerHook(Counter(), Recorder())
    counter = pair.a.bootstrap()
    done = increment(counter, 1)
    pair.deliver_one_way(pair.a)
    local = LocalServerHook(Counter(), Recorder())
    increment(local, 1).release()
    assert seen == [True, False]
    release_all(done, counter, local)
