"""The question and answer transition tables (capsvc.rpc.lifecycle), every pair of them.

As h2 tests its state machines: every (state x input) pair either moves to the table's
state or raises the typed error for who sent the input. Then the shape rules the engine
relies on, and the drawing in docs/lifecycles.md.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable

import pytest

from capsvc.errors import LocalProtocolError, RemoteProtocolError
from capsvc.rpc.lifecycle import (
    ANSWER_TRANSITIONS,
    QUESTION_TRANSITIONS,
    REMOTE_INPUTS,
    AnswerInput,
    AnswerState,
    QuestionInput,
    QuestionState,
    diagrams,
    step_answer,
    step_question,
)

TABLES: list[tuple[dict, type[enum.Enum], type[enum.Enum], Callable, enum.Enum]] = [
    (
        QUESTION_TRANSITIONS,
        QuestionState,
        QuestionInput,
        step_question,
        QuestionState.AWAITING_RETURN,
    ),
    (ANSWER_TRANSITIONS, AnswerState, AnswerInput, step_answer, AnswerState.RUNNING),
]
PAIRS = [
    (table, step, state, event)
    for table, states, inputs, step, _ in TABLES
    for state in states
    for event in inputs
]


@pytest.mark.parametrize(("table", "step", "state", "event"), PAIRS)
def test_every_state_and_input(
    table: dict, step: Callable, state: enum.Enum, event: enum.Enum
) -> None:
    following = table[state].get(event)
    if following is not None:
        assert step(state, event, 7) is following
        return
    error = RemoteProtocolError if event in REMOTE_INPUTS else LocalProtocolError
    with pytest.raises(error) as info:
        step(state, event, 7)
    entry = "question" if table is QUESTION_TRANSITIONS else "answer"
    assert str(info.value) == f"{event.value} for {entry} 7, which is {state.value}"


@pytest.mark.parametrize(("table", "states", "inputs", "step", "initial"), TABLES)
def test_shape(
    table: dict,
    states: type[enum.Enum],
    inputs: type[enum.Enum],
    step: Callable,
    initial: enum.Enum,
) -> None:
    assert set(table) == set(states)  # every state has a row
    assert table[states["DONE"]] == {}  # DONE is final: the entry is gone
    disconnected = states["DISCONNECTED"]
    for state in states:
        if state.name != "DONE":  # the connection can end in every other state
            assert table[state][inputs["DISCONNECT"]] is disconnected
    # After the connection is gone only local events can come, and change nothing.
    assert all(event not in REMOTE_INPUTS for event in table[disconnected])
    assert set(table[disconnected].values()) == {disconnected}
    # Every state is reachable from the first, and DONE from every live one.
    reached, todo = {initial}, [initial]
    while todo:
        for following in table[todo.pop()].values():
            if following not in reached:
                reached.add(following)
                todo.append(following)
    assert reached == set(states)


def test_the_remote_inputs_are_the_messages() -> None:
    """Only what arrives in a message from the peer may be blamed on the peer."""
    assert {e.name for e in REMOTE_INPUTS} == {
        "RETURN",
        "RETURN_CANCELED",
        "RETURN_TAKE",
        "FINISH",
        "TAKE",
    }


def test_the_drawing_in_the_docs_matches_the_tables() -> None:
    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "lifecycles.md")
    with open(path, encoding="utf-8") as file:
        assert file.read() == diagrams(), "run ./dev docs"
