"""A DAG with a node whose capability needs a human decision, through real processes (api,
worker, beat, a recording agent and a counting agent declaring ``require_approval``) on
SQLite and PostgreSQL.

The node's task parks; while parked the node holds no worker slot (more parked runs than
worker slots, and a plain reach still goes through) and its timeout does not run (the
wait is longer than the node's ``timeout_ms``). Approved: the task is delivered once and
the run succeeds. Rejected: the agent is never called, the node fails and the run takes
its failure branch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

import reach
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import AgentProcess, Stack
from tests.support.waiting import wait_until

STACK_SETTINGS = {"REACH_APPROVAL__TIMEOUT_S": "600"}
STACK_WORKER_CONCURRENCY = 2
DANGER = "dag-danger"
NODE_TIMEOUT_MS = 3000  # shorter than the human's wait below: it must not run while parked


@pytest.fixture(scope="module")
def agents(
    shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AgentProcess, CountingAgentProcess]]:
    directory = tmp_path_factory.mktemp("dag-approval")
    recorder = AgentProcess(shared_stack.url, directory / "recorder.log")
    danger = CountingAgentProcess(
        shared_stack.url, directory / "danger.journal", free_port(),
        "--agent-id", DANGER, "--method", "orders.cancel", "--require-approval",
    )  # fmt: skip
    try:
        wait_until(
            lambda: shared_stack.instances("recorder") and shared_stack.instances(DANGER),
            30,
            what="agents",
        )
        yield recorder, danger
    finally:
        recorder.stop()
        danger.stop()


@pytest.fixture
def stack(shared_stack: Stack, agents: Any) -> Stack:
    return shared_stack


def spec() -> dict[str, Any]:
    def node(node_id: str, deps: list[str], **extra: Any) -> dict[str, Any]:
        return {
            "id": node_id,
            "agent_id": "recorder",
            "method": "work.do",
            "dependencies": deps,
            "payload": {"node": node_id},
            **extra,
        }

    return {
        "name": "approval-flow",
        "nodes": [
            node("start", []),
            node(
                "cancel",
                ["start"],
                agent_id=DANGER,
                method="orders.cancel",
                timeout_ms=NODE_TIMEOUT_MS,
            ),
            node("on_success", ["cancel"]),
            node("on_failure", ["cancel"], condition='cancel.status == "failed"'),
        ],
    }


def start(stack: Stack) -> str:
    r = requests.post(f"{stack.url}/api/v1/dag-runs", json={"dag": spec(), "input": {}}, timeout=10)
    assert r.status_code == 201, r.text
    return str(r.json()["run_id"])


def run_view(stack: Stack, run_id: str) -> dict[str, Any]:
    return dict(requests.get(f"{stack.url}/api/v1/dag-runs/{run_id}", timeout=5).json())


def parked(stack: Stack, run_id: str) -> str:
    """Wait until the run's approval node has parked its task; that task's approval id."""

    def approval() -> str | None:
        node = {n["node_id"]: n for n in run_view(stack, run_id)["nodes"]}["cancel"]
        if not node["task_id"] or stack.task(node["task_id"])["status"] != "awaiting_approval":
            return None
        found = requests.get(f"{stack.url}/api/v1/approvals", timeout=5).json()["approvals"]
        return next((a["approval_id"] for a in found if a["task_id"] == node["task_id"]), None)

    return str(wait_until(approval, 30, interval=0.2, what=f"{run_id}'s node parked"))


def finished(stack: Stack, run_id: str) -> dict[str, Any]:
    return dict(
        wait_until(
            lambda: (v := run_view(stack, run_id))["status"] != "running" and v,
            60,
            interval=0.25,
            what=f"run {run_id} finished",
        )
    )


def nodes_of(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["node_id"]: n for n in run["nodes"]}


def test_approved_node_is_delivered_once_and_the_run_succeeds(
    stack: Stack, agents: tuple[AgentProcess, CountingAgentProcess]
) -> None:
    _, danger = agents
    runs = [start(stack) for _ in range(STACK_WORKER_CONCURRENCY + 1)]
    approvals = [parked(stack, run_id) for run_id in runs]
    tasks = {run_id: nodes_of(run_view(stack, run_id))["cancel"]["task_id"] for run_id in runs}
    # more parked nodes than worker slots, and the pool still serves a plain reach
    began = time.monotonic()
    sub = reach.send(agent_id="recorder", method="work.do", payload={"x": 1}, hub=stack.url)
    assert reach.wait_for_result(sub.task_id, timeout=10, hub=stack.url).data["echo"] == {"x": 1}
    assert time.monotonic() - began < 5
    time.sleep(NODE_TIMEOUT_MS / 1000 + 1.5)  # the human takes longer than the node's timeout
    for run_id in runs:
        view = run_view(stack, run_id)
        assert view["status"] == "running", view
        cancel = nodes_of(view)["cancel"]
        assert cancel["status"] == "running", cancel  # not timed out, not re-submitted
        assert cancel["task_id"] == tasks[run_id]
        assert stack.task(cancel["task_id"])["status"] == "awaiting_approval"
        assert danger.counts().deliveries[cancel["task_id"]] == 0

    for approval_id in approvals:
        r = requests.post(f"{stack.url}/api/v1/approvals/{approval_id}/approve", timeout=10)
        assert r.status_code == 200, r.text
    for run_id in runs:
        run = finished(stack, run_id)
        nodes = nodes_of(run)
        assert run["status"] == "success", run
        assert (nodes["cancel"]["status"], nodes["on_success"]["status"]) == ("success", "success")
        assert nodes["on_failure"]["status"] == "skipped"
        assert danger.counts().deliveries[nodes["cancel"]["task_id"]] == 1


def test_rejected_node_fails_and_the_run_takes_its_failure_branch(
    stack: Stack, agents: tuple[AgentProcess, CountingAgentProcess]
) -> None:
    _, danger = agents
    run_id = start(stack)
    approval_id = parked(stack, run_id)
    r = requests.post(
        f"{stack.url}/api/v1/approvals/{approval_id}/reject",
        json={"reason": "not during the sale", "name": "Ops"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    run = finished(stack, run_id)
    nodes = nodes_of(run)
    assert (
        nodes["cancel"]["status"],
        nodes["on_failure"]["status"],
        nodes["on_success"]["status"],
    ) == ("failed", "success", "skipped"), run
    assert "not during the sale" in str(nodes["cancel"]["error"]), nodes["cancel"]
    assert run["status"] == "failed" and "cancel" in run["reason"]
    time.sleep(1.0)
    assert danger.counts().deliveries[nodes["cancel"]["task_id"]] == 0  # never called
