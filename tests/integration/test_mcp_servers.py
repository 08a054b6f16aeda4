"""An MCP server's registration and the re-read of its tool list, in the store (SQLite and
PostgreSQL; the tool lists are given, no server): the squatting rule reads who else
declares a tool, at which trust, and whether that agent is still registered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from reach.core.security.trust import TrustLevel
from reach.errors import InvalidMcpServer
from reach.hub.clock import ManualClock
from reach.hub.fleet import registry
from reach.hub.interop.mcp import servers as mcp_servers
from reach.hub.interop.mcp.client import Listing
from reach.hub.security import trust
from reach.hub.settings import load_settings
from reach.hub.storage.models import AgentRow, InstanceEventRow, InstanceRow
from reach.wire.schemas import Capability, DeregisterRequest, RegisterRequest
from reach.worker.context import HubContext

URL = "http://10.0.0.7:8000/mcp"


@pytest.fixture
def ctx(store_url: str, engine: Engine, tmp_path: Path) -> HubContext:
    settings = load_settings(environ={"REACH_DATABASE_URL": store_url, "REACH_HOME": str(tmp_path)})
    return HubContext(settings=settings, engine=engine, clock=ManualClock(start=1_800_000_000.0))


def tools(*names: str) -> Listing:
    return Listing("Tool Server", [{"name": n, "inputSchema": {"type": "object"}} for n in names])


def register(ctx: HubContext, listing: Listing, *, refresh: bool = False) -> dict[str, Any]:
    with ctx.db.begin() as session:
        return mcp_servers.register_server(
            session, URL, listing, agent_id=None, tags=["tools"], allow_loopback=False,
            max_concurrency=4, now=ctx.clock.now(), policy=ctx.policy, refresh_s=30,
            refresh=refresh,
        ).view  # fmt: skip


def declared(ctx: HubContext, agent_id: str = "tool-server") -> list[str]:
    with ctx.db.begin() as session:
        agent = session.get(AgentRow, agent_id)
        assert agent is not None
        return [c["type"] for c in agent.capabilities]


def other_agent(
    ctx: HubContext, agent_id: str, *types: str, level: TrustLevel = TrustLevel.L2
) -> None:
    with ctx.db.begin() as session:
        registry.register(
            session,
            RegisterRequest(
                agent_id=agent_id,
                instance_id=f"{agent_id}-1",
                addr=f"10.0.1.{sum(map(ord, agent_id)) % 250}:7001",
                capabilities=[Capability(type=t) for t in types],
            ),
            ctx.clock.now(),
            ctx.policy,
        )
        if level is not TrustLevel.L2:
            trust.set_trust(session, agent_id, level, actor="admin", now=ctx.clock.now())


def test_a_registration_declares_every_usable_tool_and_says_what_it_left_out(
    ctx: HubContext,
) -> None:
    view = register(ctx, Listing("Tool Server", [*tools("a", "b").tools, {"name": "-bad"}]))
    assert view["tools"] == ["a", "b"] and set(view["skipped"]) == {"-bad"}
    assert declared(ctx) == ["a", "b"]
    with ctx.db.begin() as session:
        row = session.get(InstanceRow, mcp_servers.instance_id_of(URL))
        assert row is not None and row.protocol == "mcp" and row.endpoint == URL
    with pytest.raises(InvalidMcpServer):
        register(ctx, Listing("Tool Server", [{"name": "../x"}]))


def test_a_reread_adds_and_removes_but_holds_what_an_equal_or_better_agent_owns(
    ctx: HubContext,
) -> None:
    register(ctx, tools("a", "b"))
    other_agent(ctx, "ledger", "pay", level=TrustLevel.L1)
    other_agent(ctx, "peer", "notes")
    other_agent(ctx, "plugin", "search", level=TrustLevel.L3)
    view = register(ctx, tools("a", "pay", "notes", "search", "c"), refresh=True)
    assert declared(ctx) == ["a", "search", "c"]  # b removed; pay and notes held
    assert view["held"] == {"pay": "ledger", "notes": "peer"}
    with ctx.db.begin() as session:
        alerts = [e.detail for e in session.query(InstanceEventRow).all() if e.kind == "alert"]
    assert [a["alert"] for a in alerts] == ["mcp_tools_held"]
    # the same list read again: still held, alerted once
    register(ctx, tools("a", "pay", "notes", "search", "c"), refresh=True)
    with ctx.db.begin() as session:
        assert session.query(InstanceEventRow).filter_by(kind="alert").count() == 1
    # a deregistered owner owns nothing any more
    with ctx.db.begin() as session:
        registry.deregister(
            session, DeregisterRequest(agent_id="peer", instance_id="peer-1"), ctx.clock.now()
        )
    register(ctx, tools("a", "pay", "notes", "search", "c"), refresh=True)
    assert declared(ctx) == ["a", "notes", "search", "c"]
    # an admin's registration is the decision to share it
    register(ctx, tools("a", "pay"))
    assert declared(ctx) == ["a", "pay"]
