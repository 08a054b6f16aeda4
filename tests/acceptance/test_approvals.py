"""Human approval of dangerous capabilities (issue 13), through real processes (api, worker,
beat, a counting agent whose capability says ``require_approval``) on SQLite and PostgreSQL.

A parked task is delivered only after a named approver approves it -- exactly once; a
rejected or expired one fails with who/why and its agent is never called; two decisions
racing on one approval: exactly one wins; a hub restart while parked loses nothing; every
refused decision is a clear problem and changes nothing in the store. Deliveries are
counted at the agent, over HTTP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import MetaData, select

from reach.core.security.auth import Scope
from reach.hub.storage import create_engine_for
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, Stack, start_stack, stop_stack, wait_http_ok
from tests.support.trust_agents import PROBLEM, Key, api, make_key
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_APPROVAL__TIMEOUT_S": "600",
    "REACH_APPROVAL__CAPABILITIES": '["policy.*"]',
}
APPROVER_NAME = "trust-test-approver"  # decided_name: the key's own name, not the body's
DANGER = "ap-danger"  # declares orders.cancel with require_approval
POLICY = "ap-policy"  # declares policy.pay plainly; the hub's policy gates it


@dataclass(frozen=True)
class Keys:
    admin: Key
    caller: Key
    approver: Key
    other_approver: Key
    viewer: Key


@dataclass
class Agents:
    danger: CountingAgentProcess
    policy: CountingAgentProcess


@pytest.fixture(scope="module")
def keys(shared_stack: Stack, shared_store_url: str) -> Keys:
    return Keys(
        admin=make_key(shared_store_url, Scope.ADMIN),
        caller=make_key(shared_store_url, Scope.CALLER),
        approver=make_key(shared_store_url, Scope.APPROVER),
        other_approver=make_key(shared_store_url, Scope.APPROVER),
        viewer=make_key(shared_store_url, Scope.VIEWER),
    )


def _agent(
    stack: Stack, store_url: str, directory: Path, agent_id: str, method: str, *flags: str
) -> CountingAgentProcess:
    key = make_key(store_url, Scope.AGENT, agent_id)
    env = {k: v for k, v in stack.env.items() if not k.startswith("REACH_")}
    env["REACH_API_KEY"] = key.secret
    return CountingAgentProcess(
        stack.url, directory / f"{agent_id}.journal", free_port(),
        "--agent-id", agent_id, "--method", method, *flags, env=env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def agents(
    shared_stack: Stack,
    shared_store_url: str,
    keys: Keys,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Agents]:
    directory = tmp_path_factory.mktemp("agents")
    danger = _agent(
        shared_stack, shared_store_url, directory, DANGER, "orders.cancel", "--require-approval"
    )
    policy = _agent(shared_stack, shared_store_url, directory, POLICY, "policy.pay")
    try:
        for agent_id in (DANGER, POLICY):
            wait_until(
                lambda a=agent_id: _online(shared_stack, keys.admin, a), 30, what=f"{agent_id} up"
            )
        yield Agents(danger, policy)
    finally:
        danger.stop()
        policy.stop()


def _online(stack: Stack, admin: Key, agent_id: str) -> bool:
    r = api(stack, "GET", f"/api/v1/agents/{agent_id}", admin)
    return r.ok and any(i["status"] == "online" for i in r.json()["instances"])


def _submit(
    stack: Stack, key: Key, agent_id: str = DANGER, method: str = "orders.cancel", **payload: Any
) -> dict[str, Any]:
    body = {"agent_id": agent_id, "method": method, "payload": payload or {"order": 1}}
    r = api(stack, "POST", "/v1/tasks", key, body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _task(stack: Stack, key: Key, task_id: str) -> dict[str, Any]:
    r = api(stack, "GET", f"/v1/tasks/{task_id}", key)
    assert r.ok, r.text
    return dict(r.json())


def _approval_of(stack: Stack, key: Key, task_id: str) -> dict[str, Any]:
    r = api(stack, "GET", "/api/v1/approvals?all=true&limit=500", key)
    assert r.ok, r.text
    found = [a for a in r.json()["approvals"] if a["task_id"] == task_id]
    assert len(found) == 1, found
    return dict(found[0])


def _kinds(stack: Stack, key: Key, task_id: str) -> list[tuple[str, str | None]]:
    r = api(stack, "GET", f"/api/v1/tasks/{task_id}/audit", key)
    assert r.ok, r.text
    return [(e["kind"], e["actor"]) for e in r.json()["events"]]


def _decide(
    stack: Stack, key: Key | None, approval_id: str, verb: str, body: Any = None
) -> requests.Response:
    return api(stack, "POST", f"/api/v1/approvals/{approval_id}/{verb}", key, body)


def _problem(r: requests.Response, status: int, slug: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == PROBLEM + slug, r.text


def _settled(stack: Stack, key: Key, task_id: str) -> dict[str, Any]:
    return dict(
        wait_until(
            lambda: (t := _task(stack, key, task_id))["status"] in {"success", "failed"} and t,
            30,
            what=f"{task_id} terminal",
        )
    )


def _store(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The rows a decision could change (audit_log left out: a forbidden key is logged)."""
    engine = create_engine_for(url)
    try:
        meta = MetaData()
        meta.reflect(engine, only=["approvals", "tasks", "task_events", "outbox"])
        with engine.connect() as conn:
            return {
                name: sorted((tuple(r) for r in conn.execute(select(t))), key=repr)
                for name, t in sorted(meta.tables.items())
            }
    finally:
        engine.dispose()


