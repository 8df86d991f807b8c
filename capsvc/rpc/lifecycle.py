"""The lifecycles of questions and answers, as data (h11's rule 1: every state and every
transition lives in this file).

Theory of operation: a question (one of our calls) and an answer (one of the peer's calls)
each have exactly one state field. Every message received about them and every local event
(the results are ready, nobody wants them any more, the connection is gone) is an *input*;
``step(table, state, input)`` gives the next state, or raises if the input is illegal in that
state. Inputs that come from the peer are checked against the same table, so a second Return,
a Return 'canceled' for a question we never finished or a second take of one answer is a
``RemoteProtocolError`` (the connection is aborted with its text); an illegal local input is
an engine bug, a ``LocalProtocolError``. The side effects of each transition (sending the
Finish or the Return, freeing the ID) are done by the owner of the entry
(capsvc.rpc.questions, capsvc.rpc.answers), each next to the transition that causes it.

Questions (rpc-protocol.md §4, caller side)::

    AWAITING_RETURN --RETURN--> RETURNED --UNWANTED--> DONE        (Finish, unless not needed)
    AWAITING_RETURN --RETURN_TAKE--> TAKING --TAKE_SETTLED--> RETURNED
    AWAITING_RETURN --UNWANTED--> FINISHED_EARLY --RETURN*--> DONE (Finish releaseResultCaps)
    any but DONE --DISCONNECT--> DISCONNECTED

Answers (rpc-protocol.md §4, callee side, and §6.2 for answers to ``yourself`` calls)::

    RUNNING --RESULTS--> RETURNED --FINISH--> DONE
    RUNNING --RESULTS_NO_FINISH--> DONE                            (noFinishNeeded)
    RUNNING --FINISH--> CANCELING --RESULTS--> DONE                (Return 'canceled')
    RUNNING / RETURNED --TAKE--> RUNNING_TAKEN / RETURNED_TAKEN    (each answer taken once)
    any but DONE --DISCONNECT--> DISCONNECTED
"""

from __future__ import annotations

import enum
from typing import Final, NoReturn

from capsvc.errors import LocalProtocolError, RemoteProtocolError


