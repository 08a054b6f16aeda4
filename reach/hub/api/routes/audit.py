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

from reach.core.security.auth import Action, Principal, may_read_task
from reach.errors import UnknownTask
from reach.hub.api.auth import not_yours, require
from reach.hub.context import HubContext
from reach.hub.security import audit
from reach.hub.storage.models import TaskRow

ReadsTasks = Annotated[Principal, Depends(require(Action.READ_TASK))]

# What each event kind meant for the task, in one word.


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
            return audit.task_trail(session, task)

    return router
