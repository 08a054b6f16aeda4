"""The hub's MCP server: ``tools/list`` from the registry, ``tools/call`` as a reach.

Built on the ``mcp`` SDK's low-level `Server` (the tool list changes with the fleet, so
no decorated functions) and served by its Streamable HTTP session manager in stateless
mode: no session lives in one API process, so any replica answers any request, and a
call's progress notifications ride that call's own SSE response.

The HTTP edge (``reach.hub.api.routes.mcp``) has authenticated the request and checked
its scope before the SDK sees it; it leaves the principal and the `Scope` on the request
state, where the handlers read them. A call:

1. maps its arguments to a ``POST /v1/tasks`` body routed by capability within the scope
   (``reach.core.interop.mcp.serving.submission``) and submits it through the API's own `Intake`
   under the caller's identity: validation against ``params_schema``, admission, loop
   and session checks, the approval gate; a refusal is a tool error with its problem type;
2. a gated capability answers at once: "awaiting approval", with the approval's id;
3. otherwise it waits for the task's end up to the task's timeout: by the long-poll's
   wake-ups, or, when the client sent a ``progressToken``, by the task's progress stream,
   whose reports become ``notifications/progress``. The end (or the wait running out) is
   the tool's result (``reach.core.interop.mcp.serving.outcome_of``).

A client that cancels or drops a call leaves its task running (it is the hub's, with its
retries and dead letters): ``GET /v1/tasks/{id}`` reads it later.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, cast

import anyio
from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from reach.core.flow.priority import queue_for
from reach.core.interop.mcp import serving as rules
from reach.core.interop.mcp.serving import Scope, Tool
from reach.core.ledger.statuses import TERMINAL, TaskStatus
from reach.core.security.auth import Principal
from reach.errors import HubUnavailable, InvalidTaskRequest, ReachError
from reach.hub.gates import approvals
from reach.hub.interop.mcp.tools import SCOPE_STATE, check_scope, read_tool, read_tools
from reach.hub.ledger import streams
from reach.hub.ledger.longpoll import long_poll
from reach.hub.ledger.tasks import Publish
from reach.wire.schemas import SubmitRequest

if TYPE_CHECKING:
    from reach.hub.api.routes.tasks import Intake
    from reach.hub.context import HubContext
    from reach.hub.ledger.streams import StreamHub
    from reach.hub.ledger.wakeups import Waiters

log = logging.getLogger("reach.hub.interop.mcp")

INSTRUCTIONS = (
    "Agent-Reach hub: each tool is a capability of the hub's agents. A call is a task, "
    "routed to a live agent, retried, dead-lettered when retries run out; a capability "
    "that needs a human approval answers at once with the approval's id."
)

ReadTask = Callable[[Any, str, Request, Principal], dict[str, Any]]
"""The API's read of one task for a principal (its visibility rules applied)."""


