"""send → agent → result through real processes: hub api, worker, beat, agents."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import requests

import reach
from reach.core.delivery.retry import RetryPolicy, delay_bounds
from tests.support.stacks import AgentProcess, Stack, hub_env
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "5",
    "REACH_ROUTER__CONNECT_TIMEOUT": "0.5",
    "REACH_ROUTER__READ_TIMEOUT": "3",
    "REACH_ROUTER__WATCHDOG_GRACE": "1",
}


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """Every test here shares one hub per store (fast retries, a 1 s watchdog grace)."""
    return shared_stack


def online(stack: Stack, agent_id: str, count: int = 1) -> None:
    wait_until(
        lambda: len([i for i in stack.instances(agent_id) if i["status"] == "online"]) >= count,
        timeout=30,
        what=f"{count} online instance(s) of {agent_id}",
    )


def kinds(stack: Stack, task_id: str) -> list[str]:
    return [e["kind"] for e in stack.events(task_id)]


def test_send_and_wait_for_result(stack: Stack, tmp_path: Path) -> None:
    agent = AgentProcess(stack.url, tmp_path / "x.log")
    try:
        online(stack, "recorder")
        sub = reach.send(
            agent_id="recorder",
            method="work.do",
            payload={"n": 1},
            task_id="task-20240915-001",
            hub=stack.url,
        )
        result = reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url)
        assert result.data["echo"] == {"n": 1}
        assert result.agent_id == "recorder" and result.attempt_seq == 1
        # idempotent on task_id: resubmitting returns the same task, nothing runs again
        again = reach.send(
            agent_id="recorder",
            method="work.do",
            payload={"n": 1},
            task_id="task-20240915-001",
            hub=stack.url,
        )
        assert again.task_id == sub.task_id and again.status == "success"
        assert kinds(stack, sub.task_id) == ["accepted", "dispatched", "terminal_success"]
        by_tags = reach.send(tags=["recorder"], method="work.do", payload={"n": 2}, hub=stack.url)
        assert reach.wait_for_result(by_tags.task_id, hub=stack.url).data["echo"] == {"n": 2}
        assert agent.executions() == [sub.task_id, by_tags.task_id]

        # the command line: reach send, reach tasks show
        env = {**stack.env, "COLUMNS": "200"}
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "reach",
                "send",
                "work.do",
                "--agent",
                "recorder",
                "--payload",
                '{"n": 3}',
                "--hub",
                stack.url,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        sent = json.loads(out.stdout)
        assert sent["result"]["echo"] == {"n": 3}
        shown = subprocess.run(
            [sys.executable, "-m", "reach", "tasks", "show", sent["task_id"], "--hub", stack.url],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0 and "terminal_success" in shown.stdout
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "reach",
                "send",
                "work.do",
                "--agent",
                "nobody",
                "--hub",
                stack.url,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode == 1 and "NoSuitableAgent" in bad.stderr
    finally:
        agent.stop()


def test_business_error_is_reported_after_exactly_one_attempt(stack: Stack, tmp_path: Path) -> None:
    agent = AgentProcess(stack.url, tmp_path / "x.log", mode="business")
    try:
        online(stack, "recorder")
        sub = reach.send(agent_id="recorder", method="work.do", hub=stack.url)
        with pytest.raises(reach.BusinessError) as err:
            reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url)
        assert err.value.code == 7
        assert kinds(stack, sub.task_id).count("dispatched") == 1
        assert agent.executions() == [sub.task_id]
    finally:
        agent.stop()


def test_agent_down_then_back_within_the_retry_window_is_delivered(
    stack: Stack, tmp_path: Path
) -> None:
    agent = AgentProcess(stack.url, tmp_path / "x.log")
    online(stack, "recorder")
    agent.kill()
    sub = reach.send(agent_id="recorder", method="work.do", payload={"k": 1}, hub=stack.url)
    wait_until(lambda: stack.task(sub.task_id)["retries"] >= 2, timeout=20, what="two retries")
    agent.start()  # same port, new process: back within the window
    try:
        result = reach.wait_for_result(sub.task_id, timeout=40, hub=stack.url)
        assert result.data["echo"] == {"k": 1}
        assert stack.task(sub.task_id)["retries"] >= 2
        assert agent.executions() == [sub.task_id]
    finally:
        agent.stop()


def test_agent_down_for_good_is_dead_lettered_after_exactly_max_retry(
    stack: Stack, tmp_path: Path
) -> None:
    agent = AgentProcess(stack.url, tmp_path / "x.log")
    online(stack, "recorder")
    agent.kill()
    sub = reach.send(agent_id="recorder", method="work.do", payload={"k": 2}, hub=stack.url)
    with pytest.raises(reach.DeadLettered):
        reach.wait_for_result(sub.task_id, timeout=60, hub=stack.url)
    events = stack.events(sub.task_id)
    retries = [e for e in events if e["kind"] == "retry"]
    assert len(retries) == 5  # router.max_retry
    assert [e["kind"] for e in events][-2:] == ["terminal_failure", "dead_letter"]
    policy = RetryPolicy(max_retry=5, base=0.2, cap=5)
    for n, event in enumerate(retries, start=1):
        low, high = delay_bounds(n, policy)
        assert low - 0.001 <= event["detail"]["delay_s"] <= high + 0.001  # stored in ms
    # and each next attempt really waited its delay (and not much longer)
    failures = [e["at"] for e in events if e["kind"] in ("retry", "terminal_failure")]
    for event, failed_again_at in zip(retries, failures[1:], strict=True):
        waited = failed_again_at - event["at"]
        assert event["detail"]["delay_s"] - 0.05 <= waited <= event["detail"]["delay_s"] + 3.0
    dead_total = re.search(r"agentreach_router_dead_letter_total ([0-9.]+)", stack.metrics())
    assert dead_total and float(dead_total.group(1)) >= 1

    # the operator sees it and replays it once the agent is back
    dead = requests.get(f"{stack.url}/api/v1/dead-letters", timeout=5).json()["dead_letters"]
    (entry,) = [d for d in dead if d["task_id"] == sub.task_id]
    agent.start()
    online(stack, "recorder")
    out = subprocess.run(
        [sys.executable, "-m", "reach", "dlq", "replay", str(entry["id"]), "--hub", stack.url],
        env=hub_env("x", tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    try:
        assert reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url).data["echo"] == {
            "k": 2
        }
    finally:
        agent.stop()
    again = requests.post(f"{stack.url}/api/v1/dead-letters/{entry['id']}/replay", timeout=5)
    assert again.status_code == 409


def test_agent_that_accepts_then_dies_is_caught_by_the_watchdog(
    stack: Stack, tmp_path: Path
) -> None:
    dying = AgentProcess(stack.url, tmp_path / "a.log", agent_id="worker-pool", mode="accept-die")
    online(stack, "worker-pool")
    sub = reach.send(agent_id="worker-pool", method="work.do", timeout_ms=1000, hub=stack.url)
    wait_until(lambda: "ack" in kinds(stack, sub.task_id), timeout=20, what="202 ack")
    healthy = AgentProcess(
        stack.url, tmp_path / "b.log", agent_id="worker-pool", mode="accept-report"
    )
    try:
        result = reach.wait_for_result(sub.task_id, timeout=40, hub=stack.url)
        assert result.data == {"late": {}}
        events = stack.events(sub.task_id)
        retry = next(e for e in events if e["kind"] == "retry")
        assert retry["detail"]["reason"] == "watchdog"
        assert dying.executions() == [sub.task_id]
        assert healthy.executions() == [sub.task_id]
    finally:
        healthy.stop()
        dying.kill()


def test_late_results_first_wins_and_duplicates_are_recorded(stack: Stack, tmp_path: Path) -> None:
    agent = AgentProcess(stack.url, tmp_path / "x.log", mode="accept-report")
    try:
        online(stack, "recorder")
        sub = reach.send(agent_id="recorder", method="work.do", payload={"v": 1}, hub=stack.url)
        assert reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url).data == {
            "late": {"v": 1}
        }
        done = stack.task(sub.task_id)  # a late report names the attempt it answers
        assert (
            reach.report_result(
                sub.task_id,
                {"other": True},
                attempt_seq=done["attempt_seq"],
                instance_id=done["instance_id"],
                hub=stack.url,
            )
            is False
        )
        assert stack.task(sub.task_id)["result"] == {"late": {"v": 1}}
        events = stack.events(sub.task_id)
        assert [e["kind"] for e in events] == [
            "accepted",
            "dispatched",
            "ack",
            "progress",
            "terminal_success",
            "duplicate_result",
        ]
        progress = next(e for e in events if e["kind"] == "progress")
        assert progress["detail"] == {"progress": 0.5, "message": "halfway"}
    finally:
        agent.stop()


def test_load_spreads_over_near_equal_instances(stack: Stack, tmp_path: Path) -> None:
    agents = [AgentProcess(stack.url, tmp_path / f"{n}.log", agent_id="pool") for n in range(2)]
    try:
        online(stack, "pool", count=2)
        wait_until(
            lambda: all(i["probe_status"] == "ok" for i in stack.instances("pool")),
            timeout=30,
            what="probes",
        )
        subs = [
            reach.send(agent_id="pool", method="work.do", payload={"i": i}, hub=stack.url)
            for i in range(60)
        ]
        served = Counter(
            reach.wait_for_result(s.task_id, timeout=60, hub=stack.url).instance_id for s in subs
        )
        assert len(served) == 2, served
        assert min(served.values()) >= 12, served  # 60 tasks, each instance >= 20 %
    finally:
        for a in agents:
            a.stop()


def test_bad_submissions_are_refused_before_anything_is_queued(
    stack: Stack, tmp_path: Path
) -> None:
    agent = AgentProcess(stack.url, tmp_path / "x.log")
    try:
        online(stack, "recorder")
        cases = [
            ({"method": "work.do", "agent_id": "nobody"}, 404, "no-suitable-agent"),
            ({"method": "work.do"}, 422, "invalid-task-request"),
            ({"method": "work.undeclared", "agent_id": "recorder"}, 404, "no-suitable-agent"),
            (
                {"method": "work.do", "agent_id": "recorder", "payload": [1]},
                422,
                "invalid-task-request",
            ),
        ]
        for body, status, slug in cases:
            r = requests.post(f"{stack.url}/v1/tasks", json=body, timeout=5)
            assert (r.status_code, r.json()["type"]) == (
                status,
                f"urn:agent-reach:problem:{slug}",
            ), body
        time.sleep(0.5)
        assert agent.executions() == []
    finally:
        agent.stop()


def test_send_from_inside_a_handler_carries_the_trace(stack: Stack, tmp_path: Path) -> None:
    back = AgentProcess(stack.url, tmp_path / "back.log")
    front = AgentProcess(
        stack.url,
        tmp_path / "front.log",
        agent_id="front",
        mode="forward",
        extra=("--forward-to", "recorder"),
    )
    try:
        online(stack, "recorder")
        online(stack, "front")
        sub = reach.send(agent_id="front", method="work.do", payload={"q": 1}, hub=stack.url)
        result = reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url)
        assert result.data["forwarded"]["echo"] == {"q": 1}
        inner = stack.task(result.data["inner_task_id"])
        assert inner["trace"] == {
            "root_id": sub.task_id,
            "parent_task_id": sub.task_id,
            "hops": 1,
            "path": ["front"],
        }
        assert stack.task(sub.task_id)["trace"]["hops"] == 0
        delivered = re.search(
            r'agentreach_router_delivery_total\{outcome="success"\} ([0-9.]+)', stack.metrics()
        )
        assert delivered and float(delivered.group(1)) >= 2
    finally:
        front.stop()
        back.stop()


def test_instance_at_max_concurrency_is_skipped_while_another_can_take_the_task(
    stack: Stack, tmp_path: Path
) -> None:
    busy = AgentProcess(
        stack.url, tmp_path / "busy.log", agent_id="pool", delay=60, max_concurrency=1
    )
    try:
        online(stack, "pool")
        reach.send(
            agent_id="pool",
            method="work.do",
            payload={"hold": True},
            timeout_ms=90_000,
            hub=stack.url,
        )
        wait_until(
            lambda: stack.instances("pool")[0]["in_flight"] == 1,
            timeout=20,
            what="the only instance at max_concurrency",
        )
        free = AgentProcess(stack.url, tmp_path / "free.log", agent_id="pool")
        try:
            wait_until(  # the busy one is degraded (at capacity); the free one online
                lambda: (
                    sorted(i["status"] for i in stack.instances("pool")) == ["degraded", "online"]
                ),
                timeout=30,
                what="one degraded, one online",
            )
            wait_until(
                lambda: all(i["probe_status"] == "ok" for i in stack.instances("pool")),
                timeout=30,
                what="probes of both",
            )
            subs = [
                reach.send(agent_id="pool", method="work.do", payload={"i": i}, hub=stack.url)
                for i in range(10)
            ]
            for s in subs:
                reach.wait_for_result(s.task_id, timeout=30, hub=stack.url)
            assert len(free.executions()) == 10, [stack.events(s.task_id) for s in subs]
            assert len(busy.executions()) == 1
        finally:
            free.stop()
    finally:
        busy.kill()


def test_submit_with_wait_answers_with_the_finished_task(stack: Stack, tmp_path: Path) -> None:
    """One round trip: ``POST /v1/tasks?wait=`` holds until the result is in (woken by the
    completion notice on Redis; by re-reading on the embedded store)."""
    sync = AgentProcess(stack.url, tmp_path / "s.log", agent_id="waiter-sync")
    late = AgentProcess(stack.url, tmp_path / "l.log", agent_id="waiter-late", mode="accept-report")
    try:
        online(stack, "waiter-sync")
        online(stack, "waiter-late")
        for agent_id, expected in (("waiter-sync", {"n": 7}), ("waiter-late", {"late": {"n": 7}})):
            r = requests.post(
                f"{stack.url}/v1/tasks",
                params={"wait": 20},
                json={"agent_id": agent_id, "method": "work.do", "payload": {"n": 7}},
                timeout=30,
            )
            assert r.status_code == 201, r.text
            view = r.json()
            assert view["status"] == "success", view
            got = view["result"]["echo"] if agent_id == "waiter-sync" else view["result"]
            assert got == expected
            assert stack.task(view["task_id"])["status"] == "success"
        # a short wait that runs out answers with the task as it stands, not an error
        r = requests.post(
            f"{stack.url}/v1/tasks",
            params={"wait": 0.05},
            json={"agent_id": "waiter-late", "method": "work.do", "payload": {"n": 8}},
            timeout=30,
        )
        assert r.status_code == 201 and r.json()["status"] != "success"
        again = requests.post(  # resubmitting the same task_id with a wait: 200, same task
            f"{stack.url}/v1/tasks",
            params={"wait": 20},
            json={
                "agent_id": "waiter-late",
                "method": "work.do",
                "payload": {"n": 8},
                "task_id": r.json()["task_id"],
            },
            timeout=30,
        )
        assert again.status_code == 200 and again.json()["status"] == "success"
    finally:
        sync.stop()
        late.stop()
