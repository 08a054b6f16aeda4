"""Retry budgets per caller and target pair (seed 004), on both stores' hub-wide counts:
a caller whose tasks all fail spends a share of its own requests, not the room other
callers' healthy traffic makes in the target's budget."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import Engine

from reach.core.flow.retry_budget import RetryBudget
from reach.core.ledger.statuses import TaskStatus
from reach.hub.flow import retry_budget
from reach.hub.flow.shared_counts import SharedCounts
from reach.hub.storage import session_factory
from reach.hub.storage.models import TaskRow

NOW = 1_800_000_000.0
BUDGET = RetryBudget(ratio=0.2, min_per_s=0.1, window_s=20)  # 0.2 x first requests + 2
FLAKY, STEADY = "key:flaky-caller", "key:steady-caller"


@pytest.fixture
def shared(engine: Engine) -> SharedCounts:
    return SharedCounts(session_factory(engine), flush_every=0.0, background=False)


def deliveries(shared: SharedCounts, caller: str | None, first: int, retries: int) -> None:
    for i in range(first):
        retry_budget.count(shared, "orders", False, NOW - 10 + i * 0.01, caller)
    for i in range(retries):
        retry_budget.count(shared, "orders", True, NOW - 5 + i * 0.01, caller)


def test_a_caller_retrying_into_a_busy_target_spends_its_own_budget(
    shared: SharedCounts,
) -> None:
    deliveries(shared, STEADY, first=100, retries=0)  # healthy traffic: target room 22
    deliveries(shared, FLAKY, first=5, retries=5)  # its pair's room: 0.2 x 5 + 2 = 3
    rng = random.Random(1)
    assert retry_budget.gate(shared, "orders", NOW, BUDGET, rng, caller=FLAKY) is not None
    assert retry_budget.gate(shared, "orders", NOW, BUDGET, rng, caller=STEADY) is None
    # the target's own budget still binds everyone: without a caller (the pair of all
    # anonymous callers, none counted) only the target's counts decide
    assert retry_budget.gate(shared, "orders", NOW, BUDGET, rng) is None


def test_the_target_budget_still_binds_every_pair(shared: SharedCounts) -> None:
    deliveries(shared, FLAKY, first=10, retries=2)
    deliveries(shared, STEADY, first=10, retries=2)
    deliveries(shared, "key:third", first=0, retries=3)  # target: 7 retries, room 6
    rng = random.Random(2)
    assert retry_budget.gate(shared, "orders", NOW, BUDGET, rng, caller=STEADY) is not None


def test_precheck_reads_the_tasks_caller(shared: SharedCounts, engine: Engine) -> None:
    deliveries(shared, STEADY, first=100, retries=0)
    deliveries(shared, FLAKY, first=5, retries=5)
    with session_factory(engine).begin() as s:
        for task_id, caller in (("t-flaky", FLAKY), ("t-steady", STEADY)):
            s.add(
                TaskRow(
                    task_id=task_id, agent_id="orders", target={"agent_id": "orders"},
                    method="m", payload={}, status=TaskStatus.PENDING.value, attempt_seq=3,
                    created_at=NOW, updated_at=NOW, instance_id="i-1", retries=2,
                    caller=caller,
                )
            )  # fmt: skip
    rng = random.Random(3)
    held = retry_budget.precheck(shared, "t-flaky", NOW, BUDGET, rng)
    assert held is not None and held[0] == "orders" and held[1] > 0
    assert retry_budget.precheck(shared, "t-steady", NOW, BUDGET, rng) is None
