"""Admission at submit through real processes (issue 14): the bounded per-agent queue
(429 backpressure), the payload cap (413) and memory admission (503), on both stores.

The slow agent is tests/acceptance/agents/recording_agent.py, which logs every handler
run: what it executed is counted at the agent, not taken from the hub's word.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import func, select

import reach
from reach.errors import PROBLEM_TYPE_PREFIX
from reach.hub.storage import create_engine_for
from reach.hub.storage.models import TaskRow
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import AgentProcess, HubProcess, Stack, hub_env, wait_http_ok
from tests.support.waiting import wait_until

LIMIT = 5
PAYLOAD_CAP = 2048
STACK_SETTINGS = {
    "REACH_ROUTER__MAX_QUEUE": str(LIMIT),
    "REACH_ROUTER__MAX_PAYLOAD_BYTES": str(PAYLOAD_CAP),
}
PROBLEM = "application/problem+json"


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """One hub per store for the module; every test uses agent IDs of its own."""
    return shared_stack


@pytest.fixture
def slow_agent(stack: Stack, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Start a slow recording agent: ``slow_agent(agent_id, delay, *extra)``."""
    started: list[AgentProcess] = []

    def start(agent_id: str, delay: float, *extra: str) -> AgentProcess:
        agent = AgentProcess(
            stack.url, tmp_path / f"{agent_id}.log", agent_id=agent_id, delay=delay, extra=extra
        )
        started.append(agent)
        wait_until(
            lambda: any(i["status"] == "online" for i in stack.instances(agent_id)),
            timeout=30,
            what=f"{agent_id} online",
        )
        return agent

    yield start
    for agent in started:
        agent.stop()


def submit(url: str, agent_id: str, task_id: str, **body: Any) -> requests.Response:
    return requests.post(
        f"{url}/v1/tasks",
        json={"agent_id": agent_id, "method": "work.do", "task_id": task_id, **body},
        timeout=30,
    )


