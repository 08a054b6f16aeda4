"""Registry API on real SQLite and PostgreSQL, in-process with a controlled clock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from reach.hub.api import create_app
from reach.hub.clock import ManualClock
from reach.hub.settings import load_settings
from reach.hub.storage.models import InstanceRow
from reach.worker.context import HubContext
from tests.support.stores import snapshot

PROBLEM = "application/problem+json"
TYPE = "urn:agent-reach:problem:"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_800_000_000.0)


@pytest.fixture
def client(
    store_url: str, engine: Engine, clock: ManualClock, tmp_path: Any
) -> Iterator[TestClient]:
    settings = load_settings(environ={"REACH_DATABASE_URL": store_url, "REACH_HOME": str(tmp_path)})
    ctx = HubContext(settings=settings, engine=engine, clock=clock)
    with TestClient(create_app(ctx)) as c:
        yield c


def reg(agent_id: str = "doc-analyzer-01", **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "addr": "10.0.0.5:7001",
        "tags": ["doc", "gpu"],
        "capabilities": [
            {
                "type": "task.process",
                "params_schema": {
                    "type": "object",
                    "properties": {"doc_id": {"type": "string"}},
                    "required": ["doc_id"],
                },
                "return_schema": {"type": "object"},
                "estimated_latency": 120,
                "danger_level": "low",
                "require_approval": False,
            }
        ],
        "max_concurrency": 8,
        "heartbeat_interval": 10,
    }
    body.update(over)
    return body


def instance(client: TestClient, agent_id: str, instance_id: str) -> dict[str, Any]:
    agent = client.get(f"/api/v1/agents/{agent_id}").json()
    return next(i for i in agent["instances"] if i["instance_id"] == instance_id)


def test_register_then_list_and_get(client: TestClient) -> None:
    r = client.post("/v1/agents/register", json=reg(instance_id="i-1"))
    assert r.status_code == 201, r.text
    assert r.json() == {
        "agent_id": "doc-analyzer-01",
        "instance_id": "i-1",
        "status": "online",
        "endpoint": "http://10.0.0.5:7001",
        "heartbeat_interval": 10.0,
        "created": True,
    }
    agents = client.get("/api/v1/agents").json()["agents"]
    assert [a["agent_id"] for a in agents] == ["doc-analyzer-01"]
    (inst,) = agents[0]["instances"]
    assert inst["status"] == "online"
    assert inst["max_concurrency"] == 8
    assert {"last_heartbeat", "current_load", "in_flight", "endpoint"} <= inst.keys()
    assert agents[0]["capabilities"][0]["type"] == "task.process"
    assert client.get("/api/v1/agents/doc-analyzer-01").json()["agent_id"] == "doc-analyzer-01"


def test_reregistering_the_same_instance_is_idempotent(client: TestClient, engine: Engine) -> None:
    assert client.post("/v1/agents/register", json=reg(instance_id="i-1")).status_code == 201
    before = snapshot(engine)
    again = client.post("/v1/agents/register", json=reg(instance_id="i-1"))
    assert again.status_code == 200
    assert again.json()["created"] is False
    assert snapshot(engine) == before


def _instance_row(engine: Engine, instance_id: str) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(select(InstanceRow).where(InstanceRow.instance_id == instance_id))
        return dict(row.mappings().one())


def test_a_newcomer_is_stored_as_the_orm_stores_a_returning_instance(
    client: TestClient, engine: Engine
) -> None:
    # a new agent and instance are written with prebuilt inserts (registry.register); an
    # instance coming back after deregistering goes through the ORM: same clock, same row
    assert client.post("/v1/agents/register", json=reg(instance_id="i-1")).status_code == 201
    fresh = _instance_row(engine, "i-1")
    assert fresh["probe_status"] == "unknown" and fresh["probe_window"] == []
    assert fresh["protocol"] == "reach" and fresh["status"] == "online"
    assert fresh["next_probe_at"] == fresh["registered_at"]  # probed at once
    ident = {"agent_id": "doc-analyzer-01", "instance_id": "i-1"}
    assert client.post("/v1/agents/deregister", json=ident).status_code == 200
    back = client.post("/v1/agents/register", json=reg(instance_id="i-1"))
    assert back.status_code == 201 and back.json()["created"] is True
    assert _instance_row(engine, "i-1") == fresh
    agent = client.get("/api/v1/agents/doc-analyzer-01").json()
    assert agent["tags"] == ["doc", "gpu"] and agent["trust_level"] == "L2"
    assert agent["capabilities"][0]["type"] == "task.process"


def test_several_instances_under_one_agent(client: TestClient) -> None:
    client.post("/v1/agents/register", json=reg(instance_id="i-1", addr="10.0.0.5:7001"))
    client.post("/v1/agents/register", json=reg(instance_id="i-2", addr="10.0.0.6:7001"))
    (agent,) = client.get("/api/v1/agents").json()["agents"]
    assert sorted(i["instance_id"] for i in agent["instances"]) == ["i-1", "i-2"]


def test_filters_by_tag_capability_and_status(client: TestClient, clock: ManualClock) -> None:
    client.post("/v1/agents/register", json=reg("a-doc", instance_id="d1"))
    client.post(
        "/v1/agents/register",
        json=reg(
            "a-chat",
            instance_id="c1",
            addr="10.0.0.9:7001",
            tags=["chat"],
            capabilities=[{"type": "chat.reply"}],
            heartbeat_interval=1,
        ),
    )
    clock.advance(5)  # a-chat missed 3 one-second intervals; a-doc is fresh

    def ids(**params: Any) -> list[str]:
        body = client.get("/api/v1/agents", params=params).json()
        return [a["agent_id"] for a in body["agents"]]

    assert ids(tag="doc") == ["a-doc"]
    assert ids(tag=["doc", "gpu"]) == ["a-doc"]
    assert ids(tag=["doc", "chat"]) == []
    assert ids(capability="chat.reply") == ["a-chat"]
    assert ids(status="offline") == ["a-chat"]
    assert ids(status="online") == ["a-doc"]
    bad = client.get("/api/v1/agents", params={"status": "sleepy"})
    assert bad.status_code == 422 and bad.headers["content-type"] == PROBLEM


def test_controlled_clock_online_then_offline_after_three_missed_intervals(
    client: TestClient, clock: ManualClock
) -> None:
    client.post("/v1/agents/register", json=reg(instance_id="i-1", heartbeat_interval=10))
    assert instance(client, "doc-analyzer-01", "i-1")["status"] == "online"
    clock.advance(29.9)
    assert instance(client, "doc-analyzer-01", "i-1")["status"] == "online"
    clock.advance(0.1)  # 30 s = 3 missed intervals
    assert instance(client, "doc-analyzer-01", "i-1")["status"] == "offline"
    hb = client.post(
        "/v1/agents/heartbeat", json={"agent_id": "doc-analyzer-01", "instance_id": "i-1"}
    )
    assert hb.status_code == 200 and hb.json()["status"] == "online"
    assert instance(client, "doc-analyzer-01", "i-1")["status"] == "online"


@pytest.mark.parametrize("skew", [-86_400.0, -31.0, 0.0, 3600.0, 10 * 365 * 86_400.0])
def test_agent_clock_skew_changes_nothing(
    client: TestClient, clock: ManualClock, skew: float
) -> None:
    client.post("/v1/agents/register", json=reg(instance_id="i-1"))
    clock.advance(25)
    body = {
        "agent_id": "doc-analyzer-01",
        "instance_id": "i-1",
        "in_flight": 3,
        "current_load": 0.375,
        "sent_at": clock.now() + skew,
    }
    assert client.post("/v1/agents/heartbeat", json=body).status_code == 200
    inst = instance(client, "doc-analyzer-01", "i-1")
    assert inst["heartbeat_age_s"] == 0.0
    assert inst["in_flight"] == 3
    clock.advance(29)
    assert instance(client, "doc-analyzer-01", "i-1")["status"] == "online"
    clock.advance(1)
    assert instance(client, "doc-analyzer-01", "i-1")["status"] == "offline"


def test_heartbeat_carries_load_fields(client: TestClient) -> None:
    client.post("/v1/agents/register", json=reg(instance_id="i-1"))
    body = {
        "agent_id": "doc-analyzer-01",
        "instance_id": "i-1",
        "current_load": 0.5,
        "in_flight": 4,
        "max_concurrency": 8,
        "last_task_duration_ms": 123.4,
        "consecutive_failure_count": 2,
    }
    assert client.post("/v1/agents/heartbeat", json=body).status_code == 200
    inst = instance(client, "doc-analyzer-01", "i-1")
    assert (
        inst["current_load"],
        inst["in_flight"],
        inst["last_task_duration_ms"],
        inst["consecutive_failure_count"],
        inst["heartbeat_count"],
    ) == (0.5, 4, 123.4, 2, 1)


def test_deregister_hides_instance_and_refuses_its_heartbeats(client: TestClient) -> None:
    client.post("/v1/agents/register", json=reg(instance_id="i-1"))
    ident = {"agent_id": "doc-analyzer-01", "instance_id": "i-1"}
    assert client.post("/v1/agents/deregister", json=ident).status_code == 200
    (agent,) = client.get("/api/v1/agents").json()["agents"]
    assert agent["instances"] == []
    gone = client.get("/api/v1/agents", params={"status": "deregistered"}).json()["agents"]
    assert gone[0]["instances"][0]["status"] == "deregistered"
    hb = client.post("/v1/agents/heartbeat", json=ident)
    assert hb.status_code == 404 and hb.json()["type"] == TYPE + "unknown-instance"
    # the same instance may come back
    assert client.post("/v1/agents/register", json=reg(instance_id="i-1")).status_code == 201


def test_sweep_persists_offline(client: TestClient, engine: Engine, clock: ManualClock) -> None:
    from reach.hub.fleet import reachability as monitoring
    from reach.hub.fleet.reachability import Policy
    from reach.hub.settings import Settings
    from reach.hub.storage import session_factory
    from reach.hub.storage.models import InstanceEventRow

    policy = Policy.from_settings(Settings())
    client.post("/v1/agents/register", json=reg(instance_id="i-1", heartbeat_interval=2))
    sessions = session_factory(engine)
    with sessions.begin() as s:
        assert monitoring.sweep(s, clock.now(), policy) == []
    clock.advance(6)
    with sessions.begin() as s:
        assert monitoring.sweep(s, clock.now(), policy) == ["i-1"]
    with sessions.begin() as s:
        row = s.scalars(select(InstanceRow)).one()
        assert (row.status, row.status_changed_at) == ("offline", clock.now())
        assert monitoring.sweep(s, clock.now(), policy) == []  # idempotent
        (event,) = s.scalars(select(InstanceEventRow)).all()
        assert (event.kind, event.detail["from"], event.detail["to"]) == (
            "status",
            "online",
            "offline",
        )


def test_openapi_document_is_published(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert {
        "/v1/agents/register",
        "/v1/agents/heartbeat",
        "/v1/agents/deregister",
        "/api/v1/agents",
        "/api/v1/agents/{agent_id}",
    } <= doc["paths"].keys()


# -- bad input: every refusal is a 4xx problem and leaves the database unchanged ----------

BIG = "x" * 1_200_000  # over the default body limit (the payload cap plus its envelope)

BAD_REQUESTS: list[tuple[str, str, Any, int, str]] = [
    ("malformed json", "/v1/agents/register", b"{not json", 400, "malformed-request"),
    ("json array", "/v1/agents/register", b"[1, 2]", 422, "invalid-request"),
    ("empty body", "/v1/agents/register", b"", 400, "malformed-request"),
    ("missing agent_id", "/v1/agents/register", {"addr": "10.0.0.5:7001"}, 422, "invalid-request"),
    ("unknown field", "/v1/agents/register", reg(colour="blue"), 422, "invalid-request"),
    ("bad agent id", "/v1/agents/register", reg("bad id!"), 422, "invalid-request"),
    ("no port", "/v1/agents/register", reg(addr="10.0.0.5"), 422, "invalid-request"),
    ("loopback", "/v1/agents/register", reg(addr="127.0.0.1:7001"), 422, "loopback-address"),
    ("localhost", "/v1/agents/register", reg(addr="localhost:7001"), 422, "loopback-address"),
    ("ipv6 loopback", "/v1/agents/register", reg(addr="[::1]:7001"), 422, "loopback-address"),
    (
        "loopback public",
        "/v1/agents/register",
        reg(addr="0.0.0.0:7001", public_endpoint="127.0.0.1:7001"),
        422,
        "loopback-address",
    ),
    ("unspecified", "/v1/agents/register", reg(addr="0.0.0.0:7001"), 422, "invalid-request"),
    (
        "invalid params schema",
        "/v1/agents/register",
        reg(capabilities=[{"type": "t", "params_schema": {"type": "nope"}}]),
        422,
        "invalid-request",
    ),
    (
        "invalid return schema",
        "/v1/agents/register",
        reg(capabilities=[{"type": "t", "return_schema": {"properties": 3}}]),
        422,
        "invalid-request",
    ),
    (
        "bad danger level",
        "/v1/agents/register",
        reg(capabilities=[{"type": "t", "danger_level": "extreme"}]),
        422,
        "invalid-request",
    ),
    (
        "duplicate capability",
        "/v1/agents/register",
        reg(capabilities=[{"type": "t"}, {"type": "t"}]),
        422,
        "invalid-request",
    ),
    ("zero concurrency", "/v1/agents/register", reg(max_concurrency=0), 422, "invalid-request"),
    ("too large", "/v1/agents/register", reg(version=BIG), 413, "payload-too-large"),
    (
        "heartbeat unknown instance",
        "/v1/agents/heartbeat",
        {"agent_id": "doc-analyzer-01", "instance_id": "nope"},
        404,
        "unknown-instance",
    ),
    (
        "heartbeat other agent's instance",
        "/v1/agents/heartbeat",
        {"agent_id": "someone-else", "instance_id": "i-1"},
        404,
        "unknown-instance",
    ),
    (
        "heartbeat negative in_flight",
        "/v1/agents/heartbeat",
        {"agent_id": "doc-analyzer-01", "instance_id": "i-1", "in_flight": -1},
        422,
        "invalid-request",
    ),
    (
        "heartbeat unknown field",
        "/v1/agents/heartbeat",
        {"agent_id": "doc-analyzer-01", "instance_id": "i-1", "cpu": 3},
        422,
        "invalid-request",
    ),
    (
        "deregister unknown",
        "/v1/agents/deregister",
        {"agent_id": "doc-analyzer-01", "instance_id": "nope"},
        404,
        "unknown-instance",
    ),
    (
        "conflicting capabilities",
        "/v1/agents/register",
        reg(instance_id="i-2", addr="10.0.0.6:7001", capabilities=[{"type": "other"}]),
        409,
        "registration-conflict",
    ),
    (
        "conflicting tags",
        "/v1/agents/register",
        reg(instance_id="i-2", addr="10.0.0.6:7001", tags=["cpu"]),
        409,
        "registration-conflict",
    ),
    (
        "instance moved",
        "/v1/agents/register",
        reg(instance_id="i-1", addr="10.0.0.7:7001"),
        409,
        "registration-conflict",
    ),
    (
        "instance of another agent",
        "/v1/agents/register",
        reg("other-agent", instance_id="i-1"),
        409,
        "registration-conflict",
    ),
    (
        "address taken by another live agent",
        "/v1/agents/register",
        reg("other-agent", instance_id="i-9"),
        409,
        "registration-conflict",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "slug"),
    [pytest.param(p, b, s, t, id=name) for name, p, b, s, t in BAD_REQUESTS],
)
def test_bad_input_is_refused_and_changes_nothing(
    client: TestClient, engine: Engine, path: str, body: Any, status: int, slug: str
) -> None:
    assert client.post("/v1/agents/register", json=reg(instance_id="i-1")).status_code == 201
    before = snapshot(engine)
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    problem = r.json()
    assert problem["type"] == TYPE + slug
    assert problem["status"] == status
    assert problem["detail"]
    assert snapshot(engine) == before


def test_unknown_agent_is_a_problem(client: TestClient) -> None:
    r = client.get("/api/v1/agents/nobody")
    assert r.status_code == 404
    assert r.json()["type"] == TYPE + "unknown-agent"


def test_declaration_may_change_once_no_instance_is_live(
    client: TestClient, clock: ManualClock
) -> None:
    client.post("/v1/agents/register", json=reg(instance_id="i-1"))
    clock.advance(31)  # i-1 is offline now
    r = client.post(
        "/v1/agents/register",
        json=reg(instance_id="i-2", addr="10.0.0.6:7001", capabilities=[{"type": "v2.process"}]),
    )
    assert r.status_code == 201, r.text
    agent = client.get("/api/v1/agents/doc-analyzer-01").json()
    assert [c["type"] for c in agent["capabilities"]] == ["v2.process"]


def test_restart_at_same_address_replaces_the_old_instance(client: TestClient) -> None:
    client.post("/v1/agents/register", json=reg(instance_id="old"))
    assert client.post("/v1/agents/register", json=reg(instance_id="new")).status_code == 201
    (agent,) = client.get("/api/v1/agents").json()["agents"]
    assert [i["instance_id"] for i in agent["instances"]] == ["new"]


@pytest.mark.parametrize("agent_id", ["doc-analyzer-01", "someone-else"])
def test_a_new_incarnation_retires_an_offline_one_at_its_address(
    client: TestClient, engine: Engine, clock: ManualClock, agent_id: str
) -> None:
    # an instance swept offline (its process died), then a new one at the same address:
    # the same agent restarted, and the dead one is retired, not left registered beside
    # it. Another agent is refused: the address stays the offline agent's (issue 37)
    from reach.hub.fleet import reachability as monitoring
    from reach.hub.fleet.reachability import Policy
    from reach.hub.settings import Settings
    from reach.hub.storage import session_factory

    client.post("/v1/agents/register", json=reg(instance_id="old", heartbeat_interval=2))
    clock.advance(6)
    with session_factory(engine).begin() as s:
        assert monitoring.sweep(s, clock.now(), Policy.from_settings(Settings())) == ["old"]
    assert _instance_row(engine, "old")["status"] == "offline"
    body = reg(
        agent_id, instance_id="new", **({} if agent_id == "doc-analyzer-01" else {"tags": []})
    )
    r = client.post("/v1/agents/register", json=body)
    if agent_id == "someone-else":
        assert r.status_code == 409, r.text
        assert r.json()["type"] == TYPE + "registration-conflict"
        assert _instance_row(engine, "old")["status"] == "offline"
        return
    assert r.status_code == 201, r.text
    old = _instance_row(engine, "old")
    assert (old["status"], old["status_changed_at"]) == ("deregistered", clock.now())
    offline = client.get("/api/v1/agents", params={"status": "offline"}).json()["agents"]
    assert offline == []
