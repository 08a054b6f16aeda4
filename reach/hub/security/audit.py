"""The audit log: admin changes, reaches to and from L3 agents, and refused attempts.

Task events already say what happened to a task and who caused it (``task_events.actor``);
this log holds the acts that are not a task's step. Nothing secret is ever written here:
callers pass identities (``key:<id>``, ``agent:<id>``), never a credential.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.security.auth import HUB
from reach.hub.storage.models import AuditRow, TaskEventRow, TaskRow

ALLOWED = "allowed"
REFUSED = "refused"


def record(
    session: Session,
    *,
    actor: str,
    action: str,
    outcome: str,
    now: float,
    target: str = "",
    task_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append one entry (in the caller's transaction: it commits with what it records)."""
    session.add(
        AuditRow(
            at=now,
            actor=actor[:160],
            action=action[:64],
            target=target[:160],
            outcome=outcome[:16],
            task_id=task_id,
            detail=detail or {},
        )
    )


def for_task(session: Session, task_id: str) -> list[AuditRow]:
    return list(
        session.scalars(
            select(AuditRow).where(AuditRow.task_id == task_id).order_by(AuditRow.id)
        ).all()
    )


def view(row: AuditRow) -> dict[str, Any]:
    return {
        "at": row.at,
        "actor": row.actor,
        "action": row.action,
        "target": row.target,
        "outcome": row.outcome,
        "task_id": row.task_id,
        "detail": row.detail,
    }


OUTCOMES = {
    "accepted": "accepted",
    "submitted": "accepted",
    "dispatched": "dispatched",
    "ack": "acknowledged",
    "progress": "progress",
    "retry": "retry",
    "terminal_success": "success",
    "terminal_failure": "failed",
    "dead_letter": "dead",
    "replayed": "replayed",
    "duplicate_result": "ignored",
    "late_outcome": "ignored",
    "report_refused": "refused",
    "approval_requested": "awaiting_approval",
    "approval_granted": "approved",
    "approval_rejected": "rejected",
    "approval_expired": "expired",
}


def _outcome(kind: str, detail: dict[str, Any]) -> str:
    if kind == "terminal_failure" and isinstance(detail.get("error"), dict):
        return str(detail["error"].get("kind") or "failed")
    return OUTCOMES.get(kind, kind)


def task_trail(session: Session, task: TaskRow) -> dict[str, Any]:
    """The task's audit trail (``GET /api/v1/tasks/{id}/audit``; the dashboard's too)."""
    task_id = task.task_id
    events = session.scalars(
        select(TaskEventRow).where(TaskEventRow.task_id == task_id).order_by(TaskEventRow.id)
    ).all()
    entries = [view(r) for r in for_task(session, task_id)]
    caller = task.caller
    status = task.status
    trail = [
        {
            "at": e.at,
            "actor": e.actor or HUB,
            "kind": e.kind,
            "outcome": _outcome(e.kind, e.detail),
            "agent_id": e.agent_id,
            "instance_id": e.instance_id,
            "attempt_seq": e.attempt_seq,
            "detail": e.detail,
        }
        for e in events
    ]
    identities = {e["actor"] for e in trail} | {a["actor"] for a in entries}
    if caller:
        identities.add(caller)
    agents = {e["agent_id"] for e in trail if e["agent_id"]}
    return {
        "task_id": task_id,
        "status": status,
        "caller": caller,
        "identities": sorted(identities),
        "agents": sorted(agents),
        "events": trail,
        "audit": entries,
    }
