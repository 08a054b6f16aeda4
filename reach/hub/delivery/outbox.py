"""The safety nets between the database and the broker.

* ``scheduled`` — attempts written for later (``available_at`` past ``created_at``) that
  are due and unpublished: a background attempt deferred for online work is left here on
  purpose (`reach.hub.flow.priority`), and a retry whose countdown publish was refused or
  never sent (its worker died) is caught here at its due time.
* ``unpublished`` — outbox rows whose publication never happened (the API or a worker
  died between commit and publish, or the broker was down): the relay publishes them.
  Claiming a row marks it (``published_at``) so a concurrent relay leaves it alone, and
  opens the claim (``claimed_at``) until ``settle`` closes it: a confirmed publish keeps
  the mark, a refused one takes it back (the row is the relay's again on its next tick),
  and a claim never settled -- the relay died between claim and publish -- lapses after
  ``claim_lease`` and is claimed again. Neither depends on the overdue net, which is off
  behind a backlog. Open claims have a partial index of their own (``ix_outbox_claimed``),
  so finding the lapsed ones costs the same on a table of a million published rows.
* ``recover`` — tasks the broker lost or a worker dropped: a pending attempt long overdue
  (its message vanished, e.g. in a Redis restart), a dispatch lease that expired (the
  worker was killed mid-delivery), and the watchdog: an accepted (202) task silent past
  ``timeout + grace`` is failed and retried, or dead-lettered.

On PostgreSQL several relays may run: rows are claimed with ``FOR UPDATE SKIP LOCKED``.
Publishing twice is harmless: delivery fences on ``attempt_seq`` and the dispatch lease.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from reach.core.flow.priority import BACKGROUND_QUEUE, ONLINE_QUEUE, queue_for
from reach.core.ledger.statuses import TaskStatus
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.ledger.tasks import (
    Publish,
    dead_letter,
    fail_transient,
    mark_published,
    record_event,
    schedule_retry,
    unmark_published,
)
from reach.hub.storage.engine import skip_locked as _skip_locked
from reach.hub.storage.models import OutboxRow, TaskRow

DELIVERY_QUEUES = frozenset({ONLINE_QUEUE, BACKGROUND_QUEUE})


@dataclass(frozen=True, slots=True)
class Recovery:
    publish: list[Publish]
    republished: int
    redelivered: int
    watchdog: int


def scheduled(session: Session, now: float, limit: int = 500) -> list[Publish]:
    """Claim the attempts written for later that are due and that nobody published, in the
    order they fell due. No grace: whoever wrote one publishes it with a countdown right
    after commit (a retry) or leaves it to the relay (a priority deferral), so one still
    unpublished when due is the relay's."""
    rows = session.scalars(
        _skip_locked(
            session,
            (
                select(OutboxRow)
                .where(OutboxRow.published_at.is_(None))
                .where(OutboxRow.available_at > OutboxRow.created_at)
                .where(OutboxRow.available_at <= now)
                .order_by(OutboxRow.available_at, OutboxRow.id)
                .limit(limit)
            ),
        )
    ).all()
    return _claim(rows, now)


def unpublished(
    session: Session, now: float, grace: float, limit: int = 500, claim_lease: float = 60.0
) -> list[Publish]:
    """Claim the attempts the relay must publish: rows left unpublished for ``grace``
    seconds, then claims older than ``claim_lease`` that no relay confirmed."""
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
    lapsed = (
        _lapsed_claims(session, now - claim_lease, limit - len(rows)) if len(rows) < limit else []
    )
    return _claim([*rows, *lapsed], now)


def _claim(rows: Sequence[OutboxRow], now: float) -> list[Publish]:
    out = []
    for row in rows:
        row.published_at = now  # marked, so no other net takes it ...
        row.claimed_at = now  # ... and open until ``settle`` confirms it or takes it back
        out.append(Publish(row.task_id, row.attempt_seq, 0.0, queue_of(row.message)))
    return out


def queue_of(message: Any) -> str:
    """The queue an outbox row's attempt goes to; rows written before priorities existed
    (or anything unexpected in ``message``) go to the online delivery queue."""
    queue = message.get("queue") if isinstance(message, dict) else None
    return queue if queue in DELIVERY_QUEUES else ONLINE_QUEUE