def test_park_then_approve_delivers_exactly_once(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    task = _submit(shared_stack, keys.caller, order=42)
    task_id = task["task_id"]
    assert task["status"] == "awaiting_approval"
    approval = _approval_of(shared_stack, keys.approver, task_id)
    assert approval["status"] == "pending"
    assert approval["caller"] == keys.caller.identity
    assert approval["capability"] == "orders.cancel" and approval["agent_id"] == DANGER
    assert len(approval["payload_hash"]) == 64
    assert approval["expires_at"] == pytest.approx(approval["requested_at"] + 600)
    pending = api(shared_stack, "GET", "/api/v1/approvals", keys.viewer).json()["approvals"]
    assert approval["approval_id"] in {a["approval_id"] for a in pending}
    assert "agentreach_approvals_pending" in shared_stack_metrics(shared_stack, keys)

    time.sleep(1.5)  # parked: nothing delivered, the worker and beat ran meanwhile
    assert agents.danger.counts().deliveries[task_id] == 0
    assert _task(shared_stack, keys.caller, task_id)["status"] == "awaiting_approval"

    r = _decide(shared_stack, keys.approver, approval["approval_id"], "approve", {"name": "Ann"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "approved" and r.json()["decided_name"] == APPROVER_NAME
    assert r.json()["decided_by"] == keys.approver.identity
    assert _settled(shared_stack, keys.caller, task_id)["status"] == "success"
    wait_until(lambda: agents.danger.counts().deliveries[task_id] == 1, 10, what="delivered")
    time.sleep(1.0)
    assert agents.danger.counts().deliveries[task_id] == 1

    kinds = _kinds(shared_stack, keys.admin, task_id)
    assert ("approval_requested", keys.caller.identity) in kinds
    assert ("approval_granted", keys.approver.identity) in kinds
    assert "agentreach_approvals_total" in shared_stack_metrics(shared_stack, keys)

    before = _store(shared_stack.env["REACH_DATABASE_URL"])
    again = _decide(shared_stack, keys.other_approver, approval["approval_id"], "approve")
    _problem(again, 409, "approval-decided")
    late = _decide(shared_stack, keys.other_approver, approval["approval_id"], "reject",
                   {"reason": "too late"})  # fmt: skip
    _problem(late, 409, "approval-decided")
    assert _store(shared_stack.env["REACH_DATABASE_URL"]) == before


def shared_stack_metrics(stack: Stack, keys: Keys) -> str:
    return api(stack, "GET", "/metrics", keys.viewer).text


def test_policy_pattern_parks_an_undeclared_capability(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    task = _submit(shared_stack, keys.caller, POLICY, "policy.pay", amount=5)
    assert task["status"] == "awaiting_approval"
    approval = _approval_of(shared_stack, keys.admin, task["task_id"])
    r = _decide(shared_stack, keys.approver, approval["approval_id"], "approve")
    assert r.status_code == 200, r.text
    assert _settled(shared_stack, keys.caller, task["task_id"])["status"] == "success"
    assert agents.policy.counts().deliveries[task["task_id"]] == 1


def test_park_then_reject_tells_the_waiting_caller_and_never_calls_the_agent(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    task_id = _submit(shared_stack, keys.caller, order=7)["task_id"]
    approval_id = _approval_of(shared_stack, keys.approver, task_id)["approval_id"]
    url = shared_stack.env["REACH_DATABASE_URL"]

    before = _store(url)
    _problem(
        _decide(shared_stack, keys.approver, approval_id, "reject", {}), 422, "reason-required"
    )
    blank = _decide(shared_stack, keys.approver, approval_id, "reject", {"reason": "  "})
    _problem(blank, 422, "reason-required")
    assert _store(url) == before

    waited: dict[str, Any] = {}

    def long_poll() -> None:
        r = api(shared_stack, "GET", f"/v1/tasks/{task_id}?wait=20", keys.caller)
        waited.update(r.json(), took=time.monotonic() - started)

    started = time.monotonic()
    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(0.5)
    r = _decide(
        shared_stack, keys.approver, approval_id, "reject",
        {"reason": "order already shipped", "name": "Bob"},
    )  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "rejected" and r.json()["reason"] == "order already shipped"
    poller.join(25)
    assert waited["status"] == "failed" and waited["took"] < 10  # woken, not timed out
    error = waited["error"]
    assert error["kind"] == "approval_rejected"
    assert error["reason"] == "order already shipped"
    assert error["decided_by"] == keys.approver.identity and error["decided_name"] == APPROVER_NAME
    assert ("approval_rejected", keys.approver.identity) in _kinds(
        shared_stack, keys.admin, task_id
    )
    time.sleep(1.0)
    assert agents.danger.counts().deliveries[task_id] == 0


def test_concurrent_approve_and_reject_exactly_one_wins(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    outcomes: dict[str, tuple[int, int]] = {}
    for n in range(4):
        task_id = _submit(shared_stack, keys.caller, order=100 + n)["task_id"]
        approval_id = _approval_of(shared_stack, keys.admin, task_id)["approval_id"]
        barrier = threading.Barrier(2)
        codes: dict[str, int] = {}

        def decide(
            verb: str,
            key: Key,
            body: Any,
            aid: str = approval_id,
            barrier: threading.Barrier = barrier,
            codes: dict[str, int] = codes,
        ) -> None:
            barrier.wait()
            r = _decide(shared_stack, key, aid, verb, body)
            codes[verb] = r.status_code
            if r.status_code != 200:
                _problem(r, 409, "approval-decided")

        threads = [
            threading.Thread(target=decide, args=("approve", keys.approver, None)),
            threading.Thread(
                target=decide, args=("reject", keys.other_approver, {"reason": "race"})
            ),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(codes.values()) == [200, 409], codes
        outcomes[task_id] = (codes["approve"], codes["reject"])
    for task_id, (approved, _) in outcomes.items():
        final = _settled(shared_stack, keys.caller, task_id)
        approval = _approval_of(shared_stack, keys.admin, task_id)
        if approved == 200:
            assert final["status"] == "success" and approval["status"] == "approved"
        else:
            assert final["status"] == "failed" and approval["status"] == "rejected"
    time.sleep(1.0)
    for task_id, (approved, _) in outcomes.items():
        assert agents.danger.counts().deliveries[task_id] == (1 if approved == 200 else 0)


def test_refused_decisions_change_nothing(shared_stack: Stack, keys: Keys, agents: Agents) -> None:
    url = shared_stack.env["REACH_DATABASE_URL"]
    mine = _submit(shared_stack, keys.admin, order=9)["task_id"]  # the admin requests it
    approval_id = _approval_of(shared_stack, keys.admin, mine)["approval_id"]
    before = _store(url)

    _problem(_decide(shared_stack, keys.approver, "ap-nope", "approve"), 404, "unknown-approval")
    _problem(_decide(shared_stack, keys.caller, approval_id, "approve"), 403, "forbidden")
    _problem(
        _decide(shared_stack, keys.viewer, approval_id, "reject", {"reason": "x"}), 403, "forbidden"
    )
    _problem(api(shared_stack, "GET", "/api/v1/approvals", keys.caller), 403, "forbidden")
    _problem(_decide(shared_stack, None, approval_id, "approve"), 401, "unauthenticated")
    _problem(_decide(shared_stack, keys.admin, approval_id, "approve"), 403, "self-approval")
    self_reject = _decide(shared_stack, keys.admin, approval_id, "reject", {"reason": "mine"})
    _problem(self_reject, 403, "self-approval")
    assert _store(url) == before
    assert _task(shared_stack, keys.admin, mine)["status"] == "awaiting_approval"

    r = _decide(shared_stack, keys.approver, approval_id, "approve")  # someone else may
    assert r.status_code == 200, r.text
    assert _settled(shared_stack, keys.admin, mine)["status"] == "success"


def test_a_restart_while_parked_loses_nothing(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    task_id = _submit(shared_stack, keys.caller, order=77)["task_id"]
    approval_id = _approval_of(shared_stack, keys.admin, task_id)["approval_id"]
    port = shared_stack.url.rsplit(":", 1)[1]
    for proc in shared_stack.procs:
        proc.stop()
    home = shared_stack.home
    shared_stack.procs[:] = [
        HubProcess(["api", "--port", port], shared_stack.env, home / "api-2.log"),
        HubProcess(["worker", "--concurrency", "2"], shared_stack.env, home / "worker-2.log"),
        HubProcess(["beat"], shared_stack.env, home / "beat-2.log"),
    ]
    wait_http_ok(shared_stack.url + "/healthz", shared_stack.procs[0])
    wait_until(lambda: _online(shared_stack, keys.admin, DANGER), 30, what="hub and agent back")
    assert _task(shared_stack, keys.caller, task_id)["status"] == "awaiting_approval"
    assert _approval_of(shared_stack, keys.admin, task_id)["status"] == "pending"
    assert agents.danger.counts().deliveries[task_id] == 0

    r = _decide(shared_stack, keys.approver, approval_id, "approve")
    assert r.status_code == 200, r.text
    assert _settled(shared_stack, keys.caller, task_id)["status"] == "success"
    time.sleep(1.0)
    assert agents.danger.counts().deliveries[task_id] == 1


def test_beat_expires_a_parked_task_even_across_a_hub_restart(
    store_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An open hub (no keys) with a 3 s timeout: the hub is down when the time runs out,
    and the beat that comes back fails the task (``approval_expired``, actor ``hub``)."""
    extra = {
        "REACH_APPROVAL__TIMEOUT_S": "3",
        "REACH_APPROVAL__SWEEP_INTERVAL_S": "0.5",
        "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    }
    if "postgres" in store_url:
        redis_url: str = request.getfixturevalue("redis_db")
        extra.update(REACH_BROKER_URL=redis_url, REACH_RESULT_BACKEND=redis_url)
    stack = start_stack(store_url, tmp_path, extra)
    agent = CountingAgentProcess(
        stack.url, tmp_path / "danger.journal", free_port(),
        "--agent-id", DANGER, "--method", "orders.cancel", "--require-approval",
    )  # fmt: skip
    try:
        wait_until(lambda: stack.instance(DANGER) is not None, 30, what="agent registered")
        r = requests.post(
            stack.url + "/v1/tasks",
            json={"agent_id": DANGER, "method": "orders.cancel", "payload": {"order": 1}},
            timeout=10,
        )
        assert r.status_code == 201 and r.json()["status"] == "awaiting_approval", r.text
        task_id = r.json()["task_id"]
        stop_stack(stack)
        time.sleep(4)  # expired while nothing of the hub ran
        restarted = start_stack(store_url, tmp_path, extra)
        stack = restarted
        final = wait_until(
            lambda: (t := stack.task(task_id))["status"] == "failed" and t, 30, what="expired"
        )
        assert final["error"]["kind"] == "approval_expired"
        approvals = requests.get(stack.url + "/api/v1/approvals?status=expired", timeout=5)
        (approval,) = [a for a in approvals.json()["approvals"] if a["task_id"] == task_id]
        assert approval["status"] == "expired" and approval["decided_by"] == "hub"
        events = stack.events(task_id)
        assert any(e["kind"] == "approval_expired" for e in events)
        late = requests.post(
            f"{stack.url}/api/v1/approvals/{approval['approval_id']}/approve", timeout=10
        )
        _problem(late, 410, "approval-expired")
        assert stack.task(task_id)["status"] == "failed"
        assert agent.counts().deliveries[task_id] == 0
    finally:
        agent.stop()
        stop_stack(stack)


def test_policy_pattern_gates_broadcast_targets_and_dag_nodes_too(
    shared_stack: Stack, keys: Keys, agents: Agents
) -> None:
    """The hub's ``approval.capabilities`` rule holds whichever way the reach is made: a
    broadcast's target task and a DAG node's task park like a plain send."""
    before = agents.policy.counts().deliveries
    r = api(
        shared_stack,
        "POST",
        "/v1/broadcasts",
        keys.caller,
        {"capability": "policy.pay", "method": "policy.pay", "payload": {"amount": 7}},
    )
    assert r.status_code in (200, 201), r.text
    (target,) = [t for t in r.json()["results"] if t["agent_id"] == POLICY]
    assert target["status"] == "awaiting_approval", target
    assert _task(shared_stack, keys.caller, target["task_id"])["status"] == "awaiting_approval"

    node = {"id": "pay", "agent_id": POLICY, "method": "policy.pay", "timeout_ms": 30_000}
    r = api(
        shared_stack,
        "POST",
        "/api/v1/dag-runs",
        keys.caller,
        {"dag": {"name": "policy-gate", "nodes": [node]}, "input": {"amount": 9}},
    )
    assert r.status_code in (200, 201, 202), r.text
    run_id = r.json()["run_id"]

    def node_task() -> str | None:
        got = api(shared_stack, "GET", f"/api/v1/dag-runs/{run_id}", keys.caller).json()
        found = [n for n in got["nodes"] if n["node_id"] == "pay" and n.get("task_id")]
        return found[0]["task_id"] if found else None

    task_id = wait_until(node_task, 30, what="the DAG node's task")
    assert _task(shared_stack, keys.caller, task_id)["status"] == "awaiting_approval"
    time.sleep(2)  # parked means parked: nothing reaches the agent meanwhile
    assert agents.policy.counts().deliveries == before
