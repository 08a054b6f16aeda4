"""Progress streams: ``GET /v1/tasks/{id}/stream``, ``/v1/broadcasts/{id}/stream`` and
``/api/v1/dag-runs/{id}/stream`` as server-sent events (``reach.hub.ledger.streams``).

Authorised exactly as the plain reads (the same read decides: not yours is not found);
a ``Last-Event-ID`` header (or ``last_event_id`` query parameter, for clients that cannot
set headers) resumes after that event; one that is garbage or newer than anything the
stream sent is a 400 ``bad-last-event-id`` before the stream starts.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from sqlalchemy import select
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from reach.core.security.auth import Action, Principal, may_read_task
from reach.errors import UnknownTask
from reach.hub.api.auth import not_yours, require
from reach.hub.api.routes import broadcasts as broadcast_routes
from reach.hub.api.routes import tasks as task_routes
from reach.hub.context import HubContext
from reach.hub.ledger import streams
from reach.hub.ledger.streams import Event, StreamHub
from reach.hub.orchestration import broadcasts as broadcast
from reach.hub.orchestration import dagruns
from reach.hub.storage.models import DagRunRow

Reads = Annotated[Principal, Depends(require(Action.READ_TASK))]
LastEventId = Annotated[str | None, Header(alias="Last-Event-ID")]
LastEventQuery = Annotated[str | None, Query(max_length=40)]
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "the event stream"},
    400: {},
    404: {},
}


def _response(ctx: HubContext, events: AsyncIterator[Event]) -> EventSourceResponse:
    async def sse() -> AsyncIterator[ServerSentEvent]:
        async for event in events:
            yield ServerSentEvent(
                json.dumps(event.data, default=str), event=event.kind, id=str(event.id)
            )

    return EventSourceResponse(
        sse(),
        ping=ctx.settings.server.stream_ping_s,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _last(header: str | None, query: str | None) -> int | None:
    return streams.parse_last_event_id(header if header is not None else query)


def stream_router(ctx: HubContext, hub: StreamHub) -> APIRouter:
    router = APIRouter(tags=["streams"])

    @router.get("/v1/tasks/{task_id}/stream", responses=_RESPONSES)
    async def task_stream(
        task_id: str,
        request: Request,
        principal: Reads,
        last_event_id: LastEventId = None,
        last_event_query: Annotated[LastEventQuery, Query(alias="last_event_id")] = None,
    ) -> EventSourceResponse:
        """The task's state, then each status change, progress report and its result."""
        last = _last(last_event_id, last_event_query)

        def open_() -> tuple[dict[str, Any], int]:
            newest = streams.newest_event_id(ctx, task_id)  # first: nothing slips between
            return task_routes.read_task(ctx, task_id, request, principal), newest

        view, newest = await run_in_threadpool(open_)
        streams.check_resume(last, newest)
        return _response(ctx, streams.task_stream(hub, task_id, view, newest, last))

    @router.get("/v1/broadcasts/{broadcast_id}/stream", responses=_RESPONSES)
    async def broadcast_stream(
        broadcast_id: str,
        request: Request,
        principal: Reads,
        last_event_id: LastEventId = None,
        last_event_query: Annotated[LastEventQuery, Query(alias="last_event_id")] = None,
    ) -> EventSourceResponse:
        """The aggregate, then each target's answer as it lands, then the complete view."""
        last = _last(last_event_id, last_event_query)
        first = await run_in_threadpool(
            broadcast_routes._read, ctx, broadcast_id, request, principal
        )
        streams.check_resume(
            last, streams.newest_of(first, streams.broadcast_steps, streams.broadcast_done)
        )
        events = streams.snapshot_stream(
            hub,
            "broadcast:" + broadcast_id,
            lambda: _aggregate(ctx, broadcast_id),
            first,
            streams.broadcast_steps,
            streams.broadcast_done,
            streams.broadcast_wake_keys,
            "answer",
            "complete",
            last,
        )
        return _response(ctx, events)

    return router


def dag_stream_router(ctx: HubContext, hub: StreamHub) -> APIRouter:
    router = APIRouter(tags=["streams"])

    def read(run_id: str, request: Request, principal: Principal) -> dict[str, Any]:
        with ctx.reading() as session:
            owner = session.execute(
                select(DagRunRow.caller).where(DagRunRow.run_id == run_id)
            ).first()
            if owner is not None and not may_read_task(principal, owner.caller, None):
                not_yours(request, principal, f"DAG run {run_id!r}")
                raise UnknownTask(f"DAG run {run_id!r} does not exist", run_id=run_id)
            return dagruns.view(session, run_id)

    @router.get("/api/v1/dag-runs/{run_id}/stream", responses=_RESPONSES)
    async def dag_stream(
        run_id: str,
        request: Request,
        principal: Reads,
        last_event_id: LastEventId = None,
        last_event_query: Annotated[LastEventQuery, Query(alias="last_event_id")] = None,
    ) -> EventSourceResponse:
        """The run, then each node's start and ending in order, then the finished run."""
        last = _last(last_event_id, last_event_query)
        first = await run_in_threadpool(read, run_id, request, principal)
        streams.check_resume(last, streams.newest_of(first, streams.dag_steps, streams.dag_done))
        events = streams.snapshot_stream(
            hub,
            "dag:" + run_id,
            lambda: _dag_view(ctx, run_id),
            first,
            streams.dag_steps,
            streams.dag_done,
            streams.dag_wake_keys,
            "node",
            "run",
            last,
            settle=True,
        )
        return _response(ctx, events)

    return router


# the feeds' reads: shared by every stream of one run (broadcast), each authorised when
# it opened, so they read as the hub (no request, no principal of one stream)


def _aggregate(ctx: HubContext, broadcast_id: str) -> dict[str, Any]:
    with ctx.reading() as session:
        return broadcast.aggregate(session, broadcast_id, ctx.clock.now())


def _dag_view(ctx: HubContext, run_id: str) -> dict[str, Any]:
    with ctx.reading() as session:
        return dagruns.view(session, run_id)
