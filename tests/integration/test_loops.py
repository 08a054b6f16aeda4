"""Whose trace the loop check reads (`reach.hub.flow.loops.derive_trace`), on SQLite and
PostgreSQL, through the real API app with delivery run against real HTTP agents.

The acceptance tests (tests/acceptance/test_loops.py) show agent processes stopped with
auth on; these pin the rules one by one: a named parent's stored trace wins over what
the request claims, an agent caller is tied to its live task, an open hub trusts the
SDK's trace, and a route by tags goes on to the agents off the path (delivery skips
those on it) and is refused only when every eligible agent is on it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from reach.core.ledger.statuses import TaskStatus
from reach.errors import LoopDetected
from reach.hub.api import create_app
from reach.hub.clock import ManualClock
from reach.hub.delivery.pipeline import deliver_attempt
from reach.hub.delivery.transports import AgentTransport
from reach.hub.flow import loops
from reach.hub.flow.breakers import Breakers
from reach.hub.intake import submission
from reach.hub.settings import load_settings
from reach.hub.storage.models import TaskRow
from reach.wire.schemas import SubmitRequest
from reach.worker.context import HubContext
from tests.support.envelope_server import EnvelopeServer
from tests.support.ports import free_port

LOOP = "urn:agent-reach:problem:loop-detected"


@pytest.fixture
def ctx(store_url: str, engine: Engine, tmp_path: Path) -> HubContext:
    settings = load_settings(
        environ={
            "REACH_DATABASE_URL": store_url,
            "REACH_HOME": str(tmp_path),
            "REACH_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",  # nobody: the relay's
        }
    )
    return HubContext(settings=settings, engine=engine, clock=ManualClock(start=1_800_000_000.0))


@pytest.fixture
def servers() -> Iterator[dict[str, EnvelopeServer]]:
    started = {name: EnvelopeServer() for name in ("x", "y", "z")}
    yield started
    for server in started.values():
        server.close()


@pytest.fixture
def client(ctx: HubContext, servers: dict[str, EnvelopeServer]) -> Iterator[TestClient]:
    with TestClient(create_app(ctx)) as c:
        for name, server in servers.items():
            body = {
                "agent_id": name,
                "addr": server.addr,
                "allow_loopback": True,
                "tags": ["pool"] if name in ("x", "y") else [],
                "capabilities": [{"type": "m"}],
            }
            r = c.post("/v1/agents/register", json=body)
            assert r.status_code == 201, r.text
        yield c


def deliver(ctx: HubContext, task_id: str, seed: int = 1) -> None:
    deliver_attempt(
        ctx.db,
        task_id,
        1,
        now=ctx.clock.now,
        policy=ctx.policy,
        dpolicy=ctx.delivery_policy,
        transport=AgentTransport(),
        rng=random.Random(seed),
        breakers=Breakers(),
    )


def send(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/tasks", json={"method": "m", "payload": {}, **body})


def delivered(client: TestClient, ctx: HubContext, **body: Any) -> dict[str, Any]:
    r = send(client, **body)
    assert r.status_code == 201, r.text
    deliver(ctx, r.json()["task_id"])
    view = client.get(f"/v1/tasks/{r.json()['task_id']}").json()
    assert view["status"] == "success", view
    return dict(view)


def test_a_named_parent_continues_its_stored_trace_whatever_the_request_claims(
    client: TestClient, ctx: HubContext
) -> None:
    first = delivered(client, ctx, agent_id="x")
    claim = {"root_id": "mine", "parent_task_id": first["task_id"], "hops": 0, "path": []}
    second = send(client, agent_id="z", trace=claim).json()
    assert second["trace"] == {
        "root_id": first["task_id"],
        "parent_task_id": first["task_id"],
        "hops": 1,
        "path": ["x"],
    }
    r = send(client, agent_id="x", trace=claim)
    assert r.status_code == 508, r.text
    assert r.json()["type"] == LOOP
    assert r.json()["cycle"] == ["x", "x"]


def test_an_open_hub_checks_the_trace_the_sdk_sends(client: TestClient) -> None:
    """No authenticated agent, no known parent: the SDK's trace is what there is."""
    sent = {"root_id": "r1", "parent_task_id": "t-unknown", "hops": 2, "path": ["x", "z"]}
    r = send(client, agent_id="x", trace=sent)
    assert r.status_code == 508, r.text
    assert r.json()["cycle"] == ["x", "z", "x"]
    ok = send(client, agent_id="y", trace=sent)
    assert ok.status_code == 201, ok.text
    assert ok.json()["trace"] == sent  # kept as sent, and stored


