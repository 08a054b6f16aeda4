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
loopback name is a 403 ``forbidden`` (``reach.core.interop.mcp.serving.rebinding_refusal``): a web
page's script cannot reach the tools through a name that resolves to 127.0.0.1. Left out
of the OpenAPI document: MCP is described by its own specification.

The MCP SDK is loaded with the first request to ``/mcp`` (`McpEndpoint.service`), not when
the API starts: it costs an API process about half a second and 15 MB, and most hubs are
never asked for MCP. Its session manager then runs in a task of the lifespan's task group
(`McpEndpoint.running`) until the API stops.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.to_thread
from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from reach.core.interop.mcp.serving import Scope, rebinding_refusal
from reach.core.security.auth import Action
from reach.errors import Forbidden, HubUnavailable, ReachError
from reach.hub.api.auth import require
from reach.hub.api.problems import problem_response
from reach.hub.api.routes.tasks import Intake, read_task
from reach.hub.context import HubContext
from reach.hub.flow import admission
from reach.hub.interop.mcp.tools import SCOPE_STATE, check_scope, scope_of
from reach.hub.ledger.streams import StreamHub
from reach.hub.ledger.wakeups import Waiters

if TYPE_CHECKING:
    from reach.hub.interop.mcp.server import McpService

PATH = "/mcp"
_SUBMITS = require(Action.SUBMIT)


class McpEndpoint:
    """The ASGI app at ``/mcp``: the hub's checks, then the SDK's transport (started with
    the first request that passes them)."""

    def __init__(
        self,
        ctx: HubContext,
        intake: Intake,
        waiters: Waiters,
        stream_hub: StreamHub,
        *,
        demo: bool,
    ) -> None:
        self.ctx = ctx
        self.intake = intake
        self.waiters = waiters
        self.stream_hub = stream_hub
        self.demo = demo  # open and on loopback: refuse names that are not loopback
        self._service: McpService | None = None
        self._tasks: anyio.abc.TaskGroup | None = None  # the lifespan's, while it runs
        self._stop: anyio.Event | None = None
        self._starting: anyio.Lock | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The lifespan's part: a task group the MCP transport may start in, stopped (and
        the transport with it) when the API stops."""
        self._stop, self._starting = anyio.Event(), anyio.Lock()
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                self._tasks = None
                self._service = None
                self._stop.set()

    def _check(self, scope: Scope) -> None:
        with self.ctx.reading() as session:
            check_scope(session, scope)

    def _build(self) -> McpService:
        from reach.hub.interop.mcp.server import HubMcp, McpService

        mcp = HubMcp(self.ctx, self.intake, self.waiters, self.stream_hub, read_task)
        return McpService(mcp, admission.body_limit(self.ctx.settings))

    async def _serve(self, service: McpService, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        stop = self._stop
        assert stop is not None  # started by `service`, inside `running`
        async with service.running():
            task_status.started()
            await stop.wait()

    async def service(self) -> McpService:
        """The running MCP transport: built and started on first use."""
        if self._service is not None:
            return self._service
        if self._tasks is None or self._starting is None:
            raise HubUnavailable("the MCP endpoint is not running (the API is stopping)")
        async with self._starting:
            if self._service is None:
                service = await anyio.to_thread.run_sync(self._build)  # imports the SDK
                tasks = self._tasks
                if tasks is None:
                    raise HubUnavailable("the MCP endpoint is not running (the API is stopping)")
                await tasks.start(self._serve, service)
                self._service = service
            return self._service

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
                await self.intake.lanes.online.run(self._check, mcp_scope)
            service = await self.service()
            if not service.serving:
                raise HubUnavailable("the MCP endpoint is not running (the API is stopping)")
        except ReachError as exc:
            await problem_response(exc, request)(scope, receive, send)
            return
        scope.setdefault("state", {})[SCOPE_STATE] = mcp_scope
        await service.handle(scope, receive, send)


def install_mcp(
    app: FastAPI,
    ctx: HubContext,
    intake: Intake,
    waiters: Waiters,
    stream_hub: StreamHub,
    *,
    demo: bool,
) -> McpEndpoint:
    """Mount ``/mcp`` on ``app``; the caller runs the endpoint's `McpEndpoint.running` in
    its lifespan."""
    endpoint = McpEndpoint(ctx, intake, waiters, stream_hub, demo=demo)
    app.add_route(PATH, endpoint, include_in_schema=False)  # type: ignore[arg-type]
    return endpoint
