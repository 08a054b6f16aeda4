"""DAG runs on the canvas with real agents: parallel levels, failure branches, and slow
(202-then-report) agents that must not hold worker slots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.stacks import AgentProcess, Stack
from tests.support.waiting import wait_until


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    return shared_stack


def node(node_id: str, deps: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": node_id,
        "agent_id": "recorder",
        "method": "work.do",
        "dependencies": deps or [],
        "payload": {"node": node_id},
        **extra,
    }


def run_dag(stack: Stack, spec: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    r = requests.post(f"{stack.url}/api/v1/dag-runs", json={"dag": spec, "input": {}}, timeout=10)
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    return dict(
        wait_until(
            lambda: (
                (v := requests.get(f"{stack.url}/api/v1/dag-runs/{run_id}", timeout=5).json())
                and v["status"] != "running"
                and v
            ),
            timeout=timeout,
            interval=0.25,
            what=f"run {run_id}",
        )
    )


def test_diamond_runs_its_middle_nodes_in_parallel(stack: Stack, tmp_path: Path) -> None:
    agent = AgentProcess(stack.url, tmp_path / "x.log", delay=1.5)
    try:
        wait_until(lambda: stack.instances("recorder"), timeout=30, what="agent")
        spec = {
            "name": "diamond",
            "nodes": [
                node("split"),
                node("left", ["split"]),
                node("right", ["split"]),
                node("merge", ["left", "right"]),
            ],
        }
        run = run_dag(stack, spec)
        assert run["status"] == "success", run
        nodes = {n["node_id"]: n for n in run["nodes"]}
        left, right = nodes["left"], nodes["right"]
        overlap = min(left["finished_at"], right["finished_at"]) - max(
            left["started_at"], right["started_at"]
        )
        assert overlap > 1.0, f"middle nodes did not overlap: {overlap:.2f}s"
        assert nodes["merge"]["started_at"] >= max(left["finished_at"], right["finished_at"])
    finally:
        agent.stop()


def test_failure_branch_runs_only_on_failure(stack: Stack, tmp_path: Path) -> None:
    ok = AgentProcess(stack.url, tmp_path / "ok.log")
    bad = AgentProcess(stack.url, tmp_path / "bad.log", agent_id="breaker", mode="business")
    try:
        wait_until(
            lambda: stack.instances("recorder") and stack.instances("breaker"),
            timeout=30,
            what="agents",
        )

        def spec(risky_agent: str) -> dict[str, Any]:
            return {
                "name": "branches",
                "nodes": [
                    node("start"),
                    node("risky", ["start"], agent_id=risky_agent),
                    node("on_success", ["risky"]),
                    node("on_failure", ["risky"], condition='risky.status == "failed"'),
                ],
            }

        failing = {n["node_id"]: n for n in run_dag(stack, spec("breaker"))["nodes"]}
        assert (
            failing["risky"]["status"],
            failing["on_failure"]["status"],
            failing["on_success"]["status"],
        ) == ("failed", "success", "skipped")
        passing = {n["node_id"]: n for n in run_dag(stack, spec("recorder"))["nodes"]}
        assert (
            passing["risky"]["status"],
            passing["on_failure"]["status"],
            passing["on_success"]["status"],
        ) == ("success", "skipped", "success")
        assert "condition not met" in passing["on_failure"]["reason"]
    finally:
        ok.stop()
        bad.stop()