class HubMcp:
    """The low-level MCP server of the hub and what its handlers need.

    ``intake`` and ``read`` are the API's own submit and read of a task (its screening
    and visibility rules): a tool call is answered exactly as ``POST /v1/tasks``."""

    def __init__(
        self,
        ctx: HubContext,
        intake: Intake,
        waiters: Waiters | None,
        stream_hub: StreamHub,
        read: ReadTask,
    ) -> None:
        self.ctx = ctx
        self.intake = intake
        self.waiters = waiters
        self.stream_hub = stream_hub
        self.read = read
        self.server: Server[Any] = Server(
            "agent-reach",
            version="0.1.0",
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
        )

    # -- the scope's tools ------------------------------------------------------------------

    def _tools(self, scope: Scope) -> list[Tool]:
        with self.ctx.reading() as session:
            return read_tools(session, scope, self.ctx.approval_policy)

    def _tool(self, scope: Scope, name: str) -> Tool | None:
        with self.ctx.reading() as session:
            return read_tool(session, scope, name, self.ctx.approval_policy)

    def check(self, scope: Scope) -> None:
        """Refuse a scope naming an agent, tag or capability the hub does not know."""
        with self.ctx.reading() as session:
            check_scope(session, scope)

    async def list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        _principal, scope = _caller(ctx)
        tools = await self.intake.lanes.online.run(self._tools, scope)
        return types.ListToolsResult(tools=[_tool(t) for t in tools])

    # -- a call -----------------------------------------------------------------------------

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        principal, scope = _caller(ctx)
        try:
            options = rules.call_options(ctx.params)
        except ValueError as exc:
            return _result(rules.refusal(InvalidTaskRequest(str(exc))))
        tool = await self.intake.lanes.online.run(self._tool, scope, params.name)
        if tool is None:
            raise MCPError(
                types.INVALID_PARAMS, f"unknown tool {params.name!r} ({scope.describe()})"
            )
        try:
            body = SubmitRequest.model_validate(
                rules.submission(scope, tool, params.arguments, options)
            )
        except ValidationError as exc:
            wrong = exc.errors()[0]
            where = ".".join(str(p) for p in wrong["loc"])
            return _result(rules.refusal(InvalidTaskRequest(f"{where}: {wrong['msg']}")))
        try:
            view, created = await self.intake.accept(body, principal)
        except ReachError as exc:
            return _result(rules.refusal(exc))
        task_id = str(view["task_id"])
        if view["status"] == TaskStatus.AWAITING_APPROVAL:
            approval_id = await self.intake.lanes.online.run(self._approval_of, task_id)
            return _result(rules.awaiting_approval(task_id, approval_id))
        first = Publish(task_id, 1, 0.0, queue_for(view.get("priority")))
        wait = options.timeout_ms / 1000
        request = _request(ctx)
        if options.progress:
            final = await self._follow(ctx, view, first if created else None, wait, principal)
        else:
            final = await self._wait(view, first if created else None, wait, request, principal)
        return _result(rules.outcome_of(final, wait))

    def _approval_of(self, task_id: str) -> str | None:
        with self.ctx.reading() as session:
            row = approvals.for_task(session, task_id)
            return row.approval_id if row is not None else None

    async def _wait(
        self,
        view: dict[str, Any],
        first: Publish | None,
        wait: float,
        request: Request,
        principal: Principal,
    ) -> dict[str, Any]:
        """The task's end by the long-poll's wake-ups (``POST /v1/tasks?wait=``'s way: the
        attempt is published inside the watch, so a fast answer cannot slip past it)."""
        task_id = str(view["task_id"])
        views = iter([view])
        pending = first

        def read() -> dict[str, Any]:
            nonlocal pending
            if pending is not None:
                self.ctx.publish_premarked(pending)
                pending = None
            known = next(views, None)
            return known if known is not None else self.read(self.ctx, task_id, request, principal)

        return await long_poll(
            read,
            lambda v: v["status"] in TERMINAL,
            wait,
            waiters=self.waiters,
            keys=[task_id],
            carried=True,
            run=self.intake.lanes.online.run,
        )

    async def _follow(
        self,
        ctx: ServerRequestContext[Any],
        view: dict[str, Any],
        first: Publish | None,
        wait: float,
        principal: Principal,
    ) -> dict[str, Any]:
        """The task's end by its progress stream, each report that moves it on sent as a
        progress notification. The stream reads the task's events from the first, so an
        attempt published before it opens loses nothing."""
        task_id = str(view["task_id"])
        if first is not None:
            await self.intake.lanes.online.run(self.ctx.publish_premarked, first)
        final: dict[str, Any] | None = None
        last = 0.0
        with anyio.move_on_after(wait):
            events = cast(
                AsyncGenerator[streams.Event],
                streams.task_stream(self.stream_hub, task_id, view, 0, 0),
            )
            async with contextlib.aclosing(events):
                async for event in events:
                    if event.kind == "progress":
                        data = event.data
                        step = rules.progress_step(data.get("progress"), data.get("message"), last)
                        if step is not None:
                            last = step[0]
                            await ctx.session.report_progress(*step)
                    elif event.kind == "result":
                        final = event.data
        if final is not None:
            return final
        request = _request(ctx)
        read: dict[str, Any] = await self.intake.lanes.online.run(
            self.read, self.ctx, task_id, request, principal
        )
        return read


class McpService:
    """The Streamable HTTP side: one session manager per run of the API's lifespan
    (the SDK's manager runs once), stateless, answering at ``/mcp``."""

    def __init__(self, mcp: HubMcp, max_body: int) -> None:
        self.mcp = mcp
        self.max_body = max_body
        self._manager: StreamableHTTPSessionManager | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        manager = StreamableHTTPSessionManager(
            app=self.mcp.server,
            stateless=True,  # Host and Origin are checked at the edge (reach.hub.api.routes.mcp)
            max_request_body_size=self.max_body,
        )
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    @property
    def serving(self) -> bool:
        return self._manager is not None

    async def handle(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        manager = self._manager
        if manager is None:
            raise HubUnavailable("the MCP endpoint is not running (the API is stopping)")
        await manager.handle_request(scope, receive, send)


def _request(ctx: ServerRequestContext[Any]) -> Request:
    if not isinstance(ctx.request, Request):  # only ever served over HTTP by the API
        raise MCPError(types.INTERNAL_ERROR, "the hub's MCP server answers over HTTP only")
    return ctx.request


def _caller(ctx: ServerRequestContext[Any]) -> tuple[Principal, Scope]:
    """The principal and scope the HTTP edge left on the request."""
    state = _request(ctx).state
    principal = getattr(state, "principal", None)
    scope = getattr(state, SCOPE_STATE, None)
    if not isinstance(principal, Principal) or not isinstance(scope, Scope):
        raise MCPError(types.INTERNAL_ERROR, "request not authenticated by the hub's edge")
    return principal, scope


def _tool(tool: Tool) -> types.Tool:
    return types.Tool.model_validate(
        {
            "name": tool.name,
            "title": tool.capability,
            "description": tool.description,
            "inputSchema": tool.input_schema,
            "_meta": tool.meta(),
        }
    )


def _result(result: rules.ToolResult) -> types.CallToolResult:
    return types.CallToolResult.model_validate(
        {
            "content": [{"type": "text", "text": result.text}],
            "structuredContent": result.structured,
            "isError": result.is_error,
            **({"_meta": result.meta()} if result.task_id else {}),
        }
    )
