"""The dead-letter queue: tasks whose retries ran out, kept for an operator to inspect or replay."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core import lifecycle
from reach.core.lifecycle import TaskEvent
from reach.core.priority import queue_for
from reach.core.statuses import TaskStatus
from reach.errors import IllegalTransition, TaskConflict, UnknownTask
from reach.hub.delivery import Publish, add_attempt, load_for_update, record_event
from reach.hub.storage.models import DeadLetterRow


def view(row: DeadLetterRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "task_id": row.task_id,
        "agent_id": row.agent_id,
        "method": row.method,
        "target": row.target,
        "attempts": row.attempts,
        "reason": row.reason,
        "last_error": row.last_error,
        "created_at": row.created_at,
        "replayed_at": row.replayed_at,
        "payload": row.payload,
    }


def list_dead(
    session: Session, include_replayed: bool = False, limit: int = 100
) -> list[DeadLetterRow]:
    query = select(DeadLetterRow).order_by(DeadLetterRow.id.desc()).limit(limit)
    if not include_replayed:
        query = query.where(DeadLetterRow.replayed_at.is_(None))
    return list(session.scalars(query))


def get(session: Session, dead_id: int) -> DeadLetterRow:
    row = session.get(DeadLetterRow, dead_id)
    if row is None:
        raise UnknownTask(f"dead letter {dead_id} does not exist", dead_letter_id=dead_id)
    return row


def replay(session: Session, dead_id: int, now: float, actor: str | None = None) -> Publish:
    """Give the task a fresh retry budget and a new attempt; the caller publishes it.
    ``actor``: the identity of the operator who replays it (recorded on the event)."""
    dead = session.get(DeadLetterRow, dead_id, with_for_update=True)
    if dead is None:
        raise UnknownTask(f"dead letter {dead_id} does not exist", dead_letter_id=dead_id)
    if dead.replayed_at is not None:
        raise TaskConflict(f"dead letter {dead_id} was already replayed", dead_letter_id=dead_id)
    task = load_for_update(session, dead.task_id)
    if task is None:
        raise TaskConflict(f"task {dead.task_id!r} is not dead any more", task_id=dead.task_id)
    try:
        status = lifecycle.transition(TaskStatus(task.status), TaskEvent.REPLAY)
    except IllegalTransition as exc:
        raise IllegalTransition(
            f"task {dead.task_id!r} is not dead any more ({exc.detail})",
            task_id=dead.task_id,
            **exc.extra,
        ) from None
    dead.replayed_at = now
    task.status = status
    task.attempt_seq += 1
    task.retries = task.redeliveries = task.deferrals = 0
    task.error = None
    task.finished_at = None
    task.next_attempt_at = now
    task.updated_at = now
    add_attempt(session, task, now, available_at=now)
    record_event(session, task, "replayed", now, {"dead_letter_id": dead_id}, actor=actor)
    return Publish(task.task_id, task.attempt_seq, 0.0, queue_for(task.priority))
