"""Result and progress reports after a 202 are fenced like deliveries: only the attempt the
task waits on, from the instance it went to, may decide it. Anything else is a 409
``stale-report`` problem, recorded as a ``report_refused`` event, the task untouched.

Real stores (SQLite, PostgreSQL) behind the real API; the attempts are delivered to a real
HTTP endpoint that answers 202 (or fails, to make a retry).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select

from reach.hub.api import create_app
from reach.hub.clock import ManualClock
from reach.hub.delivery.pipeline import deliver_attempt
from reach.hub.delivery.transports import AgentTransport
from reach.hub.fleet import registry
from reach.hub.flow.breakers import Breakers
from reach.hub.intake import submission
from reach.hub.settings import load_settings
from reach.hub.storage.models import TaskRow
from reach.wire.schemas import RegisterRequest, SubmitRequest
from reach.worker.context import HubContext
from tests.integration.test_registry_api import PROBLEM, TYPE
from tests.support.envelope_server import EnvelopeServer
from tests.support.stores import snapshot

INSTANCE = "i-agent-1"


@pytest.fixture
def ctx(store_url: str, engine: Engine, tmp_path: Path) -> HubContext:
    settings = load_settings(
        environ={
            "REACH_DATABASE_URL": store_url,
            "REACH_HOME": str(tmp_path),
            "REACH_ROUTER__BACKOFF_BASE": "0.05",
        }
    )
    return HubContext(settings=settings, engine=engine, clock=ManualClock(start=1_800_000_000.0))


@pytest.fixture
def client(ctx: HubContext) -> Iterator[TestClient]:
    with TestClient(create_app(ctx), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def agent() -> Iterator[EnvelopeServer]:
    server = EnvelopeServer(status=202)
    yield server
    server.close()


def submitted(ctx: HubContext, agent: EnvelopeServer) -> str:
    def work(session: Any) -> str:
        now = ctx.clock.now()
        registry.register(
            session,
            RegisterRequest(
                agent_id="a",
                instance_id=INSTANCE,
                addr=agent.addr,
                allow_loopback=True,
                capabilities=[{"type": "m"}],
            ),
            now,
            ctx.policy,
        )
        view, _ = submission.submit(session, SubmitRequest(agent_id="a", method="m"), now)
        return str(view["task_id"])

    return ctx.write(work)


def deliver(ctx: HubContext, task_id: str, seq: int) -> None:
    deliver_attempt(
        ctx.db,
        task_id,
        seq,
        now=ctx.clock.now,
        policy=ctx.policy,
        dpolicy=ctx.delivery_policy,
        transport=AgentTransport(),
        rng=random.Random(1),
        breakers=Breakers(),
    )


def accepted(ctx: HubContext, agent: EnvelopeServer) -> str:
    """A task whose attempt 1 the agent (INSTANCE) answered 202: it waits on its report."""
    task_id = submitted(ctx, agent)
    deliver(ctx, task_id, 1)
    assert row(ctx, task_id)[:3] == ("executing", 1, INSTANCE)
    return task_id


def row(ctx: HubContext, task_id: str) -> tuple[Any, ...]:
    with ctx.db() as s:
        t = s.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        assert t is not None
        return (t.status, t.attempt_seq, t.instance_id, t.result, t.error, t.updated_at)


def events(client: TestClient, task_id: str) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/tasks/{task_id}/events")
    assert answer.status_code == 200, answer.text
    return list(answer.json()["events"])


def report(client: TestClient, task_id: str, kind: str = "result", **body: Any) -> Any:
    return client.post(f"/v1/tasks/{task_id}/{kind}", json=body)


FOREIGN = [
    pytest.param({"attempt_seq": 1, "instance_id": "i-stranger"}, id="another-instance"),
    pytest.param({"attempt_seq": 2, "instance_id": INSTANCE}, id="an-attempt-not-made"),
]


@pytest.mark.parametrize("kind", ["result", "progress"])
@pytest.mark.parametrize("claim", FOREIGN)
def test_a_foreign_report_is_refused_recorded_and_changes_nothing(
    ctx: HubContext,
    client: TestClient,
    agent: EnvelopeServer,
    kind: str,
    claim: dict[str, Any],
) -> None:
    task_id = accepted(ctx, agent)
    before = row(ctx, task_id)
    fields = {"code": 0} if kind == "result" else {"progress": 0.9}
    answer = report(client, task_id, kind, data={"forged": True}, **fields, **claim)
    assert answer.status_code == 409, answer.text
    assert answer.headers["content-type"] == PROBLEM
    problem = answer.json()
    assert problem["type"] == TYPE + "stale-report"
    assert (problem["attempt_seq"], problem["instance_id"]) == (
        claim["attempt_seq"],
        claim["instance_id"],
    )
    assert "current_instance_id" not in problem  # a stranger learns nothing to forge with
    assert row(ctx, task_id) == before
    refused = events(client, task_id)[-1]
    assert refused["kind"] == "report_refused"
    assert (refused["instance_id"], refused["attempt_seq"]) == (
        claim["instance_id"],
        claim["attempt_seq"],
    )
    assert refused["detail"]["report"] == kind
    assert refused["detail"]["current_instance_id"] == INSTANCE
    assert refused["detail"]["current_attempt_seq"] == 1
    # the real answer still decides the task
    good = report(client, task_id, code=0, data={"ok": 1}, attempt_seq=1, instance_id=INSTANCE)
    assert good.status_code == 200, good.text
    assert good.json() == {"task_id": task_id, "decided": True, "status": "success"}
    assert row(ctx, task_id)[:4] == ("success", 1, INSTANCE, {"ok": 1})


def test_a_report_for_an_attempt_a_retry_replaced_is_refused(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer
) -> None:
    task_id = submitted(ctx, agent)
    agent.status = 500  # attempt 1 fails transiently: attempt 2 is queued
    deliver(ctx, task_id, 1)
    agent.status = 202
    deliver(ctx, task_id, 2)
    assert row(ctx, task_id)[:3] == ("executing", 2, INSTANCE)
    stale = report(client, task_id, code=7, message="old", attempt_seq=1, instance_id=INSTANCE)
    assert stale.status_code == 409, stale.text
    assert stale.json()["type"] == TYPE + "stale-report"
    assert row(ctx, task_id)[0] == "executing"
    assert report(client, task_id, code=0, attempt_seq=2, instance_id=INSTANCE).json()["decided"]


def test_a_report_while_the_retry_is_not_dispatched_yet_is_refused(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer
) -> None:
    task_id = submitted(ctx, agent)
    agent.status = 500
    deliver(ctx, task_id, 1)
    assert row(ctx, task_id)[:2] == ("pending", 2)
    for seq in (1, 2):  # the old attempt, and a guess at the one not sent to anyone yet
        answer = report(client, task_id, code=0, attempt_seq=seq, instance_id=INSTANCE)
        assert answer.status_code == 409, answer.text
    assert row(ctx, task_id)[0] == "pending"


def test_a_failure_report_of_the_right_attempt_decides_the_task(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer
) -> None:
    task_id = accepted(ctx, agent)
    answer = report(client, task_id, code=7, message="no", attempt_seq=1, instance_id=INSTANCE)
    assert answer.json() == {"task_id": task_id, "decided": True, "status": "failed"}


def test_late_reports_after_the_end_are_recorded_and_the_first_result_wins(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer
) -> None:
    task_id = accepted(ctx, agent)
    assert report(client, task_id, data=1, attempt_seq=1, instance_id=INSTANCE).json()["decided"]
    for claim in (
        {"attempt_seq": 1, "instance_id": INSTANCE},
        {"attempt_seq": 1, "instance_id": "x"},
    ):
        late = report(client, task_id, data=2, **claim)
        assert late.status_code == 200, late.text
        assert late.json() == {"task_id": task_id, "decided": False, "status": "success"}
    assert row(ctx, task_id)[3] == 1
    assert [e["kind"] for e in events(client, task_id)][-3:] == [
        "terminal_success",
        "duplicate_result",
        "duplicate_result",
    ]


@pytest.mark.parametrize("kind", ["result", "progress"])
@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"code": 0}, id="names-nothing"),
        pytest.param({"code": 0, "attempt_seq": 1}, id="no-instance"),
        pytest.param({"code": 0, "instance_id": INSTANCE}, id="no-attempt"),
        pytest.param({"code": 0, "attempt_seq": 0, "instance_id": INSTANCE}, id="attempt-0"),
    ],
)
def test_a_report_that_does_not_name_its_attempt_and_instance_is_invalid(
    ctx: HubContext,
    client: TestClient,
    agent: EnvelopeServer,
    engine: Engine,
    kind: str,
    body: dict[str, Any],
) -> None:
    task_id = accepted(ctx, agent)
    before = snapshot(engine)
    if kind == "progress":
        body = {k: v for k, v in body.items() if k != "code"} | {"progress": 0.5}
    answer = report(client, task_id, kind, **body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["type"] == TYPE + "invalid-task-request"
    assert snapshot(engine) == before


def test_progress_of_the_right_attempt_is_recorded_without_the_claim_fields(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer
) -> None:
    task_id = accepted(ctx, agent)
    answer = report(
        client, task_id, "progress", progress=0.5, message="half", attempt_seq=1,
        instance_id=INSTANCE,
    )  # fmt: skip
    assert answer.json() == {"task_id": task_id, "recorded": True}
    progress = events(client, task_id)[-1]
    assert (progress["kind"], progress["detail"]) == (
        "progress",
        {"progress": 0.5, "message": "half"},
    )


def deadline_of(ctx: HubContext, task_id: str) -> float:
    with ctx.db() as s:
        value = s.scalar(select(TaskRow.deadline).where(TaskRow.task_id == task_id))
        assert value is not None
        return float(value)


@pytest.mark.parametrize("kind", ["keepalive", "progress"])
def test_word_from_the_agent_moves_the_watchdog_deadline(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer, kind: str
) -> None:
    """A handler that runs longer than any timeout stays alive while its agent says so:
    each keepalive (or progress) gives the task ``timeout`` + grace again from now. A
    keepalive records nothing; progress is an event as before."""
    task_id = accepted(ctx, agent)
    first = deadline_of(ctx, task_id)
    assert first == pytest.approx(ctx.clock.now() + 30.0 + 30.0)  # timeout 30 s + grace 30 s
    ctx.clock.advance(50.0)  # type: ignore[attr-defined]
    body = {"keepalive": True} if kind == "keepalive" else {"progress": 0.5}
    answer = report(client, task_id, "progress", attempt_seq=1, instance_id=INSTANCE, **body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["recorded"] is (kind == "progress")
    assert deadline_of(ctx, task_id) == pytest.approx(ctx.clock.now() + 60.0)
    progress = [e for e in events(client, task_id) if e["kind"] == "progress"]
    assert len(progress) == (0 if kind == "keepalive" else 1)


def test_a_keepalive_is_fenced_and_carries_nothing_else(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer
) -> None:
    task_id = accepted(ctx, agent)
    before = deadline_of(ctx, task_id)
    ctx.clock.advance(20.0)  # type: ignore[attr-defined]
    stale = report(client, task_id, "progress", attempt_seq=1, instance_id="i-x", keepalive=True)
    assert stale.status_code == 409, stale.text
    assert deadline_of(ctx, task_id) == before  # a stranger cannot keep a task alive
    loaded = report(
        client, task_id, "progress", attempt_seq=1, instance_id=INSTANCE, keepalive=True,
        message="hi",
    )  # fmt: skip
    assert loaded.status_code == 422, loaded.text
    assert "keepalive carries no" in loaded.text


def test_a_transient_failure_report_retries_the_task(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer
) -> None:
    """An accepted handler that failed in a way a retry may mend says so (``transient``):
    the hub retries it with backoff, as for a 5xx answer, instead of failing the task."""
    task_id = accepted(ctx, agent)
    answer = report(
        client, task_id, attempt_seq=1, instance_id=INSTANCE, code=-1,
        message="RuntimeError: model overloaded", transient=True,
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"task_id": task_id, "decided": False, "status": "pending"}
    status, seq, _, _, error, _ = row(ctx, task_id)
    assert (status, seq) == ("pending", 2)
    assert error["kind"] == "agent_error" and "model overloaded" in error["message"]
    retry = [e for e in events(client, task_id) if e["kind"] == "retry"]
    assert retry and retry[-1]["detail"]["reason"] == "reported_failure"
    # the retry is delivered like any attempt; a second report for attempt 1 is stale now
    again = report(
        client, task_id, attempt_seq=1, instance_id=INSTANCE, code=-1, message="x",
        transient=True,
    )  # fmt: skip
    assert again.status_code == 409, again.text


def test_transient_reports_past_the_retries_dead_letter_the_task(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer
) -> None:
    task_id = accepted(ctx, agent)
    for seq in range(1, ctx.delivery_policy.retry.max_retry + 2):
        if seq > 1:
            deliver(ctx, task_id, seq)  # the retry, answered 202 again
        answer = report(
            client, task_id, attempt_seq=seq, instance_id=INSTANCE, code=-1, message="boom",
            transient=True,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
    assert row(ctx, task_id)[0] == "dead"


def test_a_transient_report_must_be_a_failure(
    ctx: HubContext, client: TestClient, agent: EnvelopeServer
) -> None:
    task_id = accepted(ctx, agent)
    answer = report(client, task_id, attempt_seq=1, instance_id=INSTANCE, code=0, transient=True)
    assert answer.status_code == 422, answer.text
    assert row(ctx, task_id)[0] == "executing"
