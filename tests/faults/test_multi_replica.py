"""Multi-replica hub: two APIs, two worker nodes, two beats; one API and one worker SIGKILLed.

PostgreSQL (a fresh database) and Redis (this pytest worker's database number) are shared by
every replica, as in a scaled-out deployment. Workers run as separate Celery nodes
(``reach worker --hostname``); the two beats share the beat lock, so exactly one sends.
Caller threads submit 1,000 tasks with explicit task_ids spread over both APIs and resubmit
to the other API whenever one does not answer. Mid-run the first API and the first worker
are SIGKILLed by process group (the worker's prefork children die with deliveries in
flight). Every accepted task must end ``success`` with one task row and one terminal event,
the raw counting agent must see every task and apply each side effect once; deliveries per
task (redeliveries allowed, counted) and the time to drain are printed for the README.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sqlalchemy import func, select

import reach
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import TaskEventRow, TaskRow
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("store_url", ["postgres"], indirect=True),
    pytest.mark.timeout(180),  # ~45 s alone; the drain is one worker's throughput on 2 cores
]

SETTINGS = {
    "REACH_ROUTER__CONNECT_TIMEOUT": "0.5",
    "REACH_ROUTER__READ_TIMEOUT": "2",
    "REACH_ROUTER__REPUBLISH_GRACE": "2",  # the outbox net re-sends what a dead worker held
    "REACH_PROBE__INTERVAL": "1",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "1",
    "REACH_BEAT__LOCK_LEASE_S": "3",
    "REACH_BEAT__LOCK_RENEW_S": "1",
    "REACH_BEAT__LOCK_POLL_S": "0.5",
}
TASKS = 1000
CALLERS = 10
KILL_AT = 400  # accepted submits before the API and the worker are killed
NODES = ("reach-a@replica-a", "reach-b@replica-b")
RECEIVED = re.compile(r"Task reach\.deliver\[([0-9a-f-]+)\] received")
FINISHED = re.compile(r"Task reach\.deliver\[([0-9a-f-]+)\] (?:succeeded|retry|raised)")
ACTIVE = re.compile(r"beat active: (\S+) holds the lock")
STANDBY = "beat standby: lock held by"


@dataclass
class Replicas:
    apis: list[HubProcess]
    urls: list[str]
    workers: list[HubProcess]
    beats: list[HubProcess]

    def all(self) -> list[HubProcess]:
        return [*self.apis, *self.workers, *self.beats]


@pytest.fixture
def replicas(store_url: str, redis_db: str, tmp_path: Path) -> Iterator[Replicas]:
    env = hub_env(
        store_url,
        tmp_path,
        **SETTINGS,
        REACH_BROKER_URL=redis_db,
        REACH_RESULT_BACKEND=redis_db,
    )
    ports = [free_port(), free_port()]
    hub = Replicas(
        apis=[
            HubProcess(["api", "--port", str(p)], env, tmp_path / f"api-{i}.log")
            for i, p in enumerate(ports)
        ],
        urls=[f"http://127.0.0.1:{p}" for p in ports],
        workers=[
            HubProcess(
                ["worker", "--concurrency", "4", "--hostname", node],
                env,
                tmp_path / f"worker-{i}.log",
            )
            for i, node in enumerate(NODES)
        ],
        beats=[HubProcess(["beat"], env, tmp_path / f"beat-{i}.log") for i in range(2)],
    )
    try:
        for url, api in zip(hub.urls, hub.apis, strict=True):
            wait_http_ok(url + "/healthz", api)
        yield hub
    finally:
        for proc in hub.all():
            proc.stop()


@dataclass
class Callers:
    """Threads that submit with explicit task_ids, preferring one API per task and falling
    over to the other whenever the preferred one does not answer."""

    urls: list[str]
    accepted: dict[str, float] = field(default_factory=dict)  # task_id -> when accepted
    failovers: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def submit(self, n: int, task_id: str) -> None:
        deadline = time.monotonic() + 60
        attempt = 0
        while time.monotonic() < deadline:
            url = self.urls[(n + attempt) % len(self.urls)]
            try:
                reach.send(
                    agent_id="counter",
                    method="work.do",
                    payload={"n": n},
                    task_id=task_id,
                    hub=url,
                )
            except reach.HubUnavailable:
                with self.lock:
                    self.failovers[task_id] += 1
                attempt += 1
                continue
            except reach.ReachError as exc:  # a conflict on resubmit would land here
                with self.lock:
                    self.errors.append(f"{task_id}: {exc!r}")
                return
            with self.lock:
                self.accepted[task_id] = time.monotonic()
            return
        with self.lock:
            self.errors.append(f"{task_id}: not accepted in 60 s")

    def run(self, numbered: list[tuple[int, str]]) -> None:
        for n, task_id in numbered:
            self.submit(n, task_id)


def task_rows(store_url: str, prefix: str) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """(rows per task_id, statuses, terminal events per task_id) of this run's tasks."""
    engine = create_engine_for(store_url)
    try:
        with session_factory(engine)() as s:
            mine = TaskRow.task_id.startswith(prefix)
            per_id = s.execute(
                select(TaskRow.task_id, func.count()).where(mine).group_by(TaskRow.task_id)
            ).all()
            status = s.execute(
                select(TaskRow.status, func.count()).where(mine).group_by(TaskRow.status)
            ).all()
            ends = s.execute(
                select(TaskEventRow.task_id, func.count())
                .where(
                    TaskEventRow.task_id.startswith(prefix),
                    TaskEventRow.kind.in_(["terminal_success", "terminal_failure", "dead_letter"]),
                )
                .group_by(TaskEventRow.task_id)
            ).all()
    finally:
        engine.dispose()
    return Counter(dict(per_id)), Counter(dict(status)), Counter(dict(ends))


