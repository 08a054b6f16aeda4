"""The hub's dispatcher on Celery (`reach.hub.dispatch.Dispatcher`): delivery attempts,
DAG runs, broadcasts, callbacks and approval webhooks, sent to the broker.

A failed publish is not an error for the caller: the attempt is already durable in the
outbox, and the relay publishes it once the broker answers again.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.exceptions import ChannelError

from reach.core.flow.priority import BACKGROUND_QUEUE, ONLINE_QUEUE
from reach.core.orchestration.dags import Plan
from reach.hub.ledger.tasks import Publish
from reach.hub.notify.approval_webhook import WEBHOOK_TASK
from reach.hub.notify.callbacks import CALLBACK_TASK
from reach.hub.settings import Settings
from reach.worker.canvas import canvas, fan_out
from reach.worker.factory import RESULT_EXPIRES_S, create_celery

log = logging.getLogger("reach.worker.publisher")
DELIVER_TASK = "reach.deliver"
DELIVERY_QUEUE = ONLINE_QUEUE  # online attempts, sweeps, webhooks: what every worker consumes
NOT_FOUND = "404"  # a passive declare's answer for a queue that does not exist (AMQP and
# kombu's virtual transports alike; the latter give the code as a string)
_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}


class Publisher:
    """Implements `reach.hub.dispatch.Dispatcher` on one Celery app."""

    # chord state lives as long as Celery's results (``result_expires``)
    run_lifetime_s: float = RESULT_EXPIRES_S

    def __init__(self, celery_app: Any) -> None:
        self.app = celery_app

    @classmethod
    def from_settings(cls, settings: Settings) -> Publisher:
        """The dispatcher of a hub process: a Celery app of its own, on the settings'
        broker (`reach.hub.dispatch.DispatcherFactory`)."""
        return cls(create_celery(settings))

    def publish(self, item: Publish) -> bool:
        try:
            self.app.send_task(
                DELIVER_TASK,
                args=[item.task_id, item.attempt_seq],
                countdown=item.delay if item.delay > 0 else None,
                queue=item.queue,  # the task's priority: online or background
                # W3C trace context in the message's headers (Celery's own propagation)
                headers={"traceparent": item.traceparent} if item.traceparent else None,
                # nobody waits on a Celery result of a delivery (the store has the outcome);
                # without this every publish subscribes to a result channel on Redis
                ignore_result=True,
                reply_to=DELIVERY_QUEUE,
                retry=True,
                retry_policy=_RETRY_POLICY,
            )
        except Exception as exc:  # any broker error: the outbox keeps the attempt
            log.warning(
                "publish of %s#%d deferred to the relay: %s", item.task_id, item.attempt_seq, exc
            )
            return False
        return True

    def publish_webhook(self, approval_id: str) -> bool:
        """Queue one approval's webhook (``reach.hub.notify.approval_webhook``); False if
        refused."""
        try:
            self.app.send_task(
                WEBHOOK_TASK,
                args=[approval_id],
                queue=DELIVERY_QUEUE,
                ignore_result=True,
                reply_to=DELIVERY_QUEUE,
                retry=True,
                retry_policy=_RETRY_POLICY,
            )
        except Exception as exc:
            log.warning("webhook of approval %s not queued: %s", approval_id, exc)
            return False
        return True

    def start_run(self, run_id: str, plan: Plan, from_level: int = 0) -> None:
        """Start (or resume) a DAG run's canvas; the broker's refusal raises."""
        canvas(self.app, run_id, plan, from_level).apply_async()

    def fan_out(self, task_ids: list[str]) -> None:
        """A broadcast's first attempts as one group; the broker's refusal raises."""
        fan_out(self.app, task_ids).apply_async()

    def send_callback(self, callback_id: int, countdown: float | None = None) -> None:
        """Queue one callback (``reach.hub.notify.callbacks``); the broker's refusal raises
        (the row stays due and the beat's net publishes it again)."""
        self.app.send_task(
            CALLBACK_TASK,
            args=[callback_id],
            countdown=countdown,
            queue="reach",
            ignore_result=True,
            reply_to="reach",
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2},
        )

    def backlog(self) -> int | None:
        """Messages waiting in the delivery queues (online and background); None if the
        broker cannot say. A queue that does not exist counts as empty: on Redis that is
        every empty queue (an empty list is no key), on AMQP one nobody declared yet.

        Only asked of Redis and AMQP brokers: the embedded transport would open a new
        connection to its SQLite file on every relay tick, beside the workers' own."""
        if not str(self.app.conf.broker_url or "").startswith(("redis", "amqp", "pyamqp")):
            return None
        try:
            with self.app.connection_for_read() as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, timeout=1)
                return _depth(conn, DELIVERY_QUEUE) + _depth(conn, BACKGROUND_QUEUE)
        except Exception as exc:
            log.debug("delivery queue depth unknown: %s", exc)
            return None


def _depth(conn: Any, queue: str) -> int:
    """One queue's depth (0 if it does not exist), on a channel of its own: a refused
    passive declare closes its channel."""
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue=queue, passive=True).message_count)
    except ChannelError as exc:
        if str(getattr(exc, "reply_code", "")) == NOT_FOUND:
            return 0
        raise
    finally:
        try:
            channel.close()
        except Exception as exc:  # already closed by the broker's refusal
            log.debug("channel not closed: %s", exc)
