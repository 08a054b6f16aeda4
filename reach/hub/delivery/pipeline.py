"""One attempt's pipeline: begin (claim, route, sign), exchange, conclude (record).

`Pipeline.begin` and `Pipeline.conclude` are the short steps: a worker slot runs
`begin` and hands the `Dispatch` to its process's exchanger (``exchanger``), whose event
loop holds the exchange for as long as the agent works; `conclude` records the answer
on one of the exchanger's threads. `deliver_attempt` runs the three in a row, blocking:
for callers with no exchanger (tests, tools).

The common path is two short transactions of plain statements (claim and route;
record a success); anything unusual takes the ORM path. A database failure leaves as
`HubUnavailable` (the shell retries; the outbox's nets recover).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from reach.core.delivery.retry import Outcome, classify
from reach.core.flow.priority import BACKGROUND
from reach.core.interop import a2a as a2a_rules
from reach.core.security.auth import ANONYMOUS
from reach.hub import logs, metrics, tracing
from reach.hub.delivery.claims import claim
from reach.hub.delivery.outcomes import record_outcome
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.delivery.routing import Dispatch, route, wait_for_breakers, wait_for_budget
from reach.hub.delivery.transports import AgentTransport, Exchanged
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.flow import breakers as breaker_store
from reach.hub.flow import priority as priority_gate
from reach.hub.flow import retry_budget
from reach.hub.flow.breakers import Breakers
from reach.hub.flow.loops import LinkWatch, caller_agent
from reach.hub.flow.shared_counts import SharedCounts
from reach.hub.gates import sessions as user_sessions
from reach.hub.interop.a2a import PROTOCOL as PROTOCOL_A2A
from reach.hub.interop.a2a import exchange as a2a_exchange
from reach.hub.interop.mcp.servers import PROTOCOL as PROTOCOL_MCP
from reach.hub.ledger.tasks import Publish, fail_transient, load_for_update, succeed
from reach.hub.security.signing import Signer
from reach.hub.storage.outage import database_outage

_FAILED = (Outcome.TRANSIENT, Outcome.BACKPRESSURE)  # an attempt span's error status


@dataclass(frozen=True)
class Pipeline:
    """What an attempt's steps need, built once per process.

    ``breakers`` holds this process's failure windows: every answer feeds the instance's
    circuit breaker, which opens (or closes after a trial) in a transaction of its own.
    ``candidates`` lets a process reuse routing candidates for a moment. ``signer``
    mints the attempts' reach tokens (``dpolicy.sign_deliveries``; without one, one is
    made per attempt, reading the key). ``shared`` (the process's hub-wide counts)
    makes the breakers' windows hub-wide and enables the per-target retry budget
    (``reach.hub.flow.retry_budget``); without it, neither."""

    db: sessionmaker[Session]
    now: Callable[[], float]
    policy: Policy
    dpolicy: DeliveryPolicy
    rng: random.Random
    breakers: Breakers
    candidates: registry.CandidateCache | None = None
    signer: Signer | None = None
    shared: SharedCounts | None = None
    links: LinkWatch | None = None  # counts reaches by tags or capability by routed agent

    def begin(self, task_id: str, attempt_seq: int) -> Dispatch | Publish | None:
        """Claim the attempt, route it and sign it: the `Dispatch` to exchange, or a
        retry to publish (no route, a breaker or a budget to wait for), or None (nothing
        to do: a duplicate message, a closed session, a background attempt deferred for
        online work, which the outbox relay publishes when due)."""
        with logs.task_context(task_id=task_id, attempt=attempt_seq):
            return self._begin(task_id, attempt_seq)

    @database_outage("delivery of an attempt")
    def _begin(self, task_id: str, attempt_seq: int) -> Dispatch | Publish | None:
        now, dpolicy, rng = self.now, self.dpolicy, self.rng
        budget_wait = None  # a re-send beyond its target's retry budget (read before claim)
        if attempt_seq > 1 and self.shared is not None:
            budget_wait = retry_budget.precheck(
                self.shared, task_id, now(), dpolicy.retry_budget, rng
            )
        with self.db.begin() as session:
            claimed = claim(session, task_id, attempt_seq, now(), dpolicy)
            if claimed is None:
                return None
            if claimed.session_id is not None and user_sessions.cancel_if_closed(
                session, task_id, claimed.session_id, now()
            ):
                return None  # its session closed since it was queued: cancelled
            if claimed.priority == BACKGROUND:  # online pays nothing for the check
                if priority_gate.yield_to_online(session, task_id, now(), dpolicy.priority):
                    return None  # deferred: its next attempt waits in the outbox
            if budget_wait is not None and retry_budget.resend(
                claimed.instance_id, claimed.retries
            ):
                return wait_for_budget(session, claimed, now(), *budget_wait)
            routed = route(session, claimed, now(), self.policy, dpolicy, rng, self.candidates)
            if isinstance(routed, str):
                task = load_for_update(session, task_id)
                assert task is not None
                held = wait_for_breakers(
                    session, task, claimed, now(), self.policy, dpolicy, rng, self.candidates
                )
                if held is not None:
                    return held  # only breakers hold its instances out: the next trial
                return fail_transient(
                    session, task, claimed.lease_token, now(), dpolicy.retry, rng,
                    reason="no_route", error={"kind": "no_route", "message": routed},
                )  # fmt: skip
        retry = retry_budget.resend(claimed.instance_id, claimed.retries)
        retry_budget.count(self.shared, routed.agent_id, retry, now(), claimed.caller)
        if self.links is not None and attempt_seq == 1 and not claimed.target.get("agent_id"):
            # a reach by tags or capability resolves here: its agent pair counts now
            src = caller_agent(claimed.caller, claimed.trace or {})
            self.links.resolved(self._transact, src, routed.agent_id, now())
        return self._signed(routed)

    def _transact(self, work: Callable[[Session], Any]) -> Any:
        with self.db.begin() as session:
            return work(session)

    def _signed(self, d: Dispatch) -> Dispatch:
        """The exchange's headers: the attempt, and a hub-signed reach token bound to the
        caller, the agent, the task, the attempt, the method and the body's exact bytes
        (the body leaves encoded). An A2A agent is reached under its card's own scheme:
        it gets no reach token, nor does an MCP server (``tools/call`` carries none)."""
        headers = {"X-Reach-Task-Id": d.task_id, "X-Reach-Attempt": str(d.attempt_seq)}
        d = self._traced(d, headers)
        if self.dpolicy.sign_deliveries and d.protocol not in (PROTOCOL_A2A, PROTOCOL_MCP):
            # the body is encoded once, here: the token binds these exact bytes, and they
            # are what is posted
            raw = (
                json.dumps(d.body, separators=(",", ":")).encode()
                if isinstance(d.body, dict)
                else d.body
            )
            headers["Authorization"] = f"Bearer {self._mint(d, raw)}"
            return replace(d, headers=headers, body=raw)
        return replace(d, headers=headers)

    def resigned(self, d: Dispatch) -> Dispatch:
        """``d`` with a new reach token (a new ``jti``) to send it again: an agent's replay
        guard refuses a token it has seen, even on a request it answered 429 (busy)."""
        if "Authorization" not in d.headers or not isinstance(d.body, bytes):
            return d  # not signed (A2A, MCP, signing off): nothing to renew
        return replace(d, headers={**d.headers, "Authorization": f"Bearer {self._mint(d, d.body)}"})

    def _mint(self, d: Dispatch, raw: bytes) -> str:
        dp = self.dpolicy
        signer = self.signer or Signer(
            self.db, issuer=dp.issuer, ttl_s=dp.token_ttl_s, seal=dp.seal
        )
        return signer.mint(
            subject=d.caller or ANONYMOUS,
            audience=d.agent_id,
            task_id=d.task_id,
            attempt_seq=d.attempt_seq,
            method=d.method,
            body=raw,
            now=self.now(),
        )

    @staticmethod
    def _traced(d: Dispatch, headers: dict[str, str]) -> Dispatch:
        """The attempt's span, a child of its task's (retries are siblings), and its
        context for the agent: the ``traceparent`` header and, in the signed body, the
        delivery's ``trace`` (what the SDKs read, whatever carries the delivery)."""
        stored = d.body.get("trace") if isinstance(d.body, dict) else None
        parent = tracing.of_trace(stored)
        if parent is None and not tracing.enabled():
            return d  # no trace to continue and none to start
        span, context = tracing.begin_attempt(
            parent,
            {
                "reach.task_id": d.task_id,
                "reach.attempt": d.attempt_seq,
                "reach.agent_id": d.agent_id,
                "reach.instance_id": d.instance_id,
                "reach.method": d.method,
            },
        )
        if context is None:
            return replace(d, span=span)
        headers[tracing.KEY] = context
        body = d.body
        if isinstance(body, dict) and d.protocol != PROTOCOL_A2A:
            body = {**body, "trace": {**(stored or {}), tracing.KEY: context}}
        return replace(d, span=span, body=body)

    def record_progress(self, d: Dispatch, update: a2a_rules.Progress) -> None:
        """A status update a streaming (A2A) exchange brought, as the task's progress
        while the attempt holds its lease (blocking: call it on a thread)."""
        with logs.task_context(d.task_id, d.attempt_seq, d.agent_id):
            a2a_exchange.record_progress(self.db, d.task_id, d.token, update, self.now())

    def conclude(self, d: Dispatch, exchanged: Exchanged, elapsed: float) -> Publish | None:
        """Record how the exchange ended; a retry to publish, if one was scheduled."""
        with logs.task_context(d.task_id, d.attempt_seq, d.agent_id):
            with tracing.within(d.span):  # its log lines carry the attempt's trace id
                return self._conclude(d, exchanged, elapsed)

    @database_outage("recording an attempt's answer")
    def _conclude(self, d: Dispatch, exchanged: Exchanged, elapsed: float) -> Publish | None:
        answer = exchanged.answer
        outcome = classify(answer.status, answer.body)
        metrics.DELIVERY_SECONDS.labels(outcome.value).observe(elapsed)
        status = {"http.response.status_code": answer.status}
        tracing.end_attempt(d.span, outcome.value, outcome in _FAILED, **status)
        metrics.DELIVERY_TOTAL.labels(outcome.value).inc()
        if self.candidates is not None and outcome not in (
            Outcome.SUCCESS,
            Outcome.BUSINESS_ERROR,
        ):
            self.candidates.clear()  # something is off with this instance: fresh facts
        # before the outcome, so a retry it schedules already finds the breaker open;
        # an mTLS refusal says nothing of the instance's health (and the task ends anyway)
        if not answer.refused:
            breaker_store.observe(
                self.db, self.breakers, d.ticket, outcome, self.now(),
                self.dpolicy.breaker, self.shared, d.task_id,
            )  # fmt: skip
        with self.db.begin() as session:
            if outcome is Outcome.SUCCESS:
                body = answer.body if isinstance(answer.body, dict) else {}
                detail = {"instance_id": d.instance_id, "attempt_seq": d.attempt_seq}
                if succeed(session, d.task_id, body.get("data"), self.now(), detail) is not None:
                    return None
            return record_outcome(
                session, d, outcome, answer, self.now(), self.dpolicy, self.rng,
                exchanged.verdict,
            )  # fmt: skip


def deliver_attempt(
    db: sessionmaker[Session],
    task_id: str,
    attempt_seq: int,
    *,
    now: Callable[[], float],
    policy: Policy,
    dpolicy: DeliveryPolicy,
    transport: AgentTransport,
    rng: random.Random,
    breakers: Breakers,
    candidates: registry.CandidateCache | None = None,
    signer: Signer | None = None,
    shared: SharedCounts | None = None,
) -> Publish | None:
    """Begin, exchange and conclude one attempt, blocking until the agent answers;
    returns a retry to publish, if any. The exchange runs on ``transport``'s loop."""
    pipeline = Pipeline(db, now, policy, dpolicy, rng, breakers, candidates, signer, shared)
    begun = pipeline.begin(task_id, attempt_seq)
    if not isinstance(begun, Dispatch):
        return begun
    dispatch = begun

    async def progress(update: a2a_rules.Progress) -> None:
        await asyncio.to_thread(pipeline.record_progress, dispatch, update)

    started = time.perf_counter()
    exchanged = transport.run(transport.exchange(dispatch, progress))
    return pipeline.conclude(dispatch, exchanged, time.perf_counter() - started)
