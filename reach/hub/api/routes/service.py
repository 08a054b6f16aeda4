"""The hub's own service routes: liveness (``/healthz``), the token-verifying keys
(``/.well-known/jwks.json``) and Prometheus ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text

from reach.core.security.auth import Action
from reach.hub import metrics
from reach.hub.api.auth import require
from reach.hub.context import HubContext
from reach.hub.fleet import registry
from reach.hub.gates import approvals
from reach.hub.ledger import tasks as ledger
from reach.hub.security import signing

ReadsFleet = Depends(require(Action.READ_FLEET))


def health_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthz")
    def healthz() -> dict[str, Any]:
        with ctx.reading() as session:
            session.execute(text("SELECT 1"))
        return {"status": "ok", "time": ctx.clock.now()}

    return router


def jwks_router(ctx: HubContext) -> APIRouter:
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


def metrics_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(tags=["admin"], dependencies=[ReadsFleet])

    @router.get("/metrics", include_in_schema=False)
    def prometheus_metrics() -> Response:
        def rows() -> list[dict[str, Any]]:
            with ctx.reading() as session:
                return registry.instance_gauges(session, ctx.clock.now(), ctx.policy)

        def pending_approvals() -> tuple[int, float]:
            with ctx.reading() as session:
                return approvals.pending_gauges(session, ctx.clock.now())

        def open_tasks() -> dict[str, int]:
            with ctx.reading() as session:
                return ledger.open_counts(session)

        body, content_type = metrics.render(rows, pending_approvals, open_tasks)
        return Response(body, media_type=content_type)

    return router
