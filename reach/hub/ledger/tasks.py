"""Task records: the writes every module that moves a task shares.

Submission, delivery, reports, approvals, sessions, priority, the outbox's nets, dead
letters and the A2A edge all end, retry or annotate tasks; they do it through these
primitives, which import none of them (so no cycle can form around a task's record):

* the task's view (`task_view`, `VIEW_COLUMNS`) and its row, locked (`load_for_update`);
* an event on its trail (`record_event`), which wakes progress streams and callbacks;
* the terminal moves: `succeed` (two plain statements, the hot path), `finish` (first
  terminal result wins), `dead_letter`;
* a new attempt: `schedule_retry`, `defer_attempt`, `fail_transient`, each with its
  outbox row in the same transaction (`add_attempt`), and the relay's marks on it
  (`mark_published`, `unmark_published`).

Every status written here is the one ``reach.core.ledger.lifecycle`` gives for the move, so no
path can write a move its transition table does not list.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace
from typing import Any, cast

from sqlalchemy import ColumnElement, Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from reach.core.delivery.retry import RetryPolicy, backoff_delay, should_retry
from reach.core.flow.priority import ONLINE_QUEUE, queue_for
from reach.core.ledger import lifecycle
from reach.core.ledger.lifecycle import TaskEvent
from reach.core.ledger.reports import AWAITING_REPORT
from reach.core.ledger.statuses import TERMINAL, TaskStatus
from reach.hub import metrics
from reach.hub.ledger.wakeups import mark_changed, mark_finished
from reach.hub.notify import callbacks
from reach.hub.storage.models import DeadLetterRow, OutboxRow, TaskEventRow, TaskRow

log = logging.getLogger("reach.hub.ledger.tasks")


@dataclass(frozen=True, slots=True)
class Publish:
    """Instruction for the Celery shell: publish this attempt after ``delay`` seconds
    to ``queue`` (the task's priority: ``reach.core.flow.priority.queue_for``)."""

    task_id: str
    attempt_seq: int
    delay: float
    queue: str = ONLINE_QUEUE


TASKS = cast(Table, TaskRow.__table__)
_EVENTS = cast(Table, TaskEventRow.__table__)
# what callers see of a task (``task_view``, the success statement's RETURNING)
VIEW_COLUMNS = (
    "task_id", "status", "method", "target", "agent_id", "instance_id", "attempt_seq",
    "retries", "result", "error", "trace", "session_id", "timeout_ms", "created_at",
    "updated_at", "finished_at", "caller", "priority",
)  # fmt: skip


def status_in(event: TaskEvent) -> ColumnElement[bool]:
    """``status IN (sources of event)``; a plain ``=`` for one source (no expanding IN)."""
    sources = sorted(lifecycle.sources_of(event))
    return TASKS.c.status == sources[0] if len(sources) == 1 else TASKS.c.status.in_(sources)


# The hot path's statements, built once: constructing a statement and its cache key on
# every delivery cost more CPU than executing it. Bound names carry a ``b_`` prefix
# (column names are reserved for the SET clause).
_SUCCEED = (
    update(TASKS)
    .where(TASKS.c.task_id == bindparam("b_task_id"), status_in(TaskEvent.SUCCEED))
    .values(
        status=lifecycle.target_of(TaskEvent.SUCCEED),
        result=bindparam("b_result", type_=TASKS.c.result.type),
        error=None,
        finished_at=bindparam("b_now"),
        updated_at=bindparam("b_now"),
        lease_token=None,
        lease_until=None,
    )
    .returning(*(TASKS.c[name] for name in VIEW_COLUMNS), TASKS.c.callback_url)
)
# A reported success: only for the attempt the task waits on, from its own instance
# (``reach.core.ledger.reports``); anything else takes the ORM path to be judged and recorded.
assert AWAITING_REPORT <= lifecycle.sources_of(TaskEvent.SUCCEED)
_SUCCEED_REPORTED = _SUCCEED.where(
    TASKS.c.status.in_(sorted(AWAITING_REPORT)),
    TASKS.c.attempt_seq == bindparam("b_seq"),
    TASKS.c.instance_id == bindparam("b_instance"),
)
_ADD_EVENT = insert(_EVENTS)


def task_view(task: TaskRow) -> dict[str, Any]:
    return {name: getattr(task, name) for name in VIEW_COLUMNS}


def load_for_update(session: Session, task_id: str) -> TaskRow | None:
    """The task row, locked until the transaction ends (PostgreSQL; SQLite locks the file)."""
    return session.scalar(select(TaskRow).where(TaskRow.task_id == task_id).with_for_update())


def record_event(
    session: Session,
    task: TaskRow,
    kind: str,
    now: float,
    detail: dict[str, Any],
    *,
    actor: str | None = None,
) -> None:
    """One task event; ``actor`` is the identity that caused it (None: the hub's own step)."""
    session.add(
        TaskEventRow(
            task_id=task.task_id,
            agent_id=task.agent_id,
            instance_id=task.instance_id,
            attempt_seq=task.attempt_seq,
            kind=kind,
            detail=detail,
            at=now,
            actor=actor,
        )
    )
    mark_changed(session, task.task_id)  # progress streams wake (reach.hub.ledger.streams)
    if task.callback_url:
        callbacks.on_event(session, task.task_id, kind, now, detail)


def insert_event(
    session: Session,
    task_id: str,
    agent_id: str | None,
    instance_id: str | None,
    attempt_seq: int,
    kind: str,
    now: float,
    detail: dict[str, Any],
    actor: str | None = None,
) -> None:
    session.connection().execute(
        _ADD_EVENT,
        {
            "task_id": task_id,
            "agent_id": agent_id,
            "instance_id": instance_id,
            "attempt_seq": attempt_seq,
            "kind": kind,
            "detail": detail,
            "at": now,
            "actor": actor,
        },
    )
    mark_changed(session, task_id)  # progress streams wake (reach.hub.ledger.streams)


def succeed(
    session: Session,
    task_id: str,
    data: Any,
    now: float,
    detail: dict[str, Any],
    *,
    answering: tuple[int, str] | None = None,
    actor: str | None = None,
) -> dict[str, Any] | None:
    """The common ending in two statements: the task becomes ``success`` unless it is
    terminal already or unknown (then the ORM path records or refuses). Its view if so.

    ``answering`` (attempt_seq, instance_id) fences a reported result: it applies only
    while that attempt is out at that instance."""
    params: dict[str, Any] = {"b_task_id": task_id, "b_result": data, "b_now": now}
    statement = _SUCCEED
    if answering is not None:
        statement = _SUCCEED_REPORTED
        params["b_seq"], params["b_instance"] = answering
    row = session.connection().execute(statement, params).first()
    if row is None:
        return None
    view = dict(zip(VIEW_COLUMNS, row[:-1], strict=True))
    insert_event(
        session, task_id, view["agent_id"], view["instance_id"], view["attempt_seq"],
        "terminal_success", now, detail, actor,
    )  # fmt: skip
    if row[-1]:  # the task has a callback: armed in this transaction
        callbacks.on_event(session, task_id, "terminal_success", now, detail)
    mark_finished(session, task_id, view)
    metrics.TASKS_TOTAL.labels(TaskStatus.SUCCESS).inc()
    return view


def finish(
    session: Session,
    task: TaskRow,
    status: TaskStatus,
    now: float,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
    detail: dict[str, Any] | None = None,
    actor: str | None = None,
) -> bool:
    """Make the task terminal (``status``) unless it already is: first terminal result wins.
    ``actor``: who caused it, when not the hub itself (an agent's reported result)."""
    if task.status in TERMINAL:
        duplicate = {"status": status, **(detail or {})}
        record_event(session, task, "duplicate_result", now, duplicate, actor=actor)
        return False
    status = lifecycle.transition(TaskStatus(task.status), lifecycle.ending(status))
    task.status = status
    task.result = result
    task.error = error
    task.finished_at = now
    task.updated_at = now
    task.lease_token = None
    task.lease_until = None
    kind = "terminal_success" if status is TaskStatus.SUCCESS else "terminal_failure"
    mark_finished(session, task.task_id, task_view(task))
    record_event(
        session,
        task,
        kind,
        now,
        {**(detail or {}), **({"error": error} if error else {})},
        actor=actor,
    )
    metrics.TASKS_TOTAL.labels(status).inc()
    return True


def dead_letter(
    session: Session, task: TaskRow, now: float, *, reason: str, error: dict[str, Any]
) -> None:
    finish(session, task, TaskStatus.DEAD, now, error={**error, "reason": reason})
    session.add(
        DeadLetterRow(
            task_id=task.task_id,
            agent_id=task.agent_id,
            method=task.method,
            payload=task.payload,
            attempts=task.attempt_seq,
            last_error=error,
            reason=reason,
            created_at=now,
            target=task.target,
        )
    )
    record_event(session, task, "dead_letter", now, {"reason": reason})
    metrics.DEAD_LETTER_TOTAL.inc()
    log.error("ALERT dead-lettered task %s (%s): %s", task.task_id, reason, error.get("message"))


def add_attempt(session: Session, task: TaskRow, now: float, available_at: float) -> None:
    """The outbox row of the task's current attempt, committed with the state change."""
    session.add(
        OutboxRow(
            task_id=task.task_id,
            agent_id=task.agent_id or "-",
            attempt_seq=task.attempt_seq,
            message=attempt_message(task.task_id, task.attempt_seq, task.priority),
            created_at=now,
            available_at=available_at,
        )
    )


def attempt_message(task_id: str, attempt_seq: int, priority: str | None) -> dict[str, Any]:
    """An outbox row's ``message``: the attempt and the queue the relay publishes it to."""
    return {"task_id": task_id, "attempt_seq": attempt_seq, "queue": queue_for(priority)}


def target_key(target: dict[str, Any]) -> str:
    """The outbox's agent column: the agent when named, else the filter in short."""
    if target.get("agent_id"):
        return str(target["agent_id"])
    return f"tags={','.join(target.get('tags') or [])};cap={target.get('capability') or ''}"[:128]


def mark_published(session: Session, task_id: str, attempt_seq: int, now: float) -> None:
    """Confirm a publication: the attempt is marked published and its claim, if a relay
    held one, is closed."""
    session.execute(
        update(OutboxRow)
        .where(OutboxRow.task_id == task_id, OutboxRow.attempt_seq == attempt_seq)
        .values(published_at=now, claimed_at=None)
    )
    session.execute(update(TaskRow).where(TaskRow.task_id == task_id).values(last_published_at=now))


def unmark_published(session: Session, task_id: str, attempt_seq: int) -> None:
    """Hand a refused publication back to the relay: unmarked, no claim open."""
    session.execute(
        update(OutboxRow)
        .where(OutboxRow.task_id == task_id, OutboxRow.attempt_seq == attempt_seq)
        .values(published_at=None, claimed_at=None)
    )
    session.execute(
        update(TaskRow).where(TaskRow.task_id == task_id).values(last_published_at=None)
    )


def schedule_retry(
    session: Session, task: TaskRow, now: float, delay: float, reason: str, detail: dict[str, Any]
) -> Publish:
    task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.RETRY)
    task.attempt_seq += 1
    task.lease_token = None
    task.lease_until = None
    task.next_attempt_at = now + delay
    task.updated_at = now
    add_attempt(session, task, now, available_at=now + delay)
    record_event(
        session, task, "retry", now, {"reason": reason, "delay_s": round(delay, 3), **detail}
    )
    metrics.RETRY_TOTAL.labels(reason).inc()
    return Publish(task.task_id, task.attempt_seq, delay, queue_for(task.priority))


