"""The callback tasks: one POST of a task's result (or progress) to the caller's URL,
and the beat's net for due callbacks whose publish was lost.

The slot claims and signs the callback (``reach.hub.notify.callbacks.prepare``); the POST goes
out from this process's exchanger loop (``reach.worker.exchanges``), so a receiver that
takes its time holds no worker slot, and the answer is recorded on the exchanger's
threads. A retry is a new message with its countdown; the callback's claim in the store
keeps it at-least-once if this process dies meanwhile (the net publishes it again)."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from reach.core.delivery.answers import AgentAnswer
from reach.core.notify import callbacks as callback_rules
from reach.hub.notify import callbacks
from reach.worker.exchanges import machinery
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
    settings = ctx.settings.callbacks
    try:
        post = callbacks.prepare(
            ctx.db, settings, callback_id, ctx.clock.now(), _rng, seal=ctx.seal
        )
    except Exception as exc:  # the store refused: the row stays due, the net retries it
        log.warning("callback %s not attempted: %s: %s", callback_id, type(exc).__name__, exc)
        return "deferred"
    if isinstance(post, callbacks.Sent):
        if post.retry_in is not None:
            log.info("callback %s: %s; again in %.1fs", callback_id, post.detail, post.retry_in)
            raise self.retry(countdown=post.retry_in)
        return post.outcome

    def record(answer: AgentAnswer) -> None:
        why = (answer.error or "").partition(":")[0] or None  # the kind, not the address
        sent = callbacks.answered(ctx.db, settings, post, answer.status, why, ctx.clock.now(), _rng)
        if sent.retry_in is not None:
            log.info("callback %s: %s; again in %.1fs", callback_id, sent.detail, sent.retry_in)
            ctx.dispatcher.send_callback(callback_id, countdown=sent.retry_in)

    machinery().exchanger.hand_over_post(
        post.url, post.body, post.headers, post.connect_timeout, post.timeout, record,
        rule=callback_rules.rule_of(settings.allow_private),
    )  # fmt: skip
    return "sent"


@shared_task(name=callbacks.CALLBACK_SWEEP_TASK, ignore_result=True)
@skip_when_unavailable
def callbacks_sweep() -> int:
    """Publish due callbacks nobody took (a lost publish, a worker lost mid-retry)."""
    from reach.worker.app import runtime

    ctx = runtime()
    with ctx.reading() as session:
        ids = callbacks.due_ids(session, ctx.clock.now())
    for callback_id in ids:
        ctx.dispatcher.send_callback(callback_id)
    if ids:
        log.info("re-published %d due callback(s)", len(ids))
    return len(ids)
