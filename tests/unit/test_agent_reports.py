"""An agent names the attempt it was delivered when it reports later (no sockets here)."""

from __future__ import annotations

from typing import Any

import pytest

import reach
from reach.errors import StaleReport
from reach.sdk.agent import REMEMBERED_ATTEMPTS


def accepting_agent() -> reach.Agent:
    agent = reach.Agent("a", addr="10.0.0.5:7001", instance_id="i-1")

    @agent.route("m")
    def later(task_id: str, payload: dict[str, Any]) -> object:
        return reach.ACCEPTED

    return agent


def deliver(agent: reach.Agent, task_id: str, seq: Any) -> int:
    status, _ = agent.invoke("m", {"task_id": task_id, "payload": {}, "attempt_seq": seq})
    return status


def test_the_latest_delivered_attempt_is_remembered() -> None:
    agent = accepting_agent()
    assert agent.accepted_attempt("t") is None
    assert deliver(agent, "t", 2) == 202
    assert agent.accepted_attempt("t") == 2
    deliver(agent, "t", 3)  # a redelivery (answered from the guard) is the one the hub awaits
    assert agent.accepted_attempt("t") == 3
    deliver(agent, "t", 1)  # never goes back
    assert agent.accepted_attempt("t") == 3
    deliver(agent, "u", True)  # not an attempt number
    assert agent.accepted_attempt("u") is None


def test_memory_of_attempts_is_bounded() -> None:
    agent = accepting_agent()
    for n in range(REMEMBERED_ATTEMPTS + 5):
        agent._remember_attempt(f"t-{n}", {"attempt_seq": 1})
    assert agent.accepted_attempt("t-0") is None
    assert agent.accepted_attempt(f"t-{REMEMBERED_ATTEMPTS + 4}") == 1
    assert len(agent._attempts) == REMEMBERED_ATTEMPTS


def test_a_report_for_a_task_never_delivered_here_fails_before_any_call() -> None:
    agent = accepting_agent()
    agent.hub.base_url = "http://127.0.0.1:9"  # would fail differently if it were called
    with pytest.raises(StaleReport, match="holds no delivery"):
        agent.report_result("t", {"x": 1})
    with pytest.raises(StaleReport):
        agent.report_progress("t", 0.5)
