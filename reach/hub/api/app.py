"""Application factory: everything the API needs is passed in, nothing is global."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text
from sqlalchemy.orm import Session

from reach.core.health import InstanceStatus
from reach.hub import metrics, monitoring, registry
from reach.hub.api import links
from reach.hub.api.problems import BodyLimitMiddleware, install_problem_handlers
from reach.hub.api.routes.broadcasts import broadcast_router
from reach.hub.api.routes.dagruns import dag_router
from reach.hub.api.routes.tasks import dead_letter_router, task_router
from reach.hub.context import HubContext
from reach.hub.wakeups import Waiters
from reach.schemas import (
    DeregisterRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
)

T = TypeVar("T")


class Surface(StrEnum):
    """Which routes one listener serves: everything, or the agent-facing and admin halves
    apart (``server.admin_port`` set), so the admin API and metrics can stay internal."""

    ALL = "all"
    PUBLIC = "public"
    ADMIN = "admin"


def create_app(ctx: HubContext, surface: Surface = Surface.ALL) -> FastAPI:
    waiters = Waiters()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        waiters.start(ctx.completions, asyncio.get_running_loop())
        try:
            yield
        finally:
            waiters.stop()

    app = FastAPI(
        lifespan=lifespan,
        title="Agent-Reach hub" + ("" if surface is Surface.ALL else f" ({surface.value})"),
        version="0.1.0",
        description="Registry, reachability and delivery between AI agents.",
    )
    app.state.ctx = ctx
    install_problem_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=ctx.settings.server.max_body_bytes)
    app.include_router(_health_router(ctx))
    if surface in (Surface.ALL, Surface.PUBLIC):
        app.include_router(_agent_router(ctx))
        app.include_router(task_router(ctx, waiters))
        app.include_router(broadcast_router(ctx, waiters))
    if surface in (Surface.ALL, Surface.ADMIN):
        app.include_router(_admin_router(ctx))
        app.include_router(_metrics_router(ctx))
        app.include_router(dead_letter_router(ctx))
        app.include_router(dag_router(ctx))
    return app


def _health_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz")
    def healthz() -> dict[str, Any]:
        with ctx.reading() as session:
            session.execute(text("SELECT 1"))
        return {"status": "ok", "time": ctx.clock.now()}

    return router


def _agent_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/v1/agents", tags=["agents (agent-facing)"])

    @router.post(
        "/register",
        response_model=RegisterResponse,
        responses={**links.responses(links.REGISTERED, 200, 201), 409: {}, 422: {}},
    )
    def register(body: RegisterRequest, request: Request) -> JSONResponse:
        result = ctx.write(lambda s: registry.register(s, body, ctx.clock.now(), ctx.policy))
        return JSONResponse(result.model_dump(), status_code=201 if result.created else 200)

    @router.post("/heartbeat", response_model=HeartbeatResponse, responses={404: {}})
    def heartbeat(body: HeartbeatRequest) -> HeartbeatResponse:
        def work(session: Session) -> HeartbeatResponse:
            row = registry.heartbeat(session, body, ctx.clock.now(), ctx.policy)
            metrics.HEARTBEATS_TOTAL.inc()
            return HeartbeatResponse(status=row.status, next_heartbeat_in=row.heartbeat_interval)

        return ctx.write(work)

    @router.post("/deregister", responses={404: {}})
    def deregister(body: DeregisterRequest) -> dict[str, str]:
        ctx.write(lambda s: registry.deregister(s, body, ctx.clock.now()))
        return {"instance_id": body.instance_id, "status": InstanceStatus.DEREGISTERED.value}

    return router


def _metrics_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(tags=["admin"])

    @router.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        def rows() -> list[dict[str, Any]]:
            with ctx.reading() as session:
                return registry.instance_gauges(session, ctx.clock.now(), ctx.policy)

        body, content_type = metrics.render(rows)
        return Response(body, media_type=content_type)

    return router


def _admin_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/api/v1", tags=["admin"])

    @router.get("/agents")
    def list_agents(
        tag: Annotated[list[str] | None, Query()] = None,
        capability: str | None = None,
        status: InstanceStatus | None = None,
    ) -> dict[str, Any]:
        flt = registry.AgentFilter(
            tag=tuple(tag or ()),
            capability=capability,
            status=status.value if status else None,
        )
        with ctx.reading() as session:
            agents = registry.list_agents(session, flt, ctx.clock.now(), ctx.policy)
        return {"agents": agents}

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
            return registry.get_agent(session, agent_id, ctx.clock.now(), ctx.policy)

    return router
