"""Submit marks its first attempt published in the same transaction and publishes right
after commit; when the broker refuses, the mark is taken back so the relay publishes it.
Real stores and a real Celery publisher, aimed at a broker that is down or up."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from reach.hub.delivery import outbox
from reach.hub.fleet import registry
from reach.hub.intake import submission
from reach.hub.ledger.tasks import Publish
from reach.hub.settings import Settings
from reach.hub.storage.models import OutboxRow, TaskRow
from reach.wire.schemas import RegisterRequest, SubmitRequest
from reach.worker.context import HubContext
from tests.support.ports import free_port


def _ctx(store_url: str, broker: str, home: Path) -> HubContext:
    settings = Settings.model_validate(
        {"storage": {"database_url": store_url, "broker_url": broker, "home": str(home)}}
    )
    return HubContext.from_settings(settings)


def _submit(ctx: HubContext) -> str:
    now = ctx.clock.now()

    def work(session: object) -> str:
        registry.register(
            session,  # type: ignore[arg-type]
            RegisterRequest(agent_id="a", addr="127.0.0.1:9", allow_loopback=True),
            now,
            ctx.policy,
        )
        view, created = submission.submit(
            session,  # type: ignore[arg-type]
            SubmitRequest(agent_id="a", method="m"),
            now,
            published_at=now,
        )
        assert created
        return str(view["task_id"])

    return ctx.write(work)


def _marks(ctx: HubContext, task_id: str) -> tuple[float | None, float | None]:
    with ctx.db() as s:
        out = s.scalar(select(OutboxRow.published_at).where(OutboxRow.task_id == task_id))
        last = s.scalar(select(TaskRow.last_published_at).where(TaskRow.task_id == task_id))
    return out, last


def test_refused_publish_is_unmarked_and_left_to_the_relay(store_url: str, tmp_path: Path) -> None:
    ctx = _ctx(store_url, f"redis://127.0.0.1:{free_port()}/0", tmp_path)  # nobody listens
    task_id = _submit(ctx)
    assert all(_marks(ctx, task_id))  # marked at commit, optimistically
    assert ctx.publish_premarked(Publish(task_id, 1, 0.0)) is False
    assert _marks(ctx, task_id) == (None, None)
    with ctx.transaction() as s:
        relayed = outbox.unpublished(s, ctx.clock.now() + 5, grace=2.0)
    assert [(p.task_id, p.attempt_seq) for p in relayed] == [(task_id, 1)]
    ctx.engine.dispose()


@pytest.mark.redis
def test_accepted_publish_keeps_the_mark(store_url: str, tmp_path: Path, redis_db: str) -> None:
    ctx = _ctx(store_url, redis_db, tmp_path)
    task_id = _submit(ctx)
    assert ctx.publish_premarked(Publish(task_id, 1, 0.0)) is True
    assert all(_marks(ctx, task_id))
    with ctx.transaction() as s:  # nothing for the relay
        assert outbox.unpublished(s, ctx.clock.now() + 5, grace=2.0) == []
    ctx.engine.dispose()
