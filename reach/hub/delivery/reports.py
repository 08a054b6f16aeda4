"""What agents report about the tasks they took: a late result after a 202 (or a
transient failure of the accepted work), and progress (which keeps the task alive).

Reports are fenced like deliveries (``reach.core.ledger.reports``): only the attempt the task
waits on, from the instance it went to, may decide it; anything else is recorded as a
``report_refused`` event and comes back as a `StaleReport`.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from reach.core.ledger.reports import Verdict, judge_report
from reach.core.ledger.statuses import TaskStatus
from reach.errors import StaleReport, UnknownTask
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.ledger.tasks import (
    Publish,
    fail_transient,
    finish,
    load_for_update,
    record_event,
    succeed,
)
from reach.hub.storage.models import TaskEventRow, TaskRow

log = logging.getLogger("reach.hub.delivery.reports")


def record_report(
    session: Session,
    task_id: str,
    code: int,
    data: Any,
    message: str,
    now: float,
    *,
    attempt_seq: int,
    instance_id: str,
    actor: str | None = None,
    transient: Transient | None = None,
) -> bool | StaleReport | Publish:
    """Record an agent's reported answer (after its 202).

    True if it decided the task; False if the task had its terminal result already (the
    report is kept as a ``duplicate_result`` event). A report for another attempt or from
    another instance (``reach.core.ledger.reports``) changes nothing but a ``report_refused``
    event, and comes back as the `StaleReport` to raise once this transaction committed
    (raising here would roll the record back with it). A ``transient`` failure report
    fails the attempt as a 5xx answer would: the retry to publish after commit comes
    back (or False: dead-lettered, or nothing left to fail).
    """
    detail = {"reported_by": instance_id, "attempt_seq": attempt_seq, "late_report": True}
    answering = (attempt_seq, instance_id)
    if code == 0 and (
        succeed(session, task_id, data, now, detail, answering=answering, actor=actor) is not None
    ):
        return True  # the common case, without loading the row
    task = load_for_update(session, task_id)
    if task is None:
        raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
    current = (TaskStatus(task.status), task.attempt_seq, task.instance_id)
    verdict = judge_report(*current, attempt_seq, instance_id)
    if verdict is Verdict.STALE:
        return refuse_report(session, task, "result", attempt_seq, instance_id, now, actor)
    if code == 0:
        return finish(
            session, task, TaskStatus.SUCCESS, now, result=data, detail=detail, actor=actor
        )
    if transient is not None:
        if verdict is not Verdict.APPLY:  # terminal already: the first result stands
            record_event(session, task, "duplicate_result", now, {**detail, "transient": True})
            return False
        error = {"kind": "agent_error", "code": code, "message": message[:2000]}
        error["instance_id"] = instance_id
        retry = fail_transient(
            session, task, None, now, transient.policy.retry, transient.rng,
            reason="reported_failure", error=error,
        )  # fmt: skip
        return False if retry is None else retry
    error = {"kind": "business", "code": code, "message": message[:2000]}
    return finish(session, task, TaskStatus.FAILED, now, error=error, detail=detail, actor=actor)


@dataclass(frozen=True, slots=True)
class Transient:
    """What failing a reported attempt needs: the retry schedule and its jitter."""

    policy: DeliveryPolicy
    rng: random.Random


def report_progress(
    session: Session,
    task_id: str,
    detail: dict[str, Any],
    now: float,
    *,
    attempt_seq: int,
    instance_id: str,
    actor: str | None = None,
    keepalive: bool = False,
    grace: float = 0.0,
) -> StaleReport | None:
    """Record progress of the attempt in flight; a `StaleReport` (recorded, as for a
    result) if the report names another attempt or instance. Late progress of a
    terminal task is kept as an event, as before. The row is locked: a task's events
    commit in their id order, which a progress stream resuming by id relies on.

    Progress of an accepted task is word from its agent: the watchdog's deadline moves
    to ``timeout`` + ``grace`` from now. A ``keepalive`` moves it and records nothing."""
    task = load_for_update(session, task_id)
    if task is None:
        raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
    verdict = judge_report(
        TaskStatus(task.status), task.attempt_seq, task.instance_id, attempt_seq, instance_id
    )
    if verdict is Verdict.STALE:
        return refuse_report(session, task, "progress", attempt_seq, instance_id, now, actor)
    if verdict is Verdict.APPLY and task.status == TaskStatus.EXECUTING:
        task.deadline = max(task.deadline or 0.0, now + task.timeout_ms / 1000 + grace)
    if not keepalive:
        record_event(session, task, "progress", now, detail, actor=actor)
    return None


def refuse_report(
    session: Session,
    task: TaskRow,
    report: str,
    attempt_seq: int,
    instance_id: str,
    now: float,
    actor: str | None = None,
) -> StaleReport:
    """Record a refused report (who claimed what, and what the task waits on) as a task
    event that leaves the task as it is; the error names only what the reporter sent."""
    session.add(
        TaskEventRow(
            task_id=task.task_id,
            agent_id=None,  # a claim, not a fact: the reporter may be anyone
            instance_id=instance_id,
            attempt_seq=attempt_seq,
            kind="report_refused",
            actor=actor,
            detail={
                "report": report,
                "claimed_instance_id": instance_id,
                "claimed_attempt_seq": attempt_seq,
                "status": task.status,
                "current_attempt_seq": task.attempt_seq,
                "current_instance_id": task.instance_id,
            },
            at=now,
        )
    )
    log.warning(
        "refused %s report for task %s from instance %s (attempt %d): it waits on attempt %d"
        " at %s (%s)",
        report, task.task_id, instance_id, attempt_seq, task.attempt_seq, task.instance_id,
        task.status,
    )  # fmt: skip
    return StaleReport(
        f"task {task.task_id!r} is not waiting on a {report} of attempt {attempt_seq} "
        f"from instance {instance_id!r}; the report was recorded and not applied",
        task_id=task.task_id,
        attempt_seq=attempt_seq,
        instance_id=instance_id,
    )
