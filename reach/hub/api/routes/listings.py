"""The operator's lists: tasks, DAG runs and alerts, filtered and paged newest first.

Each answers ``{"items": [...], "next_cursor": ...}`` (`reach.hub.ops.listings`,
`reach.hub.ops.alerts`); pass ``next_cursor`` back as ``cursor`` for the next page. Times
(``since``, ``until``) are epoch seconds, ISO 8601 or a duration ago (``15m``, ``2h``);
a bad filter is 422 ``invalid-query``, a forged cursor 400 ``bad-cursor``.

Admins and viewers list every task and run; a caller key lists what it submitted, an
agent key that and what was delivered to its agents (the rule of ``GET /v1/tasks/{id}``,
applied in the query). Alerts are the fleet's: admins and viewers only. Muting an alert
kind (``PUT``/``DELETE /api/v1/alerts/mutes/{kind}``) is an admin write, audited; an
unknown kind is 422 ``invalid-query``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from starlette.concurrency import run_in_threadpool

from reach.core.ops.paging import DagRunFilter, TaskFilter, parse_instant
from reach.core.security.auth import Action, Principal
from reach.hub.api.auth import require
from reach.hub.context import HubContext
from reach.hub.ops import alerts, listings

ReadsTasks = Annotated[Principal, Depends(require(Action.READ_TASK))]
ReadsFleet = Annotated[Principal, Depends(require(Action.READ_FLEET))]
Administers = Annotated[Principal, Depends(require(Action.ADMINISTER))]
Repeated = Annotated[list[str] | None, Query()]
_PROBLEMS: dict[int | str, dict[str, Any]] = {400: {}, 422: {}}
_ADMIN_PROBLEMS: dict[int | str, dict[str, Any]] = {403: {}, 422: {}}


def listing_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["admin"])

    @router.get("/tasks", responses=_PROBLEMS)
    async def list_tasks(
        principal: ReadsTasks,
        status: Repeated = None,
        agent_id: str | None = None,
        capability: str | None = None,
        caller: str | None = None,
        session_id: str | None = None,
        since: str | None = None,
        until: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """Tasks, newest first: ``status`` (repeatable, any of them), ``agent_id``,
        ``capability`` (the method), ``caller`` (``key:<id>``, ``agent:<id>``),
        ``session_id``, ``since``/``until`` (created)."""
        filters = TaskFilter.parse(
            ctx.clock.now(),
            status=status,
            agent_id=agent_id,
            capability=capability,
            caller=caller,
            session_id=session_id,
            since=since,
            until=until,
        )
        page = await run_in_threadpool(
            listings.list_tasks, ctx, filters, cursor, limit, principal=principal
        )
        return page.to_json()

    @router.get("/dag-runs", responses=_PROBLEMS)
    async def list_dag_runs(
        principal: ReadsTasks,
        status: Repeated = None,
        name: str | None = None,
        since: str | None = None,
        until: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """DAG runs, newest first: ``status`` (repeatable), ``name`` (the DAG's),
        ``since``/``until`` (started)."""
        filters = DagRunFilter.parse(
            ctx.clock.now(), status=status, name=name, since=since, until=until
        )
        page = await run_in_threadpool(
            listings.list_dag_runs, ctx, filters, cursor, limit, principal=principal
        )
        return page.to_json()

    @router.get("/alerts", responses=_PROBLEMS)
    async def list_alerts(
        principal: ReadsFleet,
        kind: Repeated = None,
        since: str | None = None,
        until: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
        include_muted: bool = False,
    ) -> dict[str, Any]:
        """Alerts, newest first: ``kind`` (repeatable; see `reach.hub.ops.alerts.KINDS`),
        ``since``/``until``. Muted kinds are left out unless ``include_muted=true`` (each
        item says ``muted``)."""
        now = ctx.clock.now()
        kinds = alerts.parse_kinds(kind)
        start = parse_instant(since, now, name="since")
        end = parse_instant(until, now, name="until")
        page = await run_in_threadpool(
            alerts.list_alerts,
            ctx,
            set(kinds),
            start,
            cursor,
            limit,
            until=end,
            include_muted=include_muted,
        )
        return page.to_json()

    @router.get("/alerts/mutes", responses=_PROBLEMS)
    def list_mutes(principal: ReadsFleet) -> dict[str, Any]:
        """The muted alert kinds, with who muted each and when."""
        with ctx.reading() as session:
            return {"mutes": alerts.list_mutes(session)}

    @router.put("/alerts/mutes/{kind}", responses=_ADMIN_PROBLEMS)
    def mute(kind: str, principal: Administers) -> dict[str, Any]:
        """Mute an alert kind: not pushed by the alert webhook, hidden from the list by
        default (admin; audited)."""
        return ctx.write(
            lambda s: alerts.mute(s, kind, actor=principal.identity, now=ctx.clock.now())
        )

    @router.delete("/alerts/mutes/{kind}", responses=_ADMIN_PROBLEMS)
    def unmute(kind: str, principal: Administers) -> dict[str, Any]:
        """Unmute an alert kind (admin; audited)."""
        return ctx.write(
            lambda s: alerts.unmute(s, kind, actor=principal.identity, now=ctx.clock.now())
        )

    return router
