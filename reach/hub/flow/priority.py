"""Background yields to online work: what the hub looks like, and deferring an attempt.

``reach.core.flow.priority`` decides; this module measures and acts. Everything here runs for
background attempts only (``Pipeline.begin`` asks after its claim), so an online
delivery pays no query for it. The measures are hub-wide, read from the store:

* online waiting: an online task ``pending`` and due, or online traffic live (an online
  attempt due within ``ONLINE_RECENT_S``, waiting, in flight or answered): indexed
  exists-probes on ``(priority, status, next_attempt_at)``;
* background busy: background tasks in ``dispatching`` whose lease is live (each holds
  one of a worker process's exchange places while its agent works);
* slots: the sum of the exchange places each worker reported in the last ``SLOTS_TTL_S``
  (``record_slots``: every worker's main process every ``HEARTBEAT_S``, in
  ``flow_counts`` under the name ``worker_slots``, keyed by the worker's node name);
* deferred since: the task's first ``deferred`` event, for the bound on its waiting.

A deferral is a new attempt on the background queue after ``defer_s``; no retry is
spent, and the task's ``deferred`` event says why. Its outbox row commits with it and
the outbox relay publishes it once it is due (`reach.hub.delivery.outbox.scheduled`), never a
countdown message: Celery holds a countdown message in the worker that fetched it and,
once due, queues it for that worker's pool in front of online work that arrived
meanwhile. A backlog deferred that way clogged the worker it meant to free (measured:
online p99 36x its unloaded figure under a background flood, ``python -m bench --only
priority``; docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import math

from sqlalchemy import Integer as SqlInteger
from sqlalchemy import Table, and_, bindparam, cast, delete, exists, func, select
from sqlalchemy.orm import Session

from reach.core.flow.priority import (
    BACKGROUND,
    BACKGROUND_QUEUE,
    ONLINE,
    Decision,
    Load,
    PriorityPolicy,
    Reason,
    admit_background,
)
from reach.core.ledger import lifecycle
from reach.core.ledger.lifecycle import TaskEvent
from reach.core.ledger.statuses import TaskStatus
from reach.hub.ledger import tasks as ledger
from reach.hub.storage.engine import advisory_xact_lock
from reach.hub.storage.models import FlowCountRow, TaskEventRow, TaskRow

log = logging.getLogger("reach.hub.flow.priority")

SLOTS = "worker_slots"  # the ``flow_counts`` name of the workers' reports
HEARTBEAT_S = 10.0
SLOTS_TTL_S = 35.0  # a worker silent this long no longer counts (three missed reports)
_KEEP_S = 300

_T: Table = TaskRow.__table__  # type: ignore[assignment]
_F: Table = FlowCountRow.__table__  # type: ignore[assignment]
_E: Table = TaskEventRow.__table__  # type: ignore[assignment]

ONLINE_RECENT_S = 2.0
"""Online traffic is live while an online attempt was due this recently: background keeps
to its share for that long, so an online task arriving finds a free slot instead of
waiting for a background one to finish (a slot freed *after* it arrived is too late)."""
_ONLINE_WAITING = exists().where(
    _T.c.priority == ONLINE,
    _T.c.status.in_(
        [TaskStatus.PENDING, TaskStatus.DISPATCHING, TaskStatus.EXECUTING, TaskStatus.SUCCESS]
    ),
    _T.c.next_attempt_at <= bindparam("b_now"),
    _T.c.next_attempt_at >= bindparam("b_recent"),
) | exists().where(
    _T.c.priority == ONLINE,
    _T.c.status == TaskStatus.PENDING,
    _T.c.next_attempt_at <= bindparam("b_now"),
)
_BACKGROUND_BUSY = (
    select(func.count())
    .select_from(_T)
    .where(
        _T.c.priority == BACKGROUND,
        _T.c.status == TaskStatus.DISPATCHING,
        _T.c.lease_until > bindparam("b_now"),
        _T.c.task_id != bindparam("b_task_id"),
    )
    .scalar_subquery()
)
_per_worker = (
    select(func.max(_F.c.count).label("slots"))
    .where(_F.c.name == SLOTS, _F.c.bucket >= bindparam("b_since"))
    .group_by(_F.c.key)
    .subquery()
)
_SLOTS = select(cast(func.sum(_per_worker.c.slots), SqlInteger)).scalar_subquery()
_DEFERRED_SINCE = (
    select(func.min(_E.c.at))
    .where(_E.c.task_id == bindparam("b_task_id"), _E.c.kind == "deferred")
    .scalar_subquery()
)
_LOAD = select(_ONLINE_WAITING, _BACKGROUND_BUSY, _SLOTS, _DEFERRED_SINCE)
_GATE_KEY = 0x7072696F72697479  # "priority": the background admissions' advisory lock


def measure(session: Session, task_id: str, now: float) -> Load:
    """The hub's load as one background attempt (``task_id``) sees it, in one statement.

    On PostgreSQL the background attempts being admitted take turns (a transaction-scoped
    advisory lock, held until the delivery's first transaction commits its claim): two
    workers counting at once would each see a free slot in the share and both take it
    (measured: background held 3 of 4 slots behind a burst of due deferrals). SQLite's
    write transactions take turns already."""
    advisory_xact_lock(session, _GATE_KEY)
    row = (
        session.connection()
        .execute(
            _LOAD,
            {
                "b_now": now,
                "b_recent": now - ONLINE_RECENT_S,
                "b_task_id": task_id,
                "b_since": now - SLOTS_TTL_S,
            },
        )
        .one()
    )
    waiting, busy, slots, since = row
    return Load(
        online_waiting=bool(waiting),
        background_busy=int(busy or 0),
        slots=int(slots) if slots is not None else None,
        deferred_s=None if since is None else max(0.0, now - float(since)),
    )


def yield_to_online(session: Session, task_id: str, now: float, policy: PriorityPolicy) -> bool:
    """Defer the claimed background attempt if online work waits and background holds its
    share of the slots already: True if deferred (the relay publishes it when due),
    False: deliver it now."""
    load = measure(session, task_id, now)
    decision = admit_background(load, policy)
    if decision.run:
        if decision.reason is Reason.WAITED_TOO_LONG:
            log.info(
                "background task %s runs past online work after %.1fs of deferrals",
                task_id, load.deferred_s or 0.0,
            )  # fmt: skip
        return False
    defer(session, task_id, now, decision, load)
    return True


def defer(session: Session, task_id: str, now: float, decision: Decision, load: Load) -> None:
    """Put the claimed attempt back as a new one ``decision.delay_s`` from now, left
    unpublished for the outbox relay (no countdown message: see the module's docstring)."""
    task = ledger.load_for_update(session, task_id)
    assert task is not None  # claimed in this same transaction
    delay = decision.delay_s
    task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.RETRY)
    task.attempt_seq += 1
    task.lease_token = None
    task.lease_until = None
    task.next_attempt_at = now + delay
    task.updated_at = now
    ledger.add_attempt(session, task, now, available_at=now + delay)
    detail = {
        "reason": "priority",
        "delay_s": round(delay, 3),
        "background_busy": load.background_busy,
        "background_limit": decision.limit,
        "slots": load.slots,
        "queue": BACKGROUND_QUEUE,
    }
    ledger.record_event(session, task, "deferred", now, detail)


def record_slots(session: Session, worker: str, slots: int, now: float) -> None:
    """A worker's report of its slots (its concurrency); older reports of it are dropped."""
    bucket = math.floor(now)
    session.execute(
        delete(FlowCountRow).where(
            FlowCountRow.name == SLOTS,
            (FlowCountRow.key == worker) | (FlowCountRow.bucket < bucket - _KEEP_S),
        )
    )
    session.add(FlowCountRow(name=SLOTS, key=worker, bucket=bucket, count=slots))


def forget_slots(session: Session, worker: str) -> None:
    """A worker going away takes its slots with it at once (not after ``SLOTS_TTL_S``)."""
    session.execute(
        delete(FlowCountRow).where(and_(FlowCountRow.name == SLOTS, FlowCountRow.key == worker))
    )


def hub_slots(session: Session, now: float) -> int | None:
    """The worker slots reported hub-wide (None: no worker reported lately)."""
    value = session.execute(select(_SLOTS), {"b_since": now - SLOTS_TTL_S}).scalar()
    return None if value is None else int(value)
