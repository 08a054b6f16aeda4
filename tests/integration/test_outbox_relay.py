"""The relay never strands an attempt: a refused publish hands the row back, an unsettled
claim lapses and is claimed again, neither waiting for the overdue net (which is off behind
a backlog); an attempt written for later (a priority deferral) goes out once it is due.
Real stores, a real Celery publisher and a private redis-server that is down, then up."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from reach.hub.clock import ManualClock
from reach.hub.delivery import outbox
from reach.hub.fleet import registry
from reach.hub.intake import submission
from reach.hub.ledger import tasks as ledger
from reach.hub.settings import Settings
from reach.hub.storage.models import OutboxRow, TaskRow
from reach.wire.schemas import RegisterRequest, SubmitRequest
from reach.worker.context import HubContext
from reach.worker.publisher import DELIVERY_QUEUE
from tests.support.ports import free_port
from tests.support.private_redis import PrivateRedis

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path, free_port())  # not started: the broker is down
    yield server
    server.stop()


@pytest.fixture
def hub(
    store_url: str, broker: PrivateRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HubContext]:
    import reach.worker.app

    settings = Settings.model_validate(
        {"storage": {"database_url": store_url, "broker_url": broker.url, "home": str(tmp_path)}}
    )
    ctx = HubContext.from_settings(settings, clock=ManualClock())
    monkeypatch.setattr(reach.worker.app, "runtime", lambda: ctx)  # what the shell runs on
    yield ctx
    ctx.engine.dispose()


def relay() -> dict[str, int]:
    from reach.tasks.outbox import outbox_relay

    result: dict[str, int] = outbox_relay()
    return result


def submit(ctx: HubContext, *, premarked: bool) -> str:
    now = ctx.clock.now()

    def work(session: Any) -> str:
        registry.register(
            session,
            RegisterRequest(agent_id="a", addr="127.0.0.1:9", allow_loopback=True),
            now,
            ctx.policy,
        )
        view, _ = submission.submit(
            session,
            SubmitRequest(agent_id="a", method="m"),
            now,
            published_at=now if premarked else None,
        )
        return str(view["task_id"])

    return ctx.write(work)


def marks(ctx: HubContext, task_id: str) -> tuple[float | None, float | None]:
    with ctx.db() as s:
        out = s.scalar(select(OutboxRow.published_at).where(OutboxRow.task_id == task_id))
        last = s.scalar(select(TaskRow.last_published_at).where(TaskRow.task_id == task_id))
    return out, last


def claim_of(ctx: HubContext, task_id: str) -> float | None:
    """When a relay claimed the task's outbox row, while the claim is open."""
    with ctx.db() as s:
        return s.scalar(select(OutboxRow.claimed_at).where(OutboxRow.task_id == task_id))


def queued(broker: PrivateRedis) -> list[str]:
    """Task ids of the delivery messages waiting on the broker."""
    import json

    with broker.client() as c:
        bodies = [json.loads(m) for m in c.lrange(DELIVERY_QUEUE, 0, -1)]
    return [b["headers"]["argsrepr"] for b in bodies if "headers" in b]


def clog(broker: PrivateRedis, depth: int = 50) -> None:
    """A backlog in the delivery queue: the overdue net stands down behind it."""
    with broker.client() as c:
        c.rpush(DELIVERY_QUEUE, *[b"{}"] * depth)


def test_refused_publish_is_handed_back_and_published_once_the_broker_is_up(
    hub: HubContext, broker: PrivateRedis
) -> None:
    task_id = submit(hub, premarked=False)  # the API died before publishing
    hub.clock.advance(3)  # past the relay's grace
    result = relay()
    assert marks(hub, task_id) == (None, None)  # not marked published: still the relay's
    assert claim_of(hub, task_id) is None  # handed back: no claim left open to lapse
    assert result.get("refused") == 1
    broker.start()
    clog(broker)  # the relay does not wait for the queue to drain
    hub.clock.advance(1)
    assert relay()["published"] == 1
    assert queued(broker) == [repr([task_id, 1])]
    out, last = marks(hub, task_id)
    assert out is not None and last is not None
    hub.clock.advance(120)
    assert relay()["published"] == 0  # published once: not again
    assert len(queued(broker)) == 1


