"""The agent-facing registry routes: register, heartbeat, deregister (``/v1/agents``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from reach.core.fleet.health import InstanceStatus
from reach.core.security.auth import Action, Principal, may_act_for
from reach.core.security.networks import NetworkRule
from reach.hub.api import links
from reach.hub.api.auth import check_declarable, demand_agent, require
from reach.hub.api.heartbeats import HeartbeatIntake
from reach.hub.context import HubContext
from reach.hub.fleet import registry
from reach.wire.schemas import (
    DeregisterRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
)

ActsAsAgent = Annotated[Principal, Depends(require(Action.ACT_AS_AGENT))]


def agent_router(ctx: HubContext, network: NetworkRule, intake: HeartbeatIntake) -> APIRouter:
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
        if result.created:
            intake.registered(
                result.instance_id, body.agent_id, result.status, result.heartbeat_interval
            )
        return JSONResponse(result.model_dump(), status_code=201 if result.created else 200)

    @router.post("/heartbeat", response_model=HeartbeatResponse, responses={404: {}})
    async def heartbeat(
        body: HeartbeatRequest, request: Request, principal: ActsAsAgent
    ) -> JSONResponse:
        """A fleet's most frequent call: a quiet beat is answered on the event loop (it is
        only buffered), any other is written in a worker thread; the answer is built
        directly (the response model only documents it)."""
        if not may_act_for(principal, body.agent_id):  # refused: logged and audited (I/O)
            await run_in_threadpool(
                demand_agent, request, principal, body.agent_id, Action.ACT_AS_AGENT
            )
        taken = intake.buffered(body)
        if taken is None:
            taken = await run_in_threadpool(intake.write, body)
        beat, headers = taken
        return JSONResponse(
            {"status": beat.status, "next_heartbeat_in": beat.heartbeat_interval},
            headers=headers,
        )

    @router.post("/deregister", responses={404: {}})
    def deregister(
        body: DeregisterRequest, request: Request, principal: ActsAsAgent
    ) -> dict[str, str]:
        demand_agent(request, principal, body.agent_id, Action.ACT_AS_AGENT)
        ctx.write(lambda s: registry.deregister(s, body, ctx.clock.now()))
        intake.forget(body.instance_id)
        return {"instance_id": body.instance_id, "status": InstanceStatus.DEREGISTERED.value}

    return router
