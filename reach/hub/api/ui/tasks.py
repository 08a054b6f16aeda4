"""Task pages: ``/ui/tasks`` (filtered, one keyset page at a time) and ``/ui/tasks/{id}``
(payload, result, every attempt and the audit trail), live while the task runs.

The list is `reach.hub.ops.listings.list_tasks` (``GET /api/v1/tasks``'s), the trail
`reach.hub.security.audit.task_trail` (``GET /api/v1/tasks/{id}/audit``'s). Live:
``/ui/tasks/{id}/live`` follows the task's progress stream (`reach.hub.ledger.streams.task_stream`,
``GET /v1/tasks/{id}/stream``'s) and answers each of its events with the task's live
section rendered afresh (SSE event ``update``, which htmx's ``sse-swap`` puts in place),
then ``done`` once the task is terminal (``sse-close``: the browser does not reconnect).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from reach.core.ledger.statuses import TERMINAL, TaskStatus
from reach.core.ops.paging import MAX_LIMIT, TaskFilter
from reach.core.security.auth import Action, may_read_task
from reach.errors import InvalidQuery
from reach.hub import tracing
from reach.hub.api.auth import not_yours
from reach.hub.api.ui.pages import PageNotFound, Viewer, env, render, require_ui
from reach.hub.context import HubContext
from reach.hub.ledger import streams
from reach.hub.ledger import tasks as ledger
from reach.hub.ledger.streams import StreamHub
from reach.hub.ops import listings
from reach.hub.security.audit import task_trail
from reach.hub.storage.models import TaskRow

ReadsTasks = Annotated[Viewer, Depends(require_ui(Action.READ_TASK))]
Text = Annotated[str, Query(max_length=256)]
PAGE_SIZE = 50
STATUSES = [s.value for s in TaskStatus]
FILTERS = ("status", "agent_id", "capability", "caller", "session_id", "since", "until")


def router(ctx: HubContext, stream_hub: StreamHub) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/tasks")
    def task_list(
        request: Request,
        viewer: ReadsTasks,
        status: Text = "",
        agent_id: Text = "",
        capability: Text = "",
        caller: Text = "",
        session_id: Text = "",
        since: Text = "",
        until: Text = "",
        cursor: Annotated[str, Query(max_length=1024)] = "",
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = PAGE_SIZE,
    ) -> HTMLResponse:
        given = {
            "status": status,
            "agent_id": agent_id,
            "capability": capability,
            "caller": caller,
            "session_id": session_id,
            "since": since,
            "until": until,
        }
        error = ""
        items: list[dict[str, Any]] = []
        next_cursor: str | None = None
        try:
            filters = TaskFilter.parse(
                ctx.clock.now(), **{k: (v.strip() or None) for k, v in given.items()}
            )
            page = listings.list_tasks(
                ctx, filters, cursor or None, limit, principal=viewer.principal
            )
            items, next_cursor = page.items, page.next_cursor
        except InvalidQuery as exc:  # a bad filter or a forged cursor: said on the page
            error = str(exc)
        kept: dict[str, str | int] = {k: v for k, v in given.items() if v}
        if limit != PAGE_SIZE:
            kept["limit"] = limit
        context = {
            "tasks": items,
            "filters": given,
            "statuses": STATUSES,
            "error": error,
            "next_href": f"/ui/tasks?{urlencode({**kept, 'cursor': next_cursor})}"
            if next_cursor
            else None,
            "first_href": f"/ui/tasks?{urlencode(kept)}" if cursor else None,
        }
        return render(request, viewer, "tasks.html", context, active="tasks")

    @router.get("/ui/tasks/{task_id}")
    def task_page(request: Request, task_id: str, viewer: ReadsTasks) -> HTMLResponse:
        view = _task(ctx, request, viewer, task_id)
        return render(request, viewer, "task.html", view, active="tasks")

    @router.get("/ui/tasks/{task_id}/live")
    async def task_live(request: Request, task_id: str, viewer: ReadsTasks) -> EventSourceResponse:
        def open_() -> tuple[dict[str, Any], int]:
            newest = streams.newest_event_id(ctx, task_id)  # first: nothing slips between
            return _task(ctx, request, viewer, task_id), newest

        first, newest = await run_in_threadpool(open_)

        async def events() -> AsyncIterator[ServerSentEvent]:
            yield ServerSentEvent(_live_html(first), event="update")
            if first["task"]["status"] not in TERMINAL:
                async for _ in streams.task_stream(
                    stream_hub, task_id, first["task"], newest, None
                ):
                    view = await run_in_threadpool(_task, ctx, request, viewer, task_id)
                    yield ServerSentEvent(_live_html(view), event="update")
            yield ServerSentEvent("", event="done")

        return EventSourceResponse(
            events(),
            ping=ctx.settings.server.stream_ping_s,
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return router


def _task(ctx: HubContext, request: Request, viewer: Viewer, task_id: str) -> dict[str, Any]:
    """Everything the task page shows; 404 page when unknown or not the viewer's to see."""
    with ctx.reading() as session:
        row = session.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        if row is not None and not may_read_task(viewer.principal, row.caller, row.agent_id):
            not_yours(request, viewer.principal, f"task {task_id!r}")
            row = None
        if row is None:
            raise PageNotFound(f"task {task_id!r} does not exist")
        trail = task_trail(session, row)
        task = ledger.task_view(row)
        payload = row.payload
    return {
        "task": task,
        "payload": payload,
        "trail": trail,
        "attempts": attempts_of(trail["events"]),
        "progress": next(
            (e["detail"] for e in reversed(trail["events"]) if e["kind"] == "progress"), None
        ),
        "live": task["status"] not in TERMINAL,
        "trace_id": tracing.trace_id(task.get("trace")),  # to look the reach up in a tracer
    }


def attempts_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task's attempts, from its trail: each numbered attempt's instance, its first
    and last event, and how it ended (the last event's outcome, with its error if any)."""
    by_seq: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        seq = event.get("attempt_seq") or 0
        if seq > 0:
            by_seq.setdefault(seq, []).append(event)
    out = []
    for seq in sorted(by_seq):
        group = by_seq[seq]
        last = group[-1]
        error = next(
            (e["detail"].get("error") for e in reversed(group) if e["detail"].get("error")), None
        )
        out.append(
            {
                "seq": seq,
                "instance_id": next((e["instance_id"] for e in group if e["instance_id"]), None),
                "agent_id": next((e["agent_id"] for e in group if e["agent_id"]), None),
                "started_at": group[0]["at"],
                "last_at": last["at"],
                "events": [e["kind"] for e in group],
                "outcome": last["outcome"],
                "error": error,
            }
        )
    return out


def _live_html(view: dict[str, Any]) -> str:
    return env.get_template("_task_live.html").render(view)
