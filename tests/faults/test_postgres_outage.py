"""PostgreSQL stopped for ~10 s mid-run: the hub says 503 and waits; nothing is lost.

A hub of real processes (api, worker, beat) on a private PostgreSQL cluster (this test
may stop it; the shared one is never touched) and the shared Redis as broker. A raw HTTP
agent counts every delivery per task_id and applies its side effect once per task_id.
While the database is down every API answer is a quick ``503`` problem with
``Retry-After``; afterwards every accepted task succeeds and each side effect ran once.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
from sqlalchemy import func, select

import reach
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import TaskRow
from tests.support.counting_agent import CountingAgentProcess
from tests.support.ports import free_port
from tests.support.private_postgres import PrivatePostgres
from tests.support.stacks import Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.postgres

SETTINGS = {
    "REACH_ROUTER__CONNECT_TIMEOUT": "0.5",
    "REACH_ROUTER__READ_TIMEOUT": "2",
    "REACH_ROUTER__REPUBLISH_GRACE": "2",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "2",
    "REACH_PROBE__INTERVAL": "1",
    "REACH_PROBE__FAST_INTERVAL": "1",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "1",
}
TASKS = 200
OUTAGE_S = 10.0
PROBLEM_JSON = "application/problem+json"
SWEEP_RAISED = re.compile(
    r"Task reach\.(?:outbox_relay|probe_sweep|reachability_sweep)\[\S+\] raised unexpected"
)


@pytest.fixture
def outage_stack(private_pg_url: str, redis_db: str, tmp_path: Path) -> Iterator[Stack]:
    extra = {**SETTINGS, "REACH_BROKER_URL": redis_db, "REACH_RESULT_BACKEND": redis_db}
    stack = start_stack(private_pg_url, tmp_path, extra)
    try:
        yield stack
    finally:
        stop_stack(stack)


def statuses(store_url: str, ids: set[str]) -> Counter[str]:
    engine = create_engine_for(store_url)
    try:
        with session_factory(engine)() as s:
            rows = s.execute(
                select(TaskRow.status, func.count())
                .where(TaskRow.task_id.in_(ids))
                .group_by(TaskRow.status)
            ).all()
            return Counter({status: count for status, count in rows})
    finally:
        engine.dispose()


@dataclass
class Submitter:
    """Callers submitting with explicit task_ids, resubmitting on ``HubUnavailable``."""

    stack: Stack
    unavailable: int = 0
    accepted: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def one(self, task_id: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                reach.send(
                    agent_id="counter",
                    method="work.do",
                    payload={"id": task_id},
                    task_id=task_id,
                    hub=self.stack.url,
                )
                with self.lock:
                    self.accepted.add(task_id)
                return
            except reach.HubUnavailable:
                with self.lock:
                    self.unavailable += 1
                time.sleep(0.25)
        raise AssertionError(f"could not submit {task_id}")

    def run(self, ids: list[str], pause: float) -> None:
        with ThreadPoolExecutor(4) as pool:
            futures = []
            for task_id in ids:
                futures.append(pool.submit(self.one, task_id))
                time.sleep(pause)
            for f in futures:
                f.result()


@dataclass(frozen=True)
class Answer:
    what: str
    status: int | None  # None: no answer in time (a hang)
    content_type: str
    retry_after: str | None
    elapsed: float


def probe_api(base: str, known_task: str, n: int) -> list[Answer]:
    """One round of submits and reads, as raw HTTP, timed."""
    calls = [
        ("submit", "POST", "/v1/tasks", {"agent_id": "counter", "method": "work.do",
                                         "payload": {}, "task_id": f"outage-probe-{n}"}),
        ("read", "GET", f"/v1/tasks/{known_task}", None),
        ("long-poll", "GET", f"/v1/tasks/{known_task}?wait=2", None),
        ("events", "GET", f"/v1/tasks/{known_task}/events", None),
        ("agents", "GET", "/api/v1/agents", None),
    ]  # fmt: skip
    answers = []
    for what, verb, path, body in calls:
        started = time.monotonic()
        try:
            r = requests.request(verb, base + path, json=body, timeout=8)
            answers.append(
                Answer(
                    what,
                    r.status_code,
                    r.headers.get("content-type", ""),
                    r.headers.get("retry-after"),
                    time.monotonic() - started,
                )
            )
        except requests.RequestException:
            answers.append(Answer(what, None, "", None, time.monotonic() - started))
    return answers


def last_probe_at(stack: Stack) -> datetime | None:
    instance = stack.instance("counter")
    stamp = instance and instance.get("last_probe_at")
    return datetime.fromisoformat(stamp) if stamp else None


def test_postgres_outage_answers_503_and_loses_nothing(
    outage_stack: Stack, private_pg: PrivatePostgres, private_pg_url: str, tmp_path: Path
) -> None:
    stack = outage_stack
    agent = CountingAgentProcess(stack.url, tmp_path / "journal.log", free_port(), "--delay", "0.1")
    try:
        wait_until(lambda: stack.instance("counter"), timeout=30, what="agent registered")
        ids = [f"pg-{n:03d}" for n in range(TASKS)]
        submitter = Submitter(stack)
        feeding = threading.Thread(target=submitter.run, args=(ids, 0.04), daemon=True)
        feeding.start()
        wait_until(lambda: len(agent.counts().deliveries) >= 60, timeout=60, what="work under way")

        with submitter.lock:
            accepted_at_stop = set(submitter.accepted)
        private_pg.stop()  # fast shutdown: every session is cut off mid-transaction
        backlog = len(accepted_at_stop - set(agent.counts().deliveries))
        down_at = time.monotonic()
        answers: list[Answer] = []
        n = 0
        while time.monotonic() - down_at < OUTAGE_S:
            answers += probe_api(stack.url, ids[0], n)
            n += 1
            time.sleep(0.2)
        private_pg.start()
        up_at = time.monotonic()
        up_wall = datetime.now(UTC)

        feeding.join(90)
        assert not feeding.is_alive(), "submitters still stuck after the database returned"
        expected = set(ids)
        final = wait_until(
            lambda: (
                (c := statuses(private_pg_url, expected)) and c["success"] == len(expected) and c
            ),
            timeout=60,
            interval=0.5,
            what="every accepted task to succeed",
        )
        recovered_s = time.monotonic() - up_at

        # while it was down: quick 503 problems with Retry-After, never a 500 or a hang
        assert len(answers) >= 25, answers
        wrong = [a for a in answers if a.status != 503 or not a.content_type.startswith(
            PROBLEM_JSON) or not (a.retry_after or "").isdigit() or a.elapsed > 3.0]  # fmt: skip
        assert not wrong, Counter((a.what, a.status, a.retry_after, a.elapsed > 3) for a in wrong)
        # the worker and beat survived, and work after it: tasks finished (worker) and the
        # probe sweep (beat -> worker -> database) stamped the agent again
        for proc in stack.procs:
            assert proc.proc.poll() is None, proc.output()[-3000:]
        # a sweep that could not reach the store skipped its tick (one line), not raised
        worker_log = stack.worker.output()
        assert "skipped this tick" in worker_log
        assert not SWEEP_RAISED.findall(worker_log), SWEEP_RAISED.findall(worker_log)[:3]
        stamp = wait_until(
            lambda: (t := last_probe_at(stack)) and t > up_wall and t,
            timeout=15,
            what="a probe recorded after the database returned",
        )
        assert stamp > up_wall
        assert final == Counter({"success": len(expected)})

        counts = agent.counts()
        assert set(counts.deliveries) == expected
        twice = {t: n for t, n in counts.side_effects.items() if n != 1}
        assert not twice, f"side effects not exactly once: {twice}"
        assert set(counts.side_effects) == expected
        redelivered = {t: n for t, n in counts.deliveries.items() if n > 1}
        print(
            f"\nFAULT postgres-outage: {len(expected)} tasks, {OUTAGE_S:.0f} s down with "
            f"{len(accepted_at_stop)} accepted ({backlog} not yet delivered), "
            f"deliveries per task {dict(sorted(counts.redeliveries().items()))} "
            f"(redelivered: {redelivered}), side effects once each, "
            f"503s: {len(answers)} probe answers (max {max(a.elapsed for a in answers):.2f} s) "
            f"+ {submitter.unavailable} caller resubmits, "
            f"all succeeded {recovered_s:.1f} s after the database returned"
        )
    finally:
        agent.stop()
