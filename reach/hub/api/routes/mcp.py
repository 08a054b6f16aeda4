"""The hub's MCP endpoint (``reach.hub.interop.mcp``): ``/mcp``, Streamable HTTP.

Scoped by its query: ``/mcp`` serves every capability of the hub, ``/mcp?agent=ID`` one
agent's, ``/mcp?tag=T`` (repeatable: agents carrying every tag) and
``/mcp?capability=C`` one capability; they combine. An MCP client is configured with that
URL and the caller's API key as ``Authorization: Bearer``.

Authenticated like the rest of the hub before the MCP SDK sees a byte: with auth on, no
key or a bad one is a 401 problem (`reach.hub.api.auth.AuthMiddleware`); a key that may
not submit tasks is a 403 ``forbidden`` (logged and audited); a bad scope is a 422
``invalid-query``, one naming an agent, tag or capability the hub does not know a 404.
On an open hub bound to loopback (the demo), a ``Host`` or ``Origin`` that is not a
loopback name is a 403 ``forbidden`` (``reach.core.interop.mcp.rebinding_refusal``): a web
page's script cannot reach the tools through a name that resolves to 127.0.0.1. Left out
of the OpenAPI document: MCP is described by its own specification.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from reach.core.interop.mcp import Scope, rebinding_refusal
from reach.core.security.auth import Action
from reach.errors import Forbidden, HubUnavailable, ReachError
from reach.hub.api.auth import require
from reach.hub.api.problems import problem_response
from reach.hub.api.routes.tasks import Intake, read_task
from reach.hub.context import HubContext
from reach.hub.flow import admission
from reach.hub.interop.mcp.server import SCOPE_STATE, HubMcp, McpService, scope_of
from reach.hub.ledger.streams import StreamHub
from reach.hub.ledger.wakeups import Waiters

PATH = "/mcp"
_SUBMITS = require(Action.SUBMIT)


class McpEndpoint:
    """The ASGI app at ``/mcp``: the hub's checks, then the SDK's transport."""

    def __init__(self, service: McpService, demo: bool) -> None:
        self.service = service
        self.demo = demo  # open and on loopback: refuse names that are not loopback

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            if self.demo and (
                why := rebinding_refusal(request.headers.get("host"), request.headers.get("origin"))
            ):
                raise Forbidden(why)
            await _SUBMITS(request)  # 403 forbidden (logged, audited) for a key that may not
            query: dict[str, list[str]] = {}
            for key, value in request.query_params.multi_items():
                query.setdefault(key, []).append(value)
            mcp_scope = scope_of(query)
            if mcp_scope != Scope():
                await self.service.mcp.intake.lane.run(self.service.mcp.check, mcp_scope)
            if not self.service.serving:
                raise HubUnavailable("the MCP endpoint is not running (the API is stopping)")
        except ReachError as exc:
            await problem_response(exc, request)(scope, receive, send)
            return
        scope.setdefault("state", {})[SCOPE_STATE] = mcp_scope
        await self.service.handle(scope, receive, send)


def install_mcp(
    app: FastAPI,
    ctx: HubContext,
    intake: Intake,
    waiters: Waiters,
    stream_hub: StreamHub,
    *,
    demo: bool,
) -> McpService:
    """Mount ``/mcp`` on ``app``; the caller runs the returned service in its lifespan."""
    mcp = HubMcp(ctx, intake, waiters, stream_hub, read_task)
    service = McpService(mcp, admission.body_limit(ctx.settings))
    app.add_route(PATH, McpEndpoint(service, demo), include_in_schema=False)  # type: ignore[arg-type]
    return service
