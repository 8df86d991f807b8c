"""The answer table: the peer's calls to us, each with its lifecycle (rpc-protocol.md §4).

Theory of operation:
- An ``Answer`` is created when a Call or Bootstrap arrives and holds the call's
  ``CallResult``. When the result settles, the Return goes out (``_results_ready``); its
  ``state`` moves only through capsvc.rpc.lifecycle, and the effect of each move sits next to
  it here: the Return, the release of result exports, forgetting the entry.
- The Return is built in a place reserved in the outbox first (capsvc.rpc.outbox): whatever
  building it releases (a copied payload's last reference to an import) follows it. If it
  cannot be built (a capability where the payload has no pointer, a value pycapnp rejects),
  the call fails with an exception Return instead; nothing escapes into the code that
  settled the result (a trio task of the runtime).
- After the Return, the answer's pipeline is frozen at what the Return described
  (``frozen``): calls the peer pipelines on the answer, and Disembargos aimed at it, keep
  reaching exactly that (the Tribble rule; C++ ``PostReturnRpcPipeline``).
- Cap-free results need no Finish (noFinishNeeded): the entry goes at once, and a call that
  still names it gets a broken capability (rpc-protocol.md §13.11). A Finish before the
  Return cancels the call (if nothing else wants its results) and it answers 'canceled'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from capsvc.errors import Failed, LimitExceeded, RemoteProtocolError, RpcError
from capsvc.rpc import copying, wire
from capsvc.rpc.hooks import BrokenHook, CallResult, Hook, Path
from capsvc.rpc.lifecycle import (
    A_CANCELING,
    A_DONE,
    A_RETURNED,
    A_RUNNING,
    A_RUNNING_TAKEN,
    AI_DISCONNECT,
    AI_FINISH,
    AI_RESULTS,
    AI_RESULTS_NO_FINISH,
    AI_TAKE,
    ANSWER_TRANSITIONS,
    AnswerInput,
    AnswerState,
    step_answer,
)
from capsvc.rpc.payload import CodecPayload, WritablePayload, new_return_payload

if TYPE_CHECKING:
    from capsvc.rpc.session import RpcSession

log = logging.getLogger("capsvc")


def _no_caps(desc: Any, index: int, hook: Hook) -> None:
    """The describer of cap-free results (never called: there is no cap table)."""


class Answer:
    """One of the peer's calls; see the module docstring."""

    __slots__ = ("frozen", "id", "redirected", "result", "result_exports", "size", "state")

    def __init__(self, answer_id: int, result: CallResult, redirected: bool, size: int) -> None:
        self.id = answer_id
        self.state = A_RUNNING
        #: The Call message's size in bytes, counted against the flow budget while it runs.
        self.size = size
        self.result = result  # owned
        #: Sent with sendResultsTo.yourself: the results wait for a takeFromOtherQuestion.
        self.redirected = redirected
        #: Export IDs written into the results' cap table (released by releaseResultCaps).
        self.result_exports: list[int] = []
        #: After the Return: what it described, where that differs from the results' hooks
        #: (keyed by the id of the results' hook: the results hold it while this does).
        self.frozen: dict[int, Hook] | None = None


#: The states of an answer whose Return is not sent yet: a call in flight (flow budget).
_IN_FLIGHT = frozenset((A_RUNNING, A_RUNNING_TAKEN, A_CANCELING))