def _lapsed_claims(session: Session, claimed_before: float, limit: int) -> list[OutboxRow]:
    """Rows a relay claimed before ``claimed_before`` and never settled, of attempts that
    are still waiting; a lapsed claim whose attempt moved on meanwhile (delivered, retried,
    republished by the overdue net, cancelled) is closed here without publishing.

    Two reads, neither of which a planner can turn into a scan of the table: the open
    claims in claim order from their partial index, then their tasks by ``task_id``.
    Publication sets the task's ``last_published_at`` to at least the claim's time (so
    do the submit's optimistic mark and the overdue net): a pending task at this attempt
    whose last publication predates the claim was never published.
    """
    claims = session.scalars(_skip_locked(session, open_claims(claimed_before, limit))).all()
    if not claims:
        return []
    tasks = {
        t.task_id: t
        for t in session.scalars(
            select(TaskRow).where(TaskRow.task_id.in_({c.task_id for c in claims}))
        )
    }
    waiting = []
    for claim in claims:
        task = tasks.get(claim.task_id)
        if task is not None and _never_published(task, claim):
            waiting.append(claim)
        else:
            claim.claimed_at = None  # the attempt moved on: nothing left to publish
    return waiting


def open_claims(claimed_before: float, limit: int) -> Select[OutboxRow]:
    """The oldest ``limit`` claims opened before ``claimed_before`` and still open. The
    comparison implies ``claimed_at IS NOT NULL`` and the order is the index's, so the
    partial index answers it even under a generic plan."""
    return (
        select(OutboxRow)
        .where(OutboxRow.claimed_at <= claimed_before)
        .order_by(OutboxRow.claimed_at)
        .limit(limit)
    )


def _never_published(task: TaskRow, claim: OutboxRow) -> bool:
    return (
        task.status == TaskStatus.PENDING
        and task.attempt_seq == claim.attempt_seq
        and (task.last_published_at is None or task.last_published_at < (claim.claimed_at or 0))
    )


def publish_each(
    items: Sequence[Publish], publish: Callable[[Publish], bool]
) -> tuple[list[Publish], list[Publish]]:
    """Publish in order; (published, refused). After the first refusal the broker is
    presumed down: the rest are refused without trying (each try costs its retries)."""
    for i, item in enumerate(items):
        if not publish(item):
            return list(items[:i]), list(items[i:])
    return list(items), []


def settle(
    session: Session, published: Sequence[Publish], refused: Sequence[Publish], now: float
) -> None:
    """Confirm what the broker took; hand what it refused back to the relay (unmarked)."""
    for item in published:
        mark_published(session, item.task_id, item.attempt_seq, now)
    for item in refused:
        unmark_published(session, item.task_id, item.attempt_seq)


def recover(
    session: Session,
    now: float,
    dpolicy: DeliveryPolicy,
    rng: random.Random,
    limit: int = 500,
    backlog: int | Callable[[], int | None] | None = None,
) -> Recovery:
    """Run the three nets. ``backlog`` is the delivery queue's depth, if known, or how
    to ask the broker for it: asked only when an attempt is overdue (the relay ticks
    every second, and a broker round trip on a fresh connection was most of an idle
    tick's CPU).

    An overdue pending attempt is presumed lost only while the queue is (nearly) empty:
    behind a backlog it is simply waiting its turn, and republishing every waiting
    attempt each ``republish_grace`` would multiply the backlog exactly when the
    workers are already behind (measured: throughput halved under overload). A message
    the broker really lost is republished once the queue drains.
    """
    grace = dpolicy.republish_grace
    publish: list[Publish] = []
    due = (
        select(TaskRow)
        .where(TaskRow.status == TaskStatus.PENDING)
        .where(TaskRow.next_attempt_at <= now - grace)
        .where((TaskRow.last_published_at.is_(None)) | (TaskRow.last_published_at <= now - grace))
    )
    overdue: Sequence[TaskRow] = []
    # a plain read first: the broker is asked, and rows are locked, only when one is overdue
    if session.scalar(due.with_only_columns(TaskRow.task_id).limit(1)) is not None:
        depth = backlog() if callable(backlog) else backlog
        if depth is None or depth <= dpolicy.republish_backlog:
            overdue = session.scalars(_skip_locked(session, due.limit(limit))).all()
    for task in overdue:
        task.last_published_at = now
        record_event(
            session,
            task,
            "republished",
            now,
            {"overdue_s": round(now - (task.next_attempt_at or now), 3)},
        )
        publish.append(Publish(task.task_id, task.attempt_seq, 0.0, queue_for(task.priority)))

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
            session, task, None, now, dpolicy.retry, rng, reason="watchdog", error=error
        )
        if retry is not None:
            publish.append(retry)
    return Recovery(publish, len(overdue), redelivered, len(silent))
