"""The hub's A2A endpoints (``reach.hub.api.a2a_server``): a card and a JSON-RPC endpoint for
every agent (``/a2a/{agent_id}``) and every capability (``/a2a/capability/{type}``).

Authenticated like the rest of the hub (a key that may submit tasks; the card advertises
the hub's bearer scheme when auth is on). An unknown agent or capability is a 404
problem; everything inside the JSON-RPC body is answered by ``a2a-sdk``'s dispatcher with
the protocol's own errors (a wrong or missing ``A2A-Version``, an unknown method, v0.3
method names unless ``a2a.v03_compat``, malformed params). Left out of the OpenAPI
document: JSON-RPC is described by the A2A specification, not by it.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from reach.core.security.auth import Action, Principal
from reach.errors import NoSuitableAgent, UnknownAgent
from reach.hub.api.auth import require
from reach.hub.api.routes.tasks import Intake, read_task
from reach.hub.context import HubContext
from reach.hub.ledger.streams import StreamHub
from reach.hub.ledger.wakeups import Waiters

Submits = Annotated[Principal, Depends(require(Action.SUBMIT))]
CARD = "/.well-known/agent-card.json"


def a2a_router(
    ctx: HubContext, intake: Intake, require_auth: bool, waiters: Waiters, stream_hub: StreamHub
) -> APIRouter:
    # a2a-sdk is loaded by the first A2A request, not when the API starts: it costs an
    # API process about 0.3 s, and most hubs are never asked for A2A
    built: list[tuple[ModuleType, Any]] = []
    building = threading.Lock()

    def build() -> tuple[ModuleType, Any]:
        with building:
            if not built:
                from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher

                from reach.hub.api import a2a_server

                handler = a2a_server.HubRequestHandler(ctx, intake, waiters, stream_hub, read_task)
                dispatcher = JsonRpcDispatcher(
                    handler,
                    a2a_server.ContextBuilder(),
                    enable_v0_3_compat=ctx.settings.a2a.v03_compat,
                )
                built.append((a2a_server, dispatcher))
            return built[0]

    async def served() -> tuple[ModuleType, Any]:
        """The hub's A2A module and a2a-sdk's dispatcher over its handler."""
        return built[0] if built else await run_in_threadpool(build)

    router = APIRouter(tags=["a2a"], include_in_schema=False)

    def skills(server: ModuleType, target: dict[str, Any]) -> list[dict[str, Any]]:
        with ctx.reading() as session:
            found: list[dict[str, Any]] | None = server.skills_of(session, target)
        if found is None and "agent_id" in target:
            agent_id = target["agent_id"]
            raise UnknownAgent(f"agent {agent_id!r} is not registered", agent_id=agent_id)
        if not found:
            capability = target["capability"]
            raise NoSuitableAgent(f"no agent declares capability {capability!r}")
        return found

    async def card(request: Request, target: dict[str, Any], path: str, name: str) -> Response:
        server, _dispatcher = await served()
        found = await run_in_threadpool(skills, server, target)
        base = str(request.base_url).rstrip("/")
        description = f"{name}, reached through Agent-Reach (routing, retries, dead letters)"
        return JSONResponse(server.card_for(name, description, base + path, found, require_auth))

    async def rpc(request: Request, target: dict[str, Any]) -> Response:
        server, dispatcher = await served()
        await run_in_threadpool(skills, server, target)  # 404 for a target that is not there
        request.state.reach_target = target
        response: Response = await dispatcher.handle_requests(request)
        return response

    @router.get("/a2a/capability/{capability:path}" + CARD)
    async def capability_card(capability: str, request: Request, principal: Submits) -> Response:
        """The A2A card of a capability: any agent that has it answers."""
        target = {"capability": capability}
        return await card(request, target, f"/a2a/capability/{capability}", capability)

    @router.post("/a2a/capability/{capability:path}")
    async def capability_rpc(capability: str, request: Request, principal: Submits) -> Response:
        return await rpc(request, {"capability": capability})

    @router.get("/a2a/{agent_id}" + CARD)
    async def agent_card(agent_id: str, request: Request, principal: Submits) -> Response:
        """The A2A card of a hub agent: its capabilities as skills."""
        return await card(request, {"agent_id": agent_id}, f"/a2a/{agent_id}", agent_id)

    @router.post("/a2a/{agent_id}")
    async def agent_rpc(agent_id: str, request: Request, principal: Submits) -> Response:
        """The agent's A2A JSON-RPC endpoint (SendMessage, SendStreamingMessage, GetTask,
        CancelTask, SubscribeToTask), answered with the hub's tasks."""
        return await rpc(request, {"agent_id": agent_id})

    return router
