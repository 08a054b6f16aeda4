"""The Redis broker: kombu's Redis transport, whose channels fail like a lost connection
once their connection is gone.

Celery 5.7 tears a lost broker connection down as ``collect()`` and then ``close()``.
When Redis goes away, the first pass fails inside the channel's close (its pending BRPOP
cannot be drained from a dead server) and leaves the channel open, while ``collect()``
detaches the transport from its connection. From then on everything on that channel that
needs a Redis client (the second close restoring unacked messages, a task that finishes
after the reconnect acking its message) dies in kombu's ``_connparams`` with
``AttributeError: 'NoneType' object has no attribute 'hostname'``. Celery's teardown and
its ack path ignore connection errors, not that one: the worker logged "Unrecoverable
error" and exited on every Redis restart that caught a message unacked
(tests/faults/test_delivery_faults.py).

Here such a channel raises a Redis ``ConnectionError`` instead, which both paths handle:
the teardown goes on to reconnect, and the late ack is logged as not done. Nothing is lost
by it: the message is still in Redis's unacked index (restored after the visibility
timeout; the hub's claim keeps a finished task from running twice) or, after a restart
without persistence, gone with Redis and republished by the hub's overdue scan.

`reach.worker.broker_schemes.install` makes kombu's ``redis`` and ``rediss`` schemes
resolve to this transport, by name: this module (and redis-py) loads with the first Redis
connection.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

from reach.worker.broker_schemes import SCHEMES, install

__all__ = ["SCHEMES", "Channel", "Transport", "install"]


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            raise RedisConnectionError("this channel's broker connection is closed")
        return super()._connparams(asynchronous=asynchronous)  # type: ignore[no-untyped-call]


class Transport(kombu_redis.Transport):
    Channel = Channel
