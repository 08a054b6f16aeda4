"""`reach flower` where it works (Redis: it sees the hub's worker and its tasks, read from
Flower's own HTTP API) and where it cannot (the embedded broker: it says so and exits)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

import reach
from tests.support.ports import free_port
from tests.support.stacks import AgentProcess, HubProcess, Stack, hub_env
from tests.support.waiting import wait_until


def flower_get(port: int, path: str, **params: str) -> Any:
    try:
        r = requests.get(f"http://127.0.0.1:{port}{path}", params=params, timeout=10)
        return r.json() if r.ok else None
    except (requests.RequestException, ValueError):
        return None


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_flower_shows_the_hubs_worker_and_tasks_on_redis(stack: Stack, tmp_path: Path) -> None:
    assert stack.env["REACH_BROKER_URL"].startswith("redis://")
    port = free_port()
    flower = HubProcess(
        ["flower", "--port", str(port)],
        {**stack.env, "FLOWER_UNAUTHENTICATED_API": "true"},  # its /api/* is closed by default
        tmp_path / "flower.log",
    )
    agent = AgentProcess(stack.url, tmp_path / "agent.log")
    try:

        def hub_worker() -> str | None:
            assert flower.proc.poll() is None, flower.output()
            workers = flower_get(port, "/api/workers", refresh="1") or {}
            return next(
                (name for name, w in workers.items() if "reach.deliver" in w.get("registered", [])),
                None,
            )

        name = wait_until(hub_worker, timeout=40, interval=0.5, what="Flower to list the worker")
        assert name.startswith("celery@")
        # Task events are off in the hub's config; Flower turns them on by remote control.
        wait_until(
            lambda: "enabled by remote" in stack.worker.output(),
            timeout=30,
            interval=0.25,
            what="Flower to enable the worker's task events",
        )
        wait_until(lambda: stack.instance("recorder"), timeout=30, what="the agent online")
        sub = reach.send(agent_id="recorder", method="work.do", payload={"n": 1}, hub=stack.url)
        assert reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url).data["echo"] == {
            "n": 1
        }

        def delivery() -> dict[str, Any] | None:
            tasks = flower_get(port, "/api/tasks", taskname="reach.deliver") or {}
            mine = [t for t in tasks.values() if sub.task_id in str(t.get("args"))]
            # the caller's result lands before the Celery task returns: wait for its end
            return next((t for t in mine if t.get("state") == "SUCCESS"), None)

        seen = wait_until(delivery, timeout=20, interval=0.25, what="Flower to show the delivery")
        assert seen["name"] == "reach.deliver"
        assert seen["worker"] == name
    finally:
        agent.stop()
        flower.stop()


def test_flower_on_the_embedded_broker_explains_instead_of_an_empty_page(tmp_path: Path) -> None:
    env = hub_env(f"sqlite:///{tmp_path}/reach.db", tmp_path)
    port = free_port()
    r = subprocess.run(
        [sys.executable, "-m", "reach", "flower", "--port", str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    said = " ".join(r.stderr.split())
    assert "Flower needs Redis or RabbitMQ" in said
    assert "no task events" in said and "REACH_BROKER_URL=redis://" in said
    with pytest.raises(requests.ConnectionError):  # nothing was started on the port
        requests.get(f"http://127.0.0.1:{port}/healthcheck", timeout=2)
