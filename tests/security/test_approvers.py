"""Issue 37, item 16: approvals are decided by designated approvers, under their keys.

Through a real ``reach api`` process with auth on, on SQLite and PostgreSQL, with
``approval.approvers`` designating ``alice`` and ``carol`` for ``policy.*``. Before, a
second key held by the requester (the same name) approved the requester's own task, any
approver key decided any approval, and ``decided_name`` was whatever the body said. Now
the same holder's other key is refused (``self-approval``), an approver not designated
for the capability is refused (``forbidden``), and the record names the deciding key:
its identity and its own name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from reach.core.security.auth import Scope
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok
from tests.support.trust_agents import PROBLEM, Key, make_key

AGENT = "ap-policy"


@pytest.fixture
def hub(store_url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = hub_env(
        store_url,
        tmp_path,
        REACH_SECURITY__REQUIRE_AUTH="true",
        REACH_APPROVAL__CAPABILITIES='["policy.*"]',
        REACH_APPROVAL__APPROVERS=json.dumps({"policy.*": ["alice", "carol"]}),
    )
    proc = HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(base + "/healthz", proc)
        yield base
    finally:
        proc.stop()


def _post(hub: str, key: Key, path: str, body: Any = None) -> requests.Response:
    return requests.post(hub + path, json=body, headers=key.headers(), timeout=10)


def test_only_a_designated_approver_other_than_the_requester_decides(
    hub: str, store_url: str
) -> None:
    agent = make_key(store_url, Scope.AGENT, AGENT)
    body = {
        "agent_id": AGENT,
        "addr": "127.0.0.1:9",
        "allow_loopback": True,
        "capabilities": [{"type": "policy.pay"}],
    }
    assert _post(hub, agent, "/v1/agents/register", body).status_code == 201
    alice_caller = make_key(store_url, Scope.CALLER, name="alice")
    alice_approver = make_key(store_url, Scope.APPROVER, name="alice")
    bob = make_key(store_url, Scope.APPROVER, name="bob")
    carol = make_key(store_url, Scope.APPROVER, name="carol")
    admin = make_key(store_url, Scope.ADMIN, name="ops")

    task = _post(
        hub, alice_caller, "/v1/tasks", {"agent_id": AGENT, "method": "policy.pay", "payload": {}}
    )
    assert task.status_code == 201, task.text
    assert task.json()["status"] == "awaiting_approval"
    task_id = task.json()["task_id"]
    listed = requests.get(hub + "/api/v1/approvals", headers=carol.headers(), timeout=10)
    (approval,) = [a for a in listed.json()["approvals"] if a["task_id"] == task_id]
    path = f"/api/v1/approvals/{approval['approval_id']}"

    own = _post(hub, alice_approver, path + "/approve", {"name": "not alice"})
    assert own.status_code == 403, own.text
    assert own.headers["content-type"].startswith("application/problem+json")
    assert own.json()["type"] == PROBLEM + "self-approval"

    for outsider in (bob, admin):
        r = _post(hub, outsider, path + "/approve", {})
        assert r.status_code == 403, r.text
        assert r.json()["type"] == PROBLEM + "forbidden"
        assert "designated approver" in r.json()["detail"]

    done = _post(hub, carol, path + "/approve", {"name": "Mallory"})
    assert done.status_code == 200, done.text
    assert done.json()["decided_by"] == carol.identity
    assert done.json()["decided_name"] == "carol"  # the key's name, not the body's
    events = requests.get(
        f"{hub}/v1/tasks/{task_id}/events", headers=admin.headers(), timeout=10
    ).json()["events"]
    (granted,) = [e for e in events if e["kind"] == "approval_granted"]
    assert granted["actor"] == carol.identity
    assert granted["detail"]["decided_name"] == "carol"
    assert "Mallory" not in json.dumps(events)
