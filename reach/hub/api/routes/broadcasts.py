"""Broadcast endpoints: fan one request out to every target at once, read the aggregate."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from reach.core.ledger.statuses import TERMINAL
from reach.core.security.auth import Action, Principal, may_read_task
from reach.errors import Backpressure, TaskConflict, UnknownTask
from reach.hub.api import links
from reach.hub.api.auth import not_yours, require
from reach.hub.context import HubContext
from reach.hub.flow import admission
from reach.hub.ledger.longpoll import long_poll
from reach.hub.ledger.tasks import unmark_published
from reach.hub.ledger.wakeups import Waiters
from reach.hub.ops.alerts import BackpressureLog
from reach.hub.orchestration import broadcasts as broadcast
from reach.hub.storage.models import BroadcastRow
from reach.wire.schemas import MAX_WAIT_S, BroadcastRequest

Submits = Annotated[Principal, Depends(require(Action.SUBMIT))]
Reads = Annotated[Principal, Depends(require(Action.READ_TASK))]


def broadcast_router(ctx: HubContext, waiters: Waiters | None = None) -> APIRouter:
    router = APIRouter(prefix="/v1/broadcasts", tags=["broadcasts"])
    limits = admission.Limits.of(ctx.settings)
    refusals = BackpressureLog()

    @router.post(
        "",
        status_code=201,
        responses={**links.responses(links.STARTED_BROADCAST, 201), 404: {}, 422: {}},
    )
    def start(body: BroadcastRequest, request: Request, principal: Submits) -> JSONResponse:
        def work(session: Session) -> tuple[str, list[str]]:
            now = ctx.clock.now()
            row = broadcast.start(
                session,
                body,
                now,
                ctx.policy,
                published_at=now,
                caller=principal.identity,
                l3_cap=ctx.settings.security.l3_max_payload_bytes,
                approval=ctx.approval_policy,
                limits=limits,
            )
            return row.broadcast_id, [t["task_id"] for t in row.targets]

        try:
            broadcast_id, task_ids = ctx.write(work, conflict=TaskConflict)
        except Backpressure as full:  # the 429 rolled back: its alert row apart
            refusals.record(ctx, full, principal.identity)
            raise
        try:
            ctx.dispatcher.fan_out(task_ids)
        except Exception:  # the broker is down: hand the attempts to the relay
            with ctx.transaction() as session:
                for task_id in task_ids:
                    unmark_published(session, task_id, 1)
        return JSONResponse(_read(ctx, broadcast_id, request, principal), status_code=201)

    @router.get("/{broadcast_id}", responses={404: {}})
    async def get(
        broadcast_id: str,
        request: Request,
        principal: Reads,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    ) -> dict[str, Any]:
        """The aggregate; with ``wait``, hold until it is complete or time is up."""
        first = await run_in_threadpool(_read, ctx, broadcast_id, request, principal)
        if not wait or first["complete"]:
            return first
        targets = [t["task_id"] for t in first["results"]]
        return await long_poll(
            # read afresh: long_poll reads only once it watches, so no answer that
            # lands after ``first`` can slip past it
            lambda: _read(ctx, broadcast_id, request, principal),
            lambda v: v["complete"],
            wait,
            waiters=waiters,
            keys=targets,
            wake_after=_answers_missing,
            reread_within=first["deadline"] - ctx.clock.now(),
        )

    return router


def _answers_missing(view: dict[str, Any]) -> int:
    """How many more targets must finish before the aggregate can be complete: enough
    successes for ``min_results``, or every target (whichever comes first)."""
    results = view["results"]
    pending = sum(1 for r in results if r["status"] not in TERMINAL)
    return min(max(0, int(view["min_results"]) - int(view["succeeded"])), pending)


def _read(
    ctx: HubContext, broadcast_id: str, request: Request, principal: Principal
) -> dict[str, Any]:
    """The aggregate, for whoever may read it: anyone else is told, as for an unknown id,
    that it does not exist."""
    with ctx.reading() as session:
        owner = session.execute(
            select(BroadcastRow.caller).where(BroadcastRow.broadcast_id == broadcast_id)
        ).first()
        if owner is not None and not may_read_task(principal, owner.caller, None):
            not_yours(request, principal, f"broadcast {broadcast_id!r}")
            raise UnknownTask(
                f"broadcast {broadcast_id!r} does not exist", broadcast_id=broadcast_id
            )
        return broadcast.aggregate(session, broadcast_id, ctx.clock.now())
