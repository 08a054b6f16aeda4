"""The task lifecycle table: every legal move and its target, every other move refused."""

from __future__ import annotations

import itertools

import pytest

from reach.core.ledger import lifecycle
from reach.core.ledger.lifecycle import (
    TRANSITIONS,
    TaskEvent,
    ending,
    sources_of,
    target_of,
    transition,
)
from reach.core.ledger.statuses import LIVE, TERMINAL, TaskStatus
from reach.errors import IllegalTransition, TaskConflict

S, E = TaskStatus, TaskEvent

# Written out by hand, not derived from the table: (from, event) -> to.
LEGAL: dict[tuple[TaskStatus, TaskEvent], TaskStatus] = {
    (S.PENDING, E.CLAIM): S.DISPATCHING,
    (S.DISPATCHING, E.RECLAIM): S.DISPATCHING,
    (S.DISPATCHING, E.ACCEPT): S.EXECUTING,
    (S.DISPATCHING, E.RETRY): S.PENDING,
    (S.EXECUTING, E.RETRY): S.PENDING,  # the watchdog
    (S.PENDING, E.SUCCEED): S.SUCCESS,  # a late report after a retry was queued
    (S.DISPATCHING, E.SUCCEED): S.SUCCESS,
    (S.EXECUTING, E.SUCCEED): S.SUCCESS,
    (S.PENDING, E.FAIL): S.FAILED,
    (S.DISPATCHING, E.FAIL): S.FAILED,
    (S.EXECUTING, E.FAIL): S.FAILED,
    (S.PENDING, E.DEAD_LETTER): S.DEAD,
    (S.DISPATCHING, E.DEAD_LETTER): S.DEAD,
    (S.EXECUTING, E.DEAD_LETTER): S.DEAD,
    (S.PENDING, E.CANCEL): S.CANCELLED,
    (S.DISPATCHING, E.CANCEL): S.CANCELLED,
    (S.EXECUTING, E.CANCEL): S.CANCELLED,
    (S.AWAITING_APPROVAL, E.CANCEL): S.CANCELLED,
    (S.AWAITING_APPROVAL, E.APPROVE): S.PENDING,
    (S.AWAITING_APPROVAL, E.REJECT): S.FAILED,
    (S.DEAD, E.REPLAY): S.PENDING,
    # an A2A agent asking for input or authorisation, and going on
    (S.DISPATCHING, E.WAIT): S.WAITING,
    (S.EXECUTING, E.WAIT): S.WAITING,
    (S.WAITING, E.RESUME): S.EXECUTING,
    (S.WAITING, E.RETRY): S.PENDING,  # its follow lost the agent: a new attempt
    (S.WAITING, E.SUCCEED): S.SUCCESS,
    (S.WAITING, E.FAIL): S.FAILED,
    (S.WAITING, E.DEAD_LETTER): S.DEAD,
    (S.WAITING, E.CANCEL): S.CANCELLED,
}
ILLEGAL = [pair for pair in itertools.product(TaskStatus, TaskEvent) if pair not in LEGAL]


@pytest.mark.parametrize(("move", "expected"), LEGAL.items(), ids=lambda v: str(v))
def test_legal_transition(move: tuple[TaskStatus, TaskEvent], expected: TaskStatus) -> None:
    current, event = move
    assert transition(current, event) is expected
    assert current in sources_of(event)
    assert target_of(event) is expected


@pytest.mark.parametrize(("current", "event"), ILLEGAL, ids=lambda v: str(v))
def test_illegal_transition_is_refused(current: TaskStatus, event: TaskEvent) -> None:
    with pytest.raises(IllegalTransition) as caught:
        transition(current, event)
    assert current not in sources_of(event)
    problem = caught.value.to_problem()
    assert problem["status"] == 409
    assert (problem["task_status"], problem["event"]) == (current, event)
    assert str(current) in caught.value.detail


def test_the_product_is_covered_and_the_table_says_no_more() -> None:
    assert len(LEGAL) + len(ILLEGAL) == len(TaskStatus) * len(TaskEvent)
    from_table = {
        (source, event): target
        for event, (sources, target) in TRANSITIONS.items()
        for source in sources
    }
    assert from_table == LEGAL
    assert set(TRANSITIONS) == set(TaskEvent)


def test_strings_read_back_from_a_row_are_the_members() -> None:
    """A stored value is the enum's string, so a row's status works as a member."""
    assert transition("pending", E.CLAIM) == "dispatching"  # type: ignore[arg-type]
    assert {s.value for s in TaskStatus} == {
        "pending", "dispatching", "executing", "waiting", "awaiting_approval",
        "success", "failed", "dead", "cancelled",
    }  # fmt: skip


def test_terminal_states_have_no_way_out_but_an_operators_replay() -> None:
    for status, event in itertools.product(TERMINAL, TaskEvent):
        if (status, event) != (S.DEAD, E.REPLAY):
            with pytest.raises(IllegalTransition):
                transition(status, event)


def test_every_live_task_can_end_in_every_terminal_state() -> None:
    for status, terminal in itertools.product(LIVE, TERMINAL):
        assert transition(status, ending(terminal)) is terminal


@pytest.mark.parametrize("status", sorted(set(TaskStatus) - TERMINAL))
def test_ending_is_only_for_terminal_states(status: TaskStatus) -> None:
    with pytest.raises(ValueError, match="not a terminal status"):
        ending(status)


def test_claim_and_reclaim_lead_to_the_same_status() -> None:
    """The claim statement writes one status for both (see reach.hub.delivery._CLAIM)."""
    assert target_of(E.CLAIM) is target_of(E.RECLAIM) is S.DISPATCHING


def test_an_illegal_transition_is_a_task_conflict() -> None:
    """Callers that catch TaskConflict (409) keep catching a refused move."""
    assert issubclass(IllegalTransition, TaskConflict)
    assert lifecycle.__all__  # the module's surface is declared
