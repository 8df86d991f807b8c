"""The question table: our calls to the peer, each with its lifecycle (rpc-protocol.md §4).

Theory of operation:
- A ``Question`` is created when a Call or Bootstrap goes out. Its ``state`` moves only
  through ``capsvc.rpc.lifecycle`` (``QuestionTable.advance``); the side effect of each move
  (the Finish, freeing the ID) sits next to the move that causes it, here.
- *Holders* decide when the Finish goes: the caller's interest in the results (the
  CallResult's link), each pipelined capability not yet settled, each pinned reference
  to one (capsvc.rpc.remote.PinnedHook), and each call pipelined on the results that has
  not returned yet (rpc.capnp, Finish: such calls still care about the results). When the
  last holder goes, the input is UNWANTED: before the Return that means cancellation
  (Finish with releaseResultCaps); after it, the ordinary Finish (none when the Return said
  noFinishNeeded). The caller usually drops its
  results right before its next call, so the Finish leaves in the same write.
- The ID is freed once the Return has arrived and the Finish has left (§3): DONE. When
  the connection ends every question becomes DISCONNECTED, where late local events (a
  pipelined capability dropped afterwards) change nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capsvc.errors import RemoteProtocolError
from capsvc.rpc import wire
from capsvc.rpc.hooks import CallResult, Hook, Path
from capsvc.rpc.ids import IdAllocator
from capsvc.rpc.lifecycle import (
    Q_AWAITING_RETURN,
    Q_DONE,
    Q_FINISHED_EARLY,
    Q_RETURNED,
    Q_TAKING,
    QI_DISCONNECT,
    QI_UNWANTED,
    QUESTION_TRANSITIONS,
    QuestionInput,
    QuestionState,
    step_question,
)
from capsvc.rpc.remote import PipelineHook

if TYPE_CHECKING:
    from capsvc.rpc.session import RpcSession


class Question:
    """One of our calls (or bootstrap requests); see the module docstring."""

    __slots__ = (
        "holders",
        "id",
        "no_finish_needed",
        "param_exports",
        "pipelines",
        "result",
        "session",
        "state",
        "table",
        "upstream",
    )

    def __init__(self, table: QuestionTable, question_id: int, result: CallResult) -> None:
        self.table = table
        self.session = table.session
        self.id = question_id
        self.state = Q_AWAITING_RETURN
        #: The caller's results (an uncounted link: the caller owns the references).
        self.result: CallResult | None = result
        self.holders = 1  # the caller's interest in ``result``
        #: Pipelined capabilities not settled yet, by pointer path (rpc-protocol.md §6).
        self.pipelines: dict[Path, PipelineHook] = {}
        #: Export IDs written into the params' cap table (released by releaseParamCaps).
        self.param_exports: list[int] = []
        self.no_finish_needed = False
        #: The question whose pipeline this call was sent to, held until our Return: a
        #: call pipelined on its results still cares about them (rpc.capnp, Finish), so it
        #: is not finished early under us, and a tail call that serves it is not cancelled.
        self.upstream: Question | None = None

    # -------------------------------------------------------------- holders
    def pipeline(self, path: Path) -> Hook:
        """A hook for the capability at ``path`` of the results, before the Return."""
        hook = self.pipelines.get(path)
        if hook is not None:
            return hook.add_ref()
        hook = PipelineHook(self, path)
        self.pipelines[path] = hook
        self.holders += 1
        return hook

    def pipeline_settled(self, hook: PipelineHook) -> None:
        """The Return redirected ``hook``: it no longer needs the question."""
        if self.pipelines.get(hook.path) is hook:
            del self.pipelines[hook.path]
            self.drop_holder()

    def drop_pipeline(self, hook: PipelineHook) -> None:
        """Every owner of an unsettled pipelined capability let go of it."""
        self.pipeline_settled(hook)

    def drop_interest(self) -> None:
        """The caller let go of the results (CallResult's RemoteQuestion protocol).

        The result stays linked (uncounted): it still settles with the Return, so that
        whatever waits on it (an answer we forward for the peer) completes too.
        """
        self.drop_holder()

    def add_holder(self) -> None:
        self.holders += 1

    def drop_holder(self) -> None:
        self.holders -= 1
        if self.holders == 0:
            self.table.advance(self, QI_UNWANTED)

    # -------------------------------------------------------------- wire
    def write_promised_answer(self, builder: Any, path: Path) -> None:
        builder.questionId = self.id
        transform = builder.init("transform", len(path))
        for index, step in enumerate(path):
            transform[index].getPointerField = step


class QuestionTable:
    """Our questions by ID, and the effects of their transitions."""

    __slots__ = ("_ids", "entries", "session")

    def __init__(self, session: RpcSession) -> None:
        self.session = session
        self.entries: dict[int, Question] = {}
        self._ids = IdAllocator()

    def new(self, result: CallResult, upstream: Question | None = None) -> Question:
        """A question for a call about to be sent (to the pipeline of ``upstream``, if set)."""
        question = Question(self, self._ids.allocate(), result)
        self.entries[question.id] = question
        if upstream is not None:
            upstream.add_holder()
            question.upstream = upstream
        return question

    def give_back(self, question: Question) -> None:
        """The Call for ``question`` was never sent: forget it without any message."""
        self._forget(question)
        upstream, question.upstream = question.upstream, None
        if upstream is not None:
            upstream.drop_holder()

    def awaiting_return(self) -> bool:
        """True if a question of ours still waits for its Return (see
        RpcSession.flow_blocked)."""
        return any(question.state is Q_AWAITING_RETURN for question in self.entries.values())

    def awaiting(self, answer_id: int) -> Question:
        """The question a Return names (unknown IDs are violations: rpc-protocol.md §4)."""
        question = self.entries.get(answer_id)
        if question is None:
            raise RemoteProtocolError(f"return for question {answer_id}, which is not awaiting one")
        return question

    def advance(self, question: Question, event: QuestionInput) -> QuestionState:
        """Move ``question`` by ``event`` and do what the move implies."""
        before = question.state
        after = QUESTION_TRANSITIONS[before].get(event) or step_question(before, event, question.id)
        question.state = after
        upstream = question.upstream
        if upstream is not None and after not in (Q_AWAITING_RETURN, Q_FINISHED_EARLY):
            question.upstream = None
            upstream.drop_holder()
        if before is Q_AWAITING_RETURN and after is Q_FINISHED_EARLY:
            self._send_finish(question, release_result_caps=True)
        elif after is Q_DONE:
            if before is Q_RETURNED and not question.no_finish_needed:
                self._send_finish(question, release_result_caps=False)
            self._forget(question)
        return after

    def _send_finish(self, question: Question, *, release_result_caps: bool) -> None:
        session = self.session
        if session.closed is not None:
            return
        # requireEarlyCancellationWorkaround is false (rpc-protocol.md §13.5).
        session.outbox.send(wire.finish_message(question.id, release_result_caps), urgent=False)

    def _forget(self, question: Question) -> None:
        if self.entries.get(question.id) is question:
            del self.entries[question.id]
            self._ids.free(question.id)

    def disconnect_all(self) -> list[Question]:
        """The connection is gone: every question is DISCONNECTED; returns those unanswered."""
        questions, self.entries = self.entries, {}
        unanswered = []
        for question in questions.values():
            if question.state in (Q_AWAITING_RETURN, Q_TAKING):
                unanswered.append(question)
            question.state = step_question(question.state, QI_DISCONNECT, question.id)
            question.upstream = None
        return unanswered
