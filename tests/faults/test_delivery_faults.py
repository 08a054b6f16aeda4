"""Fault tests: every accepted task reaches a terminal state, and no side effect runs twice.

Real PostgreSQL, real Redis, real worker processes killed with SIGKILL, a real Redis
restart, a real agent process recording each handler execution.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

import reach
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import TaskRow
from tests.support.private_redis import PrivateRedis
from tests.support.stacks import AgentProcess, Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("store_url", ["postgres"], indirect=True),
]

FAULT_SETTINGS = {
    "REACH_ROUTER__CONNECT_TIMEOUT": "0.5",
    "REACH_ROUTER__READ_TIMEOUT": "2",
    "REACH_ROUTER__REPUBLISH_GRACE": "2",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "2",
    "REACH_PROBE__INTERVAL": "1",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "1",
}


# a slow run the kill lands in: well inside the read timeout above, so only the kill ends it
SLOW_RUN = 1.5


@pytest.fixture
def pg_stack(
    store_url: str, private_redis: PrivateRedis, tmp_path: Path
) -> Iterator[tuple[Stack, str]]:
    redis_url = private_redis.url
    extra = {**FAULT_SETTINGS, "REACH_BROKER_URL": redis_url, "REACH_RESULT_BACKEND": redis_url}
    stack = start_stack(store_url, tmp_path, extra)
    try:
        yield stack, store_url
    finally:
        stop_stack(stack)


def statuses(store_url: str) -> Counter[str]:
    engine = create_engine_for(store_url)
    try:
        with session_factory(engine)() as s:
            rows = s.execute(select(TaskRow.status, func.count()).group_by(TaskRow.status)).all()
            return Counter({status: count for status, count in rows})
    finally:
        engine.dispose()


def submit_all(
    stack: Stack, ids: list[str], pause: float = 0.0, slow: frozenset[str] = frozenset()
) -> list[str]:
    """Send every id; those in ``slow`` ask the agent to hold its answer 1.5 s."""

    def one(task_id: str) -> str:
        payload: dict[str, object] = {"id": task_id}
        if task_id in slow:
            payload["sleep"] = SLOW_RUN
        for _ in range(50):  # the hub itself may be briefly unreachable during a fault
            try:
                reach.send(
                    agent_id="recorder",
                    method="work.do",
                    payload=payload,
                    task_id=task_id,
                    hub=stack.url,
                )
                return task_id
            except reach.HubUnavailable:
                time.sleep(0.2)
        raise AssertionError(f"could not submit {task_id}")

    with ThreadPoolExecutor(4) as pool:
        futures = []
        for task_id in ids:
            futures.append(pool.submit(one, task_id))
            if pause:
                time.sleep(pause)
        return [f.result() for f in futures]


def recovery_events(store_url: str, task_id: str | None = None) -> Counter[str]:
    """How the safety nets stepped in (for one task, or all): retries by reason,
    republished attempts."""
    from reach.hub.storage.models import TaskEventRow

    engine = create_engine_for(store_url)
    query = select(TaskEventRow).where(TaskEventRow.kind.in_(["retry", "republished"]))
    if task_id is not None:
        query = query.where(TaskEventRow.task_id == task_id)
    try:
        with session_factory(engine)() as s:
            rows = s.scalars(query).all()
            return Counter(r.detail.get("reason", r.kind) for r in rows)
    finally:
        engine.dispose()


def task_events(store_url: str, task_id: str) -> list[tuple[str, dict[str, Any]]]:
    """One task's events, oldest first: (kind, detail)."""
    from reach.hub.storage.models import TaskEventRow

    engine = create_engine_for(store_url)
    try:
        with session_factory(engine)() as s:
            query = select(TaskEventRow).where(TaskEventRow.task_id == task_id)
            rows = s.scalars(query.order_by(TaskEventRow.id)).all()
            return [(r.kind, dict(r.detail)) for r in rows]
    finally:
        engine.dispose()


