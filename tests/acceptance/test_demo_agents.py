"""The demo agents the shipped DAGs need (examples/sales_agent.py, knowledge_agent.py,
chat_agent.py) as real processes behind a real hub, and `reach up` starting all of them."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

import reach
from tests.conftest import REPO, Stack, free_port, wait_until

DEMO_AGENTS = {
    "sales-agent-01": "sales_agent.py",
    "knowledge-agent-01": "knowledge_agent.py",
    "chat-agent-01": "chat_agent.py",
}


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """Every test here shares one hub per store."""
    return shared_stack


@pytest.fixture(scope="module")
def demo_agents(
    shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Path]]:
    """The three demo agents, started once per hub, online; yields their log files."""
    logs_dir = tmp_path_factory.mktemp("demo-agents")
    logs: dict[str, Path] = {}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    outs: list[IO[bytes]] = []
    try:
        for agent_id, script in DEMO_AGENTS.items():
            logs[agent_id] = logs_dir / f"{agent_id}.log"
            out = logs[agent_id].open("wb")
            outs.append(out)
            procs[agent_id] = subprocess.Popen(
                [
                    sys.executable,
                    str(REPO / "examples" / script),
                    "--port",
                    str(free_port()),
                    "--hub",
                    shared_stack.url,
                    "--heartbeat-interval",
                    "0.5",
                ],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        for agent_id, proc in procs.items():

            def online(agent_id: str = agent_id, proc: subprocess.Popen[bytes] = proc) -> bool:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"{agent_id} exited with {proc.returncode}:\n{logs[agent_id].read_text()}"
                    )
                return any(i["status"] == "online" for i in shared_stack.instances(agent_id))

            wait_until(online, timeout=30, what=f"{agent_id} online")
        yield logs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in outs:
            log.close()


def run(stack: Stack, method: str, payload: dict[str, object]) -> reach.TaskResult:
    sub = reach.send(capability=method, method=method, payload=payload, hub=stack.url)
    return reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url)


def test_sales_fetch(stack: Stack, demo_agents: dict[str, Path]) -> None:
    result = run(stack, "sales.fetch", {"region": "east"})
    assert result.agent_id == "sales-agent-01"
    rows, total = result.data["rows"], result.data["total"]
    assert len(rows) == 6 and all(set(r) == {"month", "revenue"} for r in rows)
    assert total == sum(r["revenue"] for r in rows)
    # deterministic: the same region gives the same figures; another region other figures
    assert run(stack, "sales.fetch", {"region": "east"}).data == result.data
    assert run(stack, "sales.fetch", {"region": "west"}).data["total"] != total

    with pytest.raises(reach.BusinessError) as failed:
        run(stack, "sales.fetch", {"region": "south"})
    assert failed.value.code == 404 and "south" in failed.value.message

    # not in the schema's enum: refused by the hub at submit, nothing is queued
    with pytest.raises(reach.InvalidPayload):
        reach.send(
            capability="sales.fetch",
            method="sales.fetch",
            payload={"region": "nowhere"},
            hub=stack.url,
        )
    with pytest.raises(reach.InvalidPayload):
        reach.send(capability="sales.fetch", method="sales.fetch", payload={}, hub=stack.url)


def test_knowledge_explain(stack: Stack, demo_agents: dict[str, Path]) -> None:
    sales = run(stack, "sales.fetch", {"region": "west"}).data
    payload = {"region": "west", "rows": sales["rows"], "total": sales["total"]}

    plain = run(stack, "knowledge.explain", payload)
    assert plain.agent_id == "knowledge-agent-01"
    assert isinstance(plain.data["explanation"], str) and "west" in plain.data["explanation"]
    pricing = run(stack, "knowledge.explain", {**payload, "angle": "pricing"}).data
    assert "Pricing" in pricing["explanation"]
    east = run(stack, "sales.fetch", {"region": "east"}).data
    supply_east = {"region": "east", "angle": "supply", **east}
    assert run(stack, "knowledge.explain", supply_east).data["explanation"]

    # the diamond's failure branch: the supply review of west fails
    with pytest.raises(reach.BusinessError) as failed:
        run(stack, "knowledge.explain", {**payload, "angle": "supply"})
    assert failed.value.code == 503 and failed.value.message == "supply data unavailable"

    with pytest.raises(reach.InvalidPayload):  # angle outside the enum, rows missing
        reach.send(
            capability="knowledge.explain",
            method="knowledge.explain",
            payload={"region": "west", "total": 1, "angle": "weather"},
            hub=stack.url,
        )


def test_chat_compose(stack: Stack, demo_agents: dict[str, Path]) -> None:
    reply = run(
        stack,
        "chat.compose",
        {"tone": "concise", "region": "east", "total": 1234, "explanations": ["Demand grew."]},
    )
    assert reply.agent_id == "chat-agent-01"
    assert "1,234" in reply.data["reply"] and "Demand grew." in reply.data["reply"]
    escalation = run(
        stack,
        "chat.compose",
        {
            "tone": "escalation",
            "region": "west",
            "error": {"code": 503, "message": "supply data unavailable"},
        },
    )
    assert "supply data unavailable" in escalation.data["reply"]
    with pytest.raises(reach.InvalidPayload):  # tone is required
        reach.send(
            capability="chat.compose", method="chat.compose", payload={"region": "x"}, hub=stack.url
        )
