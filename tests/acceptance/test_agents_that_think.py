"""Agents that think, through a real hub (api, worker, beat; PostgreSQL): an
``async def`` handler's value comes back as the task's data, over HTTP and over the
channel; a handler longer than ``accept_after`` ends the task by the SDK's own report,
kept alive past the hub's watchdog; a failure after the 202 is retried by the hub.

The agents run in the test's process (their handlers count their runs); the hub's
watchdog grace is 1 s here, so a run answered 202 that went silent would be failed and
retried within seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import reach
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

STACK_SETTINGS = {"REACH_ROUTER__WATCHDOG_GRACE": "1", "REACH_ROUTER__BACKOFF_BASE": "0.2"}


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """Every test here shares one hub (a 1 s watchdog grace, fast retries); each agent
    has an id of its own, so no test's agent stands in for another's."""
    return shared_stack


@contextmanager
def thinking_agent(stack: Stack, agent_id: str, **kwargs: Any) -> Iterator[reach.Agent]:
    """An agent of this process registered with the hub; routes are added in the block
    (the hub lists none: tasks name the agent and method)."""
    if not kwargs.get("channel"):
        kwargs.update(addr=f"127.0.0.1:{free_port()}", allow_loopback=True)
    agent = reach.Agent(agent_id, heartbeat_interval=0.5, hub=stack.url, **kwargs)
    agent.start()
    try:
        wait_until(
            lambda: any(i["status"] == "online" for i in stack.instances(agent_id)),
            timeout=30,
            what=f"{agent_id} online",
        )
        yield agent
    finally:
        agent.close()


def kinds(stack: Stack, task_id: str) -> list[str]:
    return [e["kind"] for e in stack.events(task_id)]


@pytest.mark.parametrize("channel", [False, True], ids=["http", "channel"])
def test_an_async_handler_through_the_hub_ends_success_with_its_data(
    stack: Stack, channel: bool
) -> None:
    agent_id = "thinker-channel" if channel else "thinker"
    with thinking_agent(stack, agent_id, channel=channel) as agent:

        @agent.route("think")
        async def think(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(0.1)
            return {"thought": payload["q"] * 2}

        sub = reach.send(agent_id=agent_id, method="think", payload={"q": "ab"}, hub=stack.url)
        result = reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url)
    assert result.data == {"thought": "abab"}
    assert "ack" not in kinds(stack, sub.task_id)  # answered at once: no 202


@pytest.mark.parametrize(
    ("kind", "channel"),
    [("def", False), ("async def", False), ("async def", True)],
    ids=["def", "async-def", "async-def-channel"],
)
def test_a_handler_longer_than_accept_after_ends_success_by_report(
    stack: Stack, kind: str, channel: bool
) -> None:
    """Answered 202 at 0.5 s; the task's 2 s timeout and the 1 s grace would have the
    watchdog fail it at ~3.5 s; keepalives every second hold it off until the 5 s run
    reports its value. One run, one attempt."""
    runs: list[str] = []
    agent_id = f"slow-thinker-{kind.replace(' ', '-')}" + ("-channel" if channel else "")
    with thinking_agent(stack, agent_id, accept_after=0.5, channel=channel) as agent:
        if kind == "def":

            @agent.route("think")
            def think(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
                runs.append(task_id)
                time.sleep(5)
                return {"slept": 5}

        else:

            @agent.route("think")
            async def athink(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
                runs.append(task_id)
                await asyncio.sleep(5)
                return {"slept": 5}

        sub = reach.send(agent_id=agent_id, method="think", timeout_ms=2000, hub=stack.url)
        result = reach.wait_for_result(sub.task_id, timeout=40, hub=stack.url)
        events = kinds(stack, sub.task_id)
    assert result.data == {"slept": 5}
    assert runs == [sub.task_id]
    assert "ack" in events and "retry" not in events, events
    assert stack.task(sub.task_id)["attempt_seq"] == 1


def test_a_failure_after_the_202_is_retried_by_the_hub(stack: Stack) -> None:
    runs: list[str] = []
    with thinking_agent(stack, "flaky-thinker", accept_after=0.2) as agent:

        @agent.route("think")
        async def think(task_id: str, payload: dict[str, Any]) -> str:
            runs.append(task_id)
            await asyncio.sleep(0.5)
            if len(runs) == 1:
                raise ConnectionError("model endpoint reset")
            return "second time lucky"

        sub = reach.send(agent_id="flaky-thinker", method="think", hub=stack.url)
        result = reach.wait_for_result(sub.task_id, timeout=40, hub=stack.url)
        events = stack.events(sub.task_id)
    assert result.data == "second time lucky"
    assert runs == [sub.task_id] * 2
    (retry,) = [e for e in events if e["kind"] == "retry"]
    assert retry["detail"]["reason"] == "reported_failure", retry
