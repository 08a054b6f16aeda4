"""Retention: the beat clean-up that keeps every table from growing forever.

What goes (``reach.core.retention`` computes the cut-offs):

* terminal tasks that finished before the cut-off, with their task events, outbox rows
  and resolved dead letters -- never a task that is still in delivery's hands or waits
  for approval, nor one whose dead letter is unresolved (an operator may replay it);
* resolved (replayed) dead letters older than the cut-off whose task is no longer live;
* finished DAG runs and their node rows; broadcasts whose deadline is past the cut-off;
  instance events older than the cut-off;
* instances ``offline`` since before their own cut-off: they stop being probed, and an
  agent that comes back registers again;
* dashboard sign-outs whose session has expired anyway (its cookie is refused by then).

Every batch is one short transaction of a few statements over at most ``batch_size``
rows, found through an index from its oldest end (migration 0007), so the sweep never
holds long locks beside the API and the workers; at most ``batches`` per kind run in one
sweep and the next sweep carries on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, cast

from sqlalchemy import CursorResult, Delete, and_, delete, exists, select
from sqlalchemy.orm import Session

from reach.core.retention import Cutoffs, RetentionPolicy, cutoffs
from reach.core.statuses import TERMINAL, DagRunStatus, InstanceStatus, TaskStatus
from reach.hub.settings import Settings
from reach.hub.storage.models import (
    BroadcastRow,
    DagNodeRunRow,
    DagRunRow,
    DeadLetterRow,
    InstanceEventRow,
    InstanceRow,
    OutboxRow,
    TaskEventRow,
    TaskRow,
    UiSignOutRow,
)

log = logging.getLogger("reach.hub.retention")

Transaction = Callable[[], AbstractContextManager[Session]]
Counts = dict[str, int]
_TERMINAL = sorted(s.value for s in TERMINAL)
_LIVE_TASK = [s.value for s in TaskStatus if s not in TERMINAL]
_FINISHED_RUNS = [DagRunStatus.SUCCESS.value, DagRunStatus.FAILED.value]


def policy_from(settings: Settings) -> RetentionPolicy:
    r = settings.retention
    return RetentionPolicy(
        days=r.days,
        offline_instance_hours=r.offline_instance_hours,
        batch_size=r.batch_size,
        batches=r.batches,
    )


def sweep(transaction: Transaction, now: float, policy: RetentionPolicy) -> Counts:
    """Delete what is past retention, batch by batch; rows deleted per table."""
    cut = cutoffs(now, policy)
    total: Counts = {}
    batches = (_tasks, _dead_letters, _dag_runs, _broadcasts, _instance_events, _instances)
    for batch in (*batches, _sign_outs):
        for _ in range(policy.batches):
            with transaction() as session:
                counts = batch(session, now, cut, policy.batch_size)
            for table, n in counts.items():
                total[table] = total.get(table, 0) + n
            if max(counts.values(), default=0) < policy.batch_size:
                break  # nothing more of this kind
    deleted = {table: n for table, n in total.items() if n}
    if deleted:
        log.info("retention deleted %s", ", ".join(f"{n} {t}" for t, n in deleted.items()))
    return deleted


def _tasks(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    unresolved = exists().where(
        DeadLetterRow.task_id == TaskRow.task_id, DeadLetterRow.replayed_at.is_(None)
    )
    query = (
        select(TaskRow.task_id)
        .where(TaskRow.finished_at < cut.records)
        .where(TaskRow.status.in_(_TERMINAL))
        .where(~unresolved)
        .order_by(TaskRow.finished_at)
        .limit(limit)
    )
    if session.get_bind().dialect.name == "postgresql":
        # a task row another transaction holds (a late duplicate result) is left for later
        query = query.with_for_update(of=TaskRow, skip_locked=True)
    ids = list(session.scalars(query).all())
    if not ids:
        return {"tasks": 0}
    return {
        "task_events": _count(session, delete(TaskEventRow).where(TaskEventRow.task_id.in_(ids))),
        "outbox": _count(session, delete(OutboxRow).where(OutboxRow.task_id.in_(ids))),
        "dead_letters": _count(
            session, delete(DeadLetterRow).where(DeadLetterRow.task_id.in_(ids))
        ),
        "tasks": _count(
            session,
            delete(TaskRow).where(TaskRow.task_id.in_(ids), TaskRow.status.in_(_TERMINAL)),
        ),
    }


def _dead_letters(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    """Replayed long ago; the task they revived kept its own (it ended or is still live)."""
    live = exists().where(TaskRow.task_id == DeadLetterRow.task_id, TaskRow.status.in_(_LIVE_TASK))
    old = (
        select(DeadLetterRow.id)
        .where(DeadLetterRow.replayed_at < cut.records)
        .where(~live)
        .order_by(DeadLetterRow.replayed_at)
        .limit(limit)
    )
    return {"dead_letters": _count(session, delete(DeadLetterRow).where(DeadLetterRow.id.in_(old)))}


def _dag_runs(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    old = session.scalars(
        select(DagRunRow.run_id)
        .where(DagRunRow.finished_at < cut.records)
        .where(DagRunRow.status.in_(_FINISHED_RUNS))
        .order_by(DagRunRow.finished_at)
        .limit(limit)
    ).all()
    if not old:
        return {"dag_runs": 0}
    return {
        "dag_node_runs": _count(
            session, delete(DagNodeRunRow).where(DagNodeRunRow.run_id.in_(old))
        ),
        "dag_runs": _count(
            session,
            delete(DagRunRow).where(
                DagRunRow.run_id.in_(old), DagRunRow.status.in_(_FINISHED_RUNS)
            ),
        ),
    }


def _broadcasts(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    old = (
        select(BroadcastRow.id)
        .where(BroadcastRow.deadline < cut.records)
        .order_by(BroadcastRow.deadline)
        .limit(limit)
    )
    return {"broadcasts": _count(session, delete(BroadcastRow).where(BroadcastRow.id.in_(old)))}


def _instance_events(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    old = (
        select(InstanceEventRow.id)
        .where(InstanceEventRow.at < cut.records)
        .order_by(InstanceEventRow.at)
        .limit(limit)
    )
    return {
        "instance_events": _count(
            session, delete(InstanceEventRow).where(InstanceEventRow.id.in_(old))
        )
    }


def _instances(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    """Offline since before the cut-off; the condition is checked again by the DELETE
    itself, so a heartbeat that revived the instance meanwhile keeps it."""
    gone = and_(
        InstanceRow.status == InstanceStatus.OFFLINE.value,
        InstanceRow.status_changed_at < cut.offline,
    )
    old = select(InstanceRow.instance_id).where(gone).order_by(InstanceRow.status_changed_at)
    stmt = delete(InstanceRow).where(InstanceRow.instance_id.in_(old.limit(limit)), gone)
    removed = session.execute(stmt.returning(InstanceRow.instance_id, InstanceRow.agent_id)).all()
    for instance_id, agent_id in removed:
        session.add(
            InstanceEventRow(
                instance_id=instance_id,
                agent_id=agent_id,
                kind="removed",
                detail={"reason": "offline past retention", "offline_before": cut.offline},
                at=now,
            )
        )
    return {"instances": len(removed)}


def _sign_outs(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    old = (
        select(UiSignOutRow.sid)
        .where(UiSignOutRow.expires_at < now)
        .order_by(UiSignOutRow.expires_at)
        .limit(limit)
    )
    return {"ui_sign_outs": _count(session, delete(UiSignOutRow).where(UiSignOutRow.sid.in_(old)))}


def _count(session: Session, stmt: Delete) -> int:
    return int(cast(CursorResult[Any], session.execute(stmt)).rowcount)