class AnswerTable:
    """The peer's calls to us by the peer's question ID, and what of them is in flight."""

    __slots__ = ("entries", "in_flight", "in_flight_bytes", "session")

    def __init__(self, session: RpcSession) -> None:
        self.session = session
        self.entries: dict[int, Answer] = {}
        #: Answers whose Return is not sent yet, and their Call messages' bytes (the
        #: session's flow budget, Limits.max_calls_in_flight / max_call_bytes_in_flight).
        self.in_flight = 0
        self.in_flight_bytes = 0

    # -------------------------------------------------------------- creating, pipelining
    def start(self, answer_id: int, result: CallResult, *, redirected: bool, size: int) -> None:
        """A call (or bootstrap) ``answer_id`` arrived; its results settle ``result``.

        Raises LimitExceeded (the connection is aborted) when the peer already holds
        Limits.max_answers answers: calls running, or returned and not yet finished.
        """
        limit = self.session.max_answers
        if len(self.entries) >= limit:
            raise LimitExceeded(
                "max_answers",
                limit,
                f"the peer would hold {len(self.entries) + 1} unfinished calls",
            )
        answer = Answer(answer_id, result, redirected, size)
        self.entries[answer_id] = answer
        self.in_flight += 1
        self.in_flight_bytes += size
        result.add_done_callback(lambda _: self._results_ready(answer))

    def pipelined(self, answer_id: int, path: Path, unknown: str) -> Hook:
        """A new reference to the capability at ``path`` of an answer's results (a call's
        promisedAnswer target, a receiverAnswer descriptor, a Disembargo's target). A gone
        answer gives a capability broken with ``unknown`` (rpc.c++ getMessageTarget)."""
        answer = self.entries.get(answer_id)
        if answer is None or answer.state is A_CANCELING:
            return BrokenHook(Failed(unknown))
        frozen = answer.frozen
        if frozen is not None:
            returned = answer.result.payload.cap_at(path)
            if returned is not None:
                described = frozen.get(id(returned))
                returned.release()
                if described is not None:
                    return described.add_ref()
        return answer.result.pipeline(path)

    def advance(self, answer: Answer, event: AnswerInput) -> AnswerState:
        before = answer.state
        after = ANSWER_TRANSITIONS[before].get(event) or step_answer(before, event, answer.id)
        answer.state = after
        if before in _IN_FLIGHT and after not in _IN_FLIGHT:
            self._landed(answer)
        if after is A_DONE:
            self._forget(answer)
        return after

    def _landed(self, answer: Answer) -> None:
        """``answer`` is no longer in flight (its Return went, or the connection ended)."""
        session = self.session
        blocked = session.on_flow_released is not None and session.flow_blocked
        self.in_flight -= 1
        self.in_flight_bytes -= answer.size
        if blocked and not session.flow_blocked:
            assert session.on_flow_released is not None
            session.on_flow_released()
        if self.in_flight == 0 and session.on_idle is not None:
            session.on_idle()

    # -------------------------------------------------------------- from the peer
    def on_finish(self, question_id: int, release: bool) -> None:
        """The peer's Finish for ``question_id`` (``release``: its releaseResultCaps)."""
        answer = self.entries.get(question_id)
        if answer is None:
            return  # it may have crossed our noFinishNeeded Return (rpc-protocol.md §13.8)
        exports, answer.result_exports = answer.result_exports, []
        if self.advance(answer, AI_FINISH) is A_CANCELING:
            if not answer.result.pipelined:
                # Nothing is pipelined on the results: cancel the work (§4 callee step 4);
                # a call not started yet never starts. If something is (a call, or a
                # capability of this answer the peer passed back to us as receiverAnswer),
                # the call runs on and answers 'canceled' (rpc.capnp, Finish).
                answer.result.cancel()
        elif release:
            self.session.exports.release_all(exports)

    def take(self, answer_id: int) -> Answer:
        """Our question's Return said takeFromOtherQuestion = ``answer_id`` (§6.2)."""
        answer = self.entries.get(answer_id)
        if answer is None or not answer.redirected:
            raise RemoteProtocolError(
                f"takeFromOtherQuestion names answer {answer_id}, which was not sent to 'yourself'"
            )
        self.advance(answer, AI_TAKE)
        return answer

    # -------------------------------------------------------------- the Return
    def _results_ready(self, answer: Answer) -> None:
        if self.session.closed is not None or self.entries.get(answer.id) is not answer:
            return
        if answer.state is A_CANCELING:
            self._send_simple_return(answer, "canceled")
        elif answer.redirected:
            # rpc-protocol.md §6.2: always resultsSentElsewhere, even when the call failed
            # (C++ aborts otherwise); the caller learns the outcome through its take.
            self._send_simple_return(answer, "resultsSentElsewhere")
        elif answer.result.error is not None:
            self._send_exception_return(answer, answer.result.error)
        else:
            self._send_results(answer)

    def _send_results(self, answer: Answer) -> None:
        outbox = self.session.outbox
        place = outbox.reserve()
        frozen: dict[int, Hook] = {}
        try:
            segments, no_caps = self._build_results(answer, frozen)
        except Exception as error:  # never into whoever settled the result
            outbox.give_up(place)
            self._undo_results(answer, frozen)
            log.warning("could not send the results of call %d: %r", answer.id, error)
            self._send_exception_return(answer, Failed(f"results could not be sent: {error}"))
            return
        outbox.fill(place, segments)
        answer.frozen = frozen or None
        # rpc-protocol.md §4 callee step 3: cap-free results need no Finish (C++ does this).
        if self.advance(answer, AI_RESULTS_NO_FINISH if no_caps else AI_RESULTS) is A_RETURNED:
            # Until the Finish, only the results' capabilities can still be asked for
            # (pipelined calls, Disembargos): the content need not be held (Limits).
            answer.result.keep_caps_only()

    def _build_results(
        self, answer: Answer, frozen: dict[int, Hook]
    ) -> tuple[list[bytes | bytearray], bool]:
        payload = answer.result.payload
        copied = not (
            isinstance(payload, WritablePayload)
            and payload.content_path == wire.RETURN_CONTENT_PATH
        )
        if copied:
            payload = copying.copy_to_return(payload, new_return_payload())
        assert isinstance(payload, WritablePayload)
        no_caps = not any(hook is not None for hook in payload.caps)
        if isinstance(payload, CodecPayload):
            payload.write_return_header(answer.id, no_caps)
        else:
            body = payload.header()
            body.answerId = answer.id
            body.releaseParamCaps = False
            if no_caps:
                body.noFinishNeeded = True
        segments = payload.write(_no_caps if no_caps else self._describer(answer, frozen))
        if copied:
            payload.release()  # after the place was reserved: its drops follow the Return
        limit = self.session.limits.max_message_words
        wire.check_sendable(segments, limit, "the Return")
        return segments, no_caps

    def _describer(
        self, answer: Answer, frozen: dict[int, Hook]
    ) -> Callable[[Any, int, Hook], None]:
        describe = self.session.exports.describe_pinned
        exports = answer.result_exports

        def write(desc: Any, index: int, hook: Hook) -> None:
            described = describe(desc, hook, exports)
            if described is None:
                return
            if described is hook:
                described.release()
            else:
                frozen[id(hook)] = described

        return write

    def _undo_results(self, answer: Answer, frozen: dict[int, Hook]) -> None:
        """The Return was not sent: the exports its cap table counted were never seen."""
        exports, answer.result_exports = answer.result_exports, []
        self.session.exports.release_all(exports)
        for hook in frozen.values():
            hook.release()

    def _send_simple_return(self, answer: Answer, which: str) -> None:
        message = wire.Message.new_message()
        body = message.init("return")
        body.answerId = answer.id
        body.releaseParamCaps = False
        setattr(body, which, None)
        self.session.outbox.send(message.to_segments())
        self.advance(answer, AI_RESULTS)

    def _send_exception_return(self, answer: Answer, error: RpcError) -> None:
        message = wire.Message.new_message()
        body = message.init("return")
        body.answerId = answer.id
        body.releaseParamCaps = False
        wire.write_exception(body.init("exception"), error)
        self.session.outbox.send(message.to_segments())
        self.advance(answer, AI_RESULTS)

    # -------------------------------------------------------------- the end
    def _forget(self, answer: Answer) -> None:
        if self.entries.get(answer.id) is answer:
            del self.entries[answer.id]
        frozen, answer.frozen = answer.frozen, None
        for hook in (frozen or {}).values():
            hook.release()
        answer.result.release()

    def close(self) -> None:
        """The connection is gone: cancel what runs, drop everything (rpc-protocol.md §10)."""
        answers, self.entries = self.entries, {}
        self.in_flight = self.in_flight_bytes = 0
        if self.session.on_flow_released is not None:
            self.session.on_flow_released()
        for answer in answers.values():
            answer.state = step_answer(answer.state, AI_DISCONNECT, answer.id)
            frozen, answer.frozen = answer.frozen, None
            for hook in (frozen or {}).values():
                hook.release()
            answer.result.cancel()
            answer.result.release()
