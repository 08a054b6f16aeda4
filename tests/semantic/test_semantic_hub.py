"""Semantic matching through the hub's API with the real model, on real SQLite and
PostgreSQL (in-process API, controlled clock): the demo agents register as `reach up`
registers them, their capability vectors are computed at registration and stored, and
``GET /v1/match`` and sends with an ``intent`` rank, refuse below the threshold, keep
the hard filters and the matched capability's ``params_schema``."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

from reach.core.fleet.matching import texts_digest, texts_for
from reach.hub.api import create_app
from reach.hub.clock import ManualClock
from reach.hub.fleet.embeddings import EmbeddingBackend
from reach.hub.fleet.embeddings.backends.minilm import MiniLM, MiniLMInt8
from reach.hub.fleet.matching import Matcher
from reach.hub.settings import load_settings
from reach.hub.storage.models import AgentCapabilityRow, AgentRow, TaskRow
from reach.worker.context import HubContext
from tests.semantic.demo import declarations, registration

TYPE = "urn:agent-reach:problem:"


class Counted(EmbeddingBackend):
    """The default provider, loaded once for the whole module, counting what it embeds."""

    dimension = MiniLMInt8.dimension
    shared: ClassVar[MiniLMInt8 | None] = None
    texts: ClassVar[list[str]] = []

    def __init__(self) -> None:
        if Counted.shared is None:
            Counted.shared = MiniLMInt8()

    @classmethod
    def model_name(cls) -> str:
        return MiniLMInt8.model_name()

    def embed(self, texts: Sequence[str]) -> Any:
        Counted.texts.extend(texts)
        assert Counted.shared is not None
        return Counted.shared.embed(texts)


def matcher_for(ctx: HubContext, threshold: float = 0.5) -> Matcher:
    router = ctx.settings.router
    return Matcher(
        router.semantic, threshold, router.semantic_margin, ctx.write, ctx.policy, backend=Counted
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_800_000_000.0)


@pytest.fixture
def ctx(store_url: str, engine: Engine, clock: ManualClock, tmp_path: Path) -> HubContext:
    settings = load_settings(environ={"REACH_DATABASE_URL": store_url, "REACH_HOME": str(tmp_path)})
    context = HubContext(settings=settings, engine=engine, clock=clock)
    context.matcher = matcher_for(context)  # type: ignore[misc]
    return context


def stored(engine: Engine) -> dict[tuple[str, str], str | None]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                AgentCapabilityRow.agent_id,
                AgentCapabilityRow.capability,
                AgentCapabilityRow.embedding_digest,
            )
        ).all()
    return {(a, c): d for a, c, d in rows}


def wait_stored(engine: Engine, timeout: float = 60) -> dict[tuple[str, str], str | None]:
    deadline = time.monotonic() + timeout
    while True:
        found = stored(engine)
        if found and all(found.values()):
            return found
        assert time.monotonic() < deadline, f"vectors not stored: {found}"
        time.sleep(0.1)


@pytest.fixture
def client(ctx: HubContext, engine: Engine) -> Iterator[TestClient]:
    """The API with the five demo agents registered and their vectors stored."""
    with TestClient(create_app(ctx)) as c:
        for i, decl in enumerate(declarations()):
            r = c.post("/v1/agents/register", json=registration(decl, f"10.0.0.{i + 5}:7001"))
            assert r.status_code == 201, r.text
        wait_stored(engine)
        yield c


def tasks(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(TaskRow)) or 0)


def test_registration_stores_each_capabilitys_vectors(client: TestClient, engine: Engine) -> None:
    model = MiniLMInt8.model_name()
    found = stored(engine)
    with engine.connect() as conn:
        declared = dict(conn.execute(select(AgentRow.agent_id, AgentRow.capabilities)).all())
    expected = {
        (agent, cap["type"]): texts_digest(model, texts_for(cap))
        for agent, caps in declared.items()
        for cap in caps
    }
    assert found == expected and len(found) == 7
    with engine.connect() as conn:
        blob = conn.scalar(
            select(AgentCapabilityRow.embedding).where(
                AgentCapabilityRow.capability == "orders.refund"
            )
        )
    # type, description and five examples: seven 384-wide float32 rows
    assert blob is not None and len(blob) == 7 * 384 * 4


def test_match_ranks_candidates_best_first(client: TestClient) -> None:
    r = client.get("/v1/match", params={"intent": "refund a damaged order"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["intent"] == "refund a damaged order" and body["threshold"] == 0.5
    first = body["candidates"][0]
    assert (first["agent_id"], first["capability"]) == ("sales-agent-01", "orders.refund")
    assert first["score"] > 0.99  # one of its declared examples
    scores = [c["score"] for c in body["candidates"]]
    assert all(s >= 0.5 for s in scores) and scores == sorted(scores, reverse=True)
    assert set(first) == {"agent_id", "capability", "score"}


def test_a_send_by_intent_is_the_matched_capability(client: TestClient, engine: Engine) -> None:
    r = client.post(
        "/v1/tasks",
        json={"intent": "how much revenue did the east make", "payload": {"region": "east"}},
    )
    assert r.status_code == 201, r.text
    task = r.json()
    assert (task["agent_id"], task["method"], task["status"]) == (
        "sales-agent-01",
        "sales.fetch",
        "pending",
    )
    target = task["target"]
    assert (target["agent_id"], target["capability"]) == ("sales-agent-01", "sales.fetch")
    assert target["intent"] == "how much revenue did the east make"
    assert target["asked"]["method"] is None and target["asked"]["agent_id"] is None
    accepted = client.get(f"/v1/tasks/{task['task_id']}/events").json()["events"][0]
    assert accepted["kind"] == "accepted"
    assert accepted["detail"]["intent"] == target["intent"]
    assert accepted["detail"]["score"] >= 0.5
    assert accepted["detail"]["candidates"][0]["capability"] == "sales.fetch"


def test_a_dangerous_match_still_waits_for_a_human(client: TestClient) -> None:
    r = client.post(
        "/v1/tasks",
        json={
            "intent": "customer wants money back for a broken item",
            "payload": {"order_id": "o-77", "amount": 12.5},
        },
    )
    assert r.status_code == 201, r.text
    assert (r.json()["method"], r.json()["status"]) == ("orders.refund", "awaiting_approval")


@pytest.mark.parametrize(
    "intent", ["play some jazz music", "what is the capital of Australia", "book a flight"]
)
def test_below_the_threshold_no_suitable_agent_and_nothing_written(
    client: TestClient, engine: Engine, intent: str
) -> None:
    before = tasks(engine)
    for r in (
        client.get("/v1/match", params={"intent": intent}),
        client.post("/v1/tasks", json={"intent": intent, "payload": {}, "task_id": "t-jazz"}),
    ):
        assert r.status_code == 404, r.text
        problem = r.json()
        assert problem["type"] == TYPE + "no-suitable-agent"
        assert problem["intent"] == intent and problem["threshold"] == 0.5
        assert 1 <= len(problem["candidates"]) <= 5
        assert all(c["score"] < 0.5 for c in problem["candidates"])
        assert {"agent_id", "capability", "score"} == set(problem["candidates"][0])
    assert tasks(engine) == before


def test_hard_filters_stay_first(client: TestClient, engine: Engine) -> None:
    # a refund asked of a capability that is no refund: refused, not guessed elsewhere
    r = client.post(
        "/v1/tasks",
        json={
            "intent": "refund a damaged order",
            "capability": "sales.fetch",
            "payload": {"region": "east"},
        },
    )
    assert r.status_code == 404, r.text
    assert {c["capability"] for c in r.json()["candidates"]} == {"sales.fetch"}
    # capability + intent: matched among that capability's agents
    r = client.post(
        "/v1/tasks",
        json={
            "intent": "monthly sales for the east",
            "capability": "sales.fetch",
            "payload": {"region": "east"},
        },
    )
    assert r.status_code == 201 and r.json()["method"] == "sales.fetch", r.text
    # tags and the agent ID narrow the candidates too
    r = client.get("/v1/match", params={"intent": "refund a damaged order", "tag": "text"})
    assert r.status_code == 404 and r.json()["candidates"][0]["agent_id"] == "summarizer-01"
    r = client.get(
        "/v1/match", params={"intent": "why did sales fall", "agent_id": "knowledge-agent-01"}
    )
    assert [c["agent_id"] for c in r.json()["candidates"]] == ["knowledge-agent-01"]
    # an agent that is not registered: nothing to match against
    r = client.post("/v1/tasks", json={"intent": "refund it", "agent_id": "nobody"})
    assert r.status_code == 404 and r.json()["candidates"] == []


def test_an_intent_never_goes_back_along_its_path(client: TestClient) -> None:
    """A handler of the sales agent asking in words is not matched to the sales agent."""
    trace = {"root_id": "t-root", "parent_task_id": "t-root", "hops": 1, "path": ["sales-agent-01"]}
    r = client.post(
        "/v1/tasks",
        json={"intent": "refund a damaged order", "payload": {"order_id": "1"}, "trace": trace},
    )
    assert r.status_code == 404, r.text
    assert "sales-agent-01" not in {c["agent_id"] for c in r.json()["candidates"]}


def test_the_matched_capabilitys_schema_still_validates_the_payload(
    client: TestClient, engine: Engine
) -> None:
    before = tasks(engine)
    r = client.post(
        "/v1/tasks",
        json={"intent": "monthly revenue for a region", "payload": {"region": "nowhere"}},
    )
    assert r.status_code == 422, r.text
    assert r.json()["type"] == TYPE + "invalid-payload" and "sales.fetch" in r.json()["detail"]
    assert tasks(engine) == before


def test_resubmitting_a_task_id_by_intent(client: TestClient) -> None:
    body = {"task_id": "t-intent-1", "intent": "cancel order 8812", "payload": {"order_id": "8"}}
    first = client.post("/v1/tasks", json=body)
    assert first.status_code == 201, first.text
    again = client.post("/v1/tasks", json=body)
    assert again.status_code == 200 and again.json()["task_id"] == "t-intent-1"
    other = client.post("/v1/tasks", json={**body, "intent": "refund order 8812"})
    assert other.status_code == 409 and other.json()["type"] == TYPE + "task-conflict"
    named = client.post(
        "/v1/tasks",
        json={
            "task_id": "t-intent-1",
            "agent_id": "sales-agent-01",
            "method": "orders.cancel",
            "payload": {"order_id": "8"},
        },
    )
    assert named.status_code == 409  # the match's agent, but asked by name: another task


def test_vectors_are_not_computed_per_message(ctx: HubContext, client: TestClient) -> None:
    """Another API replica (a fresh matcher, empty caches) reads the stored vectors: a
    send embeds its intent and nothing else, and the same intent again embeds nothing."""
    replica = matcher_for(ctx)
    ctx.matcher = replica  # type: ignore[misc]
    Counted.texts.clear()
    for intent in ("cancel order 1", "why did sales fall in the north", "summarise this"):
        r = client.post("/v1/tasks", json={"intent": intent, "payload": {"order_id": "1"}})
        assert r.status_code in (201, 422), r.text  # matched (the payload may not fit)
    assert Counted.texts == ["cancel order 1", "why did sales fall in the north", "summarise this"]
    client.get("/v1/match", params={"intent": "cancel order 1"})
    assert len(Counted.texts) == 3


def test_a_changed_declaration_gets_new_vectors(client: TestClient, engine: Engine) -> None:
    before = stored(engine)
    decl = next(d for d in declarations() if d.agent_id == "summarizer-01")
    body = registration(decl, "10.0.0.6:7001")
    body["capabilities"][0]["examples"] = ["boil this text down"]
    r = client.post("/v1/agents/register", json=body)
    assert r.status_code == 200, r.text
    key = ("summarizer-01", "text.summarize")
    deadline = time.monotonic() + 60
    while stored(engine)[key] in (None, before[key]):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    texts = texts_for(body["capabilities"][0])
    assert stored(engine)[key] == texts_digest(MiniLMInt8.model_name(), texts)
    r = client.get("/v1/match", params={"intent": "boil this text down"})
    assert r.json()["candidates"][0]["score"] > 0.99


def test_equally_apt_agents_are_ranked_by_reachability(ctx: HubContext, clock: ManualClock) -> None:
    """Two agents declaring the same capability in the same words: the one whose
    instance went offline (its heartbeats stopped) ranks after the live one, although
    its name sorts first."""
    cap = {
        "type": "invoices.send",
        "description": "Send an invoice to a customer.",
        "examples": ["email the invoice", "bill the customer"],
    }
    with TestClient(create_app(ctx)) as c:
        for agent, addr in (("billing-a", "10.0.1.1:7001"), ("billing-b", "10.0.1.2:7001")):
            r = c.post(
                "/v1/agents/register",
                json={"agent_id": agent, "addr": addr, "capabilities": [cap]},
            )
            assert r.status_code == 201, r.text
            if agent == "billing-a":
                clock.advance(100)  # billing-a: no heartbeat for 100 s, billing-b fresh
        assert c.get("/api/v1/agents/billing-a").json()["status"] == "offline"
        assert c.get("/api/v1/agents/billing-b").json()["status"] == "online"
        r = c.get("/v1/match", params={"intent": "send the invoice to the client"})
        assert r.status_code == 200, r.text
        found = r.json()["candidates"]
        assert [x["agent_id"] for x in found] == ["billing-b", "billing-a"]
        assert found[0]["score"] == found[1]["score"]
        for _ in range(10):  # never drawn with the offline one: it is no equal
            sent = c.post("/v1/tasks", json={"intent": "bill the customer", "payload": {}})
            assert sent.status_code == 201 and sent.json()["agent_id"] == "billing-b"


def test_the_threshold_is_a_setting(ctx: HubContext, client: TestClient) -> None:
    ctx.matcher = matcher_for(ctx, threshold=0.95)  # type: ignore[misc]
    r = client.get("/v1/match", params={"intent": "customer wants money back for a broken item"})
    assert r.status_code == 404 and r.json()["threshold"] == 0.95
    assert r.json()["candidates"][0]["capability"] == "orders.refund"


def test_the_hub_runs_the_quantized_model_unless_told_otherwise(
    store_url: str, engine: Engine, tmp_path: Path
) -> None:
    def model(**env: str) -> str:
        environ = {"REACH_DATABASE_URL": store_url, "REACH_HOME": str(tmp_path), **env}
        return HubContext(settings=load_settings(environ=environ), engine=engine).matcher.model

    assert model() == MiniLMInt8.model_name() and model().endswith("+int8")
    assert model(REACH_ROUTER__SEMANTIC_QUANTIZE="false") == MiniLM.model_name()


def test_semantic_off_by_setting(store_url: str, engine: Engine, tmp_path: Path) -> None:
    settings = load_settings(
        environ={
            "REACH_DATABASE_URL": store_url,
            "REACH_HOME": str(tmp_path),
            "REACH_ROUTER__SEMANTIC": "off",
        }
    )
    with TestClient(create_app(HubContext(settings=settings, engine=engine))) as c:
        r = c.get("/v1/match", params={"intent": "refund a damaged order"})
        assert r.status_code == 501 and r.json()["reason"] == "router.semantic is off"
