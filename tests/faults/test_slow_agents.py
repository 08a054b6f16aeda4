"""Faults while agents think: hundreds of slow exchanges in flight when a worker dies or
restarts, and an agent that takes the connection and never answers.

Real PostgreSQL and Redis of the test's own, real hub processes, real agent processes
that count every delivery over HTTP (below any dedup guard) and every handler run:

* a plain HTTP service with no SDK (``tests.support.counting_agent``: a side-effect
  guard of its own, in a journal);
* an SDK agent (``tests.support.slow_agent``), whose dedup guard must answer a
  redelivered task it already ran (or still runs) without running it again.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest

import reach
from tests.faults.test_delivery_faults import recovery_events, statuses
from tests.support import processes
from tests.support.counting_agent import CountingAgentProcess, read_journal
from tests.support.listeners import SlowHttpListener
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.private_redis import PrivateRedis
from tests.support.slow_agent import read_counts
from tests.support.stacks import Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("store_url", ["postgres"], indirect=True),
    pytest.mark.timeout(420),
]

SETTINGS = {
    "REACH_ROUTER__CONNECT_TIMEOUT": "1",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "2",
    "REACH_ROUTER__REPUBLISH_GRACE": "3",
    "REACH_PROBE__INTERVAL": "1",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "1",
    # a dead worker's exchanges are delivered again ~lease + margin (10 s) after
    "REACH_EXCHANGES__LEASE_S": "5",
    "REACH_EXCHANGES__DRAIN_S": "2",
}
THINK_S = 4.0  # each handler's time: longer than the drain, shorter than the task timeout
TIMEOUT_MS = 60_000


@pytest.fixture
def pg_stack(store_url: str, private_redis: PrivateRedis, tmp_path: Path) -> Iterator[Stack]:
    url = private_redis.url
    stack = start_stack(
        store_url, tmp_path, {**SETTINGS, "REACH_BROKER_URL": url, "REACH_RESULT_BACKEND": url}
    )
    try:
        yield stack
    finally:
        stop_stack(stack)


class Agent:
    """One of the two kinds of agent above, as a process, with what it counted."""

    def __init__(self, kind: str, stack: Stack, home: Path) -> None:
        self.kind = kind
        self.journal = home / f"{kind}-journal"
        port = free_port()
        if kind == "plain":
            self.proc: subprocess.Popen[bytes] | CountingAgentProcess = CountingAgentProcess(
                stack.url, self.journal, port, "--agent-id", "slow", "--method", "think",
                "--delay", str(THINK_S), "--max-concurrency", "700",
            )  # fmt: skip
        else:
            handler = "async" if kind == "sdk-async" else "sync"
            with (home / f"{kind}.out").open("wb") as log:
                self.proc = subprocess.Popen(
                    [
                        sys.executable, "-m", "tests.support.slow_agent", "--port", str(port),
                        "--hub", stack.url, "--journal", str(self.journal), "--agent-id",
                        "slow", "--delay", str(THINK_S), "--handler", handler,
                        "--max-concurrency", "700",
                    ],
                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
        wait_until(lambda: stack.instance("slow"), timeout=60, what=f"{kind} agent registered")

    def deliveries(self) -> Counter[str]:
        """Deliveries per task, counted at the agent over HTTP."""
        if isinstance(self.proc, CountingAgentProcess):
            return read_journal(self.journal).deliveries
        return read_counts(self.journal, "deliveries.log")

    def runs(self) -> Counter[str]:
        """Side effects per task (handler runs behind the agent's guard)."""
        if isinstance(self.proc, CountingAgentProcess):
            return read_journal(self.journal).side_effects
        return read_counts(self.journal, "runs.log")

    def stop(self) -> None:
        if isinstance(self.proc, CountingAgentProcess):
            self.proc.stop()
        else:
            processes.stop(self.proc)


@contextmanager
def slow_agent(kind: str, stack: Stack, home: Path) -> Iterator[Agent]:
    agent = Agent(kind, stack, home)
    try:
        yield agent
    finally:
        agent.stop()


def submit(stack: Stack, ids: list[str]) -> None:
    def one(task_id: str) -> None:
        reach.send(
            agent_id="slow", method="think", payload={"id": task_id}, task_id=task_id,
            timeout_ms=TIMEOUT_MS, hub=stack.url,
        )  # fmt: skip

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, ids))


def all_succeeded(store_url: str, ids: list[str]) -> None:
    final = wait_until(
        lambda: (c := statuses(store_url)) and c["success"] == len(ids) and c,
        timeout=240,
        interval=1.0,
        what="every task to succeed",
    )
    assert final == Counter({"success": len(ids)})


def check_counted(agent: Agent, ids: list[str]) -> Counter[int]:
    """Every task reached the agent, and its side effect ran once; the deliveries per
    task (how many were redelivered) come back for the test to judge."""
    deliveries = agent.deliveries()
    assert set(deliveries) == set(ids)
    runs = agent.runs()
    assert set(runs) == set(ids)
    twice = {t: n for t, n in runs.items() if n > 1}
    assert not twice, f"{agent.kind}: handlers ran again behind the hub's back: {twice}"
    return Counter(deliveries.values())


