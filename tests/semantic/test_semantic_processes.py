"""Semantic matching end to end with real processes: ``reach api``/worker/beat with the
model, the demo sales and knowledge agents as their own processes, callers through the
SDK and the CLI. A send by intent is delivered to the matched agent, which answers."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import reach
from tests.support.demo_agents import running
from tests.support.paths import REPO
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

AGENTS = {"sales-agent-01": "sales_agent.py", "knowledge-agent-01": "knowledge_agent.py"}
ROWS = [{"month": "2024-01", "revenue": 100.0}, {"month": "2024-06", "revenue": 80.0}]


@pytest.fixture(scope="module")
def agents(shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running(shared_stack, AGENTS, tmp_path_factory.mktemp("agents")):
        yield shared_stack


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reach", *args, "--hub", stack.url],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )


def test_the_api_says_it_is_on_and_loads_the_model_once(agents: Stack) -> None:
    api_log = agents.procs[0]
    wait_until(lambda: "loaded in" in api_log.output(), timeout=60, what="the model loaded")
    log = api_log.output()
    assert "semantic matching is on" in log
    assert log.count("loading the embedding model") == 1
    worker_log = Path(agents.worker.log_path).read_text()
    assert "embedding model" not in worker_log  # only the API needs it


def test_sdk_find_and_send_by_intent_reach_the_matched_agent(agents: Stack) -> None:
    found = reach.find("how much revenue did the east region make", hub=agents.url)
    assert found[0] == reach.Match("sales-agent-01", "sales.fetch", found[0].score)
    assert found[0].score >= 0.5
    sub = reach.send(
        intent="how much revenue did the east region make",
        payload={"region": "east"},
        hub=agents.url,
    )
    assert (sub.agent_id, sub.method) == ("sales-agent-01", "sales.fetch")
    result = reach.wait_for_result(sub.task_id, timeout=90, hub=agents.url)
    assert result.agent_id == "sales-agent-01"
    assert len(result.data["rows"]) == 6  # computed by the agent process
    assert result.data["total"] == sum(r["revenue"] for r in result.data["rows"])


def test_sdk_no_suitable_agent_names_the_closest(agents: Stack) -> None:
    with pytest.raises(reach.NoSuitableAgent) as refused:
        reach.send(intent="play some jazz music", payload={}, hub=agents.url)
    closest = refused.value.extra["candidates"]
    assert closest and all(c["score"] < 0.5 for c in closest)
    assert refused.value.extra["threshold"] == 0.5
    with pytest.raises(reach.NoSuitableAgent):
        reach.find("play some jazz music", hub=agents.url)


def test_cli_match_and_send_by_intent(agents: Stack) -> None:
    done = cli(agents, "match", "what caused the sales decline")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "score\tcapability\tagent"
    assert lines[1].split("\t")[1:] == ["knowledge.explain", "knowledge-agent-01"]
    done = cli(agents, "match", "what caused the sales decline", "-o", "json")
    assert json.loads(done.stdout)["candidates"][0]["capability"] == "knowledge.explain"

    payload = {"region": "west", "rows": ROWS, "total": 180.0}
    done = cli(
        agents,
        "send",
        "--intent",
        "explain why revenue fell",
        "--payload",
        json.dumps(payload),
        "--wait",
        "90",  # the worker may still be starting on a loaded box
    )
    assert done.returncode == 0, done.stderr
    assert "intent matched knowledge.explain of knowledge-agent-01" in done.stderr
    answer = json.loads(done.stdout)
    assert answer["agent_id"] == "knowledge-agent-01"
    assert "revenue fell 20.0%" in answer["result"]["explanation"]

    done = cli(agents, "match", "book a flight to Tokyo")
    assert done.returncode == 1
    assert "NoSuitableAgent" in done.stderr and "below the threshold" in done.stderr