def test_an_agent_caller_is_tied_to_its_live_task(client: TestClient, ctx: HubContext) -> None:
    """However it sends (no trace, a forged fresh one, a foreign parent), a reach from an
    agent while it handles a task is that task's child."""
    first = delivered(client, ctx, agent_id="x")
    handling = send(
        client, agent_id="z", trace={"root_id": "r", "parent_task_id": first["task_id"]}
    )
    handling_id = handling.json()["task_id"]
    with ctx.transaction() as session:  # z is executing it (a 202 answered, say)
        session.execute(
            update(TaskRow)
            .where(TaskRow.task_id == handling_id)
            .values(status=TaskStatus.EXECUTING, agent_id="z")
        )
    guard = loops.LoopGuard(max_hops=8)
    claims: list[SubmitRequest] = [
        SubmitRequest(agent_id="x", method="m"),
        SubmitRequest(agent_id="x", method="m", trace={"root_id": "fresh", "path": []}),
        SubmitRequest(
            agent_id="x", method="m", trace={"root_id": "r", "parent_task_id": first["task_id"]}
        ),
    ]
    for req in claims:
        with ctx.transaction() as session, pytest.raises(LoopDetected) as caught:
            submission.submit(session, req, ctx.clock.now(), caller="agent:z", loop_guard=guard)
        assert caught.value.extra["cycle"] == ["x", "z", "x"]
    # to an agent off the path: accepted, with the hub's trace
    with ctx.transaction() as session:
        view, _ = submission.submit(
            session,
            SubmitRequest(agent_id="y", method="m", trace={"root_id": "fresh", "path": []}),
            ctx.clock.now(),
            caller="agent:z",
            loop_guard=guard,
        )
    assert view["trace"] == {
        "root_id": first["task_id"],
        "parent_task_id": handling_id,
        "hops": 2,
        "path": ["x", "z"],
    }
    # an agent handling nothing sends from the edge
    with ctx.transaction() as session:
        view, _ = submission.submit(
            session, SubmitRequest(agent_id="x", method="m"), ctx.clock.now(),
            caller="agent:y", loop_guard=guard,
        )  # fmt: skip
    assert view["trace"]["path"] == [] and view["trace"]["hops"] == 0


def test_a_route_goes_on_off_the_path_and_is_refused_when_all_of_it_is_on(
    client: TestClient, ctx: HubContext, servers: dict[str, EnvelopeServer]
) -> None:
    first = delivered(client, ctx, agent_id="x")
    trace = {"root_id": first["task_id"], "parent_task_id": first["task_id"]}
    for seed in range(6):  # whatever the draw, x (on the path) is never chosen
        r = send(client, tags=["pool"], trace=trace)
        assert r.status_code == 201, r.text
        deliver(ctx, r.json()["task_id"], seed)
        assert client.get(f"/v1/tasks/{r.json()['task_id']}").json()["agent_id"] == "y"
    assert servers["x"].calls[r.json()["task_id"]] == 0
    # x and y both on the path: nobody left
    second = delivered(client, ctx, agent_id="y", trace=trace)
    r = send(client, tags=["pool"], trace={"root_id": "r", "parent_task_id": second["task_id"]})
    assert r.status_code == 508, r.text
    assert r.json()["cycle"] in (["x", "y", "x"], ["y", "y"])
    assert r.json()["cycle"] == ["y", "y"]  # the shortest cycle is named
