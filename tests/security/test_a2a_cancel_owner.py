"""Issue 37, item 13: an agent key cannot cancel a caller's task through A2A CancelTask.

CancelTask checked only that the principal could read the task, and an agent key reads
every task routed to its agent: it could cancel a caller's task, and withdraw the
approval request of a parked one. Now only the task's caller (or an admin) cancels it;
the agent is told ``TaskNotCancelableError`` and nothing changes.

Real processes: a hub with auth on (api, worker, beat) and an agent that declares an
approval-gated capability (``tests/support/counting_agent.py``), so the caller's task
parks in ``awaiting_approval`` with a pending approval.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from reach.core.security.auth import Scope
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.trust_agents import Key, api, make_key
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_APPROVAL__TIMEOUT_S": "600",
}
AGENT = "cx-danger"
NOT_CANCELABLE = -32002  # A2A TaskNotCancelableError
NOT_FOUND = -32001  # A2A TaskNotFoundError


class Keys:
    def __init__(self, store_url: str) -> None:
        self.admin = make_key(store_url, Scope.ADMIN)
        self.caller = make_key(store_url, Scope.CALLER)
        self.other = make_key(store_url, Scope.CALLER)
        self.agent = make_key(store_url, Scope.AGENT, AGENT)


@pytest.fixture(scope="module")
def keys(shared_stack: Stack, shared_store_url: str) -> Keys:
    return Keys(shared_store_url)


@pytest.fixture(scope="module")
def agent(
    shared_stack: Stack, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CountingAgentProcess]:
    directory: Path = tmp_path_factory.mktemp("agent")
    env = {k: v for k, v in shared_stack.env.items() if not k.startswith("REACH_")}
    env["REACH_API_KEY"] = keys.agent.secret
    proc = CountingAgentProcess(
        shared_stack.url, directory / "danger.journal", free_port(),
        "--agent-id", AGENT, "--method", "orders.cancel", "--require-approval", env=env,
    )  # fmt: skip
    try:

        def online() -> bool:
            r = api(shared_stack, "GET", f"/api/v1/agents/{AGENT}", keys.admin)
            return r.ok and any(i["status"] == "online" for i in r.json()["instances"])

        wait_until(online, 30, what=f"{AGENT} online")
        yield proc
    finally:
        proc.stop()


def parked(stack: Stack, keys: Keys) -> str:
    body = {"agent_id": AGENT, "method": "orders.cancel", "payload": {"order": 1}}
    r = api(stack, "POST", "/v1/tasks", keys.caller, body)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "awaiting_approval", r.json()
    return str(r.json()["task_id"])


def cancel_task(stack: Stack, key: Key, task_id: str) -> dict[str, Any]:
    """A2A ``CancelTask`` of the hub task ``task_id``, with ``key``'s bearer."""
    r = requests.post(
        f"{stack.url}/a2a/{AGENT}",
        json={"jsonrpc": "2.0", "id": 1, "method": "CancelTask", "params": {"id": task_id}},
        headers={"A2A-Version": "1.0", **key.headers()},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def state(stack: Stack, keys: Keys, task_id: str) -> tuple[str, str]:
    """(the task's status, its approval's status)."""
    task = api(stack, "GET", f"/v1/tasks/{task_id}", keys.admin).json()
    r = api(stack, "GET", "/api/v1/approvals?all=true&limit=500", keys.admin)
    (approval,) = [a for a in r.json()["approvals"] if a["task_id"] == task_id]
    return task["status"], approval["status"]


def test_the_agent_it_was_routed_to_cannot_cancel_a_callers_task(
    shared_stack: Stack, keys: Keys, agent: CountingAgentProcess
) -> None:
    task_id = parked(shared_stack, keys)
    # the agent may read it (it was routed to it) ...
    seen = api(shared_stack, "GET", f"/v1/tasks/{task_id}", keys.agent)
    assert seen.status_code == 200, seen.text
    # ... and may not end it, nor withdraw its approval request
    answer = cancel_task(shared_stack, keys.agent, task_id)
    assert "result" not in answer, answer
    assert answer["error"]["code"] == NOT_CANCELABLE, answer
    assert "only by its caller or an admin" in answer["error"]["message"]
    assert state(shared_stack, keys, task_id) == ("awaiting_approval", "pending")
    events = api(shared_stack, "GET", f"/v1/tasks/{task_id}/events", keys.admin).json()
    assert "cancel_requested" not in [e["kind"] for e in events["events"]]


def test_another_caller_is_told_the_task_does_not_exist(
    shared_stack: Stack, keys: Keys, agent: CountingAgentProcess
) -> None:
    task_id = parked(shared_stack, keys)
    answer = cancel_task(shared_stack, keys.other, task_id)
    assert answer["error"]["code"] == NOT_FOUND, answer
    assert state(shared_stack, keys, task_id) == ("awaiting_approval", "pending")


@pytest.mark.parametrize("who", ["caller", "admin"])
def test_its_caller_or_an_admin_cancels_it(
    shared_stack: Stack, keys: Keys, agent: CountingAgentProcess, who: str
) -> None:
    task_id = parked(shared_stack, keys)
    answer = cancel_task(shared_stack, getattr(keys, who), task_id)
    assert answer["result"]["status"]["state"] == "TASK_STATE_CANCELED", answer
    assert state(shared_stack, keys, task_id) == ("cancelled", "cancelled")
    assert agent.counts().deliveries[task_id] == 0


def test_unknown_ids_stay_unknown(shared_stack: Stack, keys: Keys, agent: None) -> None:
    answer = cancel_task(shared_stack, keys.agent, f"t-{uuid.uuid4().hex}")
    assert answer["error"]["code"] == NOT_FOUND, answer
