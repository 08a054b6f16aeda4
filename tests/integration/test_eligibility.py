"""Submit and delivery agree on who may take a task (one rule: ``routing.eligibility``).

Through the real API on SQLite and PostgreSQL, with delivery run against a real HTTP agent:
what submit accepts, delivery can route; what delivery could never route, submit refuses.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from reach.core.fleet.routing import RouteFilter, rank
from reach.hub.api import create_app
from reach.hub.clock import ManualClock
from reach.hub.delivery.pipeline import deliver_attempt
from reach.hub.delivery.transports import AgentTransport
from reach.hub.fleet import registry
from reach.hub.flow.breakers import Breakers
from reach.hub.settings import load_settings
from reach.hub.storage.models import TaskRow
from reach.worker.context import HubContext
from tests.support.envelope_server import EnvelopeServer
from tests.support.ports import free_port

PROBLEM = "urn:agent-reach:problem:"


@pytest.fixture
def ctx(store_url: str, engine: Engine, tmp_path: Path) -> HubContext:
    settings = load_settings(
        environ={
            "REACH_DATABASE_URL": store_url,
            "REACH_HOME": str(tmp_path),
            # nobody listens: submit's publish is refused and left to the relay; this
            # test runs delivery itself, as the worker's task shell would
            "REACH_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
        }
    )
    return HubContext(settings=settings, engine=engine, clock=ManualClock(start=1_800_000_000.0))


@pytest.fixture
def client(ctx: HubContext) -> Iterator[TestClient]:
    with TestClient(create_app(ctx)) as c:
        yield c


@pytest.fixture
def agent() -> Iterator[EnvelopeServer]:
    server = EnvelopeServer()
    yield server
    server.close()


def register(
    client: TestClient,
    agent_id: str,
    addr: str,
    capabilities: list[str],
    metadata: dict[str, Any] | None = None,
) -> None:
    body = {
        "agent_id": agent_id,
        "addr": addr,
        "allow_loopback": True,
        "capabilities": [{"type": c} for c in capabilities],
        "metadata": metadata or {},
    }
    r = client.post("/v1/agents/register", json=body)
    assert r.status_code == 201, r.text


def routable(ctx: HubContext, body: dict[str, Any]) -> bool:
    """Would delivery find a candidate for this request? (what the worker loads and ranks)"""
    flt = RouteFilter(
        agent_id=body.get("agent_id"),
        tags=tuple(sorted(body.get("tags", ()))),
        capability=body.get("capability"),
        rules=tuple(sorted(body.get("rules", {}).items())),
    )
    with ctx.db() as s:
        found = registry.load_candidates(s, flt, ctx.clock.now(), ctx.policy, body["method"])
    return bool(rank(found, flt))


def tasks(ctx: HubContext) -> int:
    with ctx.db() as s:
        return int(s.scalar(select(func.count()).select_from(TaskRow)) or 0)


def deliver(ctx: HubContext, task_id: str) -> None:
    deliver_attempt(
        ctx.db,
        task_id,
        1,
        now=ctx.clock.now,
        policy=ctx.policy,
        dpolicy=ctx.delivery_policy,
        transport=AgentTransport(),
        rng=random.Random(1),
        breakers=Breakers(),
    )


def test_a_declared_capability_with_an_undeclared_method_is_refused_at_submit(
    client: TestClient, ctx: HubContext
) -> None:
    """It used to be accepted and then retried until dead-lettered: no route existed."""
    register(client, "summariser", "10.0.0.5:7001", ["summarise"])
    body = {"capability": "summarise", "method": "translate", "payload": {}}
    assert not routable(ctx, body)

    r = client.post("/v1/tasks", json=body)

    assert r.status_code == 404, r.text
    problem = r.json()
    assert problem["type"] == PROBLEM + "no-suitable-agent"
    assert "summariser match but declare no capability 'translate'" in problem["detail"]
    assert tasks(ctx) == 0
    # the declared method is accepted, and routable
    ok = {"capability": "summarise", "method": "summarise", "payload": {}}
    assert routable(ctx, ok)
    assert client.post("/v1/tasks", json=ok).status_code == 201


def test_a_float_rule_matches_an_integer_metadata_value_and_is_delivered(
    client: TestClient, ctx: HubContext, agent: EnvelopeServer
) -> None:
    """``1.0`` against a declared ``1`` used to be refused at submit though routing matched."""
    register(client, "sharded", agent.addr, ["m"], metadata={"shard": 1})
    body = {"capability": "m", "method": "m", "rules": {"shard": 1.0}, "payload": {"x": 1}}
    assert routable(ctx, body)

    r = client.post("/v1/tasks", json=body)

    assert r.status_code == 201, r.text
    task_id = r.json()["task_id"]
    deliver(ctx, task_id)
    done = client.get(f"/v1/tasks/{task_id}").json()
    assert (done["status"], done["result"], done["agent_id"]) == (
        "success",
        {"ok": task_id},
        "sharded",
    )
    assert agent.calls[task_id] == 1


# (capabilities, metadata, request): submit accepts exactly when delivery can route
AGREEMENT = [
    (["summarise"], {}, {"capability": "summarise", "method": "translate"}),
    (["summarise"], {}, {"capability": "summarise", "method": "summarise"}),
    (["summarise", "translate"], {}, {"capability": "summarise", "method": "translate"}),
    ([], {}, {"agent_id": "x", "method": "anything"}),
    (["m"], {}, {"agent_id": "x", "method": "other"}),
    (["m"], {"shard": 1}, {"capability": "m", "method": "m", "rules": {"shard": 1.0}}),
    (["m"], {"shard": 1.0}, {"capability": "m", "method": "m", "rules": {"shard": 1}}),
    (["m"], {"shard": 1}, {"capability": "m", "method": "m", "rules": {"shard": True}}),
    (["m"], {"flag": True}, {"capability": "m", "method": "m", "rules": {"flag": 1}}),
    (["m"], {"flag": False}, {"capability": "m", "method": "m", "rules": {"flag": False}}),
    (["m"], {"shard": "1"}, {"capability": "m", "method": "m", "rules": {"shard": 1}}),
    (["m"], {"region": "east"}, {"capability": "m", "method": "m", "rules": {"zone": "a"}}),
]


@pytest.mark.parametrize(("capabilities", "metadata", "request_body"), AGREEMENT)
def test_submit_accepts_exactly_what_delivery_can_route(
    client: TestClient,
    ctx: HubContext,
    capabilities: list[str],
    metadata: dict[str, Any],
    request_body: dict[str, Any],
) -> None:
    register(client, "x", "10.0.0.5:7001", capabilities, metadata)
    r = client.post("/v1/tasks", json={**request_body, "payload": {}})
    assert r.status_code in (201, 404), r.text
    assert (r.status_code == 201) is routable(ctx, request_body), r.text