def queued_messages(redis_server: PrivateRedis) -> int:
    """Messages waiting in the broker's queues (Redis lists) right now."""
    client = redis_server.client()
    try:
        return sum(int(client.llen(k)) for k in client.scan_iter() if client.type(k) == b"list")
    finally:
        client.close()


def assert_exactly_once(store_url: str, agent: AgentProcess, ids: list[str]) -> None:
    final = wait_until(
        lambda: (
            (c := statuses(store_url))
            and sum(c.values()) == len(ids)
            and c["success"] == len(ids)
            and c
        ),
        timeout=180,
        interval=1.0,
        what="every task to succeed",
    )
    assert final == Counter({"success": len(ids)})
    runs = Counter(agent.executions())
    twice = {task_id: n for task_id, n in runs.items() if n > 1}
    assert not twice, f"handler side effects repeated: {twice}"
    assert set(runs) == set(ids)


def test_worker_killed_mid_flight_loses_nothing(
    pg_stack: tuple[Stack, str], tmp_path: Path
) -> None:
    stack, store_url = pg_stack
    agent = AgentProcess(stack.url, tmp_path / "side-effects.log", delay=0.02, max_concurrency=16)
    try:
        wait_until(lambda: stack.instance("recorder"), timeout=30, what="agent registered")
        ids = [f"kill-{n:03d}" for n in range(500)]
        # kill-080 holds its answer: the kill lands while the worker is surely delivering
        # it (a kill timed by a count alone once hit a worker with nothing in its hands)
        held = "kill-080"
        submitter = threading.Thread(
            target=submit_all, args=(stack, ids), kwargs={"slow": frozenset({held})}
        )
        submitter.start()
        wait_until(lambda: held in agent.executions(), timeout=60, what="the slow run begun")
        stack.worker.kill_group()  # SIGKILL the worker and its pool children mid-flight
        time.sleep(1.0)
        stack.start_worker()
        submitter.join(120)
        assert_exactly_once(store_url, agent, ids)
        # the kill left the held delivery unfinished: either the expired dispatch lease
        # recovered it, or the agent, finding the worker's connection gone, reported its
        # answer late and the hub took it as the attempt's result
        kinds = task_events(store_url, held)
        late = any(k == "terminal_success" and d.get("late_report") for k, d in kinds)
        assert recovery_events(store_url, held)["worker_lost"] >= 1 or late, kinds
    finally:
        agent.stop()


def test_redis_restart_during_a_run_loses_nothing(
    pg_stack: tuple[Stack, str], private_redis: PrivateRedis, tmp_path: Path
) -> None:
    stack, store_url = pg_stack
    agent = AgentProcess(stack.url, tmp_path / "side-effects.log", delay=0.01)
    try:
        wait_until(lambda: stack.instance("recorder"), timeout=30, what="agent registered")
        ids = [f"redis-{n:03d}" for n in range(200)]
        submitter = threading.Thread(target=submit_all, args=(stack, ids, 0.02))
        submitter.start()
        wait_until(lambda: len(agent.executions()) >= 30, timeout=60, what="work under way")
        # Redis keeps nothing on disk here: every queued message is lost in the restart.
        queued = queued_messages(private_redis)
        private_redis.stop()
        time.sleep(2.0)
        private_redis.start()
        submitter.join(120)
        assert_exactly_once(store_url, agent, ids)
        # the worker rode the restart out: the same process, reconnected (a channel of the
        # lost connection once killed it with "Unrecoverable error": reach.worker.redis_broker)
        assert stack.worker.proc.poll() is None, stack.worker.output()[-3000:]
        assert "Unrecoverable error" not in stack.worker.output()
        # messages queued at the stop died with Redis; the recovery scan republished them
        # (with a thousand exchanges per worker, the queue may also have been empty then)
        if queued:
            assert recovery_events(store_url)["republished"] >= 1, queued
    finally:
        agent.stop()
