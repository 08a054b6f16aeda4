"""The retry budget's edge: hub-wide counts of deliveries and retries per target agent.

The arithmetic is pure (``reach.core.flow.retry_budget``). What counts, in
``reach.hub.flow.shared_counts`` (every worker process of the hub adds to the same windows):

* ``reach_requests``: every delivery posted to an agent, keyed by its agent id;
* ``reach_retries``: those that re-send a task after its target failed it (a timeout, a
  5xx, no answer: the task has spent a retry). A re-send for the hub's own reasons -- a
  worker lost mid-exchange, a priority deferral -- is no retry toward the target: it is
  how at-least-once recovers hundreds of exchanges a dead worker held, and throttling
  those as a storm made them wait a minute for a target that was fine;
* ``retry_budget_waits``: retries deferred because the budget was spent;
* the same three per caller and target pair (``pair_requests``, ``pair_retries``,
  ``pair_budget_waits``, keyed ``caller>agent``), as seed 004 counts them: a retry must
  fit its target's budget *and* its pair's, so one caller whose tasks all fail spends a
  share of its own requests, not the room other callers' healthy traffic makes.

`precheck` runs before a later attempt (``attempt_seq > 1``) is claimed -- outside the
claim's transaction, since on SQLite the counts' own transactions would wait on its write
lock: if the task is a re-send and its target's budget is spent, delivery does not send it
but defers it by the delay returned (an event ``retry`` with ``budget_wait: true``) and
checks it again when it fires. A wait is not a failure
and spends neither a retry nor a deferral: the budget always frees ``min_per_s`` retries a
second, so a waiting retry is late, never lost.
"""

from __future__ import annotations

import random

from sqlalchemy import select

from reach.core.flow.retry_budget import RetryBudget, wait_s
from reach.hub import metrics
from reach.hub.flow.shared_counts import SharedCounts
from reach.hub.storage.models import TaskRow

REQUESTS = "reach_requests"
RETRIES = "reach_retries"
WAITS = "retry_budget_waits"
PAIR_REQUESTS = "pair_requests"
PAIR_RETRIES = "pair_retries"
PAIR_WAITS = "pair_budget_waits"
ANONYMOUS_CALLER = "anonymous"  # an open hub's callers count as one


def pair_key(caller: str | None, agent_id: str) -> str:
    """The shared-counts key of a caller and target pair."""
    return f"{caller or ANONYMOUS_CALLER}>{agent_id}"


def resend(instance_id: str | None, retries: int) -> bool:
    """Whether an attempt re-sends a task after its target failed it (see above)."""
    return instance_id is not None and retries > 0


def count(
    shared: SharedCounts | None,
    agent_id: str,
    retry: bool,
    now: float,
    caller: str | None = None,
) -> None:
    """Count one delivery about to be posted to ``agent_id`` for ``caller`` (a retry also
    as one), toward the target and toward the pair."""
    if shared is None:
        return
    pair = pair_key(caller, agent_id)
    shared.add(REQUESTS, agent_id, now)
    shared.add(PAIR_REQUESTS, pair, now)
    if retry:
        shared.add(RETRIES, agent_id, now)
        shared.add(PAIR_RETRIES, pair, now)


def precheck(
    shared: SharedCounts,
    task_id: str,
    now: float,
    budget: RetryBudget,
    rng: random.Random,
) -> tuple[str, float] | None:
    """(agent, seconds to wait) if the task is a re-send whose target's budget is spent.

    One primary-key read of the task (a re-send goes back to the agent it was sent to), in
    a read-only transaction: on SQLite a write one would take the database's write lock
    (``BEGIN IMMEDIATE``) for a read."""
    if not budget.enabled:
        return None
    with shared.read_db.begin() as session:
        row = session.execute(
            select(TaskRow.agent_id, TaskRow.instance_id, TaskRow.retries, TaskRow.caller).where(
                TaskRow.task_id == task_id
            )
        ).first()
    if row is None or not resend(row.instance_id, row.retries) or not row.agent_id:
        return None  # not a retry toward its target, whatever its attempt number
    delay = gate(shared, row.agent_id, now, budget, rng, caller=row.caller)
    return None if delay is None else (str(row.agent_id), delay)


def gate(
    shared: SharedCounts | None,
    agent_id: str,
    now: float,
    budget: RetryBudget,
    rng: random.Random,
    caller: str | None = None,
) -> float | None:
    """None if a retry toward ``agent_id`` for ``caller`` may fire now; else seconds to
    wait until both its target's and its pair's budgets have room (each budget spent
    counts a wait, hub-wide, so the waiting retries spread out)."""
    if shared is None or not budget.enabled:
        return None
    spread = rng.random()
    delay = 0.0
    for requests, retries, waits, key in (
        (REQUESTS, RETRIES, WAITS, agent_id),
        (PAIR_REQUESTS, PAIR_RETRIES, PAIR_WAITS, pair_key(caller, agent_id)),
    ):
        window = budget.window_s
        wait = wait_s(
            shared.total(retries, key, now, window),
            shared.total(requests, key, now, window),
            shared.total(waits, key, now, window),
            budget,
            spread,
        )
        if wait > 0:
            shared.add(waits, key, now)
            delay = max(delay, wait)
    if delay <= 0:
        return None
    metrics.RETRY_BUDGET_WAIT_TOTAL.labels(agent_id).inc()
    return delay
