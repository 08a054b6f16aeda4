"""Delivery of one attempt: a thin shell over ``reach.hub.delivery``.

Acks late and is rejected (requeued) when its worker dies; a duplicate copy of the
message finds the attempt claimed or already finished and does nothing.
"""

from __future__ import annotations

from functools import lru_cache

from celery import shared_task

from reach.hub.agent_http import AgentTransport
from reach.hub.breakers import Breakers
from reach.hub.delivery import deliver_attempt
from reach.hub.registry import CandidateCache
from reach.worker.process_random import process_random


@lru_cache(maxsize=1)
def transport() -> AgentTransport:
    return AgentTransport()


_rng = process_random()  # reseeded in each prefork child
_breakers = Breakers()  # this worker process's failure windows (each prefork child its own)


@lru_cache(maxsize=1)
def candidates() -> CandidateCache:
    from reach.worker.app import settings

    return CandidateCache(settings.router.candidate_ttl)


@shared_task(name="reach.deliver", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def deliver(task_id: str, attempt_seq: int) -> None:
    from reach.worker.app import runtime

    ctx = runtime()
    retry = deliver_attempt(
        ctx.sessions,
        task_id,
        attempt_seq,
        now=ctx.clock.now,
        policy=ctx.policy,
        dpolicy=ctx.delivery_policy,
        transport=transport(),
        rng=_rng,
        breakers=_breakers,
        candidates=candidates(),
    )
    if retry is not None:
        ctx.publish_attempts([retry])