def test_two_of_each_one_api_and_one_worker_killed_nothing_lost(
    replicas: Replicas, store_url: str, tmp_path: Path
) -> None:
    hub = replicas
    # the agent heartbeats to the API that stays up (behind a load balancer it would be any)
    agent = CountingAgentProcess(
        hub.urls[1], tmp_path / "journal.log", free_port(),
        "--delay", "0.02", "--max-concurrency", "64",
    )  # fmt: skip
    try:
        wait_until(lambda: _registered(hub.urls[1]), timeout=30, what="agent registered")
        for node, worker in zip(NODES, hub.workers, strict=True):
            wait_until(
                lambda w=worker, n=node: f"{n} ready" in w.output(),
                timeout=40,
                what=f"worker {node} ready",
            )

        ids = [f"mr-{n:04d}" for n in range(TASKS)]
        callers = Callers(hub.urls)
        chunks = [[(n, ids[n]) for n in range(c, TASKS, CALLERS)] for c in range(CALLERS)]
        threads = [threading.Thread(target=callers.run, args=(c,), daemon=True) for c in chunks]
        started = time.monotonic()
        for t in threads:
            t.start()

        wait_until(lambda: len(callers.accepted) >= KILL_AT, timeout=60, what="submits flowing")
        wait_until(
            lambda: "reach.deliver[" in hub.workers[0].output(),
            timeout=30,
            what="the first worker delivering",
        )
        accepted_at_kill = len(callers.accepted)
        hub.apis[0].kill_group()
        hub.workers[0].kill_group()
        killed = time.monotonic()
        held = held_by(hub.workers[0])
        assert held, "the killed worker held deliveries (received, not finished)"

        for t in threads:
            t.join(70)
        assert not any(t.is_alive() for t in threads)
        assert not callers.errors, callers.errors[:5]
        assert set(callers.accepted) == set(ids)
        last_accepted = max(callers.accepted.values())

        wait_until(
            lambda: task_rows(store_url, "mr-")[1] == Counter(success=TASKS),
            timeout=60,
            interval=0.5,
            what="every task to succeed",
        )
        drained = time.monotonic()
        per_id, status, ends = task_rows(store_url, "mr-")
        assert per_id == Counter(dict.fromkeys(ids, 1)), "one task row per task_id"
        assert status == Counter(success=TASKS)
        assert ends == Counter(dict.fromkeys(ids, 1)), "one terminal event per task"

        counts = agent.counts()
        assert set(counts.deliveries) == set(ids)
        assert counts.side_effects == Counter(dict.fromkeys(ids, 1))

        # the beat lock kept exactly one of the two beats sending
        active = [b for b in hub.beats if ACTIVE.search(b.output())]
        standby = [b for b in hub.beats if STANDBY in b.output()]
        assert len(active) == 1 and len(standby) == 1, [b.output()[-2000:] for b in hub.beats]
        assert "Sending due task" not in standby[0].output()
        # the surviving worker did the work the killed one left
        assert "reach.deliver[" in hub.workers[1].output()

        redelivered = sum(1 for v in counts.deliveries.values() if v > 1)
        print(
            f"\nFAULT multi-replica: {TASKS} tasks from {CALLERS} callers over 2 APIs, "
            f"2 worker nodes (-c 4), 2 beats (1 active); API and worker SIGKILLed after "
            f"{accepted_at_kill} accepted, with {len(held)} deliveries held by the "
            f"killed worker; {sum(callers.failovers.values())} failed submits "
            f"over {len(callers.failovers)} tasks resubmitted to the other API; "
            f"0 lost, one row and one terminal event each; deliveries per task "
            f"{dict(sorted(counts.redeliveries().items()))} ({redelivered} redelivered), "
            f"side effects once each; all accepted in {last_accepted - started:.1f} s, "
            f"drained {drained - killed:.1f} s after the kill "
            f"({drained - last_accepted:.1f} s after the last submit)"
        )
    finally:
        agent.stop()


def held_by(worker: HubProcess) -> set[str]:
    """Deliveries the worker had received and not finished (from its own log)."""
    log = worker.output()
    return set(RECEIVED.findall(log)) - set(FINISHED.findall(log))


def _registered(url: str) -> bool:
    import requests

    r = requests.get(f"{url}/api/v1/agents/counter", timeout=5)
    return r.ok and any(i["status"] != "deregistered" for i in r.json().get("instances", []))
