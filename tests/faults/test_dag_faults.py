"""DAG runs and broadcasts across a worker SIGKILL and a Redis restart: every run ends
(success, or failed with a stated reason), every broadcast completes, none hangs.

Real processes (api, worker, beat) on PostgreSQL with a private redis-server as broker and
result backend; the worker is SIGKILLed with node polls and deliveries reserved, then Redis
restarts with nothing on disk (queues and chord counters are gone). Only the beat's DAG
sweep can move a run whose chord died; the outbox's nets recover the broadcast targets.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.faults.test_delivery_faults import FAULT_SETTINGS, PrivateRedis
from tests.support.stacks import AgentProcess, Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("store_url", ["postgres"], indirect=True),
]

RUNS, BROADCASTS = 20, 10
NODE_TIMEOUT_MS = 5000
# a run's bound: 3 levels of 5 s plus the retry budget (3 more) = 30 s, + the margin;
# a run silent for a node timeout + the margin (8 s) is resumed by the sweep
SWEEP_SETTINGS = {"REACH_DAGS__SWEEP_INTERVAL": "1", "REACH_DAGS__SWEEP_MARGIN": "3"}


# private_redis: tests/faults/conftest.py (a redis-server of the test's own, on a free port)


@pytest.fixture
def hub(store_url: str, private_redis: PrivateRedis, tmp_path: Path) -> Iterator[Stack]:
    extra = {
        **FAULT_SETTINGS,
        **SWEEP_SETTINGS,
        "REACH_BROKER_URL": private_redis.url,
        "REACH_RESULT_BACKEND": private_redis.url,
    }
    stack = start_stack(store_url, tmp_path, extra)
    try:
        yield stack
    finally:
        stop_stack(stack)


def diamond(n: int) -> dict[str, Any]:
    def node(node_id: str, deps: list[str]) -> dict[str, Any]:
        return {
            "id": node_id,
            "agent_id": "recorder",
            "method": "work.do",
            "dependencies": deps,
            "payload": {"run": n, "node": node_id},
            "timeout_ms": NODE_TIMEOUT_MS,
        }

    return {
        "name": f"diamond-{n}",
        "nodes": [
            node("split", []),
            node("left", ["split"]),
            node("right", ["split"]),
            node("merge", ["left", "right"]),
        ],
    }


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    for _ in range(50):  # the hub may briefly answer 503 while its broker restarts
        try:
            r = requests.post(url, json=body, timeout=10)
            if r.status_code == 201:
                return dict(r.json())
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise AssertionError(f"could not POST {url}")


def test_dags_and_broadcasts_end_across_a_worker_kill_and_a_redis_restart(
    hub: Stack, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    agents = [
        AgentProcess(hub.url, tmp_path / "recorder.log", delay=0.3, max_concurrency=16),
        AgentProcess(hub.url, tmp_path / "other.log", agent_id="other", delay=0.3),
    ]
    try:
        wait_until(
            lambda: hub.instances("recorder") and hub.instances("other"),
            timeout=30,
            what="agents registered",
        )
        started = time.monotonic()
        runs, broadcasts = [], []
        for n in range(max(RUNS, BROADCASTS)):
            if n < RUNS:
                runs.append(post(f"{hub.url}/api/v1/dag-runs", {"dag": diamond(n)})["run_id"])
            if n < BROADCASTS:
                body = {"capability": "work.do", "method": "work.do", "payload": {"b": n}}
                body |= {"timeout_ms": 20_000, "max_retry": 2}
                broadcasts.append(post(f"{hub.url}/v1/broadcasts", body)["broadcast_id"])
        wait_until(lambda: len(agents[0].executions()) >= 15, timeout=30, what="work under way")
        hub.worker.kill_group()  # node polls and deliveries die reserved by this worker
        time.sleep(0.5)
        hub.start_worker()
        time.sleep(1.0)
        private_redis.stop()  # nothing on disk: every queue and chord counter is lost
        time.sleep(1.0)
        private_redis.start()

        def run(run_id: str) -> dict[str, Any]:
            return dict(requests.get(f"{hub.url}/api/v1/dag-runs/{run_id}", timeout=5).json())

        def aggregate(broadcast_id: str) -> dict[str, Any]:
            r = requests.get(f"{hub.url}/v1/broadcasts/{broadcast_id}", timeout=5)
            return dict(r.json())

        def all_ended() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
            try:
                views = [run(r) for r in runs]
                aggregates = [aggregate(b) for b in broadcasts]
            except (requests.RequestException, ValueError):
                return None
            if any(v["status"] == "running" for v in views):
                return None
            targets = [t for a in aggregates for t in a["results"]]
            if not all(a["complete"] for a in aggregates) or any(
                t["status"] not in ("success", "failed", "dead", "cancelled") for t in targets
            ):
                return None
            return views, aggregates

        views, aggregates = wait_until(
            all_ended, timeout=75, interval=1.0, what="every run and broadcast to end"
        )
        took = time.monotonic() - started
        outcomes = Counter(v["status"] for v in views)
        resumed = {
            run_id
            for log in hub.home.glob("worker*.log")
            for line in log.read_text(errors="replace").splitlines()
            if "DAG sweep:" in line
            for run_id in re.findall(r"dag-[0-9a-f]{16}", line)
        }
        print(
            f"DAG runs: {dict(outcomes)} ({len(resumed)} resumed by the sweep); "
            f"broadcasts complete: {len(aggregates)}; {took:.0f}s"
        )
        # the faults really killed chords (else this test proves nothing), and the sweep
        # was what moved those runs on
        assert resumed & set(runs), "no run needed the sweep"
        assert set(outcomes) <= {"success", "failed"}, outcomes
        for v in views:
            assert v["finished_at"] is not None and v["reason"], v
            # every node has its result: none is left pending or waiting
            assert {n["status"] for n in v["nodes"]} <= {"success", "failed", "skipped", "timeout"}
            if v["status"] == "failed":
                assert any(n["status"] != "success" for n in v["nodes"]), v
        # the sweep resumed the canvases that died: most runs still succeed
        assert outcomes["success"] >= RUNS // 2, outcomes
        for a in aggregates:
            assert len(a["results"]) == 2 and a["succeeded"] >= 1, a
    finally:
        for agent in agents:
            agent.stop()
