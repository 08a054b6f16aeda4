"""Replaying many dead letters at once (``POST /api/v1/dead-letters/replay``): each is the
single replay, in its own transaction; refusals are reported per item and change nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

import reach
from tests.support.stacks import AgentProcess, Stack
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_ROUTER__MAX_RETRY": "1",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "1",
    "REACH_ROUTER__CONNECT_TIMEOUT": "0.5",
    "REACH_ROUTER__READ_TIMEOUT": "3",
}
TYPE = "urn:agent-reach:problem:"


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    return shared_stack


def dead_letters(stack: Stack, agent_id: str, tasks: list[str]) -> dict[str, int]:
    """The dead letters of ``tasks`` (task id -> dead-letter id), once all are dead."""

    def found() -> dict[str, int] | None:
        rows = requests.get(f"{stack.url}/api/v1/dead-letters", timeout=5).json()["dead_letters"]
        mine = {d["task_id"]: d["id"] for d in rows if d["task_id"] in tasks}
        return mine if len(mine) == len(tasks) else None

    return dict(wait_until(found, timeout=60, what=f"{len(tasks)} dead letters of {agent_id}"))


def test_replay_many_redelivers_each_once_and_reports_every_refusal(
    stack: Stack, tmp_path: Path
) -> None:
    agent = AgentProcess(stack.url, tmp_path / "a.log", agent_id="dlq-many")
    wait_until(
        lambda: any(i["status"] == "online" for i in stack.instances("dlq-many")),
        timeout=30,
        what="dlq-many online",
    )
    agent.kill()
    tasks = [
        reach.send(agent_id="dlq-many", method="work.do", payload={"n": n}, hub=stack.url).task_id
        for n in range(3)
    ]
    dead = dead_letters(stack, "dlq-many", tasks)
    assert agent.executions() == []  # nothing was ever delivered
    # the restarted agent serves the same port: until the hub has seen the killed instance
    # go down, "online" may still be that one, and a replay sent to it would be refused
    wait_until(
        lambda: not any(i["status"] == "online" for i in stack.instances("dlq-many")),
        timeout=30,
        what="the killed dlq-many seen down",
    )
    agent.start()
    try:
        wait_until(
            lambda: any(i["status"] == "online" for i in stack.instances("dlq-many")),
            timeout=30,
            what="dlq-many back online",
        )
        first, second, third = (dead[t] for t in tasks)
        answer = requests.post(
            f"{stack.url}/api/v1/dead-letters/replay",
            json={"ids": [first, second, 2_000_000_000, first]},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["replayed"], body["refused"]) == (2, 1)
        results = {r["dead_letter_id"]: r for r in body["results"]}
        assert [r["dead_letter_id"] for r in body["results"]] == [first, second, 2_000_000_000]
        assert results[first]["outcome"] == results[second]["outcome"] == "replayed"
        assert (results[first]["task_id"], results[first]["attempt_seq"]) == (tasks[0], 3)
        unknown = results[2_000_000_000]
        assert (unknown["outcome"], unknown["problem_type"]) == ("refused", TYPE + "unknown-task")
        assert "does not exist" in unknown["detail"]
        for task_id in tasks[:2]:
            assert reach.wait_for_result(task_id, timeout=30, hub=stack.url).data["echo"]
        wait_until(lambda: len(agent.executions()) >= 2, timeout=10, what="two deliveries")
        assert sorted(agent.executions()) == sorted(tasks[:2])  # once each, the third never
        assert stack.task(tasks[2])["status"] == "dead"

        # again: the replayed one is refused by name, the one left is replayed now
        again = requests.post(
            f"{stack.url}/api/v1/dead-letters/replay", json={"ids": [first, third]}, timeout=30
        ).json()
        refused, replayed = again["results"]
        assert (refused["outcome"], refused["problem_type"]) == ("refused", TYPE + "task-conflict")
        assert refused["detail"] == f"dead letter {first} was already replayed"
        assert replayed["outcome"] == "replayed"
        assert reach.wait_for_result(tasks[2], timeout=30, hub=stack.url).data["echo"] == {"n": 2}
        wait_until(lambda: len(agent.executions()) >= 3, timeout=10, what="third delivery")
        assert sorted(agent.executions()) == sorted(tasks)
        events = [e["kind"] for e in stack.events(tasks[0])]
        assert events.count("replayed") == 1
    finally:
        agent.stop()


@pytest.mark.parametrize(
    "body",
    [
        {"ids": []},
        {"ids": list(range(1, 202))},
        {"ids": [0]},
        {"ids": [2**31]},
        {"ids": ["x"]},
        {},
        {"ids": [1], "x": 1},
    ],
    ids=["empty", "too-many", "zero", "huge", "not-a-number", "missing", "extra-field"],
)
def test_a_bad_replay_many_body_is_422(stack: Stack, body: dict[str, object]) -> None:
    answer = requests.post(f"{stack.url}/api/v1/dead-letters/replay", json=body, timeout=10)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
