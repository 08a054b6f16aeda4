"""Delivery of one attempt: a thin shell over ``reach.hub.delivery``.

The slot begins the attempt (claim, route, sign) and hands its exchange to this
process's exchanger (``reach.worker.exchanges``), whose event loop holds it while the
agent works: the slot is free again within milliseconds, whatever the agent's pace.
The message is acked then; from there the attempt's lease in the store keeps it
at-least-once (a process that dies stops renewing it, and the relay's net delivers the
attempt again). A duplicate copy of the message finds the attempt claimed or finished
and does nothing.

The hub's database unavailable (``HubUnavailable``, translated at the delivery's edge) is
retried with a backoff countdown, a few times: a restart of the database is ridden out
without waiting for the outbox's nets, and if it lasts longer the nets recover the attempt
(its outbox row and lease are in the database), so the shell gives up quietly.
"""

from __future__ import annotations

import logging

from celery import Task, shared_task

from reach.core.delivery.retry import RetryPolicy, backoff_delay
from reach.errors import HubUnavailable
from reach.hub.delivery.routing import Dispatch
from reach.worker.exchanges import machinery
from reach.worker.process_random import process_random

log = logging.getLogger("reach.tasks.delivery")

OUTAGE_RETRY = RetryPolicy(max_retry=6, base=1.0, cap=30.0)
"""Retries of a delivery the database refused: ~1+2+4+8+16+30 s, then the nets' turn."""

_rng = process_random()  # reseeded in each prefork child


@shared_task(
    bind=True,
    name="reach.deliver",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    max_retries=OUTAGE_RETRY.max_retry,
)
def deliver(self: Task[[str, int], None], task_id: str, attempt_seq: int) -> None:
    try:
        _deliver(task_id, attempt_seq)
    except HubUnavailable as exc:
        done = self.request.retries
        if done >= OUTAGE_RETRY.max_retry:
            log.error(
                "delivery of %s attempt %d gave up after %d database retries (%s); "
                "the outbox's nets will recover it",
                task_id, attempt_seq, done, exc,
            )  # fmt: skip
            return
        countdown = backoff_delay(done + 1, OUTAGE_RETRY, _rng)
        log.warning(
            "delivery of %s attempt %d: %s; retry %d in %.1fs",
            task_id, attempt_seq, exc, done + 1, countdown,
        )  # fmt: skip
        raise self.retry(exc=exc, countdown=countdown) from exc


def _deliver(task_id: str, attempt_seq: int) -> None:
    from reach.worker.app import runtime

    built = machinery()
    begun = built.pipeline.begin(task_id, attempt_seq)
    if isinstance(begun, Dispatch):
        built.exchanger.hand_over(begun)
    elif begun is not None:
        runtime().publish_attempts([begun])
