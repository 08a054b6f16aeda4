"""Broadcast endpoints: fan one request out as a Celery group, read the aggregate."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from reach import broadcasting
from reach.api.longpoll import long_poll
from reach.canvas import fan_out
from reach.completions import Waiters
from reach.context import HubContext
from reach.delivery import mark_published
from reach.schemas import BroadcastRequest

MAX_WAIT_S = 60.0


def broadcast_router(ctx: HubContext, waiters: Waiters | None = None) -> APIRouter:
    router = APIRouter(prefix="/v1/broadcasts", tags=["broadcasts"])

    @router.post("", status_code=201, responses={404: {}, 422: {}})
    def start(body: BroadcastRequest) -> JSONResponse:
        def work(session: Session) -> tuple[str, list[str]]:
            row = broadcasting.start(session, body, ctx.clock.now(), ctx.policy)
            return row.broadcast_id, [t["task_id"] for t in row.targets]

        broadcast_id, task_ids = ctx.write(work)
        try:
            fan_out(ctx.publisher.app, task_ids).apply_async()
        except Exception:  # the broker is down: the tasks are in the outbox for the relay
            pass
        else:
            with ctx.transaction() as session:
                for task_id in task_ids:
                    mark_published(session, task_id, 1, ctx.clock.now())
        return JSONResponse(_read(ctx, broadcast_id), status_code=201)

    @router.get("/{broadcast_id}", responses={404: {}})
    async def get(
        broadcast_id: str, wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0
    ) -> dict[str, Any]:
        """The aggregate; with ``wait``, hold until it is complete or time is up."""
        keys = [t["task_id"] for t in _read(ctx, broadcast_id)["results"]] if wait else []
        return await long_poll(
            lambda: _read(ctx, broadcast_id),
            lambda v: v["complete"],
            wait,
            waiters=waiters,
            keys=keys,
        )

    return router


def _read(ctx: HubContext, broadcast_id: str) -> dict[str, Any]:
    with ctx.transaction() as session:
        return broadcasting.aggregate(session, broadcast_id, ctx.clock.now())
