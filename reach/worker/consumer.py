"""The worker's broker consumer: back on the broker within a second of its return.

Celery reconnects a worker that lost its broker through kombu's default schedule, which
waits 2, 4, 6 … up to 30 s between tries: after a RabbitMQ or Redis restart a worker sat
idle for up to 30 s with the broker long back (measured 9.6 s after a 10 s outage in
tests/faults/test_rabbitmq.py). Here every try is one ``RECONNECT_INTERVAL_S`` apart;
``broker_connection_max_retries`` is unbounded (factory.py), so a worker outlives any
outage instead of giving up after its hundredth try.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

RECONNECT_INTERVAL_S = 1.0


class Consumer(CeleryConsumer):  # type: ignore[misc]
    """Celery's consumer with a flat reconnect interval (``worker_consumer`` setting)."""

    def ensure_connected(self, conn: Any) -> Any:
        # Celery passes no intervals to ensure_connection; give this connection ours
        conn.ensure_connection = partial(
            conn.ensure_connection,
            interval_start=0,
            interval_step=RECONNECT_INTERVAL_S,
            interval_max=RECONNECT_INTERVAL_S,
        )
        return super().ensure_connected(conn)
