"""The fuzz target for the input path: framing decoder, then engine (issue 11).

``one_input(data)`` treats ``data`` as the byte stream a peer sends: it is framed by
``FrameDecoder`` and every whole message goes to an ``RpcSession`` that hosts a
FakeTester (tests/engine/pair.py), whose calls run at once. The properties, asserted for
every input: only ``FramingError`` comes out of the decoder and nothing out of
``receive``; while the session is open every table is within ``LIMITS``; once it is
closed it holds nothing. The Hypothesis tests (tests/test_fuzz.py) and the
coverage-guided runner (tests/fuzz/atheris_main.py) share it, and CI replays the corpus
that runner keeps (tests/fuzz/corpus/).
"""

from __future__ import annotations

from capsvc.errors import Failed, FramingError
from capsvc.framing import FrameDecoder, encode_messages
from capsvc.limits import Limits
from capsvc.rpc import wire
from capsvc.rpc.hooks import LocalServerHook
from capsvc.rpc.session import RpcSession
from tests.engine.pair import TESTER_ID, FakeTester, ManualExecutor, testing

#: Small limits, so that a few dozen messages reach them.
LIMITS = Limits(
    max_segments=8,
    max_message_words=4096,
    traversal_limit_words=4096,
    nesting_limit=16,
    max_answers=6,
    max_imports=6,
    max_exports=6,
    max_questions=6,
)


class SafeExecutor(ManualExecutor):
    """Runs the FakeTester's calls; a method that trips over hostile params fails its
    call, as capsvc's runtime does (the fake is not under test, the engine is)."""

    def run(self, limit: int | None = None) -> int:
        done = 0
        while self.pending:
            server, call = self.pending.pop(0)
            try:
                if not call.result.done and call.result.refs > 0:
                    server.handle(call)
            except Exception as error:
                call.result.set_error(Failed(repr(error)))
            call.params.release()
            done += 1
        return done


def new_session() -> tuple[RpcSession, SafeExecutor]:
    executor = SafeExecutor()
    hook = LocalServerHook(FakeTester(executor), executor)
    return RpcSession(hook, limits=LIMITS), executor


def check_bounded(session: RpcSession) -> None:
    if session.closed is None:
        assert len(session.answers.entries) <= LIMITS.max_answers
        assert len(session.imports.entries) <= LIMITS.max_imports
        assert len(session.exports.entries) <= LIMITS.max_exports
        assert len(session.questions.entries) <= LIMITS.max_questions
        assert 0 <= session.answers.in_flight <= len(session.answers.entries)


def run_stream(session: RpcSession, executor: SafeExecutor, decoder: FrameDecoder) -> None:
    """Deliver every whole message the decoder holds (a framing error ends the stream)."""
    try:
        while (segments := decoder.next_message()) is not None:
            session.receive(segments)  # must never raise
            executor.run()
            session.take_output()
            check_bounded(session)
            if session.closed is not None:
                return
    except FramingError:
        session.abort("framing")


def finish(session: RpcSession, executor: SafeExecutor) -> None:
    session.close(Failed("the input is over"))
    executor.run()
    assert session.tables_empty(), session.table_sizes()


def one_input(data: bytes) -> None:
    session, executor = new_session()
    decoder = FrameDecoder(LIMITS)
    decoder.feed(data)
    run_stream(session, executor, decoder)
    finish(session, executor)


def seeds() -> dict[str, bytes]:
    """Valid conversations to start the corpus from (each a stream of framed messages)."""
    echo = testing.Tester.schema.methods["echo"].param_type
    hold = testing.Tester.schema.methods["holdCaps"].param_type

    def message(kind: str, fill: object) -> list[bytes]:
        built = wire.Message.new_message()
        fill(built.init(kind))  # type: ignore[operator]
        return [bytes(s) for s in built.to_segments()]

    def bootstrap(body: object) -> None:
        body.questionId = 0  # type: ignore[attr-defined]

    def call_echo(body: object) -> None:
        body.questionId = 1  # type: ignore[attr-defined]
        body.target.init("promisedAnswer").questionId = 0  # type: ignore[attr-defined]
        body.interfaceId = TESTER_ID  # type: ignore[attr-defined]
        body.methodId = 0  # type: ignore[attr-defined]
        body.init("params").content.as_struct(echo).msg = "hi"  # type: ignore[attr-defined]

    def call_hold(body: object) -> None:
        body.questionId = 2  # type: ignore[attr-defined]
        body.target.init("promisedAnswer").questionId = 0  # type: ignore[attr-defined]
        body.interfaceId = TESTER_ID  # type: ignore[attr-defined]
        body.methodId = 3  # type: ignore[attr-defined]
        params = body.init("params")  # type: ignore[attr-defined]
        params.content.as_struct(hold).init("holder").name = "h"
        table = params.init("capTable", 2)
        table[0].senderHosted = 5
        table[1].senderPromise = 6

    def finish_of(question: int) -> object:
        def fill(body: object) -> None:
            body.questionId = question  # type: ignore[attr-defined]

        return fill

    def resolve(body: object) -> None:
        body.promiseId = 6  # type: ignore[attr-defined]
        body.init("cap").senderHosted = 7  # type: ignore[attr-defined]

    def release(body: object) -> None:
        body.id = 0  # type: ignore[attr-defined]
        body.referenceCount = 1  # type: ignore[attr-defined]

    def disembargo(body: object) -> None:
        body.target.importedCap = 0  # type: ignore[attr-defined]
        body.context.senderLoopback = 0  # type: ignore[attr-defined]

    parts = {
        "bootstrap": [message("bootstrap", bootstrap)],
        "echo": [message("bootstrap", bootstrap), message("call", call_echo)],
        "hold": [
            message("bootstrap", bootstrap),
            message("call", call_hold),
            message("resolve", resolve),
            message("finish", finish_of(2)),
        ],
        "release": [
            message("bootstrap", bootstrap),
            message("finish", finish_of(0)),
            message("release", release),
            message("disembargo", disembargo),
        ],
    }
    return {name: encode_messages(frames) for name, frames in parts.items()}
