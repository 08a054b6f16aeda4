"""The approval webhook task (one POST per approval request, retried with backoff) and
the alert webhook's beat tick."""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from reach.core.notify.outbound import Answer, next_delay
from reach.errors import HubUnavailable
from reach.hub.notify import approval_webhook
from reach.hub.ops import alert_webhook
from reach.worker.process_random import process_random

log = logging.getLogger("reach.tasks.webhooks")
_rng = process_random()  # reseeded in each prefork child
BACKOFF_BASE_S, BACKOFF_CAP_S = 1.0, 60.0


@shared_task(
    name=approval_webhook.WEBHOOK_TASK, bind=True, max_retries=None, acks_late=True,
    ignore_result=True,
)  # fmt: skip
def send_approval_webhook(self: Any, approval_id: str) -> str:
    from reach.worker.app import runtime

    ctx = runtime()
    settings = ctx.settings.approval
    try:
        sent = approval_webhook.deliver(
            ctx.db, settings, approval_id, ctx.clock.now(), seal=ctx.seal
        )
    except HubUnavailable as exc:
        sent = approval_webhook.Sent(Answer.RETRY, f"the hub's database is unavailable: {exc}")
    except Exception as exc:  # the database refusing the read, say: asked again later
        sent = approval_webhook.Sent(Answer.RETRY, f"{type(exc).__name__}: {exc}")
    if sent.answer is Answer.RETRY:
        if self.request.retries < settings.webhook_max_retries:
            delay = next_delay(self.request.retries + 1, BACKOFF_BASE_S, BACKOFF_CAP_S, _rng)
            log.info("webhook of approval %s: %s; again in %.1fs", approval_id, sent.detail, delay)
            raise self.retry(countdown=delay)
        log.error("webhook of approval %s given up: %s", approval_id, sent.detail)
    elif sent.answer is Answer.DROP:
        log.warning("webhook of approval %s not sent: %s", approval_id, sent.detail)
    return sent.answer.value


@shared_task(name=alert_webhook.PUSH_TASK, ignore_result=True)
def push_alerts() -> str:
    """The beat's alert webhook tick (``reach.hub.ops.alert_webhook``): its retries and
    backoff live in the store's marker, not in Celery, so a lost tick loses nothing."""
    from reach.worker.app import runtime

    ctx = runtime()
    settings = ctx.settings.alerts
    if not settings.webhook_url:
        return "off"
    pushed = alert_webhook.push(ctx.db, settings, ctx.clock.now, seal=ctx.seal, rng=_rng)
    if pushed.delivered or pushed.skipped:
        log.info(
            "alert webhook: %d delivered, %d skipped (%s)",
            pushed.delivered,
            pushed.skipped,
            pushed.detail,
        )
    return pushed.detail
