"""This worker process's delivery machinery: the pipeline, the agent transport and the
exchanger that keeps its exchanges in flight (``reach.hub.delivery.exchanger``).

Built on first use in the process that delivers (a prefork child, after its fork: an
event loop and its sockets do not survive one), once even when the threads pool asks
from many threads at once, and drained when that process stops (`drain`, connected to
Celery's shutdown signals in ``reach.worker.app``).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from reach.hub.delivery.exchanger import Exchanger
from reach.hub.delivery.loop import LoopThread
from reach.hub.delivery.pipeline import Pipeline
from reach.hub.delivery.transports import AgentTransport, HubTls
from reach.hub.fleet.registry import CandidateCache
from reach.hub.flow.breakers import Breakers
from reach.hub.flow.loops import LoopGuard
from reach.hub.security.signing import Signer
from reach.worker.process_random import process_random

log = logging.getLogger("reach.worker.exchanges")


@dataclass(frozen=True)
class Machinery:
    pipeline: Pipeline
    transport: AgentTransport
    exchanger: Exchanger


_lock = threading.Lock()
_built: dict[int, Machinery] = {}  # by pid: a forked child builds its own


def machinery() -> Machinery:
    """This process's pipeline, transport and exchanger."""
    pid = os.getpid()
    with _lock:
        built = _built.get(pid)
        if built is None:
            built = _built[pid] = _build()
        return built


def _build() -> Machinery:
    from reach.worker.app import runtime

    ctx = runtime()
    settings = ctx.settings
    dpolicy = ctx.delivery_policy
    security = settings.security
    pipeline = Pipeline(
        ctx.db,
        ctx.clock.now,
        ctx.policy,
        dpolicy,
        process_random(),
        Breakers(),  # counts hub-wide through ``shared``
        CandidateCache(settings.router.candidate_ttl),
        Signer(ctx.db, issuer=security.issuer, ttl_s=security.token_ttl_s, seal=ctx.seal)
        if dpolicy.sign_deliveries
        else None,
        ctx.shared_counts,  # hub-wide breaker windows and retry budgets
        LoopGuard.of(settings.router, ctx.shared_counts).links,  # pairs reached by tags
    )
    transport = AgentTransport(
        tls=HubTls.from_settings(settings), loop=LoopThread(), network=ctx.policy.network
    )
    exchanges = settings.exchanges
    exchanger = Exchanger(
        pipeline,
        transport,
        ctx.publish_attempts,
        max_in_flight=exchanges.max_in_flight,
        drain_s=exchanges.drain_s,
        record_threads=exchanges.record_threads,
    )
    return Machinery(pipeline, transport, exchanger)


def drain() -> None:
    """Let this process's exchanges end (``exchanges.drain_s``), give the rest back."""
    with _lock:
        built = _built.pop(os.getpid(), None)
    if built is None:
        return
    in_flight = built.exchanger.in_flight
    if in_flight:
        log.info("draining %d exchange(s) in flight", in_flight)
    built.exchanger.drain()
