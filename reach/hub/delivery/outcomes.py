"""Every way an exchange can end, recorded: success, a business error, accepted (202),
backpressure (429), a breaker that opened, a refusal of mTLS, or a transient failure
(retried with backoff, then dead-lettered).

Terminal outcomes apply unless the task is terminal already (the first result wins);
the others apply only while the attempt still holds its lease, so a copy fenced out
meanwhile records a ``late_outcome`` event and changes nothing.
"""

from __future__ import annotations

import random

from sqlalchemy.orm import Session

from reach.core.delivery.answers import AgentAnswer, declared_message, described_body
from reach.core.delivery.retry import Outcome, backoff_delay, business_message
from reach.core.interop import a2a as a2a_rules
from reach.core.interop.channel import redacted
from reach.core.ledger import lifecycle
from reach.core.ledger.lifecycle import TaskEvent
from reach.core.ledger.statuses import TaskStatus
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.delivery.routing import Dispatch
from reach.hub.flow import breakers as breaker_store
from reach.hub.interop.a2a import exchange as a2a_exchange
from reach.hub.ledger.tasks import (
    Publish,
    dead_letter,
    defer_attempt,
    fail_transient,
    finish,
    load_for_update,
    record_event,
    schedule_retry,
)
from reach.hub.storage.models import TaskRow


def record_outcome(
    session: Session,
    d: Dispatch,
    outcome: Outcome,
    answer: AgentAnswer,
    now: float,
    dpolicy: DeliveryPolicy,
    rng: random.Random,
    verdict: a2a_rules.Verdict | None = None,
) -> Publish | None:
    """Record how the attempt ended (not a success: `succeed` took that one); a retry to
    publish, if one was scheduled."""
    task = load_for_update(session, d.task_id)
    if task is None:
        return None
    body = answer.body if isinstance(answer.body, dict) else {}
    if outcome is Outcome.SUCCESS:
        finish(
            session,
            task,
            TaskStatus.SUCCESS,
            now,
            result=body.get("data"),
            detail={"instance_id": d.instance_id, "attempt_seq": d.attempt_seq},
        )
        return None
    if outcome is Outcome.BUSINESS_ERROR:
        raw_code = body.get("code")
        code = raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) else None
        code = answer.status if code is None else code
        message = declared_message(body) or described_body(answer.status, answer.body)
        error = {
            "kind": "business",
            "code": code,
            "message": business_message(answer.status, message)[:2000],
            "http_status": answer.status,
        }
        finish(
            session,
            task,
            TaskStatus.FAILED,
            now,
            error=error,
            detail={"instance_id": d.instance_id, "attempt_seq": d.attempt_seq},
        )
        return None
    if not _holds_lease(task, d):
        record_event(
            session,
            task,
            "late_outcome",
            now,
            {"outcome": outcome.value, "attempt_seq": d.attempt_seq},
        )
        return None
    if answer.refused:  # an L1 agent the hub may not reach as it is: no retry would help
        error = {
            "kind": answer.error_kind,
            "http_status": None,
            "message": (answer.error or "")[:2000],
            "instance_id": d.instance_id,
        }
        dead_letter(session, task, now, reason="refused by mTLS (L1)", error=error)
        return None
    if outcome is Outcome.ACCEPTED:
        task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.ACCEPT)
        task.accepted_at = now
        task.deadline = now + task.timeout_ms / 1000 + dpolicy.watchdog_grace
        task.lease_until = None
        task.updated_at = now
        record_event(session, task, "ack", now, {"instance_id": d.instance_id})
        a2a_exchange.accepted(session, task, verdict, now)  # an A2A task to follow
        return None
    if outcome is Outcome.BACKPRESSURE and task.deferrals < dpolicy.max_deferrals:
        task.deferrals += 1
        delay = backoff_delay(min(task.deferrals, 5), dpolicy.retry, rng)
        return schedule_retry(
            session,
            task,
            now,
            delay,
            "backpressure",
            {"instance_id": d.instance_id, "deferrals": task.deferrals},
        )
    error = {
        "kind": answer.error_kind,
        "http_status": answer.status,
        "message": redacted(  # an error may quote the URL
            answer.error or declared_message(body) or described_body(answer.status, answer.body)
        )[:2000],
        "instance_id": d.instance_id,
    }
    if breaker_store.open_until(session, d.instance_id, now) is not None:
        # its breaker is open (this answer or another opened it): no retry spent
        task.error = error
        delay = backoff_delay(task.retries + 1, dpolicy.retry, rng)
        held = defer_attempt(
            session, task, now, delay, 0.0, "breaker_open", {"error": error},
            dpolicy.max_deferrals,
        )  # fmt: skip
        if held is not None:
            return held
    return fail_transient(
        session, task, d.token, now, dpolicy.retry, rng, reason="transient", error=error
    )


def _holds_lease(task: TaskRow, d: Dispatch) -> bool:
    return task.status == TaskStatus.DISPATCHING and task.lease_token == d.token
