"""Per-process memory has a bound: the breaker book and the SDK's dedup guard, filled past it.

(The routing candidate cache needs a store: tests/integration/test_candidate_cache.py.)
"""

from __future__ import annotations

import pytest

from reach.core.flow.breakers import BreakerPolicy, BreakerState, Transition
from reach.hub.flow.breakers import Breakers, Ticket
from reach.sdk.dedup import IdempotencyGuard, answer_size

SMALL = BreakerPolicy(window_s=10, failure_ratio=0.5, min_volume=4, trial_interval_s=30)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def fail(breakers: Breakers, instance_id: str) -> Transition | None:
    return breakers.record(Ticket(instance_id, "a", 0.0, False), False, 0.0, SMALL)


def test_breakers_keep_at_most_maxsize_instances() -> None:
    breakers = Breakers(maxsize=3)
    for i in range(50):  # every agent restart is a new instance UUID
        fail(breakers, f"i-{i}")
    assert len(breakers) == 3


def test_breakers_drop_the_least_recently_answered_instance() -> None:
    breakers = Breakers(maxsize=2)
    fail(breakers, "busy")
    fail(breakers, "busy")
    fail(breakers, "idle")
    fail(breakers, "busy")
    fail(breakers, "new")  # evicts "idle", not "busy" (answered more recently)
    assert fail(breakers, "busy") == Transition(BreakerState.OPEN, 4, 4)
    for _ in range(3):  # "idle" starts afresh: its old failure was forgotten
        assert fail(breakers, "idle") is None
    assert len(breakers) == 2


def answer(n: int) -> tuple[int, dict[str, str]]:
    return 200, {"code": 0, "data": "x" * n}  # type: ignore[dict-item]


def test_dedup_guard_keeps_at_most_capacity_answers() -> None:
    guard = IdempotencyGuard(capacity=5)
    for i in range(20):
        guard.begin(f"t{i}")
        guard.finish(f"t{i}", answer(1), remember=True)
    assert len(guard) == 5
    assert guard.begin("t0").action == "run"  # forgotten: runs again
    assert guard.begin("t19").action == "done"


def test_dedup_guard_holds_at_most_max_bytes_of_answers() -> None:
    one = answer_size(answer(1000))
    guard = IdempotencyGuard(max_bytes=3 * one + one // 2)
    for i in range(10):
        guard.begin(f"t{i}")
        guard.finish(f"t{i}", answer(1000), remember=True)
    assert len(guard) == 3
    assert guard.bytes_held <= guard.max_bytes
    assert [guard.answer_of(f"t{i}") is not None for i in range(10)] == [False] * 7 + [True] * 3


def test_dedup_guard_evicts_the_least_recently_used_answer() -> None:
    one = answer_size(answer(100))
    guard = IdempotencyGuard(max_bytes=2 * one)
    for task_id in ("a", "b"):
        guard.begin(task_id)
        guard.finish(task_id, answer(100), remember=True)
    assert guard.begin("a").action == "done"  # a redelivery of "a": now the most recent
    guard.begin("c")
    guard.finish("c", answer(100), remember=True)
    assert (guard.answer_of("a"), guard.answer_of("b")) == (answer(100), None)


def test_an_answer_larger_than_the_whole_budget_is_not_kept() -> None:
    guard = IdempotencyGuard(max_bytes=100)
    guard.begin("small")
    guard.finish("small", answer(1), remember=True)
    guard.begin("huge")
    guard.finish("huge", answer(1000), remember=True)
    assert guard.answer_of("huge") is None
    assert guard.begin("huge").action == "run"  # not stuck "running" either
    assert guard.answer_of("small") == answer(1)


def test_dedup_answers_expire_after_ttl() -> None:
    clock = Clock()
    guard = IdempotencyGuard(ttl=60, timer=clock)
    guard.begin("t")
    guard.finish("t", answer(1), remember=True)
    clock.t = 59
    assert guard.begin("t").action == "done"
    clock.t = 61
    assert guard.begin("t").action == "run"
    assert len(guard) == 0


@pytest.mark.parametrize(
    "kwargs", [{"capacity": 0}, {"max_bytes": 0}, {"ttl": 0}], ids=["capacity", "bytes", "ttl"]
)
def test_dedup_bounds_must_be_positive(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        IdempotencyGuard(**kwargs)  # type: ignore[arg-type]


def test_agent_configures_its_guard() -> None:
    from reach import Agent

    agent = Agent("a", addr="127.0.0.1:9", allow_loopback=True, dedup_max_bytes=1000, dedup_ttl=5)
    assert agent.dedup.max_bytes == 1000
