"""`StubHub` as the hub of caller code: ``reach.send``, ``reach.wait_for_result``,
``reach.broadcast`` and ``reach.aio`` answered by fake agents in this process."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

import reach
import reach.aio
from reach.testing import StubHub


@pytest.fixture
def hub() -> Any:
    with StubHub() as stub:
        yield stub


def classifier(hub: StubHub, agent_id: str = "classifier-1", **options: Any) -> reach.Agent:
    agent = hub.agent(agent_id, tags=["nlp"], capabilities=[{"type": "text.classify"}], **options)

    @agent.route("text.classify")
    def classify(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        return {"label": "spam" if "win" in payload["text"] else "ham", "by": agent_id}

    return agent


# What a user tests: their own code, which reaches an agent through the hub.
def label_of(text: str, hub_url: str | None = None) -> str:
    sub = reach.send(capability="text.classify", method="text.classify",
                     payload={"text": text}, hub=hub_url)  # fmt: skip
    return str(reach.wait_for_result(sub.task_id, timeout=10, hub=hub_url).data["label"])


async def alabel_of(text: str, hub_url: str) -> str:
    sub = await reach.aio.send(tags=["nlp"], method="text.classify", payload={"text": text},
                               hub=hub_url)  # fmt: skip
    result = await reach.aio.wait_for_result(sub.task_id, timeout=10, hub=hub_url)
    return str(result.data["label"])


def test_caller_code_against_the_stub(hub: StubHub) -> None:
    classifier(hub)
    assert label_of("win a prize", hub.url) == "spam"
    assert label_of("see you at noon", hub.url) == "ham"
    assert [t["status"] for t in hub.tasks()] == ["success", "success"]


def test_caller_code_that_names_no_hub(hub: StubHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REACH_HUB_URL", hub.url)
    classifier(hub)
    assert label_of("win big") == "spam"


def test_async_caller_code(hub: StubHub) -> None:
    classifier(hub)
    assert asyncio.run(alabel_of("win now", hub.url)) == "spam"


def test_a_send_nobody_matches(hub: StubHub) -> None:
    classifier(hub)
    with pytest.raises(reach.NoSuitableAgent):
        reach.send(agent_id="nobody", method="text.classify", hub=hub.url)
    with pytest.raises(reach.SemanticMatchingOff):
        reach.send(intent="is this spam?", hub=hub.url)


def test_a_business_error_reaches_the_caller(hub: StubHub) -> None:
    agent = hub.agent("strict")

    @agent.route("doc.check")
    def check(task_id: str, payload: dict[str, Any]) -> None:
        raise reach.BusinessError(3, "missing signature")

    sub = reach.send(agent_id="strict", method="doc.check", hub=hub.url)
    with pytest.raises(reach.BusinessError) as caught:
        reach.wait_for_result(sub.task_id, timeout=10, hub=hub.url)
    assert (caught.value.code, caught.value.message) == (3, "missing signature")


def test_a_transient_failure_is_retried_then_dead_lettered() -> None:
    with StubHub(max_retry=2) as hub:
        agent = hub.agent("flaky")
        calls: list[int] = []

        @agent.route("job.run")
        def run(task_id: str, payload: dict[str, Any]) -> str:
            calls.append(1)
            if len(calls) < payload["succeed_on"]:
                raise RuntimeError("not yet")
            return "done"

        sub = reach.send(agent_id="flaky", method="job.run", payload={"succeed_on": 2}, hub=hub.url)
        result = reach.wait_for_result(sub.task_id, timeout=10, hub=hub.url)
        assert (result.data, result.attempt_seq) == ("done", 2)

        calls.clear()
        sub = reach.send(agent_id="flaky", method="job.run", payload={"succeed_on": 9}, hub=hub.url)
        with pytest.raises(reach.DeadLettered, match="2 retries exhausted"):
            reach.wait_for_result(sub.task_id, timeout=10, hub=hub.url)
        assert len(calls) == 3


def test_a_slow_agent_reports_progress_the_caller_can_read(hub: StubHub) -> None:
    agent = hub.agent("slow", accept_after=0.05)

    @agent.route("job.long")
    async def long(task_id: str, payload: dict[str, Any]) -> str:
        await reach.aio.report_progress(
            task_id, 0.5, "halfway",
            attempt_seq=agent.accepted_attempt(task_id), instance_id=agent.instance_id,
        )  # fmt: skip
        return "finished"

    sub = reach.send(agent_id="slow", method="job.long", hub=hub.url)
    assert reach.wait_for_result(sub.task_id, timeout=10, hub=hub.url).data == "finished"
    assert hub.task(sub.task_id)["progress"] == [
        {"progress": 0.5, "message": "halfway", "data": None}
    ]


def test_a_handler_that_reaches_another_agent(hub: StubHub) -> None:
    classifier(hub)
    router = hub.agent("router")

    @router.route("mail.triage")
    def triage(task_id: str, payload: dict[str, Any]) -> str:
        # inside a handler the agent's hub (the stub) and the trace are the defaults
        sub = reach.send(agent_id="classifier-1", method="text.classify", payload=payload)
        label = reach.wait_for_result(sub.task_id, timeout=10).data["label"]
        return "junk" if label == "spam" else "inbox"

    sub = reach.send(agent_id="router", method="mail.triage", payload={"text": "win"},
                     hub=hub.url)  # fmt: skip
    assert reach.wait_for_result(sub.task_id, timeout=10, hub=hub.url).data == "junk"
    nested = next(t for t in hub.tasks() if t["method"] == "text.classify")
    assert nested["trace"]["parent_task_id"] == sub.task_id
    assert nested["trace"]["path"] == ["router"]


def test_a_broadcast(hub: StubHub) -> None:
    classifier(hub, "classifier-1")
    classifier(hub, "classifier-2")
    cast = reach.broadcast(method="text.classify", tags=["nlp"], payload={"text": "hi"},
                           timeout=10, hub=hub.url)  # fmt: skip
    assert cast.complete and cast.succeeded == 2
    assert sorted(d["by"] for d in cast.data) == ["classifier-1", "classifier-2"]


def test_an_async_broadcast(hub: StubHub) -> None:
    classifier(hub, "classifier-1")
    cast = asyncio.run(reach.aio.broadcast(method="text.classify", capability="text.classify",
                                     payload={"text": "win"}, timeout=10, hub=hub.url))  # fmt: skip
    assert cast.data == [{"label": "spam", "by": "classifier-1"}]


def test_resending_a_task_id_returns_the_same_task(hub: StubHub) -> None:
    classifier(hub)
    first = reach.send(agent_id="classifier-1", method="text.classify",
                       payload={"text": "a"}, task_id="mine-1", hub=hub.url)  # fmt: skip
    again = reach.send(agent_id="classifier-1", method="text.classify",
                       payload={"text": "a"}, task_id="mine-1", hub=hub.url)  # fmt: skip
    assert first.task_id == again.task_id == "mine-1"
    assert len(hub.tasks()) == 1


def test_the_kit_imports_nothing_of_the_hub() -> None:
    code = (
        "import sys, reach.testing\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'celery', 'kombu')"
        " or m.startswith('reach.hub') or m.startswith('reach.worker')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
