"""Delivery of one attempt, and every way an attempt can end.

At-least-once with fencing:

* ``claim`` moves a task from ``pending`` to ``dispatching`` only for the message's own
  ``attempt_seq`` and only if no live lease exists, so a duplicate broker message (Redis
  visibility timeout, relay republish) finds nothing to do while the first copy runs.
* Every non-terminal transition is conditional on the claim's lease token; terminal ones
  are conditional on the task not being terminal yet, so the first result wins and later
  ones are recorded as events.
* A retry is a new attempt (``attempt_seq + 1``) with its own outbox row, written in the
  same transaction as the state change; publishing it is the caller's job (the Celery
  shell) and the relay's if the caller dies first.

Every status written here is the one ``reach.core.lifecycle`` gives for the move, so no
path can write a move its transition table does not list.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

from sqlalchemy import ColumnElement, Table, bindparam, case, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from reach.core import a2a as a2a_rules
from reach.core import lifecycle
from reach.core.auth import ANONYMOUS
from reach.core.breaker import BreakerPolicy
from reach.core.channel import redacted, shown_endpoint
from reach.core.lifecycle import TaskEvent
from reach.core.priority import BACKGROUND, ONLINE, ONLINE_QUEUE, PriorityPolicy, queue_for
from reach.core.reports import AWAITING_REPORT, Verdict, judge_report
from reach.core.retry import (
    Outcome,
    RetryPolicy,
    backoff_delay,
    business_message,
    classify,
    should_retry,
)
from reach.core.retry_budget import RetryBudget
from reach.core.routing import Candidate, RouteFilter, choose_excluding
from reach.core.statuses import TERMINAL, TaskStatus
from reach.core.trust import is_l3
from reach.errors import NoSuitableAgent, StaleReport, UnknownTask
from reach.hub import breakers as breaker_store
from reach.hub import callbacks, metrics, registry, retry_budget, trust
from reach.hub import priority as priority_gate
from reach.hub.a2a import PROTOCOL as PROTOCOL_A2A
from reach.hub.a2a import exchange as a2a_exchange
from reach.hub.agent_http import AgentAnswer, AgentTransport
from reach.hub.breakers import Breakers, Ticket
from reach.hub.monitoring import Policy
from reach.hub.settings import Settings
from reach.hub.shared_counts import SharedCounts
from reach.hub.signing import Signer
from reach.hub.storage.models import DeadLetterRow, OutboxRow, TaskEventRow, TaskRow
from reach.hub.storage.outage import database_outage
from reach.hub.wakeups import mark_changed, mark_finished

log = logging.getLogger("reach.hub.delivery")


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    retry: RetryPolicy
    connect_timeout: float
    read_timeout: float
    lease_margin: float = 10.0
    watchdog_grace: float = 30.0
    republish_grace: float = 10.0
    max_redeliveries: int = 5
    max_deferrals: int = 50
    republish_backlog: int = 10  # queue deeper than this: overdue attempts are queued, not lost
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    sign_deliveries: bool = True  # a hub-signed reach token on every delivery
    issuer: str = "agent-reach"  # the tokens' ``iss``
    token_ttl_s: float = 300.0  # the tokens' lifetime (capped at 15 min)
    l3_max_payload_bytes: int = 65_536  # the payload cap of reaches to or from an L3 agent
    retry_budget: RetryBudget = field(default_factory=RetryBudget)  # re-sends per target
    priority: PriorityPolicy = field(default_factory=PriorityPolicy)  # background yields

    @classmethod
    def from_settings(cls, settings: Settings) -> DeliveryPolicy:
        r = settings.router
        return cls(
            retry=RetryPolicy(max_retry=r.max_retry, base=r.backoff_base, cap=r.backoff_cap),
            connect_timeout=r.connect_timeout,
            read_timeout=r.read_timeout,
            watchdog_grace=r.watchdog_grace,
            republish_grace=r.republish_grace,
            breaker=BreakerPolicy(
                window_s=r.breaker_window,
                failure_ratio=r.breaker_failure_ratio,
                min_volume=r.breaker_min_volume,
                trial_interval_s=r.breaker_trial_interval,
                streak=r.breaker_streak,
            ),
            sign_deliveries=settings.security.sign_deliveries,
            issuer=settings.security.issuer,
            token_ttl_s=settings.security.token_ttl_s,
            l3_max_payload_bytes=settings.security.l3_max_payload_bytes,
            retry_budget=RetryBudget(
                ratio=r.retry_budget_ratio,
                min_per_s=r.retry_budget_min_per_s,
                window_s=r.retry_budget_window,
            ),
            priority=PriorityPolicy(
                background_share=r.background_share,
                defer_s=r.background_defer_s,
                max_wait_s=r.background_max_wait_s,
            ),
        )

    def read_timeout_for(self, task: TaskRow) -> float:
        return self.read_timeout_for_ms(task.timeout_ms)

    def read_timeout_for_ms(self, timeout_ms: int) -> float:
        return max(0.05, min(self.read_timeout, timeout_ms / 1000))

    def lease_for(self, task: TaskRow) -> float:
        return self.connect_timeout + self.read_timeout_for(task) + self.lease_margin


@dataclass(frozen=True, slots=True)
class Publish:
    """Instruction for the Celery shell: publish this attempt after ``delay`` seconds
    to ``queue`` (the task's priority: ``reach.core.priority.queue_for``)."""

    task_id: str
    attempt_seq: int
    delay: float
    queue: str = ONLINE_QUEUE


@dataclass(frozen=True, slots=True)
class _Dispatch:
    task_id: str
    attempt_seq: int
    token: str
    url: str
    body: dict[str, Any]
    instance_id: str
    agent_id: str
    read_timeout: float
    ticket: Ticket
    trust_level: str = "L2"  # L1: reached over mutual TLS only (``AgentTransport``)
    caller: str | None = None  # the task's caller identity: the reach token's ``sub``
    protocol: str = "reach"  # a2a: the attempt is an A2A SendMessage (``reach.hub.a2a``)


@database_outage("delivery of an attempt")
def deliver_attempt(
    sessions: sessionmaker[Session],
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
    """Claim, route, call the agent, record the outcome. Returns a retry to publish, if any
    (a background attempt deferred for online work is left to the outbox relay: None).

    ``breakers`` holds this process's failure windows: every answer feeds the instance's
    circuit breaker, which opens (or closes after a trial) in a transaction of its own.
    ``candidates`` lets a worker process reuse routing candidates for a moment.
    ``signer`` mints the attempt's reach token (``dpolicy.sign_deliveries``): a worker
    keeps one per process; without one, one is made for this call (it reads the key).
    ``shared`` (the process's hub-wide counts) makes the breakers' windows hub-wide and
    enables the per-target retry budget (``reach.hub.retry_budget``); without it, neither.

    The common path is two short transactions of plain statements (claim and route;
    record a success); anything unusual takes the ORM path below them. A database
    failure leaves as `HubUnavailable` (the shell retries; the outbox's nets recover).
    """
    budget_wait = None  # a re-send beyond its target's retry budget (read before the claim)
    if attempt_seq > 1 and shared is not None:
        budget_wait = retry_budget.precheck(shared, task_id, now(), dpolicy.retry_budget, rng)
    with sessions.begin() as session:
        claimed = claim(session, task_id, attempt_seq, now(), dpolicy)
        if claimed is None:
            return None
        if claimed.session_id is not None and _session_closed(session, claimed, now()):
            return None  # its session closed since it was queued: cancelled, not delivered
        if claimed.priority == BACKGROUND:  # online pays nothing for the check
            if priority_gate.yield_to_online(session, claimed, now(), dpolicy.priority):
                return None  # deferred: its next attempt waits in the outbox for the relay
        if budget_wait is not None and claimed.instance_id is not None:
            return _wait_for_budget(session, claimed, now(), *budget_wait)
        route = _route(session, claimed, now(), policy, dpolicy, rng, candidates)
        if isinstance(route, str):
            task = load_for_update(session, task_id)
            assert task is not None
            held = _wait_for_breakers(
                session, task, claimed, now(), policy, dpolicy, rng, candidates
            )
            if held is not None:
                return held  # only breakers hold its instances out: wait for the next trial
            return fail_transient(
                session,
                task,
                claimed.lease_token,
                now(),
                dpolicy,
                rng,
                reason="no_route",
                error={"kind": "no_route", "message": route},
            )
        dispatch = route
    headers = {"X-Reach-Task-Id": task_id, "X-Reach-Attempt": str(attempt_seq)}
    # an A2A agent is reached under its card's own scheme: it gets no reach token
    if dpolicy.sign_deliveries and dispatch.protocol != PROTOCOL_A2A:
        signer = signer or Signer(sessions, issuer=dpolicy.issuer, ttl_s=dpolicy.token_ttl_s)
        token = signer.mint(
            subject=dispatch.caller or ANONYMOUS,
            audience=dispatch.agent_id,
            task_id=task_id,
            attempt_seq=attempt_seq,
            now=now(),
        )
        headers["Authorization"] = f"Bearer {token}"
    retry_budget.count(shared, dispatch.agent_id, claimed.instance_id is not None, now())
    started = time.perf_counter()
    verdict: a2a_rules.Verdict | None = None
    if dispatch.protocol == PROTOCOL_A2A:  # JSON-RPC, under the card's own security scheme
        answer, verdict = a2a_exchange.exchange(
            sessions,
            task_id=task_id,
            attempt_seq=attempt_seq,
            lease_token=claimed.lease_token,
            instance_id=dispatch.instance_id,
            method=claimed.method,
            payload=claimed.payload,
            session_id=claimed.session_id,
            transport=transport,
            connect_timeout=dpolicy.connect_timeout,
            read_timeout=dispatch.read_timeout,
            now=now,
        )
    else:
        answer = transport.post(
            dispatch.url,
            dispatch.body,
            dpolicy.connect_timeout,
            dispatch.read_timeout,
            headers=headers,
            mtls_agent=dispatch.agent_id if dispatch.trust_level == "L1" else None,
        )
    metrics.DELIVERY_SECONDS.observe(time.perf_counter() - started)
    outcome = classify(answer.status, answer.body)
    metrics.DELIVERY_TOTAL.labels(outcome.value).inc()
    if candidates is not None and outcome not in (Outcome.SUCCESS, Outcome.BUSINESS_ERROR):
        candidates.clear()  # something is off with this instance: route from fresh facts
    # before the outcome, so a retry it schedules already finds the breaker open;
    # an mTLS refusal says nothing of the instance's health (and the task ends anyway)
    if not answer.refused:
        breaker_store.observe(
            sessions, breakers, dispatch.ticket, outcome, now(), dpolicy.breaker, shared, task_id
        )
    with sessions.begin() as session:
        if outcome is Outcome.SUCCESS:
            body = answer.body if isinstance(answer.body, dict) else {}
            detail = {"instance_id": dispatch.instance_id, "attempt_seq": attempt_seq}
            if succeed(session, task_id, body.get("data"), now(), detail) is not None:
                return None
        return record_outcome(session, dispatch, outcome, answer, now(), dpolicy, rng, verdict)


@dataclass(frozen=True, slots=True)
class Claimed:
    """The columns of a claimed task that routing and the agent's request need."""

    task_id: str
    attempt_seq: int
    lease_token: str
    target: dict[str, Any]
    method: str
    payload: Any
    idempotency_key: str | None
    trace: dict[str, Any] | None
    session_id: str | None
    timeout_ms: int
    instance_id: str | None
    retries: int
    caller: str | None = None  # who submitted it (``tasks.caller``): the token's ``sub``
    priority: str = ONLINE  # online | background (``reach.core.priority``)


_T = cast(Table, TaskRow.__table__)
_EVENTS = cast(Table, TaskEventRow.__table__)
# what callers see of a task (``task_view``, the success statement's RETURNING)
VIEW_COLUMNS = (
    "task_id", "status", "method", "target", "agent_id", "instance_id", "attempt_seq",
    "retries", "result", "error", "trace", "session_id", "timeout_ms", "created_at",
    "updated_at", "finished_at", "caller", "priority",
)  # fmt: skip


# The hot path's statements, built once: constructing a statement and its cache key on
# every delivery cost more CPU than executing it. Bound names carry a ``b_`` prefix
# (column names are reserved for the SET clause).
# Their status guards and targets come from the lifecycle table.
_SECONDS = _T.c.timeout_ms / 1000.0


def _status_in(event: TaskEvent) -> ColumnElement[bool]:
    """``status IN (sources of event)``; a plain ``=`` for one source (no expanding IN)."""
    sources = sorted(lifecycle.sources_of(event))
    return _T.c.status == sources[0] if len(sources) == 1 else _T.c.status.in_(sources)


_CLAIM = (
    update(_T)
    .where(
        _T.c.task_id == bindparam("b_task_id"),
        _T.c.attempt_seq == bindparam("b_seq"),
        _status_in(TaskEvent.CLAIM)
        | (
            _status_in(TaskEvent.RECLAIM)
            & (func.coalesce(_T.c.lease_until, 0) <= bindparam("b_now"))
        ),
    )
    .values(
        # CLAIM and RECLAIM lead to the same status
        status=lifecycle.target_of(TaskEvent.CLAIM),
        lease_token=bindparam("b_token"),
        lease_until=bindparam("b_lease_base")
        + case(
            (_SECONDS >= bindparam("b_read"), bindparam("b_read")),
            (_SECONDS <= 0.05, 0.05),
            else_=_SECONDS,
        ),
        updated_at=bindparam("b_now"),
        redeliveries=_T.c.redeliveries + case((_status_in(TaskEvent.RECLAIM), 1), else_=0),
    )
    .returning(
        _T.c.target,
        _T.c.method,
        _T.c.payload,
        _T.c.idempotency_key,
        _T.c.trace,
        _T.c.session_id,
        _T.c.timeout_ms,
        _T.c.instance_id,
        _T.c.retries,
        _T.c.caller,
        _T.c.priority,
    )
)
_ASSIGN = (
    update(_T)
    .where(_T.c.task_id == bindparam("b_task_id"))
    .values(
        instance_id=bindparam("b_instance"),
        agent_id=bindparam("b_agent"),
        deadline=bindparam("b_deadline"),
    )
)
_SUCCEED = (
    update(_T)
    .where(_T.c.task_id == bindparam("b_task_id"), _status_in(TaskEvent.SUCCEED))
    .values(
        status=lifecycle.target_of(TaskEvent.SUCCEED),
        result=bindparam("b_result", type_=_T.c.result.type),
        error=None,
        finished_at=bindparam("b_now"),
        updated_at=bindparam("b_now"),
        lease_token=None,
        lease_until=None,
    )
    .returning(*(_T.c[name] for name in VIEW_COLUMNS), _T.c.callback_url)
)
# A reported success: only for the attempt the task waits on, from its own instance
# (``reach.core.reports``); anything else takes the ORM path to be judged and recorded.
assert AWAITING_REPORT <= lifecycle.sources_of(TaskEvent.SUCCEED)
_SUCCEED_REPORTED = _SUCCEED.where(
    _T.c.status.in_(sorted(AWAITING_REPORT)),
    _T.c.attempt_seq == bindparam("b_seq"),
    _T.c.instance_id == bindparam("b_instance"),
)
_ADD_EVENT = insert(_EVENTS)


def claim(
    session: Session, task_id: str, attempt_seq: int, now: float, dpolicy: DeliveryPolicy
) -> Claimed | None:
    """Take the attempt's dispatch lease in one conditional UPDATE.

    Only this ``attempt_seq``, only from ``pending`` or from ``dispatching`` whose lease
    lapsed (the holder died: counted as a redelivery); the lease lasts connect + read
    timeout (the task's own, if shorter) + a margin, as ``DeliveryPolicy.lease_for``.
    """
    token = uuid.uuid4().hex
    row = (
        session.connection()
        .execute(
            _CLAIM,
            {
                "b_task_id": task_id,
                "b_seq": attempt_seq,
                "b_now": now,
                "b_token": token,
                "b_lease_base": now + dpolicy.connect_timeout + dpolicy.lease_margin,
                "b_read": dpolicy.read_timeout,
            },
        )
        .first()
    )
    if row is None:
        return None  # stale or duplicate message, terminal, or another copy holds the lease
    return Claimed(task_id, attempt_seq, token, *row)


def _candidates(
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


def _route(
    session: Session,
    task: Claimed,
    now: float,
    policy: Policy,
    dpolicy: DeliveryPolicy,
    rng: random.Random,
    cache: registry.CandidateCache | None = None,
) -> _Dispatch | str:
    flt, candidates = _candidates(session, task, now, policy, cache)
    pinned = task.target.get("instance_id")
    if not pinned and not flt.agent_id and task.trace and task.trace.get("path"):  # no loop
        candidates = [c for c in candidates if c.agent_id not in task.trace["path"]]
    screened: trust.Screened | None = None
    if any(is_l3(c.trust_level) for c in candidates):  # else: not a read more
        screened = trust.screen_candidates(
            session, task.caller, candidates, task.method, flt.capability, task.payload,
            dpolicy.l3_max_payload_bytes,
        )  # fmt: skip
        candidates = screened.allowed
        if not candidates:
            return f"no instance of {flt.describe()} may be reached: {screened.reason}"
    exclude = {task.instance_id} if task.instance_id and task.retries else set()
    while True:
        try:
            chosen = choose_excluding(candidates, flt, rng, exclude)
        except NoSuitableAgent as exc:
            return exc.detail
        ticket = breaker_store.ticket_for(session, chosen, now, dpolicy.breaker)
        if ticket is not None:
            break
        # its breaker's trial is due and another delivery claimed it: not ours to use
        candidates = [c for c in candidates if c.instance_id != chosen.instance_id]
    read_timeout = dpolicy.read_timeout_for_ms(task.timeout_ms)
    deadline = now + read_timeout
    session.connection().execute(
        _ASSIGN,
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
    _insert_event(
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
    return _Dispatch(
        task.task_id,
        task.attempt_seq,
        task.lease_token,
        f"{chosen.endpoint}/tasks/{task.method}",
        body,
        chosen.instance_id,
        chosen.agent_id,
        read_timeout,
        ticket,
        chosen.trust_level,
        caller=task.caller,
        protocol=chosen.protocol,
    )


def succeed(
    session: Session,
    task_id: str,
    data: Any,
    now: float,
    detail: dict[str, Any],
    *,
    answering: tuple[int, str] | None = None,
    actor: str | None = None,
) -> dict[str, Any] | None:
    """The common ending in two statements: the task becomes ``success`` unless it is
    terminal already or unknown (then the ORM path records or refuses). Its view if so.

    ``answering`` (attempt_seq, instance_id) fences a reported result: it applies only
    while that attempt is out at that instance."""
    params: dict[str, Any] = {"b_task_id": task_id, "b_result": data, "b_now": now}
    statement = _SUCCEED
    if answering is not None:
        statement = _SUCCEED_REPORTED
        params["b_seq"], params["b_instance"] = answering
    row = session.connection().execute(statement, params).first()
    if row is None:
        return None
    view = dict(zip(VIEW_COLUMNS, row[:-1], strict=True))
    _insert_event(
        session, task_id, view["agent_id"], view["instance_id"], view["attempt_seq"],
        "terminal_success", now, detail, actor,
    )  # fmt: skip
    if row[-1]:  # the task has a callback: armed in this transaction
        callbacks.on_event(session, task_id, "terminal_success", now, detail)
    mark_finished(session, task_id, view)
    metrics.TASKS_TOTAL.labels(TaskStatus.SUCCESS).inc()
    return view


def _insert_event(
    session: Session,
    task_id: str,
    agent_id: str | None,
    instance_id: str | None,
    attempt_seq: int,
    kind: str,
    now: float,
    detail: dict[str, Any],
    actor: str | None = None,
) -> None:
    session.connection().execute(
        _ADD_EVENT,
        {
            "task_id": task_id,
            "agent_id": agent_id,
            "instance_id": instance_id,
            "attempt_seq": attempt_seq,
            "kind": kind,
            "detail": detail,
            "at": now,
            "actor": actor,
        },
    )
    mark_changed(session, task_id)  # progress streams wake (reach.hub.streams)


def record_outcome(
    session: Session,
    d: _Dispatch,
    outcome: Outcome,
    answer: AgentAnswer,
    now: float,
    dpolicy: DeliveryPolicy,
    rng: random.Random,
    verdict: a2a_rules.Verdict | None = None,
) -> Publish | None:
    task = load_for_update(session, d.task_id)
    if task is None:
        return None
    body = answer.body if isinstance(answer.body, dict) else {}
    if outcome is Outcome.SUCCESS:
        finish(
            session,
            task,
            TaskStatus.SUCCESS,
            now,
            result=body.get("data"),
            detail={"instance_id": d.instance_id, "attempt_seq": d.attempt_seq},
        )
        return None
    if outcome is Outcome.BUSINESS_ERROR:
        raw_code = body.get("code")
        code = raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) else None
        code = answer.status if code is None else code
        message = str(body.get("message") or answer.body)
        error = {
            "kind": "business",
            "code": code,
            "message": business_message(answer.status, message)[:2000],
            "http_status": answer.status,
        }
        finish(
            session,
            task,
            TaskStatus.FAILED,
            now,
            error=error,
            detail={"instance_id": d.instance_id, "attempt_seq": d.attempt_seq},
        )
        return None
    if not _holds_lease(task, d):
        record_event(
            session,
            task,
            "late_outcome",
            now,
            {"outcome": outcome.value, "attempt_seq": d.attempt_seq},
        )
        return None
    if answer.refused:  # an L1 agent the hub may not reach as it is: no retry would help
        error = {
            "kind": answer.error_kind,
            "http_status": None,
            "message": (answer.error or "")[:2000],
            "instance_id": d.instance_id,
        }
        dead_letter(session, task, now, reason="refused by mTLS (L1)", error=error)
        return None
    if outcome is Outcome.ACCEPTED:
        task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.ACCEPT)
        task.accepted_at = now
        task.deadline = now + task.timeout_ms / 1000 + dpolicy.watchdog_grace
        task.lease_until = None
        task.updated_at = now
        record_event(session, task, "ack", now, {"instance_id": d.instance_id})
        a2a_exchange.accepted(session, task, verdict, now)  # an A2A task to follow
        return None
    if outcome is Outcome.BACKPRESSURE and task.deferrals < dpolicy.max_deferrals:
        task.deferrals += 1
        delay = backoff_delay(min(task.deferrals, 5), dpolicy.retry, rng)
        return schedule_retry(
            session,
            task,
            now,
            delay,
            "backpressure",
            {"instance_id": d.instance_id, "deferrals": task.deferrals},
        )
    error = {
        "kind": answer.error_kind,
        "http_status": answer.status,
        "message": redacted(answer.error or str(answer.body))[:2000],  # it quotes the URL
        "instance_id": d.instance_id,
    }
    if breaker_store.open_until(session, d.instance_id, now) is not None:
        # its breaker is open (this answer or another opened it): no retry spent
        task.error = error
        delay = backoff_delay(task.retries + 1, dpolicy.retry, rng)
        held = defer_attempt(
            session, task, now, delay, 0.0, "breaker_open", {"error": error}, dpolicy
        )
        if held is not None:
            return held
    return fail_transient(
        session, task, d.token, now, dpolicy, rng, reason="transient", error=error
    )


def fail_transient(
    session: Session,
    task: TaskRow,
    token: str | None,
    now: float,
    dpolicy: DeliveryPolicy,
    rng: random.Random,
    *,
    reason: str,
    error: dict[str, Any],
) -> Publish | None:
    """A transient failure of the current attempt: retry with backoff, or dead-letter."""
    if token is not None and task.lease_token != token:
        return None
    task.error = error
    budget = (
        dpolicy.retry
        if task.max_retry is None
        else replace(dpolicy.retry, max_retry=task.max_retry)
    )
    if not should_retry(task.retries, budget):
        dead_letter(session, task, now, reason=f"{task.retries} retries exhausted", error=error)
        return None
    task.retries += 1
    delay = backoff_delay(task.retries, dpolicy.retry, rng)
    return schedule_retry(
        session, task, now, delay, reason, {"error": error, "retry": task.retries}
    )


def _wait_for_budget(
    session: Session, claimed: Claimed, now: float, agent_id: str, delay: float
) -> Publish:
    """A re-send beyond its target's retry budget waits (``reach.hub.retry_budget``):
    deferred and checked again when it fires; no retry or deferral spent, not a failure."""
    task = load_for_update(session, claimed.task_id)
    assert task is not None
    detail = {"budget_wait": True, "agent_id": agent_id, "retry": task.retries}
    return schedule_retry(session, task, now, delay, "retry_budget", detail)


def _wait_for_breakers(
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
    _, found = _candidates(session, claimed, now, policy, cache)
    found = breaker_store.open_failing(session, found, now, dpolicy.breaker)
    trial = dpolicy.breaker.trial_interval_s
    until = breaker_store.held_back_until(found, now, recheck_s=min(1.0, trial))
    if until is None:
        return None
    detail = {"breaker_wait": True, "next_trial_at": until}
    return defer_attempt(
        session, task, now, until - now, min(1.0, trial / 10), "breaker_open", detail, dpolicy, rng
    )


def defer_attempt(
    session: Session,
    task: TaskRow,
    now: float,
    wait: float,
    jitter: float,
    reason: str,
    detail: dict[str, Any],
    dpolicy: DeliveryPolicy,
    rng: random.Random | None = None,
) -> Publish | None:
    """Put the attempt off ``wait`` (+ up to ``jitter``) seconds without spending a retry.

    At most ``dpolicy.max_deferrals`` times per task (shared with 429 deferrals): past
    that, None, and the caller spends retries as before, so a permanently broken agent
    still ends in the dead-letter queue."""
    if task.deferrals >= dpolicy.max_deferrals:
        return None
    task.deferrals += 1
    delay = max(0.0, wait) + (rng.uniform(0, jitter) if rng is not None and jitter > 0 else 0.0)
    return schedule_retry(
        session, task, now, delay, reason, {**detail, "deferrals": task.deferrals}
    )


def schedule_retry(
    session: Session, task: TaskRow, now: float, delay: float, reason: str, detail: dict[str, Any]
) -> Publish:
    task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.RETRY)
    task.attempt_seq += 1
    task.lease_token = None
    task.lease_until = None
    task.next_attempt_at = now + delay
    task.updated_at = now
    add_attempt(session, task, now, available_at=now + delay)
    record_event(
        session, task, "retry", now, {"reason": reason, "delay_s": round(delay, 3), **detail}
    )
    metrics.RETRY_TOTAL.labels(reason).inc()
    return Publish(task.task_id, task.attempt_seq, delay, queue_for(task.priority))


def finish(
    session: Session,
    task: TaskRow,
    status: TaskStatus,
    now: float,
    *,
    result: Any = None,
    error: dict[str, Any] | None = None,
    detail: dict[str, Any] | None = None,
    actor: str | None = None,
) -> bool:
    """Make the task terminal (``status``) unless it already is: first terminal result wins.
    ``actor``: who caused it, when not the hub itself (an agent's reported result)."""
    if task.status in TERMINAL:
        duplicate = {"status": status, **(detail or {})}
        record_event(session, task, "duplicate_result", now, duplicate, actor=actor)
        return False
    status = lifecycle.transition(TaskStatus(task.status), lifecycle.ending(status))
    task.status = status
    task.result = result
    task.error = error
    task.finished_at = now
    task.updated_at = now
    task.lease_token = None
    task.lease_until = None
    kind = "terminal_success" if status is TaskStatus.SUCCESS else "terminal_failure"
    mark_finished(session, task.task_id, task_view(task))
    record_event(
        session,
        task,
        kind,
        now,
        {**(detail or {}), **({"error": error} if error else {})},
        actor=actor,
    )
    metrics.TASKS_TOTAL.labels(status).inc()
    return True


def dead_letter(
    session: Session, task: TaskRow, now: float, *, reason: str, error: dict[str, Any]
) -> None:
    finish(session, task, TaskStatus.DEAD, now, error={**error, "reason": reason})
    session.add(
        DeadLetterRow(
            task_id=task.task_id,
            agent_id=task.agent_id,
            method=task.method,
            payload=task.payload,
            attempts=task.attempt_seq,
            last_error=error,
            reason=reason,
            created_at=now,
            target=task.target,
        )
    )
    record_event(session, task, "dead_letter", now, {"reason": reason})
    metrics.DEAD_LETTER_TOTAL.inc()
    log.error("ALERT dead-lettered task %s (%s): %s", task.task_id, reason, error.get("message"))


def add_attempt(session: Session, task: TaskRow, now: float, available_at: float) -> None:
    """The outbox row of the task's current attempt, committed with the state change."""
    session.add(
        OutboxRow(
            task_id=task.task_id,
            agent_id=task.agent_id or "-",
            attempt_seq=task.attempt_seq,
            message=attempt_message(task.task_id, task.attempt_seq, task.priority),
            created_at=now,
            available_at=available_at,
        )
    )


def attempt_message(task_id: str, attempt_seq: int, priority: str | None) -> dict[str, Any]:
    """An outbox row's ``message``: the attempt and the queue the relay publishes it to."""
    return {"task_id": task_id, "attempt_seq": attempt_seq, "queue": queue_for(priority)}


def mark_published(session: Session, task_id: str, attempt_seq: int, now: float) -> None:
    """Confirm a publication: the attempt is marked published and its claim, if a relay
    held one, is closed."""
    session.execute(
        update(OutboxRow)
        .where(OutboxRow.task_id == task_id, OutboxRow.attempt_seq == attempt_seq)
        .values(published_at=now, claimed_at=None)
    )
    session.execute(update(TaskRow).where(TaskRow.task_id == task_id).values(last_published_at=now))


def unmark_published(session: Session, task_id: str, attempt_seq: int) -> None:
    """Hand a refused publication back to the relay: unmarked, no claim open."""
    session.execute(
        update(OutboxRow)
        .where(OutboxRow.task_id == task_id, OutboxRow.attempt_seq == attempt_seq)
        .values(published_at=None, claimed_at=None)
    )
    session.execute(
        update(TaskRow).where(TaskRow.task_id == task_id).values(last_published_at=None)
    )


def _holds_lease(task: TaskRow, d: _Dispatch) -> bool:
    return task.status == TaskStatus.DISPATCHING and task.lease_token == d.token


def record_event(
    session: Session,
    task: TaskRow,
    kind: str,
    now: float,
    detail: dict[str, Any],
    *,
    actor: str | None = None,
) -> None:
    """One task event; ``actor`` is the identity that caused it (None: the hub's own step)."""
    session.add(
        TaskEventRow(
            task_id=task.task_id,
            agent_id=task.agent_id,
            instance_id=task.instance_id,
            attempt_seq=task.attempt_seq,
            kind=kind,
            detail=detail,
            at=now,
            actor=actor,
        )
    )
    mark_changed(session, task.task_id)  # progress streams wake (reach.hub.streams)
    if task.callback_url:
        callbacks.on_event(session, task.task_id, kind, now, detail)


def load_for_update(session: Session, task_id: str) -> TaskRow | None:
    """The task row, locked until the transaction ends (PostgreSQL; SQLite locks the file)."""
    return session.scalar(select(TaskRow).where(TaskRow.task_id == task_id).with_for_update())


def record_report(
    session: Session,
    task_id: str,
    code: int,
    data: Any,
    message: str,
    now: float,
    *,
    attempt_seq: int,
    instance_id: str,
    actor: str | None = None,
    transient: Transient | None = None,
) -> bool | StaleReport | Publish:
    """Record an agent's reported answer (after its 202).

    True if it decided the task; False if the task had its terminal result already (the
    report is kept as a ``duplicate_result`` event). A report for another attempt or from
    another instance (``reach.core.reports``) changes nothing but a ``report_refused``
    event, and comes back as the `StaleReport` to raise once this transaction committed
    (raising here would roll the record back with it). A ``transient`` failure report
    fails the attempt as a 5xx answer would: the retry to publish after commit comes
    back (or False: dead-lettered, or nothing left to fail).
    """
    detail = {"reported_by": instance_id, "attempt_seq": attempt_seq, "late_report": True}
    answering = (attempt_seq, instance_id)
    if code == 0 and (
        succeed(session, task_id, data, now, detail, answering=answering, actor=actor) is not None
    ):
        return True  # the common case, without loading the row
    task = load_for_update(session, task_id)
    if task is None:
        raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
    current = (TaskStatus(task.status), task.attempt_seq, task.instance_id)
    verdict = judge_report(*current, attempt_seq, instance_id)
    if verdict is Verdict.STALE:
        return refuse_report(session, task, "result", attempt_seq, instance_id, now, actor)
    if code == 0:
        return finish(
            session, task, TaskStatus.SUCCESS, now, result=data, detail=detail, actor=actor
        )
    if transient is not None:
        if verdict is not Verdict.APPLY:  # terminal already: the first result stands
            record_event(session, task, "duplicate_result", now, {**detail, "transient": True})
            return False
        error = {"kind": "agent_error", "code": code, "message": message[:2000]}
        error["instance_id"] = instance_id
        retry = fail_transient(
            session, task, None, now, transient.policy, transient.rng,
            reason="reported_failure", error=error,
        )  # fmt: skip
        return False if retry is None else retry
    error = {"kind": "business", "code": code, "message": message[:2000]}
    return finish(session, task, TaskStatus.FAILED, now, error=error, detail=detail, actor=actor)


@dataclass(frozen=True, slots=True)
class Transient:
    """What failing a reported attempt needs: the retry schedule and its jitter."""

    policy: DeliveryPolicy
    rng: random.Random


def report_progress(
    session: Session,
    task_id: str,
    detail: dict[str, Any],
    now: float,
    *,
    attempt_seq: int,
    instance_id: str,
    actor: str | None = None,
    keepalive: bool = False,
    grace: float = 0.0,
) -> StaleReport | None:
    """Record progress of the attempt in flight; a `StaleReport` (recorded, as for a
    result) if the report names another attempt or instance. Late progress of a
    terminal task is kept as an event, as before. The row is locked: a task's events
    commit in their id order, which a progress stream resuming by id relies on.

    Progress of an accepted task is word from its agent: the watchdog's deadline moves
    to ``timeout`` + ``grace`` from now. A ``keepalive`` moves it and records nothing."""
    task = load_for_update(session, task_id)
    if task is None:
        raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
    verdict = judge_report(
        TaskStatus(task.status), task.attempt_seq, task.instance_id, attempt_seq, instance_id
    )
    if verdict is Verdict.STALE:
        return refuse_report(session, task, "progress", attempt_seq, instance_id, now, actor)
    if verdict is Verdict.APPLY and task.status == TaskStatus.EXECUTING:
        task.deadline = max(task.deadline or 0.0, now + task.timeout_ms / 1000 + grace)
    if not keepalive:
        record_event(session, task, "progress", now, detail, actor=actor)
    return None


def refuse_report(
    session: Session,
    task: TaskRow,
    report: str,
    attempt_seq: int,
    instance_id: str,
    now: float,
    actor: str | None = None,
) -> StaleReport:
    """Record a refused report (who claimed what, and what the task waits on) as a task
    event that leaves the task as it is; the error names only what the reporter sent."""
    session.add(
        TaskEventRow(
            task_id=task.task_id,
            agent_id=None,  # a claim, not a fact: the reporter may be anyone
            instance_id=instance_id,
            attempt_seq=attempt_seq,
            kind="report_refused",
            actor=actor,
            detail={
                "report": report,
                "claimed_instance_id": instance_id,
                "claimed_attempt_seq": attempt_seq,
                "status": task.status,
                "current_attempt_seq": task.attempt_seq,
                "current_instance_id": task.instance_id,
            },
            at=now,
        )
    )
    log.warning(
        "refused %s report for task %s from instance %s (attempt %d): it waits on attempt %d"
        " at %s (%s)",
        report, task.task_id, instance_id, attempt_seq, task.attempt_seq, task.instance_id,
        task.status,
    )  # fmt: skip
    return StaleReport(
        f"task {task.task_id!r} is not waiting on a {report} of attempt {attempt_seq} "
        f"from instance {instance_id!r}; the report was recorded and not applied",
        task_id=task.task_id,
        attempt_seq=attempt_seq,
        instance_id=instance_id,
    )


def _session_closed(session: Session, claimed: Claimed, now: float) -> bool:
    from reach.hub.sessions import cancel_if_closed  # sessions imports this module

    assert claimed.session_id is not None
    return cancel_if_closed(session, claimed.task_id, claimed.session_id, now)


def task_view(task: TaskRow) -> dict[str, Any]:
    return {name: getattr(task, name) for name in VIEW_COLUMNS}
