"""Periodic housekeeping driven by beat."""

from __future__ import annotations

import logging

from celery import shared_task

from reach.hub.blobs import records as blobs
from reach.hub.fleet import reachability as monitoring
from reach.hub.gates import approvals
from reach.hub.ops import retention
from reach.worker.sweeps import skip_when_unavailable

log = logging.getLogger("reach.tasks.maintenance")


@shared_task(name="reach.reachability_sweep", ignore_result=True)
@skip_when_unavailable
def reachability_sweep() -> list[str]:
    """Reassess every instance (heartbeats may have stopped); persist transitions."""
    from reach.worker.app import runtime

    ctx = runtime()
    with ctx.transaction() as session:
        changed = monitoring.sweep(session, ctx.clock.now(), ctx.policy)
    if changed:
        log.info("status changed on sweep: %s", ", ".join(changed))
    return changed


@shared_task(name="reach.retention_sweep", ignore_result=True)
def retention_sweep() -> dict[str, int]:
    """Delete finished records past ``retention.days`` and long-offline instances, then
    the blobs whose task is gone and those no task took in time (``blobs.orphan_ttl_s``)."""
    from reach.worker.app import runtime

    ctx = runtime()
    deleted = retention.sweep(ctx.transaction, ctx.clock.now(), retention.policy_from(ctx.settings))
    gone = blobs.sweep(
        ctx.transaction, ctx.blob_store, ctx.clock.now(), ctx.settings.blobs.orphan_ttl_s
    )
    if gone:
        deleted["blobs"] = gone
    return deleted


@shared_task(name="reach.approvals_expire", ignore_result=True)
@skip_when_unavailable
def approvals_expire() -> int:
    """Fail the parked tasks whose approval nobody decided in time (read from the store,
    so an approval expires even when every hub process restarted meanwhile)."""
    from reach.worker.app import runtime

    ctx = runtime()
    with ctx.transaction() as session:
        expired = approvals.expire_due(session, ctx.clock.now())
    if expired:
        log.info("expired %d approval(s)", expired)
    return expired
