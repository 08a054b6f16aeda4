"""Tables for the breaker's streak rule: distinct tasks failing in a row open it at once."""

from __future__ import annotations

from typing import Any

import pytest

from reach.core.flow.breakers import (
    BreakerPolicy,
    BreakerPolicyError,
    BreakerState,
    FailureStreak,
    Transition,
)
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.flow.breakers import Breakers, Ticket
from reach.hub.settings import load_settings

# a ratio rule that never opens at these volumes: only the streak can
STREAK3 = BreakerPolicy(min_volume=1000, streak=3)


def test_ten_distinct_failing_tasks_open_it_by_default() -> None:
    assert BreakerPolicy().streak == 10
    assert load_settings(environ={}).router.breaker_streak == 10
    streak = FailureStreak(BreakerPolicy())
    opened = [streak.record(f"t{n}", False, 0.1 * n) for n in range(10)]
    assert opened[:9] == [None] * 9
    assert opened[9] == Transition(BreakerState.OPEN, 10, 10, "streak")


def test_zero_turns_it_off() -> None:
    streak = FailureStreak(BreakerPolicy(streak=0))
    assert all(streak.record(f"t{n}", False, 0.0) is None for n in range(100))


def test_setting_reaches_the_delivery_policy() -> None:
    environ = {"REACH_ROUTER__BREAKER_STREAK": "7"}
    assert DeliveryPolicy.from_settings(load_settings(environ=environ)).breaker.streak == 7


@pytest.mark.parametrize("value", [-1, 1.5, True, "3"])
def test_invalid_streak_names_the_field(value: Any) -> None:
    with pytest.raises(BreakerPolicyError) as caught:
        BreakerPolicy(streak=value)
    assert caught.value.field == "streak"


def feed(policy: BreakerPolicy, events: list[tuple[float, str, str]]) -> list[tuple[int, int]]:
    """Record ``(time, task, "F"|"S")``; return (index, distinct tasks) of each opening."""
    streak = FailureStreak(policy)
    opened = []
    for i, (at, task, kind) in enumerate(events):
        transition = streak.record(task, kind == "S", at)
        if transition is not None:
            assert transition == Transition(
                BreakerState.OPEN, transition.failures, transition.failures, "streak"
            )
            opened.append((i, transition.failures))
    return opened


def fails(tasks: str, at: float = 0.0) -> list[tuple[float, str, str]]:
    return [(at, task, "F") for task in tasks]


@pytest.mark.parametrize(
    ("policy", "events", "expected"),
    [
        pytest.param(STREAK3, fails("ab"), [], id="two-of-three-stay-closed"),
        pytest.param(STREAK3, fails("abc"), [(2, 3)], id="three-distinct-open"),
        pytest.param(STREAK3, fails("aaaaaaab"), [], id="one-task-retrying-counts-once"),
        pytest.param(STREAK3, fails("abab"), [], id="two-tasks-retrying-count-twice"),
        pytest.param(
            STREAK3,
            [*fails("ab"), (0.1, "z", "S"), *fails("cd", 0.2)],
            [],
            id="a-success-ends-the-run",
        ),
        pytest.param(
            STREAK3,
            [*fails("ab"), (0.1, "a", "S"), *fails("cde", 0.2)],
            [(5, 3)],
            id="a-fresh-run-after-a-success",
        ),
        pytest.param(STREAK3, fails("abcdef"), [(2, 3), (5, 3)], id="starts-afresh-after-opening"),
        pytest.param(
            STREAK3,
            [(0.0, "a", "F"), (5.0, "b", "F"), (10.0, "c", "F")],
            [],
            id="a-failure-older-than-the-window-drops-out",
        ),
        pytest.param(
            STREAK3,
            [(0.0, "a", "F"), (5.0, "b", "F"), (6.0, "a", "F"), (10.5, "c", "F")],
            [(3, 3)],
            id="a-task-failing-again-is-as-recent-as-its-last-failure",
        ),
        pytest.param(
            BreakerPolicy(min_volume=0, streak=3), fails("abcdef"), [], id="min-volume-0-disables"
        ),
        pytest.param(BreakerPolicy(streak=1), fails("a"), [(0, 1)], id="streak-1-any-failure"),
    ],
)
def test_streak(
    policy: BreakerPolicy, events: list[tuple[float, str, str]], expected: list[tuple[int, int]]
) -> None:
    assert feed(policy, events) == expected


# -- the per-process book (reach.hub.flow.breakers.Breakers) --------------------------------------


def ticket(instance: str = "i-1", opened_at: float = 0.0) -> Ticket:
    return Ticket(instance, "a", opened_at, False)


def test_the_streak_opens_before_the_window_and_says_so() -> None:
    breakers = Breakers()
    policy = BreakerPolicy(min_volume=4, streak=3)
    assert breakers.record(ticket(), False, 0.0, policy, task_id="a") is None
    assert breakers.record(ticket(), False, 0.0, policy, task_id="b") is None
    opened = breakers.record(ticket(), False, 0.0, policy, task_id="c")
    assert opened == Transition(BreakerState.OPEN, 3, 3, "streak")
    # the window starts afresh too: the same evidence opens nothing a second time
    assert breakers.record(ticket(), False, 0.0, policy, task_id="c") is None


def test_without_a_task_id_only_the_window_counts() -> None:
    breakers = Breakers()
    opened = [breakers.record(ticket(), False, 0.0, STREAK3) for _ in range(10)]
    assert opened == [None] * 10


def test_streaks_are_per_instance_and_per_opening() -> None:
    breakers = Breakers()
    for task in "ab":
        assert breakers.record(ticket("i-1"), False, 0.0, STREAK3, task_id=task) is None
    assert breakers.record(ticket("i-2"), False, 0.0, STREAK3, task_id="c") is None
    # another process opened i-1's breaker at t=1 (and it closed): the run starts again
    assert breakers.record(ticket("i-1", 1.0), False, 2.0, STREAK3, task_id="c") is None
    # a late answer routed before that opening is old evidence: not counted
    assert breakers.record(ticket("i-1", 0.0), False, 2.0, STREAK3, task_id="d") is None
    assert breakers.record(ticket("i-1", 1.0), False, 2.0, STREAK3, task_id="d") is None
    assert breakers.record(ticket("i-1", 1.0), False, 2.0, STREAK3, task_id="e") is not None


def test_forget_ends_the_streak() -> None:
    breakers = Breakers()
    for task in "ab":
        breakers.record(ticket(), False, 0.0, STREAK3, task_id=task)
    breakers.forget("i-1")
    assert breakers.record(ticket(), False, 0.0, STREAK3, task_id="c") is None
