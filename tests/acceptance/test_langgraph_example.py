"""An agent the way LangGraph services run: under uvicorn, through ``agent.asgi_app()``.

examples/agents/langgraph_agent.py runs as its own process behind a real hub and answers
with its graph; and an agent's app mounted at a prefix inside a FastAPI service gets its
deliveries through the hub at ``{endpoint}/tasks/{method}``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

import reach
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.uvicorn_thread import uvicorn_serving
from tests.support.waiting import wait_until

EXAMPLE = REPO / "examples" / "agents" / "langgraph_agent.py"
AGENT_ID = "ticket-triage-01"


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """Every test here shares one hub per store."""
    return shared_stack


def online(stack: Stack, agent_id: str) -> bool:
    return any(i["status"] == "online" for i in stack.instances(agent_id))


@pytest.fixture
def langgraph_agent(stack: Stack, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = tmp_path / "langgraph-agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLE),
                "--port",
                str(free_port()),
                "--hub",
                stack.url,
                "--heartbeat-interval",
                "0.5",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the example exited {proc.returncode}:\n{log.read_text()}")
            return online(stack, AGENT_ID)

        wait_until(up, timeout=60, what=f"{AGENT_ID} online")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


TICKETS = [
    (
        "I was charged twice this month, please refund me",
        {"category": "billing", "urgency": "normal", "team": "billing"},
        ["classify", "billing"],
    ),
    (
        "The site is down since this morning!",
        {"category": "technical", "urgency": "high", "team": "on-call"},
        ["classify", "technical"],
    ),
    (
        "Login error when I use the mobile app",
        {"category": "technical", "urgency": "normal", "team": "support"},
        ["classify", "technical"],
    ),
    (
        "Can I change the name on my account?",
        {"category": "general", "urgency": "normal", "team": "front-desk"},
        ["classify", "general"],
    ),
]


def test_the_langgraph_example_answers_through_the_hub(
    stack: Stack, langgraph_agent: subprocess.Popen[bytes]
) -> None:
    (instance,) = stack.instances(AGENT_ID)
    for text, expected, path in TICKETS:
        sub = reach.send(
            capability="ticket.triage",
            method="ticket.triage",
            payload={"text": text},
            hub=stack.url,
        )
        result = reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url)
        assert result.agent_id == AGENT_ID
        assert result.instance_id == instance["instance_id"]
        assert result.data == {**expected, "path": path}
    with pytest.raises(reach.InvalidPayload):  # the capability's schema, checked at submit
        reach.send(
            capability="ticket.triage",
            method="ticket.triage",
            payload={"text": ""},
            hub=stack.url,
        )

    # uvicorn's shutdown runs the app's lifespan: the instance leaves the hub cleanly.
    # (uvicorn re-raises the signal once it has shut down, so the exit status names it.)
    langgraph_agent.send_signal(signal.SIGTERM)
    assert langgraph_agent.wait(timeout=15) in (0, -signal.SIGTERM)
    assert stack.instances(AGENT_ID) == []


def test_an_app_mounted_at_a_prefix_gets_deliveries(stack: Stack) -> None:
    port = free_port()
    agent = reach.Agent(
        "mounted-agent-01",
        addr=f"http://127.0.0.1:{port}/agents/reach",
        allow_loopback=True,
        capabilities=[{"type": "mounted.echo"}],
        heartbeat_interval=0.5,
        hub=stack.url,
    )
    seen: list[tuple[str, dict[str, Any]]] = []

    @agent.route("mounted.echo")
    def echo(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        seen.append((task_id, payload))
        return {"echo": payload["word"]}

    reach_app = agent.asgi_app()
    service = FastAPI(lifespan=reach_app.lifespan)

    @service.get("/status")
    def status() -> dict[str, str]:
        return {"service": "up"}

    service.mount("/agents/reach", reach_app)
    with uvicorn_serving(service, port):
        wait_until(lambda: online(stack, agent.agent_id), timeout=30, what="mounted agent online")
        (instance,) = stack.instances(agent.agent_id)
        assert instance["endpoint"] == f"http://127.0.0.1:{port}/agents/reach"
        sub = reach.send(
            agent_id=agent.agent_id, method="mounted.echo", payload={"word": "hi"}, hub=stack.url
        )
        result = reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url)
        assert result.data == {"echo": "hi"}
        assert seen == [(sub.task_id, {"word": "hi"})]
    assert stack.instances(agent.agent_id) == []
