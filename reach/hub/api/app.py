"""Application factory: everything the API needs is passed in, nothing is global."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text
from sqlalchemy.orm import Session

from reach.core.fleet.health import InstanceStatus
from reach.core.ops import paging
from reach.core.security.auth import Action, Principal, auth_required, is_loopback_host
from reach.core.security.networks import NetworkRule
from reach.hub import metrics
from reach.hub.api import links
from reach.hub.api.admission import MemoryAdmissionMiddleware
from reach.hub.api.auth import AuthMiddleware, check_declarable, demand_agent, require
from reach.hub.api.lockout import AuthLockout
from reach.hub.api.problems import (
    BodyLimitMiddleware,
    InputGuardMiddleware,
    install_problem_handlers,
)
from reach.hub.api.routes.a2a import a2a_router
from reach.hub.api.routes.agents_admin import agents_admin_router
from reach.hub.api.routes.approvals import approval_router
from reach.hub.api.routes.audit import audit_router
from reach.hub.api.routes.broadcasts import broadcast_router
from reach.hub.api.routes.channel import channel_router
from reach.hub.api.routes.dagruns import dag_router
from reach.hub.api.routes.listings import listing_router
from reach.hub.api.routes.matching import match_router
from reach.hub.api.routes.sessions import session_router
from reach.hub.api.routes.streams import dag_stream_router, stream_router
from reach.hub.api.routes.tasks import Intake, dead_letter_router, task_router
from reach.hub.api.ui.router import install_ui
from reach.hub.context import HubContext
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import agent_rule
from reach.hub.flow import admission, loops
from reach.hub.flow.memory import MemoryGauge
from reach.hub.gates import approvals, sessions
from reach.hub.ledger.streams import StreamHub
from reach.hub.ledger.wakeups import Waiters
from reach.hub.security import signing
from reach.wire.schemas import (
    DeregisterRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
)

T = TypeVar("T")

ActsAsAgent = Annotated[Principal, Depends(require(Action.ACT_AS_AGENT))]
ReadsFleet = Depends(require(Action.READ_FLEET))


class Surface(StrEnum):
    """Which routes one listener serves: everything, or the agent-facing and admin halves
    apart (``server.admin_port`` set), so the admin API and metrics can stay internal."""

    ALL = "all"
    PUBLIC = "public"
    ADMIN = "admin"


def create_app(
    ctx: HubContext,
    surface: Surface = Surface.ALL,
    *,
    require_auth: bool | None = None,
    bind_host: str | None = None,
) -> FastAPI:
    """The API, with authentication required or not: ``require_auth`` as resolved by
    whoever knows the bind address (``reach api``), else from the settings against
    ``server.host`` (`reach.core.security.auth.auth_required`). ``bind_host``: where it listens,
    if not ``server.host``: with auth off and a loopback bind it is a local demo, which
    takes loopback and private agent addresses (`reach.core.security.networks`)."""
    security, server = ctx.settings.security, ctx.settings.server
    if require_auth is None:
        require_auth = auth_required(security.require_auth, bind_host or server.host)
    demo = not require_auth and is_loopback_host(bind_host or server.host)
    network = agent_rule(ctx.settings, demo)
    waiters = Waiters()
    stream_hub = StreamHub(ctx, waiters)  # progress streams share one feed per task

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        waiters.start(ctx.completions, asyncio.get_running_loop())
        try:
            yield
        finally:
            waiters.stop()

    # /docs and /redoc load their scripts from a CDN: with auth on they would run a third
    # party's code on the dashboard's origin, so only an open (loopback demo) hub has them.
    # /openapi.json itself is served either way (behind a key when auth is on).
    app = FastAPI(
        lifespan=lifespan,
        title="Agent-Reach hub" + ("" if surface is Surface.ALL else f" ({surface.value})"),
        version="0.1.0",
        description="Registry, reachability and delivery between AI agents.",
        docs_url=None if require_auth else "/docs",
        redoc_url=None if require_auth else "/redoc",
    )
    app.state.ctx = ctx
    app.state.require_auth = require_auth
    install_problem_handlers(app)
    # the body limit covers the payload cap (reach.hub.flow.admission.body_limit); memory
    # admission refuses a submit before its body is read
    # inside the body limit, which bounds what it reads: NUL and NaN never reach a route
    app.add_middleware(InputGuardMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=admission.body_limit(ctx.settings))
    server = ctx.settings.server
    gauge = MemoryGauge.configured(server.memory_limit_bytes, server.memory_admission_ratio)
    app.add_middleware(MemoryAdmissionMiddleware, gauge=gauge)
    # added last, so outermost: a request without a valid credential is refused before
    # its body is read
    lockout = AuthLockout.configured(ctx.settings)  # bearer failures and sign-ins alike
    app.state.auth_lockout = lockout
    app.add_middleware(AuthMiddleware, ctx=ctx, require_auth=require_auth, lockout=lockout)
    app.include_router(_health_router(ctx))
    app.include_router(_jwks_router(ctx))  # every surface: agents verify with these keys
    if surface in (Surface.ALL, Surface.PUBLIC):
        intake = Intake(ctx)  # one per app: the task and A2A routes share its callers' lane
        app.include_router(_agent_router(ctx, network))
        app.include_router(channel_router(ctx, require_auth))  # agents behind NAT
        app.include_router(task_router(ctx, intake, waiters))
        app.include_router(match_router(ctx))  # semantic capability matching
        app.include_router(broadcast_router(ctx, waiters))
        app.include_router(stream_router(ctx, stream_hub))
        app.include_router(session_router(ctx))
        app.include_router(a2a_router(ctx, intake, require_auth, waiters, stream_hub))  # A2A
    if surface in (Surface.ALL, Surface.ADMIN):
        app.include_router(_admin_router(ctx))
        app.include_router(_metrics_router(ctx))
        app.include_router(dead_letter_router(ctx))
        app.include_router(dag_router(ctx))
        app.include_router(dag_stream_router(ctx, stream_hub))
        app.include_router(agents_admin_router(ctx, network))
        app.include_router(audit_router(ctx))
        app.include_router(approval_router(ctx))
        app.include_router(listing_router(ctx))  # the operator's lists (tasks, runs, alerts)
        install_ui(app, ctx, stream_hub)  # the dashboard at /ui (reach.hub.api.ui)
    return app


def _health_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz")
    def healthz() -> dict[str, Any]:
        with ctx.reading() as session:
            session.execute(text("SELECT 1"))
        return {"status": "ok", "time": ctx.clock.now()}

    return router


def _jwks_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/.well-known/jwks.json")
    def jwks() -> JSONResponse:
        """The public keys that verify the hub's reach tokens (open; cache for a minute)."""
        now = ctx.clock.now()
        with ctx.reading() as session:
            keys = signing.jwks(session, now)
        if not keys["keys"]:  # before the first delivery: make the key agents will need
            keys = ctx.write(lambda s: signing.jwks(s, now, ensure=True, seal=ctx.seal))
        return JSONResponse(keys, headers={"Cache-Control": "public, max-age=60"})

    return router


