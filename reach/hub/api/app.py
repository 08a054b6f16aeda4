"""Application factory: everything the API needs is passed in, nothing is global."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import Any

from fastapi import FastAPI

from reach.core.security.auth import auth_required, is_loopback_host
from reach.hub import tracing
from reach.hub.api.admission import MemoryAdmissionMiddleware
from reach.hub.api.auth import AuthMiddleware
from reach.hub.api.beatpath import QuietBeatPath
from reach.hub.api.heartbeats import HeartbeatIntake
from reach.hub.api.lockout import AuthLockout
from reach.hub.api.problems import (
    BodyLimitMiddleware,
    InputGuardMiddleware,
    install_problem_handlers,
)
from reach.hub.api.routes.a2a import a2a_router
from reach.hub.api.routes.agents import agent_router
from reach.hub.api.routes.agents_admin import agents_admin_router
from reach.hub.api.routes.approvals import approval_router
from reach.hub.api.routes.audit import audit_router
from reach.hub.api.routes.blobs import PATH as BLOBS_PATH
from reach.hub.api.routes.blobs import blob_router
from reach.hub.api.routes.broadcasts import broadcast_router
from reach.hub.api.routes.channel import channel_router
from reach.hub.api.routes.dagruns import dag_router
from reach.hub.api.routes.fleet import fleet_router
from reach.hub.api.routes.listings import listing_router
from reach.hub.api.routes.matching import match_router
from reach.hub.api.routes.mcp import McpEndpoint, install_mcp
from reach.hub.api.routes.service import health_router, jwks_router, metrics_router
from reach.hub.api.routes.sessions import session_router
from reach.hub.api.routes.streams import dag_stream_router, stream_router
from reach.hub.api.routes.tasks import Intake, dead_letter_router, task_router
from reach.hub.api.ui.router import install_ui
from reach.hub.context import HubContext
from reach.hub.fleet.reachability import agent_rule
from reach.hub.flow import admission
from reach.hub.flow.memory import MemoryGauge
from reach.hub.ledger.streams import StreamHub
from reach.hub.ledger.wakeups import Waiters

# FastAPI's own OpenTelemetry spans (active once a process traces: reach.hub.tracing),
# narrowed to the requests that start a reach; a FastAPI before native telemetry has none
_TELEMETRY: dict[str, Any] = (
    {"telemetry": tracing.FASTAPI_TELEMETRY}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


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
    mcp: McpEndpoint | None = None  # the MCP endpoint, on the public surface
    beats = HeartbeatIntake(ctx, ctx.settings.heartbeat.flush_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        waiters.start(ctx.completions, asyncio.get_running_loop())
        try:
            async with mcp.running() if mcp is not None else contextlib.nullcontext():
                yield
        finally:
            waiters.stop()
            beats.stop()

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
        **_TELEMETRY,
    )
    app.state.ctx = ctx
    app.state.require_auth = require_auth
    install_problem_handlers(app)
    # the body limit covers the payload cap (reach.hub.flow.admission.body_limit); memory
    # admission refuses a submit before its body is read
    # inside the body limit, which bounds what it reads: NUL and NaN never reach a route
    # a blob upload is bytes (not scanned as JSON), up to blobs.max_bytes
    upload = ("PUT", BLOBS_PATH)
    app.add_middleware(InputGuardMiddleware, raw=frozenset({upload}))
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=admission.body_limit(ctx.settings),
        raised={upload: ctx.settings.blobs.max_bytes},
    )
    server = ctx.settings.server
    gauge = MemoryGauge.configured(server.memory_limit_bytes, server.memory_admission_ratio)
    app.add_middleware(MemoryAdmissionMiddleware, gauge=gauge)
    if surface in (Surface.ALL, Surface.PUBLIC):  # quiet heartbeats, once the key is known
        app.add_middleware(QuietBeatPath, intake=beats)
    # added last, so outermost: a request without a valid credential is refused before
    # its body is read
    lockout = AuthLockout.configured(ctx.settings)  # bearer failures and sign-ins alike
    app.state.auth_lockout = lockout
    app.add_middleware(AuthMiddleware, ctx=ctx, require_auth=require_auth, lockout=lockout)
    app.include_router(health_router(ctx))
    app.include_router(jwks_router(ctx))  # every surface: agents verify with these keys
    if surface in (Surface.ALL, Surface.PUBLIC):
        intake = Intake(ctx)  # one per app: the task and A2A routes share its callers' lane
        app.include_router(agent_router(ctx, network, beats))
        app.include_router(channel_router(ctx, require_auth))  # agents behind NAT
        app.include_router(task_router(ctx, intake, waiters))
        app.include_router(match_router(ctx))  # semantic capability matching
        app.include_router(broadcast_router(ctx, waiters))
        app.include_router(stream_router(ctx, stream_hub))
        app.include_router(session_router(ctx))
        app.include_router(blob_router(ctx))  # large payloads by reference
        app.include_router(a2a_router(ctx, intake, require_auth, waiters, stream_hub))  # A2A
        mcp = install_mcp(app, ctx, intake, waiters, stream_hub, demo=demo)  # MCP at /mcp
    if surface in (Surface.ALL, Surface.ADMIN):
        app.include_router(fleet_router(ctx))
        app.include_router(metrics_router(ctx))
        app.include_router(dead_letter_router(ctx))
        app.include_router(dag_router(ctx))
        app.include_router(dag_stream_router(ctx, stream_hub))
        app.include_router(agents_admin_router(ctx, network))
        app.include_router(audit_router(ctx))
        app.include_router(approval_router(ctx))
        app.include_router(listing_router(ctx))  # the operator's lists (tasks, runs, alerts)
        install_ui(app, ctx, stream_hub)  # the dashboard at /ui (reach.hub.api.ui)
    return app
