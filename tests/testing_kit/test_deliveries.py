"""`StubHub.deliver`: an agent's handlers run through its real ASGI app with hub-signed
deliveries, and the kit reports what the hub would record."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import reach
from reach.testing import HubKey, StubHub


def make_agent(**options: Any) -> reach.Agent:
    """An agent as an author writes it: its own addr and hub, which the kit replaces."""
    agent = reach.Agent(
        "summarizer",
        tags=["text"],
        addr="http://127.0.0.1:7001",
        hub="http://127.0.0.1:1",  # nothing there: every call must go to the stub
        allow_loopback=True,
        **options,
    )
    ran: list[str] = []

    @agent.route("text.count")
    def count(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        ran.append(task_id)
        agent.report_progress(task_id, 0.5, "counting")
        agent.report_progress(task_id, 1.0, "counted")
        return {"words": len(payload["text"].split())}

    @agent.route("text.think")
    async def think(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        ran.append(task_id)
        await asyncio.sleep(payload.get("seconds", 0))
        return {"thought": payload["about"]}

    @agent.route("text.refuse")
    def refuse(task_id: str, payload: dict[str, Any]) -> None:
        raise reach.BusinessError(42, "too long to read")

    @agent.route("text.crash")
    def crash(task_id: str, payload: dict[str, Any]) -> None:
        raise RuntimeError("disk on fire")

    agent.ran = ran  # type: ignore[attr-defined]
    return agent


@pytest.fixture
def hub() -> Any:
    with StubHub() as stub:
        yield stub


def test_a_sync_handler_and_its_progress_reports(hub: StubHub) -> None:
    agent = make_agent()
    run = hub.deliver(agent, "text.count", {"text": "one two three"})
    assert (run.http_status, run.outcome, run.status) == (200, "success", "success")
    assert run.result == {"words": 3} == run.value()
    assert [(p.progress, p.message) for p in run.progress] == [(0.5, "counting"), (1.0, "counted")]
    assert run.task["agent_id"] == "summarizer" and run.task["instance_id"] == agent.instance_id


def test_an_async_handler(hub: StubHub) -> None:
    run = hub.deliver(make_agent(), "text.think", {"about": "tea"})
    assert (run.outcome, run.status, run.result) == ("success", "success", {"thought": "tea"})


def test_a_long_handler_is_answered_202_and_reports_its_result(hub: StubHub) -> None:
    agent = make_agent(accept_after=0.1)
    run = hub.deliver(agent, "text.think", {"about": "soup", "seconds": 0.5})
    assert (run.http_status, run.outcome) == (202, "accepted")
    assert (run.status, run.result) == ("success", {"thought": "soup"})  # the later report


def test_adeliver_from_an_event_loop(hub: StubHub) -> None:
    run = asyncio.run(hub.adeliver(make_agent(), "text.think", {"about": "loops"}))
    assert run.result == {"thought": "loops"}


def test_a_business_error_fails_the_task(hub: StubHub) -> None:
    run = hub.deliver(make_agent(), "text.refuse", {})
    assert (run.outcome, run.status) == ("business_error", "failed")
    assert run.error is not None and (run.error["code"], run.error["message"]) == (
        42,
        "too long to read",
    )
    with pytest.raises(reach.BusinessError) as caught:
        run.value()
    assert caught.value.code == 42


def test_a_crash_is_a_transient_failure_the_hub_retries(hub: StubHub) -> None:
    run = hub.deliver(make_agent(), "text.crash", {})
    assert (run.http_status, run.outcome, run.status) == (500, "transient", "pending")
    assert run.error is not None and "RuntimeError" in run.error["message"]
    with pytest.raises(reach.ReachError, match="pending"):
        run.value()


def test_an_unknown_method_is_a_business_error(hub: StubHub) -> None:
    run = hub.deliver(make_agent(), "text.translate", {})
    assert (run.http_status, run.status) == (404, "failed")


def test_a_forged_token_is_refused_and_the_handler_never_runs(hub: StubHub) -> None:
    agent = make_agent()
    forged = hub.deliver(agent, "text.count", {"text": "x"}, key=HubKey(), kid=hub.key.kid)
    assert (forged.http_status, forged.refused, forged.status) == (401, True, "failed")
    assert forged.error is not None
    assert forged.error["message"] == (
        "agent refused the hub's reach token: reach token signature does not verify"
    )
    assert agent.ran == []  # type: ignore[attr-defined]


def test_a_token_for_another_agent_is_refused(hub: StubHub) -> None:
    agent = make_agent()
    run = hub.deliver(agent, "text.count", {"text": "x"}, audience="translator")
    assert run.refused
    assert run.error is not None and "meant for another agent" in run.error["message"]
    assert agent.ran == []  # type: ignore[attr-defined]


def test_a_delivery_without_a_token_is_refused(hub: StubHub) -> None:
    run = hub.deliver(make_agent(), "text.count", {"text": "x"}, authorization=None)
    assert run.refused and run.error is not None
    assert "no reach token" in run.error["message"]


def test_a_strangers_key_cannot_be_checked_yet_and_is_retried(hub: StubHub) -> None:
    """As in production: a key id the agent does not know makes it fetch the hub's keys,
    at most every few seconds; until then the hub is told to retry (503)."""
    agent = make_agent()
    assert hub.deliver(agent, "text.count", {"text": "x"}).status == "success"
    run = hub.deliver(agent, "text.count", {"text": "x"}, key=HubKey())
    assert (run.http_status, run.status) == (503, "pending")
    assert agent.ran and len(agent.ran) == 1  # type: ignore[attr-defined]


def test_a_redelivery_is_answered_from_the_agents_dedup_guard(hub: StubHub) -> None:
    agent = make_agent()
    first = hub.deliver(agent, "text.count", {"text": "a b"}, task_id="t-1")
    again = hub.deliver(agent, "text.count", {"text": "a b"}, task_id="t-1", attempt_seq=2)
    assert (first.result, again.result, again.attempt_seq) == ({"words": 2}, {"words": 2}, 2)
    assert agent.ran == ["t-1"]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="later attempt_seq"):
        hub.deliver(agent, "text.count", {"text": "a b"}, task_id="t-1", attempt_seq=2)


def test_an_agent_of_the_stub_serves_concurrent_deliveries(hub: StubHub) -> None:
    agent = hub.agent("pool", max_concurrency=4)
    gate = threading.Barrier(3, timeout=5)

    @agent.route("work.wait")
    def wait(task_id: str, payload: dict[str, Any]) -> str:
        gate.wait()  # three handlers at once, or none of them returns
        return task_id

    runs: list[reach.testing.Delivered] = []
    threads = [
        threading.Thread(target=lambda: runs.append(hub.deliver(agent, "work.wait")))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(r.result for r in runs) == sorted(r.task_id for r in runs)
