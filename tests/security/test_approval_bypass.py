"""Issue 37, item 1: an agent key cannot make an approval-gated capability run unapproved.

The attack, through real processes (api, worker, beat, a counting agent) with auth on, on
SQLite and PostgreSQL: an agent key registers more than a thousand instances of its own
agents (tag ``fin``, capability ``pay``) whose ids sort before the gated agent's, so the
hub's candidate window at submit saw only them; delivery then picked the gated agent by
ReachScore and never asked again. Now submit judges every eligible agent, delivery
checks the instance it chose (its ``params_schema`` and its approval), and one agent may
hold only so many instances.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from reach.core.security.auth import Scope
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.trust_agents import PROBLEM, Key, api, make_key
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(600)  # the flood: 1,080 registrations per store

PER_AGENT = 90  # registry.max_instances_per_agent here
FLOOD_AGENTS = 12  # 12 x 90 = 1,080 instances: more than the 1,000 of the old window
STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_REGISTRY__MAX_INSTANCES_PER_AGENT": str(PER_AGENT),
    "REACH_REGISTRY__MAX_INSTANCES_PER_KEY": "2000",  # the flood's key holds 1,080
    "REACH_APPROVAL__TIMEOUT_S": "600",
}
GATED = "doc-gated"
SCHEMA = {
    "type": "object",
    "required": ["amount"],
    "properties": {"amount": {"type": "integer", "maximum": 10}},
}


@pytest.fixture(scope="module")
def admin(shared_stack: Stack, shared_store_url: str) -> Key:
    return make_key(shared_store_url, Scope.ADMIN)


@pytest.fixture(scope="module")
def closed_port() -> Iterator[int]:
    """A port bound and never listened on: connections to it are refused, and no other
    process can take it while the module runs (the flood's instances all point there)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


@pytest.fixture(scope="module")
def gated(
    shared_stack: Stack, shared_store_url: str, admin: Key, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CountingAgentProcess]:
    key = make_key(shared_store_url, Scope.AGENT, GATED)
    env = {k: v for k, v in shared_stack.env.items() if not k.startswith("REACH_")}
    env["REACH_API_KEY"] = key.secret
    directory = tmp_path_factory.mktemp("gated")
    agent = CountingAgentProcess(
        shared_stack.url, directory / "gated.journal", free_port(),
        "--agent-id", GATED, "--method", "pay", "--tag", "fin", "--tag", "fin2",
        "--require-approval",
        "--instance-id", "zz-gated", "--params-schema", json.dumps(SCHEMA), env=env,
    )  # fmt: skip
    try:
        wait_until(lambda: _states(shared_stack, admin, GATED) == {"online"}, 30, what="gated up")
        yield agent
    finally:
        agent.stop()


@pytest.fixture(scope="module")
def flood(shared_stack: Stack, shared_store_url: str, closed_port: int) -> Key:
    """1,080 instances of twelve ``doc-flood-NN`` agents under one agent key, ids sorting
    first, all at a refused address (the probe marks them unreachable; a delivery to one
    is refused)."""
    key = make_key(shared_store_url, Scope.AGENT, "doc-flood-*")
    http = requests.Session()
    http.headers.update(key.headers())
    started = time.monotonic()
    for a in range(FLOOD_AGENTS):
        for n in range(PER_AGENT):
            body = _flood_body(a, n, closed_port)
            r = http.post(shared_stack.url + "/v1/agents/register", json=body, timeout=30)
            assert r.status_code == 201, r.text
    http.close()
    print(f"flood registered in {time.monotonic() - started:.1f}s")
    return key


def _flood_body(agent: int, n: int, port: int) -> dict[str, Any]:
    return {
        "agent_id": f"doc-flood-{agent:02}",
        "instance_id": f"0000-{agent:02}-{n:03}",
        "addr": f"http://127.0.0.1:{port}/f{agent}-{n}",
        "allow_loopback": True,
        "heartbeat_interval": 3600,
        "tags": ["fin"],
        "capabilities": [{"type": "pay"}],
    }


def _states(stack: Stack, admin: Key, agent_id: str) -> set[str]:
    r = api(stack, "GET", f"/api/v1/agents/{agent_id}", admin)
    return {i["status"] for i in r.json()["instances"]} if r.ok else set()


def _submit(stack: Stack, key: Key, payload: dict[str, Any]) -> dict[str, Any]:
    body = {"tags": ["fin"], "method": "pay", "payload": payload}
    r = api(stack, "POST", "/v1/tasks", key, body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_a_flood_of_instances_does_not_hide_the_gated_agent_at_submit(
    shared_stack: Stack, gated: CountingAgentProcess, flood: Key
) -> None:
    task = _submit(shared_stack, flood, {"amount": 5})
    assert task["status"] == "awaiting_approval"
    r = api(shared_stack, "GET", f"/v1/tasks/{task['task_id']}", flood)
    assert r.json()["status"] == "awaiting_approval"
    assert task["task_id"] not in gated.counts().deliveries


def test_delivery_refuses_the_gated_agent_a_payload_its_schema_refuses(
    shared_stack: Stack, shared_store_url: str, gated: CountingAgentProcess, closed_port: int
) -> None:
    """Beside the gated agent (tags ``fin``, ``fin2``), a plain ``pay`` agent of the
    attacker's whose one instance went offline at once. The payload fails the gated
    agent's schema, so submit, which sees the plain agent accept it, queues the task
    unparked; delivery then has only the gated agent to choose, and must not hand it a
    task its schema and its approval never passed."""
    key = make_key(shared_store_url, Scope.AGENT, "doc-plain")
    body = {
        "agent_id": "doc-plain",
        "addr": f"http://127.0.0.1:{closed_port}/plain",
        "allow_loopback": True,
        "heartbeat_interval": 0.05,  # never beats again: offline within a second
        "tags": ["fin2"],
        "capabilities": [{"type": "pay"}],
    }
    r = api(shared_stack, "POST", "/v1/agents/register", key, body)
    assert r.status_code == 201, r.text
    time.sleep(0.5)
    r = api(shared_stack, "POST", "/v1/tasks", key, {
        "tags": ["fin2"], "method": "pay", "payload": {"amount": 1_000_000},
    })  # fmt: skip
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "pending"
    task_id = r.json()["task_id"]

    def attempted() -> bool:
        events = api(shared_stack, "GET", f"/v1/tasks/{task_id}/events", key).json()["events"]
        return "refused at delivery" in json.dumps(events) or task_id in gated.counts().deliveries

    wait_until(attempted, 60, what="a delivery attempt")
    assert task_id not in gated.counts().deliveries
    events = api(shared_stack, "GET", f"/v1/tasks/{task_id}/events", key).json()["events"]
    assert "payload fails its params_schema" in json.dumps(events)


def test_one_agent_holds_a_bounded_number_of_instances(
    shared_stack: Stack, flood: Key, closed_port: int
) -> None:
    body = _flood_body(0, PER_AGENT, closed_port)
    r = api(shared_stack, "POST", "/v1/agents/register", flood, body)
    assert r.status_code == 409, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == PROBLEM + "registry-limit"
    assert "max_instances_per_agent" in r.json()["detail"]
    # a refresh of an instance it holds is no new instance
    again = api(shared_stack, "POST", "/v1/agents/register", flood, _flood_body(0, 0, closed_port))
    assert again.status_code == 200, again.text
