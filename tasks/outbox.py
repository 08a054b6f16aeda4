"""Beat-driven safety nets: publish what commit left behind, recover what the broker lost."""

from __future__ import annotations

import logging

from celery import shared_task

from reach.hub.delivery import outbox
from reach.worker.process_random import process_random
from reach.worker.sweeps import skip_when_unavailable

log = logging.getLogger("reach.tasks.outbox")
_rng = process_random()  # reseeded in each prefork child


@shared_task(name="reach.outbox_relay", ignore_result=True)
@skip_when_unavailable
def outbox_relay() -> dict[str, int]:
    from reach.worker.app import runtime

    ctx = runtime()
    now = ctx.clock.now()
    with ctx.transaction() as session:
        due = outbox.scheduled(session, now)  # deferrals: expected, not a net's catch
        left_behind = outbox.unpublished(session, now, grace=2.0)
        recovery = outbox.recover(
            session, now, ctx.delivery_policy, _rng, backlog=ctx.dispatcher.backlog
        )
    # one publication per attempt, even when two nets found the same one
    found = due + left_behind + recovery.publish
    items = list({(p.task_id, p.attempt_seq): p for p in found}.values())
    published, refused = outbox.publish_each(items, ctx.dispatcher.publish)
    with ctx.transaction() as session:  # if this fails, unsettled claims lapse and recur
        outbox.settle(session, published, refused, ctx.clock.now())
    if refused:
        log.warning("broker refused %d attempts; left to the relay's next tick", len(refused))
    if due:
        log.debug("relay published %d scheduled attempts that fell due", len(due))
    if left_behind or recovery.publish:
        log.warning(
            "relay published %d left-behind attempts; recovered %d overdue, %d lost "
            "by workers, %d silent (watchdog)",
            len(left_behind),
            recovery.republished,
            recovery.redelivered,
            recovery.watchdog,
        )
    return {
        "published": len(published),
        "refused": len(refused),
        "scheduled": len(due),
        "watchdog": recovery.watchdog,
    }