def stored(stack: Stack, agent_id: str) -> int:
    """The tasks of the agent in the store: a refused submit wrote none."""
    engine = create_engine_for(stack.env["REACH_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            return int(conn.scalar(select(func.count()).where(TaskRow.agent_id == agent_id)) or 0)
    finally:
        engine.dispose()


def assert_backpressure(answer: requests.Response, limit: int) -> None:
    assert answer.status_code == 429, answer.text
    assert answer.headers["content-type"] == PROBLEM
    assert int(answer.headers["Retry-After"]) >= 1
    problem = answer.json()
    assert problem["type"] == PROBLEM_TYPE_PREFIX + "backpressure"
    assert problem["depth"] >= limit and problem["limit"] == limit
    assert isinstance(problem["retry_after_ms"], int) and problem["retry_after_ms"] > 0


def all_complete(stack: Stack, task_ids: list[str], timeout: float = 60) -> None:
    for task_id in task_ids:
        result = reach.wait_for_result(task_id, timeout=timeout, hub=stack.url)
        assert result.data["echo"] == {}


def queue_of(stack: Stack, agent_id: str) -> dict[str, Any]:
    answer = requests.get(f"{stack.url}/api/v1/agents/{agent_id}", timeout=5)
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["queue"])


def test_past_the_bound_submits_get_backpressure_and_nothing_is_written(
    stack: Stack, slow_agent: Any
) -> None:
    agent = slow_agent("bp-bound", 2.0)
    answers = {f"bp-bound-{n}": submit(stack.url, "bp-bound", f"bp-bound-{n}") for n in range(12)}
    accepted = [t for t, a in answers.items() if a.status_code == 201]
    refused = [a for a in answers.values() if a.status_code != 201]
    assert len(accepted) == LIMIT, {t: a.status_code for t, a in answers.items()}
    assert len(refused) == 12 - LIMIT
    for answer in refused:
        assert_backpressure(answer, LIMIT)
        assert answer.json()["agent_id"] == "bp-bound"
    assert stored(stack, "bp-bound") == LIMIT
    assert queue_of(stack, "bp-bound") == {
        "limit": LIMIT,
        "source": "router.max_queue",
        "depth": LIMIT,
        "declared": None,
        "override": None,
    }
    # the SDK raises it, with the fields; it is not a failure and nothing is retried
    with pytest.raises(reach.Backpressure) as err:
        reach.send(agent_id="bp-bound", method="work.do", task_id="bp-bound-sdk", hub=stack.url)
    assert err.value.extra["limit"] == LIMIT and err.value.extra["depth"] >= LIMIT
    assert err.value.extra["retry_after_ms"] > 0
    # a resubmit of an accepted task is given the task, full queue or not
    again = submit(stack.url, "bp-bound", accepted[0])
    assert again.status_code == 200, again.text
    # a broadcast reaching the full agent is refused whole: nothing of it written
    fan = requests.post(
        f"{stack.url}/v1/broadcasts",
        json={"tags": ["recorder"], "method": "work.do", "payload": {}},
        timeout=10,
    )
    assert_backpressure(fan, LIMIT)
    assert stored(stack, "bp-bound") == LIMIT
    all_complete(stack, accepted)
    assert sorted(agent.executions()) == sorted(accepted)  # the agent saw exactly those
    assert "agentreach_admission_refusals_total" in stack.metrics()


def cli(stack: Stack, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "reach", *args, "--hub", stack.url, "--json"],
        env=stack.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(json.loads(done.stdout))


def test_declared_bound_and_admin_override(stack: Stack, slow_agent: Any, tmp_path: Path) -> None:
    # declared at registration; every task is held at the agent until the gate opens, so
    # the queue cannot drain while the CLI calls below start (each a few seconds on a
    # loaded box); 90 s is only the bound should the test die before opening it
    gate = tmp_path / "bp-own.gate"
    agent = slow_agent("bp-own", 90.0, "--max-queue", "2", "--gate", str(gate))
    first = [submit(stack.url, "bp-own", f"bp-own-{n}") for n in range(4)]
    assert [a.status_code for a in first] == [201, 201, 429, 429]
    assert_backpressure(first[2], 2)
    assert queue_of(stack, "bp-own")["source"] == "declared"

    raised = cli(stack, "agents", "queue", "bp-own", "--max", "3")
    assert (raised["limit"], raised["source"], raised["previous"]) == (3, "override", None)
    second = [submit(stack.url, "bp-own", f"bp-own-{n}") for n in range(4, 7)]
    assert [a.status_code for a in second] == [201, 429, 429]
    assert_backpressure(second[1], 3)

    cleared = cli(stack, "agents", "queue", "bp-own", "--clear")
    assert (cleared["limit"], cleared["source"], cleared["previous"]) == (2, "declared", 3)
    assert submit(stack.url, "bp-own", "bp-own-7").status_code == 429
    shown = cli(stack, "agents", "queue", "bp-own")  # all three still held at the agent
    assert (shown["limit"], shown["source"], shown["depth"]) == (2, "declared", 3)

    accepted = ["bp-own-0", "bp-own-1", "bp-own-4"]
    assert stored(stack, "bp-own") == 3
    gate.touch()
    all_complete(stack, accepted)
    assert sorted(agent.executions()) == accepted


def test_admin_endpoint_refuses_bad_values_and_unknown_agents(stack: Stack) -> None:
    for body in ({"max_queue": 0}, {"max_queue": True}, {"max_queue": "3"}, {}):
        answer = requests.put(f"{stack.url}/api/v1/agents/x/max-queue", json=body, timeout=5)
        assert answer.status_code == 422, (body, answer.text)
    answer = requests.put(
        f"{stack.url}/api/v1/agents/nobody/max-queue", json={"max_queue": 3}, timeout=5
    )
    assert answer.status_code == 404, answer.text


def test_two_api_replicas_never_exceed_the_bound_together(
    stack: Stack, slow_agent: Any, tmp_path: Path
) -> None:
    port = free_port()
    second = HubProcess(["api", "--port", str(port)], stack.env, tmp_path / "api-2.log")
    try:
        other = f"http://127.0.0.1:{port}"
        wait_http_ok(other + "/healthz", second)
        agent = slow_agent("bp-pair", 4.0)
        urls = [stack.url, other] * 20

        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(
                pool.map(
                    lambda n: (f"bp-pair-{n}", submit(urls[n], "bp-pair", f"bp-pair-{n}")),
                    range(len(urls)),
                )
            )
        codes = sorted(a.status_code for _, a in answers)
        assert codes == [201] * LIMIT + [429] * (len(urls) - LIMIT), codes
        accepted = [t for t, a in answers if a.status_code == 201]
        assert stored(stack, "bp-pair") == LIMIT
        all_complete(stack, accepted)
        assert sorted(agent.executions()) == sorted(accepted)
    finally:
        second.stop()


def test_an_oversize_payload_is_refused_with_a_reference_hint(
    stack: Stack, slow_agent: Any
) -> None:
    agent = slow_agent("bp-size", 0.0)
    big = {"blob": "x" * PAYLOAD_CAP}
    answer = submit(stack.url, "bp-size", "bp-size-big", payload=big)
    assert answer.status_code == 413, answer.text
    assert answer.headers["content-type"] == PROBLEM
    problem = answer.json()
    assert problem["type"] == PROBLEM_TYPE_PREFIX + "payload-too-large"
    assert (problem["size"], problem["limit"]) == (
        len(json.dumps(big, separators=(",", ":"))),
        PAYLOAD_CAP,
    )
    assert "reference" in problem["detail"] and str(PAYLOAD_CAP) in problem["detail"]
    with pytest.raises(reach.errors.RequestTooLarge) as err:
        reach.send(agent_id="bp-size", method="work.do", payload=big, hub=stack.url)
    assert err.value.extra["limit"] == PAYLOAD_CAP
    assert stored(stack, "bp-size") == 0
    assert requests.get(f"{stack.url}/v1/tasks/bp-size-big", timeout=5).status_code == 404

    fits = reach.send(
        agent_id="bp-size", method="work.do", payload={"blob": "x" * 1000}, hub=stack.url
    )
    assert reach.wait_for_result(fits.task_id, timeout=30, hub=stack.url).data["echo"]["blob"]
    assert agent.executions() == [fits.task_id]


def test_an_api_over_its_memory_limit_refuses_submits_but_serves_reads(
    store_url: str, tmp_path: Path
) -> None:
    port = free_port()
    env = hub_env(store_url, tmp_path, REACH_SERVER__MEMORY_LIMIT_BYTES=str(16 << 20))
    api = HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/healthz", api)
        for path, body in (
            ("/v1/tasks", {"agent_id": "a", "method": "work.do"}),
            ("/v1/broadcasts", {"tags": ["x"], "method": "work.do"}),
            ("/api/v1/dag-runs", {"dag": {}}),
        ):
            answer = requests.post(url + path, json=body, timeout=10)
            assert answer.status_code == 503, (path, answer.text)
            assert answer.headers["content-type"] == PROBLEM
            assert int(answer.headers["Retry-After"]) >= 1
            assert answer.json()["type"] == PROBLEM_TYPE_PREFIX + "overloaded"
        with pytest.raises(reach.HubOverloaded):
            reach.send(agent_id="a", method="work.do", hub=url)
        # reads (and everything that drains work) go on
        assert requests.get(url + "/api/v1/agents", timeout=5).status_code == 200
        assert requests.get(url + "/v1/tasks/t-none", timeout=5).status_code == 404
        metrics = requests.get(url + "/metrics", timeout=5).text
        assert 'agentreach_admission_refusals_total{reason="overloaded"}' in metrics
    finally:
        api.stop()
