"""200 DAG runs waiting on slow (202-then-report) agents, on the production stack
(PostgreSQL + Redis), with a worker of concurrency 2: node tasks must not hold slots."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests

from tests.support.stacks import AgentProcess, Stack
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.parametrize("shared_store_url", ["postgres"], indirect=True),
]


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    return shared_stack


def test_two_hundred_runs_on_slow_agents_do_not_hold_worker_slots(
    stack: Stack, tmp_path: Path
) -> None:
    agent = AgentProcess(
        stack.url,
        tmp_path / "slow.log",
        agent_id="slowpoke",
        mode="accept-report",
        max_concurrency=256,
        extra=("--report-after", "5"),
    )
    try:
        wait_until(lambda: stack.instances("slowpoke"), timeout=30, what="agent")
        spec = {
            "name": "slow",
            "nodes": [
                {"id": "wait", "agent_id": "slowpoke", "method": "work.do", "timeout_ms": 120000}
            ],
        }
        started = time.monotonic()
        run_ids = []
        for _ in range(200):
            r = requests.post(
                f"{stack.url}/api/v1/dag-runs", json={"dag": spec, "input": {}}, timeout=10
            )
            assert r.status_code == 201, r.text
            run_ids.append(r.json()["run_id"])

        def finished() -> bool:
            return all(
                requests.get(f"{stack.url}/api/v1/dag-runs/{rid}", timeout=5).json()["status"]
                == "success"
                for rid in run_ids
            )

        wait_until(finished, timeout=120, interval=2.0, what="200 runs")
        elapsed = time.monotonic() - started
        # The worker has 2 slots; holding one per waiting node would take 200 x 5 s / 2.
        assert elapsed < 90, f"{elapsed:.0f}s"
    finally:
        agent.stop()