def test_refused_republish_of_an_overdue_attempt_is_handed_to_the_relay(
    hub: HubContext, broker: PrivateRedis
) -> None:
    task_id = submit(hub, premarked=True)  # marked at commit; its message was then lost
    hub.clock.advance(hub.delivery_policy.republish_grace + 1)
    result = relay()  # the overdue net takes it, the broker refuses
    assert marks(hub, task_id) == (None, None)
    assert (result["published"], result.get("refused")) == (0, 1)
    broker.start()
    clog(broker)  # behind a backlog the overdue net is off: the relay alone must take it
    hub.clock.advance(1)
    assert relay()["published"] == 1
    assert queued(broker) == [repr([task_id, 1])]


def claimed_by_a_relay_that_died(hub: HubContext, broker: PrivateRedis) -> str:
    """A task whose outbox row a relay claimed and never published (it died between the
    two), with the broker up behind a backlog: only the lapsed-claim net can take it."""
    broker.start()
    clog(broker)
    task_id = submit(hub, premarked=False)
    hub.clock.advance(3)
    with hub.transaction() as s:
        claimed = outbox.unpublished(s, hub.clock.now(), grace=2.0)
    assert [p.task_id for p in claimed] == [task_id]
    return task_id


def test_a_claim_never_settled_lapses_and_is_claimed_again(
    hub: HubContext, broker: PrivateRedis
) -> None:
    task_id = claimed_by_a_relay_that_died(hub, broker)
    assert claim_of(hub, task_id) == hub.clock.now()
    hub.clock.advance(30)
    assert relay()["published"] == 0  # within the claim's lease: maybe still publishing
    hub.clock.advance(31)
    assert relay()["published"] == 1
    assert queued(broker) == [repr([task_id, 1])]
    assert claim_of(hub, task_id) is None  # confirmed: the claim is closed
    hub.clock.advance(120)
    assert relay()["published"] == 0  # settled: never again


def test_a_lapsed_claim_of_an_attempt_that_moved_on_is_closed_not_published(
    hub: HubContext, broker: PrivateRedis
) -> None:
    task_id = claimed_by_a_relay_that_died(hub, broker)
    with hub.transaction() as s:  # meanwhile the attempt went out another way and finished
        task = s.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        assert task is not None
        task.status = "success"
    hub.clock.advance(61)
    assert relay()["published"] == 0
    assert claim_of(hub, task_id) is None  # closed, so the net never reads it again
    assert queued(broker) == []


def test_an_attempt_scheduled_for_later_is_published_when_due_and_not_before(
    hub: HubContext, broker: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    broker.start()
    task_id = submit(hub, premarked=True)  # its first attempt went out at commit
    with hub.transaction() as s:  # what a priority deferral leaves: the next attempt, unpublished
        task = s.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        assert task is not None
        task.attempt_seq = 2
        ledger.add_attempt(s, task, hub.clock.now(), available_at=hub.clock.now() + 0.5)
    hub.clock.advance(0.4)
    assert relay()["published"] == 0  # not yet due
    assert queued(broker) == []
    hub.clock.advance(0.1)  # due: no grace to wait out, as a row left behind has
    with caplog.at_level(logging.DEBUG, logger="reach.tasks.outbox"):
        result = relay()
    assert (result["published"], result["scheduled"]) == (1, 1)
    assert queued(broker) == [repr([task_id, 2])]
    # expected work, not a net's catch: no warning
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    hub.clock.advance(1)
    assert relay()["published"] == 0  # settled: not published twice
