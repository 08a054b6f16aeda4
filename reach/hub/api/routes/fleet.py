"""The operator's view of the fleet: agents by page, one agent, an instance's events, and
the links suspected of a loop (``/api/v1``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from reach.core.fleet.health import InstanceStatus
from reach.core.ops import paging
from reach.core.security.auth import Action
from reach.hub.api.auth import require
from reach.hub.context import HubContext
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.flow import admission, loops

ReadsFleet = Depends(require(Action.READ_FLEET))


def fleet_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["admin"], dependencies=[ReadsFleet])

    @router.get("/agents", responses={400: {}})
    def list_agents(
        tag: Annotated[list[str] | None, Query()] = None,
        capability: str | None = None,
        status: InstanceStatus | None = None,
        cursor: Annotated[str | None, Query(max_length=512)] = None,
        limit: Annotated[int, Query(ge=1, le=paging.MAX_LIMIT)] = registry.FLEET_PAGE,
    ) -> dict[str, Any]:
        """The fleet by agent ID, one page at a time: ``next_cursor`` (None on the last
        page) is the ``cursor`` of the next one. A page reads its own agents only."""
        flt = registry.AgentFilter(
            tag=tuple(tag or ()),
            capability=capability,
            status=status.value if status else None,
        )
        after = paging.decode_key_cursor(registry.AGENTS, cursor) if cursor else None
        with ctx.reading() as session:
            agents, last = registry.list_agents(
                session, flt, ctx.clock.now(), ctx.policy, after=after, limit=limit
            )
        next_cursor = paging.encode_key_cursor(registry.AGENTS, last) if last else None
        return {"agents": agents, "next_cursor": next_cursor}

    @router.get("/instances/{instance_id}/events", responses={404: {}})
    def instance_events(
        instance_id: str, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> dict[str, Any]:
        with ctx.reading() as session:
            rows = monitoring.events(session, instance_id, limit)
        return {
            "instance_id": instance_id,
            "events": [
                {"kind": r.kind, "at": r.at, "agent_id": r.agent_id, **r.detail} for r in rows
            ],
        }

    @router.get("/agents/{agent_id}", responses={404: {}})
    def get_agent(agent_id: str) -> dict[str, Any]:
        with ctx.reading() as session:
            view = registry.get_agent(session, agent_id, ctx.clock.now(), ctx.policy)
            view["queue"] = admission.queue_view(session, agent_id, ctx.settings.router.max_queue)
            return view

    @router.get("/links")
    def agent_links() -> dict[str, Any]:
        """Agent links suspected of a dependency loop (`reach.hub.flow.loops`), demoted first."""
        with ctx.reading() as session:
            return {"links": loops.list_links(session, ctx.clock.now())}

    return router
