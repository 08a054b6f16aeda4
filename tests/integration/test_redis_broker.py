"""The Redis broker after its connection is gone: a late ack or a second close is a
connection error, which Celery's ack path and teardown handle, not an AttributeError that
stops the worker. Real Redis; the whole restart is tests/faults/test_delivery_faults.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from flower.utils.broker import Broker
from flower.utils.broker import Redis as FlowerRedis
from kombu import Connection, Exchange, Queue

from reach.hub.settings import Settings
from reach.worker import redis_broker
from reach.worker.factory import create_celery

pytestmark = pytest.mark.redis


@pytest.fixture
def unacked(redis_db: str) -> Iterator[tuple[Connection, Any]]:
    """A message taken from the queue and not yet acked, on a live connection."""
    redis_broker.install()
    conn = Connection(redis_db)
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
    assert isinstance(channel, redis_broker.Channel)
    conn.collect()  # what Celery does first with a connection it lost
    with pytest.raises(conn.connection_errors):
        channel._connparams()


def test_a_live_channel_still_builds_its_clients(unacked: tuple[Connection, Any]) -> None:
    _, message = unacked
    params = message.channel._connparams()
    assert params["host"] == "127.0.0.1"
    message.ack()  # a client from those parameters reaches Redis


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/0", "rediss://127.0.0.1:6380/0"])
def test_the_hub_app_uses_it_and_the_url_keeps_its_scheme(url: str) -> None:
    """The scheme is kept: kombu's TLS default for ``rediss`` and Flower's broker page
    (it picks its client by scheme) work as with kombu's own transport."""
    app = create_celery(Settings.model_validate({"storage": {"broker_url": url}}))
    conn = app.connection()
    assert isinstance(conn.transport, redis_broker.Transport)
    assert urlparse(conn.as_uri()).scheme == urlparse(url).scheme
    if url.startswith("rediss"):
        assert conn.ssl  # kombu's default for a rediss URL without options
    else:
        assert isinstance(Broker(conn.as_uri(include_password=True)), FlowerRedis)