KINDS = ["plain", "sdk-sync", "sdk-async"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_killed_with_500_slow_exchanges_in_flight_loses_none(
    pg_stack: Stack, store_url: str, tmp_path: Path, kind: str
) -> None:
    """SIGKILL the worker (its pool children too) while 500 exchanges wait on agents that
    think: the attempts' leases lapse, the relay delivers them again, every task ends
    ``success`` and no handler runs twice (the agents' guards answer redeliveries)."""
    stack = pg_stack
    ids = [f"k-{kind}-{n:03d}" for n in range(500)]
    with slow_agent(kind, stack, tmp_path) as agent:
        submitter = threading.Thread(target=submit, args=(stack, ids))
        submitter.start()
        # the kill lands once 300 exchanges are at the agent at the same time
        wait_until(lambda: len(agent.deliveries()) >= 300, timeout=120, what="300 in flight")
        stack.worker.kill_group()
        submitter.join(120)
        stack.start_worker()
        killed_at = time.monotonic()
        all_succeeded(store_url, ids)
        print(f"{kind}: all succeeded {time.monotonic() - killed_at:.1f}s after the restart")
        redelivered = check_counted(agent, ids)
        print(f"{kind}: deliveries per task {sorted(redelivered.items())}")
        assert redelivered[2] + sum(n for k, n in redelivered.items() if k > 2) > 0, redelivered
        assert recovery_events(store_url)["worker_lost"] >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_workers_restarted_while_200_slow_handlers_run_lose_none(
    pg_stack: Stack, store_url: str, tmp_path: Path, kind: str
) -> None:
    """SIGTERM the worker while 200 handlers think, then start it again: it drains for
    ``exchanges.drain_s`` (shorter than the handlers), gives the rest back, and the new
    worker delivers them again; nothing is lost and no handler runs twice."""
    stack = pg_stack
    ids = [f"t-{kind}-{n:03d}" for n in range(200)]
    with slow_agent(kind, stack, tmp_path) as agent:
        submit(stack, ids)
        wait_until(lambda: len(agent.deliveries()) == 200, timeout=60, what="200 in flight")
        worker = stack.worker
        worker.terminate()
        stopped = worker.stop(60)
        log = worker.log_path.read_text(errors="replace")
        assert stopped == 0, log[-2000:]
        assert "gave back" in log  # the handlers outlived the drain
        stack.start_worker()
        all_succeeded(store_url, ids)
        check_counted(agent, ids)


def test_an_agent_that_never_answers_is_retried_then_dead_lettered_on_schedule(
    pg_stack: Stack, store_url: str, tmp_path: Path
) -> None:
    """An agent that accepts the connection and then says nothing: each attempt ends at
    the task's timeout, is retried on the backoff schedule and then dead-lettered, while
    other work through the same worker (one slot) finishes at its own pace."""
    stack = pg_stack
    hole = SlowHttpListener(delay=3600)  # accepts, reads, answers in an hour
    mute = reach.Agent(
        "mute", addr=f"127.0.0.1:{hole.port}", allow_loopback=True,
        capabilities=[{"type": "think"}], heartbeat_interval=0.5, hub=stack.url,
    )  # fmt: skip
    mute.register()
    mute.start_heartbeat()
    try:
        with slow_agent("plain", stack, tmp_path) as other:
            held = [
                reach.send(agent_id="mute", method="think", timeout_ms=3000, hub=stack.url).task_id
                for _ in range(20)
            ]
            wait_until(lambda: hole.gauge.total >= 20, timeout=30, what="the mute agent reached")
            started = time.monotonic()
            quick = [f"q-{n}" for n in range(40)]
            submit(stack, quick)
            all_of = wait_until(
                lambda: all(stack.task(t)["status"] == "success" for t in quick) or None,
                timeout=60,
                what="the other agent's tasks",
            )
            assert all_of
            # held up by nothing: 40 tasks of THINK_S each, in one go, not one by one
            assert time.monotonic() - started < THINK_S + 10
            assert set(other.runs()) == set(quick)
            # the mute agent's tasks: each attempt timed out, retried, then dead
            for task_id in held:
                wait_until(
                    lambda t=task_id: stack.task(t)["status"] == "dead",  # type: ignore[misc]
                    timeout=120,
                    what=f"{task_id} dead-lettered",
                )
            events = stack.events(held[0])
            retries = [e for e in events if e["kind"] == "retry"]
            # five retries spent (router.max_retry): after a timeout, or once the timeouts
            # took the mute instance out of the pool, for want of a route; waits for the
            # breaker they opened, for the retry budget (on a loaded box) or deferrals spend
            # none: they carry no failure of their own
            spent = [
                e
                for e in retries
                if "error" in e["detail"]
                and "deferrals" not in e["detail"]
                and not e["detail"].get("budget_wait")
                and e["detail"]["reason"] != "breaker_open"
            ]
            assert [e["detail"]["retry"] for e in spent] == [1, 2, 3, 4, 5], [
                e["detail"] for e in retries
            ]
            assert {e["detail"]["reason"] for e in spent} <= {"transient", "no_route"}
            assert spent[0]["detail"]["error"]["kind"] == "timeout"
            assert events[-1]["kind"] == "dead_letter"
            for i, event in enumerate(events):
                if event["kind"] != "dispatched":
                    continue
                ended = next(
                    e for e in events[i + 1 :] if e["kind"] in ("retry", "terminal_failure")
                )
                # each attempt ended when its timeout (+ connect) ran out, not later
                assert 3.0 - 0.1 <= ended["at"] - event["at"] <= 3.0 + 1.0 + 2.0
            assert recovery_events(store_url)["worker_lost"] == 0
    finally:
        mute.close()
        hole.close()
