"""Approval pages: ``/ui/approvals`` (pending first) and ``/ui/approvals/{id}``, with
approve and reject (a reason required).

Every decision goes through `reach.hub.gates.approvals`, the service behind
``/api/v1/approvals``: the decider is the signed-in key's identity (never a form field;
the optional name is only displayed next to it), ``approval.forbid_self_approval`` holds
here as in the API, two decisions racing on one approval have exactly one winner, and an
approved task's first attempt is published after commit. A refusal (already decided,
expired, self-approval, a rejection without a reason) is shown on the page with its HTTP
status and nothing changed. Reading needs ``read_approvals`` (admin, viewer, approver);
deciding, ``approve`` (admin, approver).
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from reach.core.ledger.statuses import ApprovalStatus
from reach.core.security.auth import Action
from reach.errors import ApprovalDecided, ReachError, UnknownApproval
from reach.hub.api.ui.pages import PageNotFound, Viewer, render, require_ui, ui_action
from reach.hub.context import HubContext
from reach.hub.gates import approvals
from reach.hub.storage.models import TaskRow

ReadsApprovals = Annotated[Viewer, Depends(require_ui(Action.READ_APPROVALS))]
Decides = Annotated[Viewer, Depends(ui_action(Action.APPROVE))]
LIST_LIMIT: Final = 200
STATUSES: Final = [s.value for s in ApprovalStatus]
MAX_ID: Final = 64


def router(ctx: HubContext) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/approvals")
    def approval_list(
        request: Request,
        viewer: ReadsApprovals,
        status: Annotated[str, Query(max_length=32)] = ApprovalStatus.PENDING.value,
    ) -> HTMLResponse:
        return _list_page(ctx, request, viewer, status)

    @router.get("/ui/approvals/{approval_id}")
    def approval(request: Request, approval_id: str, viewer: ReadsApprovals) -> HTMLResponse:
        return _detail_page(ctx, request, viewer, approval_id)

    @router.post("/ui/approvals/{approval_id}/{verb}")
    async def decide(
        request: Request, approval_id: str, verb: str, viewer: Decides
    ) -> HTMLResponse:
        if verb not in ("approve", "reject") or len(approval_id) > MAX_ID:
            raise PageNotFound(f"no such action: {verb!r}")
        form = await request.form()
        name = _text(form.get("name"), approvals.MAX_NAME)
        reason = _text(form.get("reason"), approvals.MAX_REASON + 1)
        back = form.get("back")
        message, error, status_code = await run_in_threadpool(
            _decide, ctx, viewer, approval_id, verb, name, reason
        )
        if back == "list":
            shown = form.get("status")
            return await run_in_threadpool(
                _list_page, ctx, request, viewer,
                shown if isinstance(shown, str) else ApprovalStatus.PENDING.value,
                message=message, error=error, status_code=status_code,
            )  # fmt: skip
        return await run_in_threadpool(
            _detail_page, ctx, request, viewer, approval_id,
            message=message, error=error, status_code=status_code,
        )  # fmt: skip

    return router


def _text(value: Any, limit: int) -> str | None:
    """A form field as text, cut to ``limit`` (the service refuses what is too long)."""
    return value[:limit] if isinstance(value, str) else None


def _decide(
    ctx: HubContext,
    viewer: Viewer,
    approval_id: str,
    verb: str,
    name: str | None,
    reason: str | None,
) -> tuple[str, str, int]:
    """Approve or reject as the API does: (message, error, HTTP status)."""
    principal = viewer.principal
    try:
        if verb == "approve":
            item = ctx.write(
                lambda s: approvals.approve(
                    s, approval_id, principal, name, ctx.clock.now(), ctx.approval_policy
                ),
                conflict=ApprovalDecided,
            )
            ctx.publish_attempts([item])
            return f"Approved: task {item.task_id} is delivered now.", "", 200
        ctx.write(
            lambda s: approvals.reject(
                s, approval_id, principal, name, reason, ctx.clock.now(), ctx.approval_policy
            ),
            conflict=ApprovalDecided,
        )
        return "Rejected: the task failed with your reason; its agent is never called.", "", 200
    except UnknownApproval as exc:
        raise PageNotFound(exc.detail) from None
    except ReachError as exc:  # decided, expired, self-approval, no reason: nothing written
        return "", exc.detail, exc.status


def _list_page(
    ctx: HubContext,
    request: Request,
    viewer: Viewer,
    status: str,
    *,
    message: str = "",
    error: str = "",
    status_code: int = 200,
) -> HTMLResponse:
    if status != "all" and status not in STATUSES:
        error = error or f"unknown status {status!r}: one of {', '.join(STATUSES)} or all"
        status = ApprovalStatus.PENDING.value
    wanted = None if status == "all" else ApprovalStatus(status)
    with ctx.reading() as session:
        rows = [approvals.view(r) for r in approvals.list_approvals(session, wanted, LIST_LIMIT)]
    context = {
        "rows": rows,
        "status": status,
        "statuses": STATUSES,
        "message": message,
        "error": error,
        "now": ctx.clock.now(),
        "limit": LIST_LIMIT,
    }
    return render(
        request, viewer, "approvals.html", context, active="approvals", status_code=status_code
    )


def _detail_page(
    ctx: HubContext,
    request: Request,
    viewer: Viewer,
    approval_id: str,
    *,
    message: str = "",
    error: str = "",
    status_code: int = 200,
) -> HTMLResponse:
    with ctx.reading() as session:
        try:
            view = approvals.view(approvals.get(session, approval_id))
        except UnknownApproval as exc:
            raise PageNotFound(exc.detail) from None
        payload = None
        if viewer.may(Action.READ_TASK):  # the task's payload, for whoever may read tasks
            payload = session.scalar(
                select(TaskRow.payload).where(TaskRow.task_id == view["task_id"])
            )
    context = {
        "a": view,
        "payload": payload,
        "message": message,
        "error": error,
        "now": ctx.clock.now(),
    }
    return render(
        request, viewer, "approval.html", context, active="approvals", status_code=status_code
    )
