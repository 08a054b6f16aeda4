"""Memory admission at the HTTP edge: new submits answer 503 while the process is over.

``POST /v1/tasks``, ``POST /v1/broadcasts`` and ``POST /api/v1/dag-runs`` are refused
before their body is read (`reach.hub.flow.memory.MemoryGauge` says when); reads, result and
progress reports and heartbeats go on, since they are how queued work drains.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from reach.core.flow.admission import MEMORY_RETRY_AFTER_S
from reach.errors import HubOverloaded
from reach.hub import metrics
from reach.hub.api.problems import PROBLEM_JSON
from reach.hub.flow.memory import MemoryGauge

SUBMIT_PATHS = frozenset({"/v1/tasks", "/v1/broadcasts", "/api/v1/dag-runs"})
"""New work: refused under memory pressure."""


class MemoryAdmissionMiddleware:
    """Answer new submits 503 ``overloaded`` (with Retry-After) while the gauge is over."""

    def __init__(self, app: ASGIApp, gauge: MemoryGauge) -> None:
        self.app = app
        self.gauge = gauge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or scope.get("path", "").rstrip("/") not in SUBMIT_PATHS
            or not self.gauge.over()
        ):
            await self.app(scope, receive, send)
            return
        metrics.ADMISSION_REFUSALS_TOTAL.labels(reason="overloaded").inc()
        error = HubOverloaded(
            f"the hub is above {self.gauge.ratio:.0%} of its memory limit and takes no new "
            f"work for a moment; retry in {MEMORY_RETRY_AFTER_S} s",
            retry_after=MEMORY_RETRY_AFTER_S,
        )
        response = JSONResponse(
            error.to_problem(scope.get("path")),
            status_code=error.status,
            media_type=PROBLEM_JSON,
            headers=error.headers(),
        )
        await response(scope, receive, send)
