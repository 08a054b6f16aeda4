"""Choosing the instance for a claimed attempt, and what its exchange will carry.

`route` filters the live candidates (the task's agent, tags, capability and rules; a
broadcast's pinned instance; no agent already on the task's path; L3 screening), picks
one by ReachScore (``reach.core.fleet.routing``) whose breaker lets it through, assigns it in
the claim's transaction and records the ``dispatched`` event. What comes back is the
`Dispatch`: everything the exchange needs, so it runs with no store at hand.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.fleet import params_schema
from reach.core.fleet.routing import Candidate, RouteFilter, choose_excluding
from reach.core.flow.breakers import recovery_share
from reach.core.gates.approvals import needs_approval
from reach.core.interop.channel import shown_endpoint
from reach.core.ledger.statuses import ApprovalStatus
from reach.core.security.trust import is_l3
from reach.errors import NoSuitableAgent
from reach.hub.delivery.claims import ASSIGN, Claimed
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.flow import breakers as breaker_store
from reach.hub.flow.breakers import Ticket
from reach.hub.interop.a2a import PROTOCOL as PROTOCOL_A2A
from reach.hub.interop.a2a.exchange import Peer, peer_of
from reach.hub.interop.mcp.servers import PROTOCOL as PROTOCOL_MCP
from reach.hub.ledger.tasks import (
    Publish,
    defer_attempt,
    insert_event,
    load_for_update,
    schedule_retry,
)
from reach.hub.security import trust
from reach.hub.storage.models import ApprovalRow, BlobRow, TaskRow


@dataclass(frozen=True, slots=True)
class Dispatch:
    """One routed attempt, ready to exchange: where, what, and under which lease."""

    task_id: str
    attempt_seq: int
    token: str  # the attempt's lease token: its outcome is recorded only while it holds
    url: str
    body: dict[str, Any] | bytes  # bytes once signed: the token binds exactly these
    instance_id: str
    agent_id: str
    timeout: float  # the exchange's budget after connecting (the task's timeout, capped)
    connect_timeout: float
    ticket: Ticket
    method: str
    payload: Any
    session_id: str | None = None
    trust_level: str = "L2"  # L1: reached over mutual TLS only (``MtlsTransport``)
    caller: str | None = None  # the task's caller identity: the reach token's ``sub``
    # a2a: the attempt is an A2A SendMessage (``A2ATransport``); mcp: a tools/call
    # (``McpTransport``) at ``url``, the server's MCP endpoint
    protocol: str = "reach"
    peer: Peer | None = None  # an A2A instance's card: its RPC URL and security scheme
    headers: dict[str, str] = field(default_factory=dict)
    max_concurrency: int = 0  # the instance's declared slots (0: it declares none)
    span: Any = field(default=None, compare=False)  # the attempt's span (tracing on)


def candidates(
    session: Session,
    task: Claimed,
    now: float,
    policy: Policy,
    cache: registry.CandidateCache | None,
) -> tuple[RouteFilter, list[Candidate]]:
    """The task's route filter and its live candidates (a pinned broadcast target: that
    instance or nothing) -- what routing and the breaker wait both start from."""
    target = task.target
    flt = RouteFilter(
        agent_id=target.get("agent_id"),
        tags=tuple(target.get("tags") or ()),
        capability=target.get("capability"),
        rules=tuple(sorted((target.get("rules") or {}).items())),
    )
    if cache is not None:
        found = cache.get(session, flt, now, policy, task.method)
    else:
        found = registry.load_candidates(session, flt, now, policy, method=task.method)
    pinned = target.get("instance_id")
    if pinned:
        found = [c for c in found if c.instance_id == pinned]
    return flt, found


def route(
    session: Session,
    task: Claimed,
    now: float,
    policy: Policy,
    dpolicy: DeliveryPolicy,
    rng: random.Random,
    cache: registry.CandidateCache | None = None,
) -> Dispatch | str:
    """The attempt's `Dispatch`, or why no instance can take it (a route refusal)."""
    flt, found = candidates(session, task, now, policy, cache)
    pinned = task.target.get("instance_id")
    if not pinned and not flt.agent_id and task.trace and task.trace.get("path"):  # no loop
        found = [c for c in found if c.agent_id not in task.trace["path"]]
    screened: trust.Screened | None = None
    if any(is_l3(c.trust_level) for c in found):  # else: not a read more
        screened = trust.screen_candidates(
            session, task.caller, found, task.method, flt.capability, task.payload,
            dpolicy.l3_max_payload_bytes,
        )  # fmt: skip
        found = screened.allowed
        if not found:
            return f"no instance of {flt.describe()} may be reached: {screened.reason}"
    exclude = {task.instance_id} if task.instance_id and task.retries else set()
    found = [  # an instance whose breaker closed lately takes a growing share of tasks
        replace(c, recovery=recovery_share(c.breaker_closed_at, now, dpolicy.breaker))
        if c.breaker_closed_at is not None
        else c
        for c in found
    ]
    gate = _Gate(session, task, flt, dpolicy)
    while True:
        try:
            chosen = choose_excluding(found, flt, rng, exclude)
        except NoSuitableAgent as exc:
            return gate.explain(exc.detail)
        if not gate.admits(chosen):  # its capability's schema or approval says no
            found = [c for c in found if c.instance_id != chosen.instance_id]
            continue
        ticket = breaker_store.ticket_for(session, chosen, now, dpolicy.breaker)
        if ticket is not None:
            break
        # its breaker's trial is due and another delivery claimed it: not ours to use
        found = [c for c in found if c.instance_id != chosen.instance_id]
    timeout = dpolicy.exchange_timeout_ms(task.timeout_ms)
    deadline = now + dpolicy.connect_timeout + timeout
    session.connection().execute(
        ASSIGN,
        {
            "b_task_id": task.task_id,
            "b_instance": chosen.instance_id,
            "b_agent": chosen.agent_id,
            "b_deadline": deadline,
        },
    )
    detail: dict[str, Any] = {
        "endpoint": shown_endpoint(chosen.endpoint),  # no channel's socket secret in events
        "reach_score": round(chosen.reach_score, 1),
    }
    if ticket.trial:
        detail["breaker_trial"] = True
    if screened is not None:
        if screened.refused:
            detail["screened_out"] = sorted(screened.refused)
        if is_l3(chosen.trust_level) or is_l3(screened.caller.trust):
            screened.record(session, chosen, task.task_id, task.attempt_seq, now)
    insert_event(
        session, task.task_id, chosen.agent_id, chosen.instance_id, task.attempt_seq,
        "dispatched", now, detail,
    )  # fmt: skip
    body = {
        "task_id": task.task_id,
        "method": task.method,
        "payload": task.payload,
        "attempt_seq": task.attempt_seq,
        "idempotency_key": task.idempotency_key or task.task_id,
        "trace": task.trace,
        "session_id": task.session_id,
        "deadline": deadline,
    }
    if task.payload_ref is not None:
        body["payload_ref"] = _blob_ref(session, task.payload_ref, now, dpolicy)
    return Dispatch(
        task.task_id,
        task.attempt_seq,
        task.lease_token,
        (
            chosen.endpoint
            if chosen.protocol == PROTOCOL_MCP
            else f"{chosen.endpoint}/tasks/{task.method}"
        ),
        body,
        chosen.instance_id,
        chosen.agent_id,
        timeout,
        dpolicy.connect_timeout,
        ticket,
        task.method,
        task.payload,
        session_id=task.session_id,
        trust_level=chosen.trust_level,
        caller=task.caller,
        protocol=chosen.protocol,
        peer=(
            peer_of(session, chosen.instance_id, dpolicy.seal)
            if chosen.protocol == PROTOCOL_A2A
            else None
        ),
        max_concurrency=chosen.max_concurrency,
    )


