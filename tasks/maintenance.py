"""Periodic housekeeping driven by beat."""

from __future__ import annotations

import logging

from celery import shared_task

from reach import registry

log = logging.getLogger("reach.tasks.maintenance")


@shared_task(name="reach.sweep_liveness", ignore_result=True)
def sweep_liveness() -> list[str]:
    """Persist OFFLINE for instances that missed their heartbeats."""
    from reach.worker_app import runtime

    ctx = runtime()
    with ctx.transaction() as session:
        stale = registry.sweep_liveness(session, ctx.clock.now(), ctx.missed_intervals)
    if stale:
        log.warning("instances offline (heartbeats missed): %s", ", ".join(stale))
    return stale
