"""The callback tasks: one POST of a task's result (or progress) to the caller's URL,
and the beat's net for due callbacks whose publish was lost."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from reach.hub import callbacks
from reach.worker.process_random import process_random
from reach.worker.sweeps import skip_when_unavailable

log = logging.getLogger("reach.tasks.callbacks")
_rng = process_random()  # reseeded in each prefork child


@shared_task(
    name=callbacks.CALLBACK_TASK, bind=True, max_retries=None, acks_late=True,
    ignore_result=True,
)  # fmt: skip
def send_callback(self: Any, callback_id: int) -> str:
    from reach.worker.app import runtime

    ctx = runtime()
    try:
        sent = callbacks.deliver(
            ctx.sessions, ctx.settings.callbacks, callback_id, ctx.clock.now(), _rng,
            clock=ctx.clock.now,
        )  # fmt: skip
    except Exception as exc:  # the store refused: the row stays due, the net retries it
        log.warning("callback %s not attempted: %s: %s", callback_id, type(exc).__name__, exc)
        return "deferred"
    if sent.retry_in is not None:
        log.info("callback %s: %s; again in %.1fs", callback_id, sent.detail, sent.retry_in)
        raise self.retry(countdown=sent.retry_in)
    return sent.outcome


@shared_task(name=callbacks.CALLBACK_SWEEP_TASK, ignore_result=True)
@skip_when_unavailable
def callbacks_sweep() -> int:
    """Publish due callbacks nobody took (a lost publish, a worker lost mid-retry)."""
    from reach.worker.app import runtime

    ctx = runtime()
    with ctx.reading() as session:
        ids = callbacks.due_ids(session, ctx.clock.now())
    for callback_id in ids:
        callbacks.publish(ctx.publisher.app, callback_id)
    if ids:
        log.info("re-published %d due callback(s)", len(ids))
    return len(ids)
