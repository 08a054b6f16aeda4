"""The Redis broker after its connection is gone: a late ack or a second close is a
connection error, which Celery's ack path and teardown handle, not an AttributeError that
stops the worker. Real Redis; the whole restart is tests/faults/test_delivery_faults.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue

from reach.hub.settings import Settings
from reach.worker.factory import REDIS_TRANSPORT, celery_config

pytestmark = pytest.mark.redis


@pytest.fixture
def unacked(redis_db: str) -> Iterator[tuple[Connection, Any]]:
    """A message taken from the queue and not yet acked, on a live connection."""
    conn = Connection(redis_db, transport=REDIS_TRANSPORT)
    queue = Queue("reach-test", Exchange("reach-test"), routing_key="reach-test")
    with conn.Producer() as producer:
        producer.publish(
            {"n": 1}, exchange=queue.exchange, routing_key="reach-test", declare=[queue]
        )
    message = queue(conn.default_channel).get(no_ack=False)
    assert message is not None
    try:
        yield conn, message
    finally:
        conn.release()


def test_a_channel_of_a_collected_connection_raises_a_connection_error(
    unacked: tuple[Connection, Any],
) -> None:
    """Every Redis client a channel builds starts from its connection parameters: the
    second close and the late ack of a lost connection both end here."""
    conn, message = unacked
    channel = message.channel
    conn.collect()  # what Celery does first with a connection it lost
    with pytest.raises(conn.connection_errors) as raised:
        channel._connparams()
    assert not isinstance(raised.value, AttributeError)


def test_a_live_channel_still_builds_its_clients(unacked: tuple[Connection, Any]) -> None:
    _, message = unacked
    params = message.channel._connparams()
    assert params["host"] == "127.0.0.1"
    message.ack()  # a client from those parameters reaches Redis


def test_redis_urls_use_the_reach_transport() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://127.0.0.1:6380/0"):
        settings = Settings.model_validate({"storage": {"broker_url": url}})
        assert celery_config(settings)["broker_transport"] == REDIS_TRANSPORT
