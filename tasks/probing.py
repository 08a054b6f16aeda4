"""The probe sweep: claim due instances, probe them on the probe pool, record the results.

The task only claims and submits, then returns: probes run on the process's own probe
threads, so a slow or dead agent never holds a worker slot that delivery could use.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from celery import shared_task

from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet.probing import ProbePool, ProbeTarget, probe_once
from reach.hub.interop.mcp import servers as mcp_servers
from reach.worker.sweeps import skip_when_unavailable

log = logging.getLogger("reach.tasks.probing")


@lru_cache(maxsize=1)
def probe_pool(size: int) -> ProbePool:
    return ProbePool(size)


@shared_task(name="reach.probe_sweep", ignore_result=True)
@skip_when_unavailable
def probe_sweep() -> dict[str, int]:
    from reach.worker.app import runtime

    ctx = runtime()
    policy = ctx.policy
    with ctx.transaction() as session:
        targets, skipped = monitoring.claim_due_probes(session, ctx.clock.now(), policy)
    pool = probe_pool(policy.probe_limit)
    submitted = 0
    for target in targets:
        if pool.try_submit(lambda t=target: _probe_and_record(t)) is None:
            skipped += 1  # this process's threads are busy; the lease lapses and it is retried
        else:
            submitted += 1
    return {"submitted": submitted, "skipped": skipped}


def _probe_and_record(target: ProbeTarget) -> None:
    from reach.worker.app import runtime

    ctx = runtime()
    try:
        if target.protocol == mcp_servers.PROTOCOL:
            outcome = mcp_servers.probe(
                target,
                ctx.policy.probe_timeout,
                ctx.clock.now,
                ctx.policy.network,
                ctx.settings.mcp_agents.timeout_s,
            )
        else:
            outcome = probe_once(
                target, ctx.policy.probe_timeout, ctx.clock.now, rule=ctx.policy.network
            )
        with ctx.transaction() as session:
            monitoring.record_probe(session, outcome, ctx.clock.now(), ctx.policy)
    except Exception:
        log.exception("recording the probe of %s failed", target.instance_id)
