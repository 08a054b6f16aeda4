"""The dead-letter queue: tasks whose retries ran out, kept for an operator to inspect or replay.

`replay` revives one dead letter inside the caller's transaction; `replay_many` does
exactly that for each of several, one transaction each (a refused one changes nothing
and stops nothing), publishes each attempt after its commit, and says per item what
happened.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.flow.priority import queue_for
from reach.core.ledger import lifecycle
from reach.core.ledger.lifecycle import TaskEvent
from reach.core.ledger.statuses import TaskStatus
from reach.errors import IllegalTransition, InvalidQuery, ReachError, TaskConflict, UnknownTask
from reach.hub.ledger.tasks import Publish, add_attempt, load_for_update, record_event
from reach.hub.storage.models import DeadLetterRow

if TYPE_CHECKING:
    from reach.hub.context import HubContext

MAX_REPLAY_MANY: Final = 200
"""Dead letters one `replay_many` call may name (each is a transaction and a publish)."""


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


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """What replaying one dead letter did: ``replayed`` with the task's new attempt, or
    refused with the problem (its stable type and detail); a refusal changed nothing."""

    dead_letter_id: int
    replayed: bool
    task_id: str | None = None
    attempt_seq: int | None = None
    problem_type: str | None = None
    detail: str = ""
    status: int = 200  # the refusal's HTTP status (404, 409, 503 ...), 200 when replayed

    def to_json(self) -> dict[str, Any]:
        return {
            "dead_letter_id": self.dead_letter_id,
            "outcome": "replayed" if self.replayed else "refused",
            "task_id": self.task_id,
            "attempt_seq": self.attempt_seq,
            "problem_type": self.problem_type,
            "detail": self.detail,
        }


def replay_many(
    ctx: HubContext, dead_ids: Iterable[int], actor: str | None = None
) -> list[ReplayOutcome]:
    """`replay` each dead letter (once per distinct id, in the order given), each in its
    own transaction and published after its commit, as the single replay endpoint does.

    A refusal (unknown, already replayed, its task no longer dead, the store refusing)
    is that item's outcome, not an error: the others go on. More than `MAX_REPLAY_MANY`
    ids, or none, is `InvalidQuery` with nothing replayed."""
    ids = list(dict.fromkeys(dead_ids))
    if not ids:
        raise InvalidQuery("name at least one dead letter to replay", name="ids")
    if len(ids) > MAX_REPLAY_MANY:
        raise InvalidQuery(
            f"at most {MAX_REPLAY_MANY} dead letters per replay, not {len(ids)}", name="ids"
        )
    outcomes: list[ReplayOutcome] = []
    for dead_id in ids:
        try:
            item = ctx.write(partial(_replay_now, ctx, dead_id, actor), conflict=TaskConflict)
        except ReachError as exc:
            outcomes.append(
                ReplayOutcome(
                    dead_id,
                    False,
                    problem_type=exc.problem_type(),
                    detail=exc.detail,
                    status=exc.status,
                )
            )
            continue
        ctx.publish_attempts([item])  # a broker refusal leaves it to the relay, as for one
        task = item.task_id
        outcomes.append(
            ReplayOutcome(
                dead_id, True, task, item.attempt_seq, detail=f"task {task!r} queued again"
            )
        )
    return outcomes


def _replay_now(ctx: HubContext, dead_id: int, actor: str | None, session: Session) -> Publish:
    return replay(session, dead_id, ctx.clock.now(), actor=actor)
