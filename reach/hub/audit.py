"""The audit log: admin changes, reaches to and from L3 agents, and refused attempts.

Task events already say what happened to a task and who caused it (``task_events.actor``);
this log holds the acts that are not a task's step. Nothing secret is ever written here:
callers pass identities (``key:<id>``, ``agent:<id>``), never a credential.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.hub.storage.models import AuditRow

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
