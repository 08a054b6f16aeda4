"""The approvals admin surface: list, show, approve, reject (``reach.hub.gates.approvals``).

Reading needs ``read_approvals`` (admin, viewer, approver); deciding needs ``approve``
(admin, approver). The decider is the authenticated key, never a body field: the record
keeps its identity and the key's own name (``name`` in a body is accepted for old clients
and ignored). ``approval.approvers`` may designate who decides a capability. An approved
task's first attempt is published after commit, as a dead-letter replay is (the relay
covers a crash).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from reach.core.ledger.statuses import ApprovalStatus, TaskStatus
from reach.core.security.auth import Action, Principal
from reach.errors import ApprovalDecided
from reach.hub.api.auth import require
from reach.hub.context import HubContext
from reach.hub.gates import approvals

ReadsApprovals = Annotated[Principal, Depends(require(Action.READ_APPROVALS))]
Approves = Annotated[Principal, Depends(require(Action.APPROVE))]
ApprovalId = Annotated[str, Field(min_length=1, max_length=64)]


IGNORED_NAME = "ignored: the deciding key's own name is recorded"


class Approve(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, max_length=approvals.MAX_NAME, description=IGNORED_NAME)


class Reject(BaseModel):
    """``reason`` is checked by the service (``reason-required``), so a missing, empty or
    blank reason gets the same problem type."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(None, max_length=approvals.MAX_REASON)
    name: str | None = Field(None, max_length=approvals.MAX_NAME, description=IGNORED_NAME)


def approval_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/api/v1/approvals", tags=["admin"])

    @router.get("")
    def list_approvals(
        principal: ReadsApprovals,
        status: Annotated[ApprovalStatus | None, Query()] = ApprovalStatus.PENDING,
        all_statuses: Annotated[bool, Query(alias="all")] = False,
        limit: Annotated[int, Query(ge=1, le=approvals.MAX_LIST)] = 100,
    ) -> dict[str, Any]:
        """Newest first; ``status`` (default ``pending``), or ``all=true`` for every one."""
        with ctx.reading() as session:
            rows = approvals.list_approvals(session, None if all_statuses else status, limit)
            return {"approvals": [approvals.view(r) for r in rows]}

    @router.get("/{approval_id}", responses={404: {}})
    def show(approval_id: str, principal: ReadsApprovals) -> dict[str, Any]:
        with ctx.reading() as session:
            return approvals.view(approvals.get(session, approval_id))

    @router.post("/{approval_id}/approve", responses={403: {}, 404: {}, 409: {}, 410: {}})
    def approve(
        approval_id: str, principal: Approves, body: Approve | None = None
    ) -> dict[str, Any]:
        """Deliver the parked task; 409 ``approval-decided`` when already decided (or a
        concurrent decision won), 410 ``approval-expired``, 403 ``self-approval``."""
        name = body.name if body else None
        item = ctx.write(
            lambda s: approvals.approve(
                s, approval_id, principal, name, ctx.clock.now(), ctx.approval_policy
            ),
            conflict=ApprovalDecided,
        )
        ctx.publish_attempts([item])
        with ctx.reading() as session:
            answer = approvals.view(approvals.get(session, approval_id))
        return {**answer, "task_status": TaskStatus.PENDING, "attempt_seq": item.attempt_seq}

    @router.post("/{approval_id}/reject", responses={403: {}, 404: {}, 409: {}, 410: {}, 422: {}})
    def reject(approval_id: str, body: Reject, principal: Approves) -> dict[str, Any]:
        """Fail the parked task with the reason; the agent is never called."""
        answer = ctx.write(
            lambda s: approvals.reject(
                s, approval_id, principal, body.name, body.reason, ctx.clock.now(),
                ctx.approval_policy,
            ),
            conflict=ApprovalDecided,
        )  # fmt: skip
        return {**answer, "task_status": TaskStatus.FAILED}

    return router