def _agent_router(ctx: HubContext, network: NetworkRule) -> APIRouter:
    router = APIRouter(prefix="/v1/agents", tags=["agents (agent-facing)"])

    @router.post(
        "/register",
        response_model=RegisterResponse,
        responses={**links.responses(links.REGISTERED, 200, 201), 409: {}, 422: {}},
    )
    def register(body: RegisterRequest, request: Request, principal: ActsAsAgent) -> JSONResponse:
        demand_agent(request, principal, body.agent_id, Action.ACT_AS_AGENT)
        check_declarable(principal, body)
        limits, now, owner = ctx.registry_limits, ctx.clock.now, principal.key_id
        result = ctx.write(
            lambda s: registry.register(
                s, body, now(), ctx.policy, limits, owner=owner, network=network
            )
        )
        # the capability vectors, computed apart (the registration never waits for a model)
        ctx.matcher.registered(body.agent_id, bool(body.capabilities))
        return JSONResponse(result.model_dump(), status_code=201 if result.created else 200)

    @router.post("/heartbeat", response_model=HeartbeatResponse, responses={404: {}})
    def heartbeat(
        body: HeartbeatRequest, request: Request, response: Response, principal: ActsAsAgent
    ) -> HeartbeatResponse:
        demand_agent(request, principal, body.agent_id, Action.ACT_AS_AGENT)

        def work(session: Session) -> HeartbeatResponse:
            row = registry.heartbeat(session, body, ctx.clock.now(), ctx.policy)
            metrics.HEARTBEATS_TOTAL.inc()
            now = ctx.clock.now()
            response.headers.update(
                sessions.closed_header(session, body.agent_id, body.instance_id, now)
            )
            return HeartbeatResponse(status=row.status, next_heartbeat_in=row.heartbeat_interval)

        return ctx.write(work)

    @router.post("/deregister", responses={404: {}})
    def deregister(
        body: DeregisterRequest, request: Request, principal: ActsAsAgent
    ) -> dict[str, str]:
        demand_agent(request, principal, body.agent_id, Action.ACT_AS_AGENT)
        ctx.write(lambda s: registry.deregister(s, body, ctx.clock.now()))
        return {"instance_id": body.instance_id, "status": InstanceStatus.DEREGISTERED.value}

    return router


def _metrics_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(tags=["admin"], dependencies=[ReadsFleet])

    @router.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        def rows() -> list[dict[str, Any]]:
            with ctx.reading() as session:
                return registry.instance_gauges(session, ctx.clock.now(), ctx.policy)

        def pending_approvals() -> int:
            with ctx.reading() as session:
                return approvals.pending_count(session)

        body, content_type = metrics.render(rows, pending_approvals)
        return Response(body, media_type=content_type)

    return router


def _admin_router(ctx: HubContext) -> APIRouter:
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
