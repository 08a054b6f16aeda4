"""Delivery of one attempt: a thin shell over ``reach.hub.delivery``.

Acks late and is rejected (requeued) when its worker dies; a duplicate copy of the
message finds the attempt claimed or already finished and does nothing.

The hub's database unavailable (``HubUnavailable``, translated at the delivery's edge) is
retried with a backoff countdown, a few times: a restart of the database is ridden out
without waiting for the outbox's nets, and if it lasts longer the nets recover the attempt
(its outbox row and lease are in the database), so the shell gives up quietly.
"""

from __future__ import annotations

import logging
from functools import lru_cache

from celery import Task, shared_task

from reach.core.retry import RetryPolicy, backoff_delay
from reach.errors import HubUnavailable
from reach.hub.agent_http import AgentTransport, HubTls
from reach.hub.breakers import Breakers
from reach.hub.delivery import deliver_attempt
from reach.hub.registry import CandidateCache
from reach.hub.signing import Signer
from reach.worker.process_random import process_random

log = logging.getLogger("reach.tasks.delivery")

OUTAGE_RETRY = RetryPolicy(max_retry=6, base=1.0, cap=30.0)
"""Retries of a delivery the database refused: ~1+2+4+8+16+30 s, then the nets' turn."""


@lru_cache(maxsize=1)
def transport() -> AgentTransport:
    from reach.worker.app import settings

    return AgentTransport(tls=HubTls.from_settings(settings))


_rng = process_random()  # reseeded in each prefork child
_breakers = Breakers()  # counts hub-wide through ``shared`` (runtime().shared_counts)


@lru_cache(maxsize=1)
def signer() -> Signer:
    """This process's minter of reach tokens (it caches the signing key a few seconds)."""
    from reach.worker.app import runtime

    ctx = runtime()
    security = ctx.settings.security
    return Signer(ctx.sessions, issuer=security.issuer, ttl_s=security.token_ttl_s)


@lru_cache(maxsize=1)
def candidates() -> CandidateCache:
    from reach.worker.app import settings

    return CandidateCache(settings.router.candidate_ttl)


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
        signer=signer() if ctx.delivery_policy.sign_deliveries else None,
        shared=ctx.shared_counts,  # hub-wide breaker windows and retry budgets
    )
    if retry is not None:
        ctx.publish_attempts([retry])
