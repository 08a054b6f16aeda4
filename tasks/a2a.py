"""A2A sweeps (``reach.hub.interop.a2a``): re-read every A2A agent's card (its heartbeat), and
follow the A2A tasks still working with ``GetTask``. Thin shells over the hub."""

from __future__ import annotations

import logging

from celery import shared_task

from reach.hub.interop.a2a import cards, exchange
from reach.worker.exchanges import machinery
from reach.worker.process_random import process_random
from reach.worker.sweeps import skip_when_unavailable

log = logging.getLogger("reach.tasks.a2a")
_rng = process_random()  # reseeded in each prefork child


@shared_task(name="reach.a2a_cards", ignore_result=True)
@skip_when_unavailable
def a2a_cards() -> dict[str, int]:
    from reach.worker.app import runtime

    ctx = runtime()
    a2a = ctx.settings.a2a
    with ctx.transaction() as session:
        due = cards.due_refreshes(session, ctx.seal)
    read = sum(
        cards.refresh_one(
            ctx.db,
            item,
            ctx.clock.now,
            ctx.policy,
            a2a.card_refresh_s,
            a2a.card_timeout_s,
            ctx.seal,
        )
        for item in due
    )
    return {"read": read, "failed": len(due) - read}


@shared_task(name="reach.a2a_follow", ignore_result=True)
@skip_when_unavailable
def a2a_follow() -> dict[str, int]:
    from reach.worker.app import runtime

    ctx = runtime()
    a2a = ctx.settings.a2a
    retries = exchange.follow(
        ctx.db,
        machinery().transport.post,
        now=ctx.clock.now,
        retry=ctx.delivery_policy.retry,
        connect_timeout=ctx.delivery_policy.connect_timeout,
        rng=_rng,
        poll_timeout=a2a.card_timeout_s,
        poll_failures=a2a.poll_failures,
        seal=ctx.seal,
    )
    published = ctx.publish_attempts(retries) if retries else 0
    return {"retried": len(retries), "published": published}
