"""Admin endpoints on agents: the trust level, the L3 allow-list and the queue bound; A2A
agents and MCP servers registered by an admin.

An agent never declares its own trust: these are the only ways to set it, each change
audited with the admin's identity and the old and new values (`reach.hub.security.trust`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from reach.core.security.auth import Action, Principal
from reach.core.security.networks import NetworkRule
from reach.core.security.trust import TrustLevel
from reach.hub.api.auth import require
from reach.hub.context import HubContext
from reach.hub.flow import admission
from reach.hub.interop.a2a import cards
from reach.hub.interop.a2a.cards import A2aRegistration
from reach.hub.interop.mcp import servers as mcp_servers
from reach.hub.interop.mcp.client import list_tools
from reach.hub.interop.mcp.servers import McpRegistration
from reach.hub.security import audit, trust
from reach.hub.security.trust import MAX_RULE_VALUE, RuleKind

Administers = Annotated[Principal, Depends(require(Action.ADMINISTER))]
ReadsFleet = Annotated[Principal, Depends(require(Action.READ_FLEET))]
RuleValue = Annotated[str, Field(min_length=1, max_length=MAX_RULE_VALUE, pattern=r"^\S+$")]


class SetTrust(BaseModel):
    model_config = ConfigDict(extra="forbid")

    level: TrustLevel = Field(description="L1 (mutual TLS), L2 (the default) or L3 (allow-list)")


class SetMaxQueue(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_queue: int | None = Field(
        ...,
        ge=1,
        le=10_000_000,
        strict=True,
        description="pending + in-flight tasks the agent may hold (429 past it); null: clear",
    )


class AllowRule(BaseModel):
    """One allow-list entry: exactly one of ``call`` or ``callable_by``."""

    model_config = ConfigDict(extra="forbid")

    call: RuleValue | None = Field(
        None, description="a capability (method) pattern the agent may reach, e.g. search.*"
    )
    callable_by: RuleValue | None = Field(
        None, description="an agent ID or identity (agent:<id>, key:<key_id>) that may reach it"
    )

    @model_validator(mode="after")
    def _one(self) -> AllowRule:
        if (self.call is None) == (self.callable_by is None):
            raise ValueError("give exactly one of call or callable_by")
        return self

    @property
    def kind(self) -> RuleKind:
        return RuleKind.CALL if self.call is not None else RuleKind.CALLABLE_BY

    @property
    def value(self) -> str:
        return self.call if self.call is not None else str(self.callable_by)


def agents_admin_router(ctx: HubContext, network: NetworkRule) -> APIRouter:
    router = APIRouter(prefix="/api/v1/agents", tags=["admin"])

    @router.post("/a2a", status_code=201, responses={409: {}, 422: {}, 502: {}})
    async def add_a2a(body: A2aRegistration, principal: Administers) -> dict[str, Any]:
        """Register an A2A agent by its card (``/.well-known/agent-card.json`` under
        ``card_url``): its skills become its capabilities; the hub re-reads the card every
        ``a2a.card_refresh_s`` and reaches the agent over JSON-RPC (audited)."""
        a2a = ctx.settings.a2a
        fetched = await run_in_threadpool(
            cards.fetch_card,
            body.card_url,
            a2a.card_timeout_s,
            allow_loopback=body.allow_loopback,
            rule=network,
        )

        def work(session: Session) -> dict[str, Any]:
            now = ctx.clock.now()
            view = cards.register_card(
                session,
                fetched,
                agent_id=body.agent_id,
                credential=body.credential,
                allow_loopback=body.allow_loopback,
                max_concurrency=body.max_concurrency,
                now=now,
                policy=ctx.policy,
                refresh_s=a2a.card_refresh_s,
                seal=ctx.seal,
                network=network,
            )
            audit.record(
                session,
                actor=principal.identity,
                action="register_a2a",
                outcome=audit.ALLOWED,
                now=now,
                target=f"agent:{view['agent_id']}",
                detail={"card_url": fetched.url, "skills": view["skills"]},
            )
            return view

        return await run_in_threadpool(ctx.write, work)

    @router.post("/mcp", status_code=201, responses={409: {}, 422: {}, 502: {}})
    async def add_mcp(body: McpRegistration, principal: Administers) -> dict[str, Any]:
        """Register an MCP server (its Streamable HTTP URL) as an agent: its tools become
        its capabilities, reached with ``tools/call``; the hub reads the tool list again
        every ``mcp_agents.refresh_s`` (audited)."""
        mcp = ctx.settings.mcp_agents
        url = await run_in_threadpool(mcp_servers.check_url, body.url, body.allow_loopback, network)
        listing = await list_tools(url, network, mcp.timeout_s)

        def work(session: Session) -> dict[str, Any]:
            now = ctx.clock.now()
            view = mcp_servers.register_server(
                session,
                url,
                listing,
                agent_id=body.agent_id,
                tags=body.tags,
                allow_loopback=body.allow_loopback,
                max_concurrency=body.max_concurrency,
                now=now,
                policy=ctx.policy,
                refresh_s=mcp.refresh_s,
                network=network,
            ).view
            audit.record(
                session,
                actor=principal.identity,
                action="register_mcp",
                outcome=audit.ALLOWED,
                now=now,
                target=f"agent:{view['agent_id']}",
                detail={"url": url, "tools": view["tools"]},
            )
            return view

        return await run_in_threadpool(ctx.write, work)

    @router.put("/{agent_id}/trust", responses={404: {}, 422: {}})
    def set_trust(agent_id: str, body: SetTrust, principal: Administers) -> dict[str, Any]:
        """Set the agent's trust level (audited)."""
        return ctx.write(
            lambda s: trust.set_trust(
                s, agent_id, body.level, actor=principal.identity, now=ctx.clock.now()
            )
        )

    @router.put("/{agent_id}/max-queue", responses={404: {}, 422: {}})
    def set_max_queue(agent_id: str, body: SetMaxQueue, principal: Administers) -> dict[str, Any]:
        """Override the agent's queue bound (null: back to its declaration or the router's
        ``max_queue``); audited. Takes effect on the next submit, on every API replica."""
        return ctx.write(
            lambda s: admission.set_override(
                s,
                agent_id,
                body.max_queue,
                actor=principal.identity,
                now=ctx.clock.now(),
                default=ctx.settings.router.max_queue,
            )
        )

    @router.get("/{agent_id}/allow", responses={404: {}})
    def allow_list(agent_id: str, principal: ReadsFleet) -> dict[str, Any]:
        """The agent's trust level and allow-list (a read: viewers may see it)."""
        with ctx.reading() as session:
            return trust.allow_list_view(session, agent_id)

    @router.post("/{agent_id}/allow", responses={404: {}, 422: {}})
    def allow(agent_id: str, body: AllowRule, principal: Administers) -> dict[str, Any]:
        """Add an entry to the agent's allow-list (audited; adding it twice changes nothing)."""
        return ctx.write(
            lambda s: trust.add_rule(
                s, agent_id, body.kind, body.value, actor=principal.identity, now=ctx.clock.now()
            )
        )

    @router.delete("/{agent_id}/allow", responses={404: {}, 422: {}})
    def disallow(agent_id: str, body: AllowRule, principal: Administers) -> dict[str, Any]:
        """Remove an entry from the agent's allow-list (audited when it was there)."""
        return ctx.write(
            lambda s: trust.remove_rule(
                s, agent_id, body.kind, body.value, actor=principal.identity, now=ctx.clock.now()
            )
        )

    return router