def _blob_ref(
    session: Session, blob_id: str, now: float, dpolicy: DeliveryPolicy
) -> dict[str, Any]:
    """What the agent needs to read the task's blob: its facts and a fresh link (each
    attempt gets its own). A blob that is gone (it cannot be while its task lives) is
    named alone: the agent's read of it fails with a clear error."""
    row = session.get(BlobRow, blob_id)
    if row is None or dpolicy.blob_links is None:
        return {"blob_id": blob_id}
    return dpolicy.blob_links.descriptor(row, now)


class _Gate:
    """The capability's own gate, asked of the instance routing chose (issue 37): the
    payload must satisfy that agent's ``params_schema``, and a capability that needs a
    human decision is delivered only for a task whose approval was granted. Submit
    parks a task when any eligible agent needs approval, but what delivery may choose
    is decided by the second: this is the check that holds whatever submit saw."""

    def __init__(
        self, session: Session, task: Claimed, flt: RouteFilter, dpolicy: DeliveryPolicy
    ) -> None:
        self._session = session
        self._task = task
        self._flt = flt
        self._patterns = dpolicy.approval_patterns
        self._approved: bool | None = None  # read once, only when a gated one is chosen
        self.refused: list[str] = []

    def admits(self, chosen: Candidate) -> bool:
        task, decl = self._task, chosen.declaration
        if decl is not None:
            error = params_schema.payload_error(decl.get("params_schema") or {}, task.payload)
            if error is not None:
                self.refused.append(f"{chosen.agent_id}: payload fails its params_schema")
                return False
        if needs_approval(decl, task.method, self._flt.capability, self._patterns):
            if self._approved is None:
                status = self._session.scalar(
                    select(ApprovalRow.status).where(ApprovalRow.task_id == task.task_id)
                )
                self._approved = status == ApprovalStatus.APPROVED
            if not self._approved:
                self.refused.append(f"{chosen.agent_id}: needs an approval this task lacks")
                return False
        return True

    def explain(self, detail: str) -> str:
        if not self.refused:
            return detail
        return f"{detail}; refused at delivery: {'; '.join(sorted(set(self.refused)))}"


def wait_for_budget(
    session: Session, claimed: Claimed, now: float, agent_id: str, delay: float
) -> Publish:
    """A re-send beyond its target's retry budget waits (``reach.hub.flow.retry_budget``):
    deferred and checked again when it fires; no retry or deferral spent, not a failure."""
    task = load_for_update(session, claimed.task_id)
    assert task is not None
    detail = {"budget_wait": True, "agent_id": agent_id, "retry": task.retries}
    return schedule_retry(session, task, now, delay, "retry_budget", detail)


def wait_for_breakers(
    session: Session,
    task: TaskRow,
    claimed: Claimed,
    now: float,
    policy: Policy,
    dpolicy: DeliveryPolicy,
    rng: random.Random,
    cache: registry.CandidateCache | None,
) -> Publish | None:
    """No route: if only breakers hold the live instances out, defer to the next trial."""
    if task.deferrals >= dpolicy.max_deferrals:
        return None
    _, found = candidates(session, claimed, now, policy, cache)
    found = breaker_store.open_failing(session, found, now, dpolicy.breaker)
    trial = dpolicy.breaker.trial_interval_s
    until = breaker_store.held_back_until(found, now, recheck_s=min(1.0, trial))
    if until is None:
        return None
    detail = {"breaker_wait": True, "next_trial_at": until}
    return defer_attempt(
        session, task, now, until - now, min(1.0, trial / 10), "breaker_open", detail,
        dpolicy.max_deferrals, rng,
    )  # fmt: skip
