"""The delivery queues' depth on Redis, which gates the overdue net (reach.hub.delivery.outbox).

On Redis an empty queue is no key at all, and a passive declare of it is refused: the
depth read must take that as 0, not as "the broker cannot say". Before, an empty online
queue made the whole reading unknown, which turned the net on behind any background
backlog: every background attempt waiting its turn for more than the grace was
republished, adding copies to the backlog that delayed it. Real Redis, no worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from reach.core.flow.priority import BACKGROUND_QUEUE, ONLINE_QUEUE
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.ledger.tasks import Publish
from reach.hub.settings import load_settings
from reach.worker.factory import create_celery
from reach.worker.publisher import Publisher

pytestmark = pytest.mark.redis


@contextmanager
def _publisher(broker: str, home: Path) -> Iterator[Publisher]:
    environ = {"REACH_BROKER_URL": broker, "REACH_HOME": str(home)}
    app = create_celery(load_settings(environ=environ))
    try:
        yield Publisher(app)
    finally:
        app.close()


@pytest.fixture
def publisher(redis_db: str, tmp_path: Path) -> Iterator[Publisher]:
    with _publisher(redis_db, tmp_path) as publisher:
        yield publisher


def _publish(publisher: Publisher, queue: str, count: int) -> None:
    for n in range(count):
        assert publisher.publish(Publish(f"{queue}-{n}", 1, 0.0, queue))


@pytest.mark.parametrize(
    ("online", "background"),
    [(0, 0), (0, 3), (2, 0), (2, 3)],
)
def test_backlog_counts_both_queues_and_an_empty_one_as_zero(
    publisher: Publisher, online: int, background: int
) -> None:
    _publish(publisher, ONLINE_QUEUE, online)
    _publish(publisher, BACKGROUND_QUEUE, background)
    assert publisher.backlog() == online + background


def test_a_background_backlog_behind_an_empty_online_queue_holds_the_net_off(
    publisher: Publisher,
) -> None:
    limit = DeliveryPolicy.from_settings(load_settings(environ={})).republish_backlog
    _publish(publisher, BACKGROUND_QUEUE, limit + 1)
    backlog = publisher.backlog()
    assert backlog is not None and backlog > limit


def test_backlog_of_an_unreachable_broker_is_unknown(tmp_path: Path) -> None:
    with _publisher("redis://127.0.0.1:1/0", tmp_path) as publisher:
        assert publisher.backlog() is None


def test_a_published_attempt_carries_its_traceparent_in_the_message_headers(
    publisher: Publisher, redis_db: str
) -> None:
    """The task's trace context rides in Celery's message headers (W3C on every hop); an
    attempt with none carries no such header."""
    import json

    import redis

    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert publisher.publish(Publish("traced", 1, 0.0, ONLINE_QUEUE, tp))
    assert publisher.publish(Publish("untraced", 1, 0.0, ONLINE_QUEUE))
    client = redis.Redis.from_url(redis_db)
    try:
        messages = [json.loads(m) for m in client.lrange(ONLINE_QUEUE, 0, -1)]
    finally:
        client.close()
    headers = {m["headers"]["argsrepr"]: m["headers"] for m in messages}
    assert sorted(headers) == ["['traced', 1]", "['untraced', 1]"]
    assert headers["['traced', 1]"]["traceparent"] == tp
    assert "traceparent" not in headers["['untraced', 1]"]
