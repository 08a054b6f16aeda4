"""Retention: the beat clean-up that keeps every table from growing forever.

What goes (``reach.core.ops.retention`` computes the cut-offs):

* terminal tasks that finished before the cut-off, with everything written about them
  (events, outbox rows, resolved dead letters, callbacks, approvals) -- never a task that
  is still in delivery's hands or waits for approval, nor one whose dead letter is
  unresolved (an operator may replay it);
* unresolved dead letters past ``dead_letter_days``, with their task and its records:
  each holds a full payload, kept only as long as someone may still replay it;
* resolved (replayed) dead letters older than the cut-off whose task is no longer live;
* finished DAG runs and their node rows; broadcasts whose deadline is past the cut-off;
  instance events older than the cut-off; sessions closed or expired before it; loop
  suspicions cleared before it; audit rows past ``audit_days``;
* callbacks and approvals whose task is gone (left by versions that deleted tasks alone);
* instances ``offline`` or deregistered since before their own cut-off: they stop being
  probed, and an agent that comes back registers again; then agents left with no
  instance (unless an admin set their queue bound: that is configuration, kept).
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

from reach.core.ledger.statuses import TERMINAL, DagRunStatus, InstanceStatus, TaskStatus
from reach.core.ops.retention import Cutoffs, RetentionPolicy, cutoffs
from reach.hub.settings import Settings
from reach.hub.storage.models import (
    AgentCapabilityRow,
    AgentLinkRow,
    AgentRow,
    AgentTagRow,
    ApprovalRow,
    AuditRow,
    BroadcastRow,
    CallbackRow,
    DagNodeRunRow,
    DagRunRow,
    DeadLetterRow,
    InstanceEventRow,
    InstanceRow,
    OutboxRow,
    SessionRow,
    TaskEventRow,
    TaskRow,
    UiSignOutRow,
)

log = logging.getLogger("reach.hub.ops.retention")

Transaction = Callable[[], AbstractContextManager[Session]]
Counts = dict[str, int]
_TERMINAL = sorted(s.value for s in TERMINAL)
_LIVE_TASK = [s.value for s in TaskStatus if s not in TERMINAL]
_FINISHED_RUNS = [DagRunStatus.SUCCESS.value, DagRunStatus.FAILED.value]
_GONE = [InstanceStatus.OFFLINE.value, InstanceStatus.DEREGISTERED.value]


def policy_from(settings: Settings) -> RetentionPolicy:
    r = settings.retention
    return RetentionPolicy(
        days=r.days,
        offline_instance_hours=r.offline_instance_hours,
        batch_size=r.batch_size,
        batches=r.batches,
        dead_letter_days=r.dead_letter_days,
        audit_days=r.audit_days,
    )


def sweep(transaction: Transaction, now: float, policy: RetentionPolicy) -> Counts:
    """Delete what is past retention, batch by batch; rows deleted per table."""
    cut = cutoffs(now, policy)
    total: Counts = {}
    for batch in (
        _tasks,
        _dead_lettered_tasks,
        _dead_letters,
        _orphans,
        _dag_runs,
        _broadcasts,
        _instance_events,
        _sessions,
        _links,
        _audit,
        _instances,
        _agents,
        _sign_outs,
    ):
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
    return _drop_tasks(session, ids)


def _dead_lettered_tasks(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    """Unresolved dead letters past their own retention go with their (terminal) task."""
    query = (
        select(DeadLetterRow.task_id)
        .where(DeadLetterRow.replayed_at.is_(None), DeadLetterRow.created_at < cut.dead_letters)
        .order_by(DeadLetterRow.created_at)
        .limit(limit)
    )
    ids = list(dict.fromkeys(session.scalars(query).all()))
    live = set(
        session.scalars(
            select(TaskRow.task_id).where(TaskRow.task_id.in_(ids), TaskRow.status.in_(_LIVE_TASK))
        ).all()
    )
    return _drop_tasks(session, [t for t in ids if t not in live])


def _drop_tasks(session: Session, ids: list[str]) -> Counts:
    """Terminal tasks and every row written about them."""
    if not ids:
        return {"tasks": 0}
    return {
        "task_events": _count(session, delete(TaskEventRow).where(TaskEventRow.task_id.in_(ids))),
        "outbox": _count(session, delete(OutboxRow).where(OutboxRow.task_id.in_(ids))),
        "dead_letters": _count(
            session, delete(DeadLetterRow).where(DeadLetterRow.task_id.in_(ids))
        ),
        "callbacks": _count(session, delete(CallbackRow).where(CallbackRow.task_id.in_(ids))),
        "approvals": _count(session, delete(ApprovalRow).where(ApprovalRow.task_id.in_(ids))),
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


def _orphans(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    """Callbacks and approvals of tasks that no longer exist (older versions deleted a
    task and left them)."""
    counts: Counts = {}
    for name, row in (("callbacks", CallbackRow), ("approvals", ApprovalRow)):
        task_gone = ~exists().where(TaskRow.task_id == row.task_id)
        old = select(row.id).where(task_gone).order_by(row.id).limit(limit)
        counts[name] = _count(session, delete(row).where(row.id.in_(old), task_gone))
    return counts


def _sessions(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    """Closed, or past their TTL, before the cut-off."""
    ended = (SessionRow.closed_at < cut.records) | (SessionRow.expires_at < cut.records)
    old = select(SessionRow.session_id).where(ended).limit(limit)
    stmt = delete(SessionRow).where(SessionRow.session_id.in_(old), ended)
    return {"sessions": _count(session, stmt)}


def _links(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    """Loop suspicions between two agents, neither suspected nor demoted since the cut-off."""
    quiet = and_(
        (AgentLinkRow.suspected_at.is_(None)) | (AgentLinkRow.suspected_at < cut.records),
        (AgentLinkRow.demoted_until.is_(None)) | (AgentLinkRow.demoted_until < cut.records),
    )
    old = session.execute(select(AgentLinkRow.src, AgentLinkRow.dst).where(quiet).limit(limit))
    n = 0
    for src, dst in old.all():
        n += _count(
            session, delete(AgentLinkRow).where(AgentLinkRow.src == src, AgentLinkRow.dst == dst)
        )
    return {"agent_links": n}


def _audit(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    old = select(AuditRow.id).where(AuditRow.at < cut.audit).order_by(AuditRow.at).limit(limit)
    return {"audit_log": _count(session, delete(AuditRow).where(AuditRow.id.in_(old)))}


def _agents(session: Session, now: float, cut: Cutoffs, limit: int) -> Counts:
    """Agents left with no instance since before the cut-off, whose queue bound no admin
    set; the condition is checked again by the DELETE, so a registration meanwhile keeps
    the agent."""
    alone = and_(
        ~exists().where(InstanceRow.agent_id == AgentRow.agent_id),
        AgentRow.updated_at < cut.offline,
        AgentRow.max_queue_override.is_(None),
    )
    old = select(AgentRow.agent_id).where(alone).order_by(AgentRow.updated_at).limit(limit)
    removed = list(
        session.scalars(
            delete(AgentRow).where(AgentRow.agent_id.in_(old), alone).returning(AgentRow.agent_id)
        ).all()
    )
    if removed:  # the foreign keys cascade; said here too for a store that does not
        session.execute(delete(AgentTagRow).where(AgentTagRow.agent_id.in_(removed)))
        session.execute(delete(AgentCapabilityRow).where(AgentCapabilityRow.agent_id.in_(removed)))
    return {"agents": len(removed)}


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
    """Offline or deregistered since before the cut-off; the condition is checked again by
    the DELETE itself, so a heartbeat that revived the instance meanwhile keeps it."""
    gone = and_(InstanceRow.status.in_(_GONE), InstanceRow.status_changed_at < cut.offline)
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