def defer_attempt(
    session: Session,
    task: TaskRow,
    now: float,
    wait: float,
    jitter: float,
    reason: str,
    detail: dict[str, Any],
    max_deferrals: int,
    rng: random.Random | None = None,
) -> Publish | None:
    """Put the attempt off ``wait`` (+ up to ``jitter``) seconds without spending a retry.

    At most ``max_deferrals`` times per task (shared with 429 deferrals): past that,
    None, and the caller spends retries as before, so a permanently broken agent still
    ends in the dead-letter queue."""
    if task.deferrals >= max_deferrals:
        return None
    task.deferrals += 1
    delay = max(0.0, wait) + (rng.uniform(0, jitter) if rng is not None and jitter > 0 else 0.0)
    return schedule_retry(
        session, task, now, delay, reason, {**detail, "deferrals": task.deferrals}
    )


def fail_transient(
    session: Session,
    task: TaskRow,
    token: str | None,
    now: float,
    retry: RetryPolicy,
    rng: random.Random,
    *,
    reason: str,
    error: dict[str, Any],
) -> Publish | None:
    """A transient failure of the current attempt: retry with backoff, or dead-letter.
    ``token``: the attempt's lease, if the caller holds one (a lost lease: nothing done)."""
    if token is not None and task.lease_token != token:
        return None
    task.error = error
    budget = retry if task.max_retry is None else replace(retry, max_retry=task.max_retry)
    if not should_retry(task.retries, budget):
        dead_letter(session, task, now, reason=f"{task.retries} retries exhausted", error=error)
        return None
    task.retries += 1
    delay = backoff_delay(task.retries, retry, rng)
    return schedule_retry(
        session, task, now, delay, reason, {"error": error, "retry": task.retries}
    )


OPEN_STATUSES = tuple(s.value for s in TaskStatus if s not in TERMINAL)


def open_counts(session: Session) -> dict[str, int]:
    """Tasks not yet ended, by status, every open status named (0 included): the hub's
    queue depths, read at scrape time (``ix_tasks_status_next_attempt`` leads with status)."""
    counts = dict.fromkeys(OPEN_STATUSES, 0)
    rows = session.execute(
        select(TaskRow.status, func.count())
        .where(TaskRow.status.in_(OPEN_STATUSES))
        .group_by(TaskRow.status)
    )
    for status, count in rows:
        counts[str(status)] = int(count)
    return counts
