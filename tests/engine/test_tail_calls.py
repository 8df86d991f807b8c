"""Tail calls as the C++ reference sends them (rpc-protocol.md §6.2), crafted by hand."""

from __future__ import annotations

from typing import Any

from capsvc.framing import FrameDecoder
from capsvc.rpc import wire
from capsvc.rpc.hooks import LocalServerHook
from capsvc.rpc.payload import new_return_payload
from capsvc.rpc.session import RpcSession
from tests.engine.pair import COUNTER_ID, Counter, ManualExecutor, increment, testing, value_of


def sent(session: RpcSession) -> list[Any]:
    decoder = FrameDecoder()
    for frame in session.take_output():
        decoder.feed(frame)
    out = []
    while (segments := decoder.next_message()) is not None:
        out.append(wire.Message.from_segments(segments))
    return out


def give(session: RpcSession, message: Any) -> None:
    session.receive(message.to_segments())


def test_take_from_other_question() -> None:
    executor = ManualExecutor()
    ours = Counter()
    session = RpcSession(LocalServerHook(ours, executor))
    # The peer asks for our bootstrap: our Counter becomes export 0.
    bootstrap = wire.Message.new_message()
    bootstrap.init("bootstrap").questionId = 0
    give(session, bootstrap)
    [answer] = sent(session)
    assert getattr(answer, "return").results.capTable[0].senderHosted == 0
    # We get the peer's bootstrap: import 5.
    theirs = session.bootstrap()
    [question] = sent(session)
    reply = new_return_payload()
    getattr(reply.message, "return").answerId = question.bootstrap.questionId
    reply.set_cap((), LocalServerHook(Counter(), executor))  # stands for the peer's export 5

    def describe(desc: Any, path: Any, hook: Any) -> None:
        desc.senderHosted = 5

    session.receive(reply.write(describe))
    _ = sent(session)  # our Finish for the bootstrap question
    # We call increment(3) on the peer; the peer forwards it back to us as a tail call.
    ours_result = increment(theirs, 3)
    [call] = sent(session)
    q1 = call.call.questionId
    tail = wire.Message.new_message()
    tail_call = tail.init("call")
    tail_call.questionId = 7
    tail_call.target.importedCap = 0
    tail_call.interfaceId = COUNTER_ID
    tail_call.methodId = 0
    tail_call.sendResultsTo.yourself = None
    tail_call.init("params").content.as_struct(
        testing.Counter.schema.methods["increment"].param_type
    ).by = 3
    give(session, tail)
    take = wire.Message.new_message()
    take_body = take.init("return")
    take_body.answerId = q1
    take_body.takeFromOtherQuestion = 7
    give(session, take)
    assert session.closed is None
    executor.run()
    assert value_of(ours_result) == 3
    assert ours.seen == [3]
    kinds = [
        (m.which(), getattr(m, "return").which() if m.which() == "return" else "")
        for m in sent(session)
    ]
    assert ("return", "resultsSentElsewhere") in kinds
    # Our Finish for the question waits until we are done with its results.
    assert ("finish", "") not in kinds
    ours_result.release()
    [finish_ours] = sent(session)
    assert finish_ours.which() == "finish"
    assert finish_ours.finish.questionId == q1
    for answer_id in (7, 0):  # the tail call, then the bootstrap (releasing its cap)
        finish = wire.Message.new_message()
        finish.init("finish").questionId = answer_id
        give(session, finish)
    theirs.release()
    [release] = sent(session)
    assert release.which() == "release"
    assert release.release.id == 5
    assert session.tables_empty(), session.table_sizes()


def test_take_from_a_question_not_sent_to_yourself_aborts() -> None:
    session = RpcSession()
    theirs = session.bootstrap()
    [question] = sent(session)
    take = wire.Message.new_message()
    body = take.init("return")
    body.answerId = question.bootstrap.questionId
    body.takeFromOtherQuestion = 3
    give(session, take)
    assert session.closed is not None
    assert "takeFromOtherQuestion" in (session.abort_reason or "")
    theirs.release()
