"""Broadcast / aggregate through the real hub to five agent processes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests

import reach
from tests.support.stacks import AgentProcess, Stack
from tests.support.waiting import wait_until

# A synchronous delivery holds its worker slot for the agent's whole answer: four slots let
# the two slow targets run beside the fast ones (slow agents should answer 202 instead).
STACK_WORKER_CONCURRENCY = 4


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    return shared_stack


@pytest.fixture(scope="module")
def fleet(
    shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, AgentProcess]]:
    logs = tmp_path_factory.mktemp("fleet")
    agents = {
        f"bc-{n}": AgentProcess(
            shared_stack.url, logs / f"bc-{n}.log", agent_id=f"bc-{n}", delay=4.0 if n >= 4 else 0.0
        )
        for n in range(1, 6)
    }
    try:
        for agent_id in agents:
            wait_until(
                lambda a=agent_id: any(
                    i["probe_status"] == "ok" for i in shared_stack.instances(a)
                ),
                timeout=30,
                what=f"{agent_id} probed",
            )
        yield agents
    finally:
        for agent in agents.values():
            agent.stop()


def test_early_completion_with_min_results(stack: Stack, fleet: dict[str, AgentProcess]) -> None:
    started = time.monotonic()
    result = reach.broadcast(
        capability="work.do",
        method="work.do",
        payload={"q": "hi"},
        min_results=3,
        timeout=20,
        hub=stack.url,
    )
    elapsed = time.monotonic() - started
    assert result.complete and result.succeeded >= 3
    assert len(result.results) == 5  # never a blind broadcast: exactly the matching instances
    slow = [r for r in result.results if r["agent_id"] in ("bc-4", "bc-5")]
    # it answered before the slow targets did (each takes 4 s), however loaded the machine
    assert all(r["status"] != "success" for r in slow), (slow, f"{elapsed:.1f}s")
    # the stragglers' late results are still recorded
    for r in slow:
        wait_until(
            lambda tid=r["task_id"]: (
                requests.get(f"{stack.url}/v1/tasks/{tid}", timeout=5).json()["status"] == "success"
            ),
            timeout=20,
            what="straggler recorded",
        )
    after = requests.get(f"{stack.url}/v1/broadcasts/{result.broadcast_id}", timeout=5).json()
    assert after["succeeded"] == 5


def test_a_target_that_is_down_shows_in_the_aggregate(
    stack: Stack, fleet: dict[str, AgentProcess]
) -> None:
    fleet["bc-1"].kill()  # down, and the hub has not noticed yet
    # 60 s: each target's task shares the broadcast's deadline, and on a loaded box a task
    # still queued behind other modules' work at a 20 s deadline ends "timeout", not success
    result = reach.broadcast(capability="work.do", method="work.do", timeout=60, hub=stack.url)
    assert result.complete
    by_agent = {r["agent_id"]: r for r in result.results}
    assert by_agent["bc-1"]["status"] == "dead"
    # refused connections, or (had its probes noticed first) no instance left to route to
    assert by_agent["bc-1"]["error"]["kind"] in ("unreachable", "no_route"), by_agent["bc-1"]
    outcomes = [(r["agent_id"], r["status"], r["error"]) for r in result.results]
    assert result.succeeded == 4, outcomes
    assert "all targets finished" in result.reason


def test_a_broadcast_needs_a_filter(stack: Stack, fleet: dict[str, AgentProcess]) -> None:
    r = requests.post(f"{stack.url}/v1/broadcasts", json={"method": "work.do"}, timeout=5)
    assert r.status_code == 422
    r = requests.post(
        f"{stack.url}/v1/broadcasts",
        json={"method": "work.do", "capability": "nobody.has.this"},
        timeout=5,
    )
    assert r.status_code == 404 and r.json()["type"].endswith("no-suitable-agent")
