"""Online before background, through real processes: api, worker and beat on each store
and broker (SQLite + embedded broker, PostgreSQL + Redis, and once RabbitMQ), with real
agent processes that count every delivery over HTTP.

A worker of two processes is flooded with background tasks to a slow agent, then a few online
tasks go to a fast one: the online tasks finish while most of the flood still waits
(ordered by the tasks' ``finished_at``, not by wall-clock thresholds), and every
background task still completes, each delivered and applied once.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

import reach
from reach.core.flow.priority import BACKGROUND_QUEUE
from reach.hub.delivery import outbox
from reach.hub.flow import priority
from reach.hub.settings import ExchangeSettings
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import OutboxRow
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

FLOOD = 16  # background tasks of SLOW_S each
PLACES = 2 * ExchangeSettings().max_in_flight  # a worker of 2 processes: its exchange places
SLOW_S = 0.6
ONLINE = 4
OVERTAKEN = 6  # online must be done before this many background tasks finished


pytestmark = pytest.mark.timeout(300)  # a hub of processes, three agents, a 5 s backlog
AGENTS = {
    "slow": ["--delay", str(SLOW_S)],
    "fast": [],
    "flaky": ["--fail-first", "1"],  # every task fails once: a retry
}


@contextmanager
def agents(
    stack: Stack, home: Path, names: tuple[str, ...] = ("slow", "fast")
) -> Iterator[dict[str, CountingAgentProcess]]:
    specs = {name: AGENTS[name] for name in names}
    started = {
        name: CountingAgentProcess(
            stack.url, home / f"{name}.journal", free_port(), "--agent-id", name, *extra
        )
        for name, extra in specs.items()
    }
    try:
        wait_until(lambda: all(stack.instances(n) for n in started), timeout=30, what="agents")
        yield started
    finally:
        for agent in started.values():
            agent.stop()


def wait_for_slots(stack: Stack, slots: int) -> None:
    """The worker reported its exchange places (background's share is counted from them)."""
    engine = create_engine_for(stack.env["REACH_DATABASE_URL"])
    sessions = session_factory(engine)

    def reported() -> bool:
        with sessions() as s:
            return priority.hub_slots(s, time.time()) == slots

    try:
        wait_until(reported, timeout=30, what="worker slots reported")
    finally:
        engine.dispose()


def queues_of_attempts(stack: Stack, task_id: str) -> list[str]:
    engine = create_engine_for(stack.env["REACH_DATABASE_URL"])
    try:
        with session_factory(engine)() as s:
            rows = s.scalars(
                select(OutboxRow).where(OutboxRow.task_id == task_id).order_by(OutboxRow.id)
            ).all()
            return [outbox.queue_of(r.message) for r in rows]
    finally:
        engine.dispose()


def send(stack: Stack, agent_id: str, prio: str) -> str:
    sent = reach.send(agent_id=agent_id, method="work.do", priority=prio, hub=stack.url)
    return sent.task_id


def done(stack: Stack, task_ids: list[str]) -> list[dict[str, Any]] | None:
    views = [stack.task(t) for t in task_ids]
    return views if all(v["status"] == "success" for v in views) else None


def check_flood(stack: Stack, home: Path) -> None:
    with agents(stack, home) as started:
        slow, fast = started["slow"], started["fast"]
        wait_for_slots(stack, PLACES)
        background = [send(stack, "slow", "background") for _ in range(FLOOD)]
        # the flood is in flight before online work arrives
        wait_until(lambda: len(slow.counts().deliveries) >= 2, timeout=30, what="flood started")
        online = [send(stack, "fast", "online") for _ in range(ONLINE)]

        online_views = wait_until(lambda: done(stack, online), timeout=60, what="online done")
        background_views = wait_until(
            lambda: done(stack, background), timeout=120, what="background drained"
        )

        background_done = sorted(v["finished_at"] for v in background_views)
        last_online = max(v["finished_at"] for v in online_views)
        assert last_online < background_done[OVERTAKEN - 1], (
            f"online finished after {sum(t < last_online for t in background_done)} of "
            f"{FLOOD} background tasks"
        )
        assert {v["priority"] for v in background_views} == {"background"}
        assert {v["priority"] for v in online_views} == {"online"}

        # none lost, none applied twice: counted at the agents
        slow_counts, fast_counts = slow.counts(), fast.counts()
        assert set(slow_counts.side_effects) == set(background)
        assert set(slow_counts.side_effects.values()) == {1}
        assert set(fast_counts.side_effects) == set(online)
        assert set(fast_counts.side_effects.values()) == {1}


def test_online_tasks_overtake_a_background_flood(stack: Stack, tmp_path: Path) -> None:
    check_flood(stack, tmp_path)


def test_a_retry_of_a_background_task_stays_background(stack: Stack, tmp_path: Path) -> None:
    with agents(stack, tmp_path, ("flaky",)) as started:
        retried = send(stack, "flaky", "background")
        view = wait_until(lambda: done(stack, [retried]), timeout=90, what="retried")[0]
        assert (view["retries"], view["priority"]) == (1, "background")
        assert started["flaky"].counts().deliveries[retried] == 2
        assert [e["kind"] for e in stack.events(retried)].count("retry") == 1
        # both attempts went to the background queue (the outbox rows the hub published)
        assert queues_of_attempts(stack, retried) == [BACKGROUND_QUEUE] * 2


@pytest.fixture
def rabbit_vhost() -> Iterator[str]:
    """A RabbitMQ vhost of this test's own on the shared node: no queue is shared with
    another test running at the same time."""
    name = f"reach-prio-{uuid.uuid4().hex[:10]}"

    def ctl(*args: str) -> None:
        subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)

    ctl("add_vhost", name)
    try:
        ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        yield f"amqp://guest:guest@127.0.0.1:5672/{name}"
    finally:
        ctl("delete_vhost", name)


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.postgres
def test_rabbitmq_delivers_online_and_background(
    store_url: str, rabbit_vhost: str, tmp_path: Path
) -> None:
    """RabbitMQ gives no order between queues: both are consumed, and the hub's share
    (not the broker) keeps background from holding every slot while online waits."""
    extra = {
        "REACH_BROKER_URL": rabbit_vhost,
        "REACH_RESULT_BACKEND": f"db+sqlite:///{tmp_path}/results.db",
        "REACH_PROBE__INTERVAL": "0.5",
        "REACH_PROBE__FAST_INTERVAL": "0.5",
        "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    }
    stack = start_stack(store_url, tmp_path, extra)
    try:
        with agents(stack, tmp_path) as started:
            wait_for_slots(stack, PLACES)
            background = [send(stack, "slow", "background") for _ in range(6)]
            online = [send(stack, "fast", "online") for _ in range(3)]
            wait_until(lambda: done(stack, online), timeout=60, what="online done")
            wait_until(lambda: done(stack, background), timeout=60, what="background done")
            assert set(started["slow"].counts().side_effects) == set(background)
            assert set(started["fast"].counts().side_effects) == set(online)
    finally:
        stop_stack(stack)
