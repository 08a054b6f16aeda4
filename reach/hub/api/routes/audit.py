"""A task's audit trail: which identities and agents touched it, when, with what outcome.

The task's events (each with the identity behind it: the caller who submitted it, the
agent that reported, the admin who replayed it; ``hub`` for the hub's own steps) and the
audit-log rows naming the task (reaches to or from L3 agents, refused attempts).
Whoever may read the task may read its trail; anyone else is told it does not exist.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.auth import HUB, Action, Principal, may_read_task
from reach.errors import UnknownTask
from reach.hub import audit
from reach.hub.api.auth import not_yours, require
from reach.hub.context import HubContext
from reach.hub.storage.models import TaskEventRow, TaskRow

ReadsTasks = Annotated[Principal, Depends(require(Action.READ_TASK))]

# What each event kind meant for the task, in one word.
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


def audit_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/api/v1/tasks", tags=["audit"])

    @router.get("/{task_id}/audit", responses={404: {}})
    def task_audit(task_id: str, request: Request, principal: ReadsTasks) -> dict[str, Any]:
        """Every event of the task with the identity behind it, and its audit-log rows."""
        with ctx.reading() as session:
            task = session.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
            if task is not None and not may_read_task(principal, task.caller, task.agent_id):
                not_yours(request, principal, f"task {task_id!r}")
                task = None
            if task is None:
                raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
            return task_trail(session, task)

    return router


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
    entries = [audit.view(r) for r in audit.for_task(session, task_id)]
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