class QuestionState(enum.Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own hash runs Python code

    #: The Call (or Bootstrap) is sent; no Return yet.
    AWAITING_RETURN = "awaiting return"
    #: Nobody wanted the results before they came: we sent Finish(releaseResultCaps).
    FINISHED_EARLY = "finished early"
    #: The Return said takeFromOtherQuestion; the results come from one of our answers.
    TAKING = "taking results from another question"
    #: The results are here; the Finish waits until nothing uses the question any more.
    RETURNED = "returned"
    #: Return received and Finish sent (or not needed): the ID is free again.
    DONE = "done"
    #: The connection ended first; nothing more is sent or received for it.
    DISCONNECTED = "disconnected"


class QuestionInput(enum.Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own hash runs Python code

    RETURN = "Return"  # results, exception (or resultsSentElsewhere: an error for us)
    RETURN_CANCELED = "Return 'canceled'"
    RETURN_TAKE = "Return 'takeFromOtherQuestion'"
    TAKE_SETTLED = "the answer we take results from settled"  # local
    UNWANTED = "nothing uses the question any more"  # local
    DISCONNECT = "the connection is gone"  # local


class AnswerState(enum.Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own hash runs Python code

    #: The call runs (or waits to run, or was forwarded); no Return sent yet.
    RUNNING = "running"
    #: As RUNNING, and the peer has already claimed the results (takeFromOtherQuestion).
    RUNNING_TAKEN = "running, results taken"
    #: The peer sent Finish first: when the call ends we send Return 'canceled'.
    CANCELING = "canceling"
    #: The Return is sent; the answer's pipeline stays until the Finish.
    RETURNED = "returned"
    #: As RETURNED, and the peer has claimed the results.
    RETURNED_TAKEN = "returned, results taken"
    #: Return sent and Finish received (or not needed): the entry is gone.
    DONE = "done"
    #: The connection ended first; the call's outcome is dropped when it comes.
    DISCONNECTED = "disconnected"


class AnswerInput(enum.Enum):
    __hash__ = object.__hash__  # members are singletons; Enum's own hash runs Python code

    RESULTS = "the call ended (Return sent)"  # local
    RESULTS_NO_FINISH = "the call ended with cap-free results (noFinishNeeded)"  # local
    FINISH = "Finish"
    TAKE = "takeFromOtherQuestion"  # a Return of ours naming this answer
    DISCONNECT = "the connection is gone"  # local


# Every member as a module constant. Compiled by mypyc, naming one of these is a load from
# the module's globals, while ``QuestionState.DONE`` is an attribute lookup on the enum
# class (about 900 instructions; the engine makes a dozen per call).
Q_AWAITING_RETURN: Final = QuestionState.AWAITING_RETURN
Q_FINISHED_EARLY: Final = QuestionState.FINISHED_EARLY
Q_TAKING: Final = QuestionState.TAKING
Q_RETURNED: Final = QuestionState.RETURNED
Q_DONE: Final = QuestionState.DONE
Q_DISCONNECTED: Final = QuestionState.DISCONNECTED
QI_RETURN: Final = QuestionInput.RETURN
QI_RETURN_CANCELED: Final = QuestionInput.RETURN_CANCELED
QI_RETURN_TAKE: Final = QuestionInput.RETURN_TAKE
QI_TAKE_SETTLED: Final = QuestionInput.TAKE_SETTLED
QI_UNWANTED: Final = QuestionInput.UNWANTED
QI_DISCONNECT: Final = QuestionInput.DISCONNECT
A_RUNNING: Final = AnswerState.RUNNING
A_RUNNING_TAKEN: Final = AnswerState.RUNNING_TAKEN
A_CANCELING: Final = AnswerState.CANCELING
A_RETURNED: Final = AnswerState.RETURNED
A_RETURNED_TAKEN: Final = AnswerState.RETURNED_TAKEN
A_DONE: Final = AnswerState.DONE
A_DISCONNECTED: Final = AnswerState.DISCONNECTED
AI_RESULTS: Final = AnswerInput.RESULTS
AI_RESULTS_NO_FINISH: Final = AnswerInput.RESULTS_NO_FINISH
AI_FINISH: Final = AnswerInput.FINISH
AI_TAKE: Final = AnswerInput.TAKE
AI_DISCONNECT: Final = AnswerInput.DISCONNECT


Q, QI = QuestionState, QuestionInput
A, AI = AnswerState, AnswerInput

QUESTION_TRANSITIONS: dict[QuestionState, dict[QuestionInput, QuestionState]] = {
    Q.AWAITING_RETURN: {
        QI.RETURN: Q.RETURNED,
        QI.RETURN_TAKE: Q.TAKING,
        QI.UNWANTED: Q.FINISHED_EARLY,
        QI.DISCONNECT: Q.DISCONNECTED,
    },
    Q.FINISHED_EARLY: {
        QI.RETURN: Q.DONE,
        QI.RETURN_CANCELED: Q.DONE,
        QI.RETURN_TAKE: Q.DONE,
        QI.DISCONNECT: Q.DISCONNECTED,
    },
    Q.TAKING: {
        QI.TAKE_SETTLED: Q.RETURNED,
        QI.UNWANTED: Q.TAKING,  # the Finish waits until the results have settled
        QI.DISCONNECT: Q.DISCONNECTED,
    },
    Q.RETURNED: {
        QI.UNWANTED: Q.DONE,
        QI.DISCONNECT: Q.DISCONNECTED,
    },
    Q.DONE: {},
    Q.DISCONNECTED: {
        QI.UNWANTED: Q.DISCONNECTED,
        QI.TAKE_SETTLED: Q.DISCONNECTED,
        QI.DISCONNECT: Q.DISCONNECTED,
    },
}

ANSWER_TRANSITIONS: dict[AnswerState, dict[AnswerInput, AnswerState]] = {
    A.RUNNING: {
        AI.RESULTS: A.RETURNED,
        AI.RESULTS_NO_FINISH: A.DONE,
        AI.FINISH: A.CANCELING,
        AI.TAKE: A.RUNNING_TAKEN,
        AI.DISCONNECT: A.DISCONNECTED,
    },
    A.RUNNING_TAKEN: {
        AI.RESULTS: A.RETURNED_TAKEN,
        AI.FINISH: A.CANCELING,
        AI.DISCONNECT: A.DISCONNECTED,
    },
    A.CANCELING: {
        AI.RESULTS: A.DONE,
        AI.DISCONNECT: A.DISCONNECTED,
    },
    A.RETURNED: {
        AI.FINISH: A.DONE,
        AI.TAKE: A.RETURNED_TAKEN,
        AI.DISCONNECT: A.DISCONNECTED,
    },
    A.RETURNED_TAKEN: {
        AI.FINISH: A.DONE,
        AI.DISCONNECT: A.DISCONNECTED,
    },
    A.DONE: {},
    A.DISCONNECTED: {
        AI.RESULTS: A.DISCONNECTED,
        AI.RESULTS_NO_FINISH: A.DISCONNECTED,
        AI.DISCONNECT: A.DISCONNECTED,
    },
}

#: Inputs that arrive in messages from the peer; any other input is a local event.
REMOTE_INPUTS: frozenset[enum.Enum] = frozenset(
    {QI.RETURN, QI.RETURN_CANCELED, QI.RETURN_TAKE, AI.FINISH, AI.TAKE}
)


def step_question(state: QuestionState, event: QuestionInput, question_id: int) -> QuestionState:
    """The question's next state; raises if ``event`` is illegal in ``state``."""
    following = QUESTION_TRANSITIONS[state].get(event)
    if following is None:
        _illegal(f"question {question_id}", state, event)
    return following


def step_answer(state: AnswerState, event: AnswerInput, answer_id: int) -> AnswerState:
    """The answer's next state; raises if ``event`` is illegal in ``state``."""
    following = ANSWER_TRANSITIONS[state].get(event)
    if following is None:
        _illegal(f"answer {answer_id}", state, event)
    return following


def _illegal(entry: str, state: enum.Enum, event: enum.Enum) -> NoReturn:
    error = RemoteProtocolError if event in REMOTE_INPUTS else LocalProtocolError
    raise error(f"{event.value} for {entry}, which is {state.value}")


def diagram(
    title: str,
    table: dict[QuestionState, dict[QuestionInput, QuestionState]]
    | dict[AnswerState, dict[AnswerInput, AnswerState]],
    initial: enum.Enum,
) -> str:
    """A Mermaid state diagram of ``table`` (docs/lifecycles.md is made of these)."""
    lines = [f"### {title}", "", "```mermaid", "stateDiagram-v2", f"    [*] --> {initial.name}"]
    for state, moves in table.items():
        for event, following in moves.items():
            if following is not state:
                lines.append(f"    {state.name} --> {following.name}: {event.name}")
    lines += ["```", ""]
    return "\n".join(lines)


def diagrams() -> str:
    """docs/lifecycles.md: both lifecycles, drawn from the tables above."""
    return "\n".join(
        [
            "# Question and answer lifecycles",
            "",
            "Drawn from the transition tables of `capsvc/rpc/lifecycle.py` by `./dev docs`",
            "(tests/engine/test_lifecycle.py checks that this file matches them).",
            "Self-loops (inputs a state absorbs) are left out; every input not drawn from a",
            "state is illegal there: a `RemoteProtocolError` (the connection is aborted) when",
            "the peer sent it, a `LocalProtocolError` when it is a local event.",
            "",
            diagram("Questions (our calls)", QUESTION_TRANSITIONS, Q.AWAITING_RETURN),
            diagram("Answers (the peer's calls)", ANSWER_TRANSITIONS, A.RUNNING),
        ]
    )
