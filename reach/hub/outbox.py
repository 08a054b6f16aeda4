"""The safety nets between the database and the broker.

* ``unpublished`` — outbox rows whose publication never happened (the API or a worker
  died between commit and publish, or the broker was down): the relay publishes them.
* ``recover`` — tasks the broker lost or a worker dropped: a pending attempt long overdue
  (its message vanished, e.g. in a Redis restart), a dispatch lease that expired (the
  worker was killed mid-delivery), and the watchdog: an accepted (202) task silent past
  ``timeout + grace`` is failed and retried, or dead-lettered.

On PostgreSQL several relays may run: rows are claimed with ``FOR UPDATE SKIP LOCKED``.
Publishing twice is harmless: delivery fences on ``attempt_seq`` and the dispatch lease.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.statuses import TaskStatus
from reach.hub.delivery import (
    DeliveryPolicy,
    Publish,
    dead_letter,
    fail_transient,
    record_event,
    schedule_retry,
)
from reach.hub.storage.engine import skip_locked as _skip_locked
from reach.hub.storage.models import OutboxRow, TaskRow


@dataclass(frozen=True, slots=True)
class Recovery:
    publish: list[Publish]
    republished: int
    redelivered: int
    watchdog: int


def unpublished(session: Session, now: float, grace: float, limit: int = 500) -> list[Publish]:
    """Claim outbox rows due and left unpublished for ``grace`` seconds; mark them published."""
    rows = session.scalars(
        _skip_locked(
            session,
            (
                select(OutboxRow)
                .where(OutboxRow.published_at.is_(None))
                .where(OutboxRow.available_at <= now)
                .where(OutboxRow.created_at <= now - grace)
                .order_by(OutboxRow.id)
                .limit(limit)
            ),
        )
    ).all()
    out = []
    for row in rows:
        row.published_at = now
        out.append(Publish(row.task_id, row.attempt_seq, 0.0))
    return out


def recover(
    session: Session,
    now: float,
    dpolicy: DeliveryPolicy,
    rng: random.Random,
    limit: int = 500,
    backlog: int | None = None,
) -> Recovery:
    """Run the three nets. ``backlog`` is the delivery queue's depth, if known.

    An overdue pending attempt is presumed lost only while the queue is (nearly) empty:
    behind a backlog it is simply waiting its turn, and republishing every waiting
    attempt each ``republish_grace`` would multiply the backlog exactly when the
    workers are already behind (measured: throughput halved under overload). A message
    the broker really lost is republished once the queue drains.
    """
    grace = dpolicy.republish_grace
    publish: list[Publish] = []
    behind = backlog is not None and backlog > dpolicy.republish_backlog
    overdue = (
        []
        if behind
        else session.scalars(
            _skip_locked(
                session,
                (
                    select(TaskRow)
                    .where(TaskRow.status == TaskStatus.PENDING)
                    .where(TaskRow.next_attempt_at <= now - grace)
                    .where(
                        (TaskRow.last_published_at.is_(None))
                        | (TaskRow.last_published_at <= now - grace)
                    )
                    .limit(limit)
                ),
            )
        ).all()
    )
    for task in overdue:
        task.last_published_at = now
        record_event(
            session,
            task,
            "republished",
            now,
            {"overdue_s": round(now - (task.next_attempt_at or now), 3)},
        )
        publish.append(Publish(task.task_id, task.attempt_seq, 0.0))

    redelivered = 0
    lapsed = session.scalars(
        _skip_locked(
            session,
            (
                select(TaskRow)
                .where(TaskRow.status == TaskStatus.DISPATCHING)
                .where(TaskRow.lease_until < now)
                .limit(limit)
            ),
        )
    ).all()
    for task in lapsed:
        task.redeliveries += 1
        if task.redeliveries > dpolicy.max_redeliveries:
            dead_letter(
                session,
                task,
                now,
                reason=f"worker lost {task.redeliveries} times",
                error={"kind": "worker_lost", "message": "dispatch lease expired"},
            )
            continue
        redelivered += 1
        publish.append(
            schedule_retry(
                session, task, now, 0.0, "worker_lost", {"redeliveries": task.redeliveries}
            )
        )

    silent = session.scalars(
        _skip_locked(
            session,
            (
                select(TaskRow)
                .where(TaskRow.status == TaskStatus.EXECUTING)
                .where(TaskRow.deadline < now)
                .limit(limit)
            ),
        )
    ).all()
    for task in silent:
        error = {
            "kind": "timeout",
            "instance_id": task.instance_id,
            "message": f"accepted but no result within {task.timeout_ms} ms + grace",
        }
        retry = fail_transient(
            session, task, None, now, dpolicy, rng, reason="watchdog", error=error
        )
        if retry is not None:
            publish.append(retry)
    return Recovery(publish, len(overdue), redelivered, len(silent))
