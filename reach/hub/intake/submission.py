"""Accepting a task: validate it, pick nothing yet, and make it durable in one transaction.

The instance is chosen at delivery time (state changes by the second); what is decided
here is whether *any* registered agent can take the task at all — an unknown target, a
payload that fails the capability's ``params_schema``, or a target whose every instance
has its circuit breaker open (``CircuitOpen``: fail fast, do not queue behind a failing
agent) is refused before anything is queued. The task row, its first event and its outbox
row commit together, so a crash before the broker hears of it loses nothing: the relay
publishes what commit left behind.
"""

from __future__ import annotations

import math
import uuid
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from reach.core.fleet import matching, params_schema
from reach.core.fleet.routing import Declaration, RouteFilter, eligibility
from reach.core.flow.breakers import BreakerState
from reach.core.flow.breakers import state as breaker_state
from reach.core.ledger.statuses import InstanceStatus, TaskStatus
from reach.core.security.auth import Principal
from reach.core.security.trust import is_l3
from reach.errors import (
    CircuitOpen,
    InvalidPayload,
    InvalidTaskRequest,
    NoSuitableAgent,
    ReachError,
    SemanticMatchingOff,
    TaskConflict,
)
from reach.hub import logs, tracing
from reach.hub.blobs import records as blobs
from reach.hub.fleet.matching import Matcher
from reach.hub.fleet.registry import (
    CANDIDATE_LIMIT,
    PrefilterShape,
    prefilter_conditions,
    prefilter_params,
    shape_of,
)
from reach.hub.flow import admission, loops
from reach.hub.gates import approvals
from reach.hub.gates.sessions import bind as bind_session
from reach.hub.gates.sessions import check_open as check_session_open
from reach.hub.ledger.tasks import VIEW_COLUMNS, attempt_message, target_key, task_view
from reach.hub.notify import callbacks
from reach.hub.security import trust
from reach.hub.storage.models import AgentRow, InstanceRow, OutboxRow, TaskEventRow, TaskRow
from reach.wire.schemas import SubmitRequest


def route_filter(req: SubmitRequest) -> RouteFilter:
    return RouteFilter(
        agent_id=req.agent_id,
        tags=tuple(sorted(req.tags)),
        capability=req.capability,
        rules=tuple(sorted(req.rules.items())),
        intent=req.intent,
    )


def target_of(req: SubmitRequest) -> dict[str, Any]:
    target: dict[str, Any] = {
        "agent_id": req.agent_id,
        "tags": sorted(req.tags),
        "capability": req.capability,
        "rules": dict(sorted(req.rules.items())),
    }
    if req.intent is not None:
        target["intent"] = req.intent
    return target


def _asked(target: dict[str, Any], method: str | None) -> dict[str, Any]:
    """What a submission asked for: its target and method as sent. A task sent with an
    intent keeps this apart (``target["asked"]``): its target is the match."""
    return {**target, "method": method}


def submit(
    session: Session,
    req: SubmitRequest,
    now: float,
    *,
    pin_instance: str | None = None,
    max_retry: int | None = None,
    published_at: float | None = None,
    look_first: bool = True,
    caller: str | None = None,
    principal: Principal | None = None,
    l3_cap: int = trust.DEFAULT_L3_CAP,
    approval: approvals.ApprovalPolicy = approvals.DEFAULT_POLICY,
    limits: admission.Limits = admission.DEFAULT_LIMITS,
    loop_guard: loops.LoopGuard | None = None,
    matcher: Matcher | None = None,
    traceparent: str | None = None,
) -> tuple[dict[str, Any], bool]:
    """Create the task (or find the existing one with this task_id): (its view, created).

    ``traceparent`` (the caller's W3C trace context) is the parent of the task's span
    (`reach.hub.tracing.task_context`), whose context the task's ``trace`` keeps for its
    attempts; its trace id is in the ``accepted`` event.

    ``pin_instance`` (broadcasts) delivers to that instance only; ``max_retry`` overrides
    the router's retry budget for this task. ``published_at`` marks the first attempt as
    published in this same transaction, for a caller that publishes right after commit
    and un-marks it if that fails (one transaction instead of two on the hot path).
    ``look_first=False`` skips the read for an existing ``task_id``: the unique index
    refuses a duplicate at flush (IntegrityError) and the caller retries looking first.
    ``caller`` is the authenticated identity submitting it (`Principal.identity`), never
    a field of the request: only the same identity may resubmit a task_id and be given
    the task; anyone else is told the id is taken, as for a different task.
    ``principal`` (the API's submits: ``caller`` is its identity) binds the task's
    session under its owner's rules (`reach.hub.gates.sessions.bind`: another key's session is
    `Forbidden`, an unknown one is opened, owned by it); without one, a closed session is
    refused and nothing more.

    A reach to or from an L3 agent passes its screen (`reach.hub.security.trust`, with ``l3_cap``
    the payload cap): a refusal (`Forbidden`, `RequestTooLarge`) is raised before anything
    of the task is written, with its audit row in the session -- a caller that commits
    after catching it keeps the record and nothing else.

    A task whose capability needs a human decision (`reach.hub.gates.approvals.required`, under
    ``approval``) is parked instead: status ``awaiting_approval``, an approval row, no
    outbox row -- the caller must not publish it (its view says the status).

    Admission (`reach.hub.flow.admission`, under ``limits``): a payload over the cap raises
    `RequestTooLarge` first; a task whose eligible agents are all full raises
    `Backpressure` before it is written (a parked task holds no slot: never refused).

    With a ``loop_guard`` (the API's submits) the stored trace is the hub's own
    (`reach.hub.flow.loops.derive_trace`), a reach closing a cycle or too deep raises
    `LoopDetected`, and a reach on a link suspected of a dependency loop is stored as
    ``background``.

    A request with an ``intent`` is matched first (``matcher``, `reach.hub.fleet.matching`:
    `SemanticMatchingOff` without one, `NoSuitableAgent` with the closest candidates below
    the threshold); the task is then the matched agent's capability, exactly as if the
    caller had named both, and its target keeps the intent and what was asked.
    """
    admission.check_payload(req.payload, limits.max_payload_bytes)
    target = target_of(req)
    if pin_instance:
        target["instance_id"] = pin_instance
    asked = _asked(target, req.method)
    if req.task_id is not None and look_first:
        existing = session.scalar(select(TaskRow).where(TaskRow.task_id == req.task_id))
        if existing is not None:
            before = existing.target.get("asked") or _asked(existing.target, existing.method)
            same = (before, existing.payload, existing.payload_ref, existing.caller) == (
                asked,
                req.payload,
                req.payload_ref,
                caller,
            )
            if not same:
                raise TaskConflict(
                    f"task_id {req.task_id!r} is already used by a different task",
                    task_id=req.task_id,
                )
            return task_view(existing), False
    task_id = req.task_id or f"t-{uuid.uuid4().hex}"
    with logs.task_context(task_id=task_id, agent_id=req.agent_id):  # its log lines name it
        if principal is not None:  # only its owner's reaches; opened on first use
            bind_session(session, req.session_id, principal, now)
        else:
            check_session_open(session, req.session_id, now)  # a closed session takes no new reach
        accepted: dict[str, Any] = {}
        if req.intent is not None:
            req, accepted = _match(session, req, now, matcher)
            target = {**target_of(req), "intent": accepted["intent"], "asked": asked}
        method = req.method
        if method is None:  # the schema requires it without an intent; a match sets it
            raise InvalidTaskRequest("method: required (or give an intent)")
        decls = _check_target(
            session, req, method, now, task_id=task_id, caller=caller, l3_cap=l3_cap
        )
        trace = (
            req.trace.model_dump()
            if req.trace
            else {"root_id": task_id, "parent_task_id": None, "hops": 0, "path": []}
        )
        if loop_guard is not None:  # the hub's own trace, loop-checked (`reach.hub.flow.loops`)
            trace = loop_guard.trace_for(session, req, task_id, caller, list(decls))
        traced = tracing.task_context(
            traceparent,
            {"reach.task_id": task_id, "reach.method": method, "reach.agent_id": req.agent_id},
        )
        if traced is not None:
            trace = {**trace, tracing.KEY: traced}
            accepted = {**accepted, "trace_id": tracing.trace_id(trace)}
        values = {
            "task_id": task_id,
            "agent_id": req.agent_id,
            "target": target,
            "method": method,
            "payload": req.payload,
            "status": TaskStatus.PENDING,
            "attempt_seq": 1,
            "idempotency_key": task_id,
            "session_id": req.session_id,
            "trace": trace,
            "timeout_ms": req.timeout_ms,
            "created_at": now,
            "updated_at": now,
            "next_attempt_at": now,
            "retries": 0,
            "redeliveries": 0,
            "deferrals": 0,
            "max_retry": max_retry,
            "last_published_at": published_at,
            "caller": caller,
            "priority": req.priority,
        }
        if (
            req.callback_url
        ):  # its URL was checked at the edge (reach.hub.notify.callbacks.check_url)
            values["callback_url"] = req.callback_url
            callbacks.register(
                session, task_id, req.callback_url, req.callback_context, req.callback_progress, now
            )
        if req.payload_ref is not None:  # the caller's blob goes with this task from now on
            if principal is None:
                raise InvalidTaskRequest("payload_ref: only a caller's submit may carry one")
            blobs.bind(session, req.payload_ref, principal, task_id)
            values["payload_ref"] = req.payload_ref
        if approvals.required(decls.values(), method, req.capability, approval):
            approvals.park(session, values, now, approval, capability=req.capability or method)
            view = {name: values.get(name) for name in VIEW_COLUMNS}
            view["status"] = TaskStatus.AWAITING_APPROVAL
            return view, True
        named = bool(req.agent_id)
        admission.admit(session, list(decls), limits, now, named=named, task_id=req.task_id)
        if loop_guard is not None and loop_guard.observe(session, caller, trace, req.agent_id, now):
            values["priority"] = "background"  # a link suspected of a dependency loop
        # plain inserts (the hot path of every submit: the ORM's unit of work cost more)
        conn = session.connection()
        conn.execute(_ADD_TASK, values)
        conn.execute(
            _ADD_EVENT,
            {
                "task_id": task_id,
                "agent_id": req.agent_id,
                "instance_id": None,
                "attempt_seq": 1,
                "kind": "accepted",
                "detail": {"target": target, **accepted},
                "at": now,
                "actor": caller,
            },
        )
        conn.execute(
            _ADD_OUTBOX,
            {
                "task_id": task_id,
                "agent_id": target_key(target),
                "attempt_seq": 1,
                "message": attempt_message(task_id, 1, str(values["priority"])),
                "created_at": now,
                "available_at": now,
                "published_at": published_at,
            },
        )
        # the view of a row just written: what it holds, None for what it does not yet
        view = {name: values.get(name) for name in VIEW_COLUMNS}
        return view, True


_ADD_TASK = insert(cast(Table, TaskRow.__table__))
_ADD_EVENT = insert(cast(Table, TaskEventRow.__table__))
_ADD_OUTBOX = insert(cast(Table, OutboxRow.__table__))


def _match(
    session: Session, req: SubmitRequest, now: float, matcher: Matcher | None
) -> tuple[SubmitRequest, dict[str, Any]]:
    """The request as the intent's match makes it (the matched agent and capability
    named, the capability as method), and what the accepted event records of the match."""
    if matcher is None:
        raise SemanticMatchingOff(
            "semantic matching is off here: this hub process has no matcher",
            reason="no matcher",
        )
    path = set(req.trace.path) if req.trace else set()  # never back along the reach's path
    chosen, ranked = matcher.resolve(session, route_filter(req), req.method, now, path)
    resolved = req.model_copy(
        update={
            "agent_id": chosen.agent_id,
            "capability": chosen.capability,
            "method": chosen.capability,
            "intent": None,
        }
    )
    record = {
        "intent": req.intent,
        "score": round(chosen.similarity, 4),
        "candidates": [p.shown() for p in ranked[: matching.SHOWN]],
    }
    return resolved, record


def _check_target(
    session: Session,
    req: SubmitRequest,
    method: str,
    now: float,
    *,
    task_id: str | None = None,
    caller: str | None = None,
    l3_cap: int = trust.DEFAULT_L3_CAP,
) -> dict[str, dict[str, Any] | None]:
    """At least one registered agent must be eligible (`reach.core.fleet.routing.eligibility`,
    the rule delivery routes by) and accept the payload, and not every instance of the
    eligible agents may have its circuit breaker open.

    Returns the capability declaration (None: the agent declares none) by eligible
    agent, for the approval gate and the queue bound.

    One indexed read (`registry.prefilter`: the agents the filter names, never the fleet)
    of the matching agents with their instances' status and breaker state (live before
    offline, closed before open) and at most ``CANDIDATE_LIMIT`` instances; a second, as
    small, only to explain a refusal.
    """
    flt = route_filter(req)
    agents: dict[str, Any] = {}
    breakers: dict[str, list[float | None]] = {}
    # plain rows (a Core statement, built once per filter shape): no ORM objects
    window = session.connection().execute(*_targets(flt, method)).all()
    for agent in window:
        agents[agent.agent_id] = agent
        held = breakers.setdefault(agent.agent_id, [])
        # an offline instance (a dead incarnation, kept for a while) takes no work now: it
        # must not keep a submit from failing fast behind a live one whose breaker is open;
        # one whose own breaker is open still counts as open
        if agent.status != InstanceStatus.OFFLINE.value or _is_open(agent.breaker_open_until, now):
            held.append(agent.breaker_open_until)
    if len(window) >= CANDIDATE_LIMIT:
        # the window is full: agents whose instances all sort past it are judged too, so
        # the approval gate and the schema see every eligible agent (issue 37: an agent key
        # that registers a thousand instances must not push a gated agent out of sight)
        for agent in session.connection().execute(*_eligible_agents(flt, method)):
            agents.setdefault(agent.agent_id, agent)
    schema_errors: list[str] = []
    matched: list[str] = []
    decls: dict[str, dict[str, Any] | None] = {}
    for agent in agents.values():
        types = {c["type"]: c for c in agent.capabilities}
        declared = Declaration(
            agent_id=agent.agent_id,
            tags=tuple(agent.tags),
            capabilities=tuple(types),
            metadata=tuple(agent.meta.items()),
        )
        found = eligibility(declared, flt, method)
        if found is None:
            continue
        if found.capability is not None:
            schema = types[found.capability].get("params_schema") or {}
            error = params_schema.payload_error(schema, req.payload)
            if error:
                schema_errors.append(f"{agent.agent_id}: {error}")
                continue
        matched.append(agent.agent_id)
        decls[agent.agent_id] = types.get(found.capability) if found.capability else None
    if matched:
        trusts = {a: agents[a].trust_level for a in matched}
        matched = _screen(session, req, method, trusts, now, task_id, caller, l3_cap)
        rows = [(a, u) for a in matched for u in breakers.get(a, ())]
        _check_breakers(matched, rows, now)
        return {a: decls[a] for a in matched}
    if schema_errors:
        raise InvalidPayload(
            f"payload does not satisfy params_schema of {method!r}: {schema_errors[0]}",
            errors=schema_errors,
        )
    # the method's prefilter left out agents that match but lack it: name a few
    undeclared: set[str] = set()
    for agent in session.connection().execute(*_targets(flt, None, limit=_HINT_LIMIT)):
        declared = Declaration(
            agent_id=agent.agent_id,
            tags=tuple(agent.tags),
            capabilities=tuple(c["type"] for c in agent.capabilities),
            metadata=tuple(agent.meta.items()),
        )
        if eligibility(declared, flt, None) and not eligibility(declared, flt, method):
            undeclared.add(agent.agent_id)
    hint = (
        f"; {', '.join(sorted(undeclared))} match but declare no capability {method!r}"
        if undeclared
        else ""
    )
    raise NoSuitableAgent(
        f"no registered agent matches {flt.describe()} with method {method!r}{hint}",
        filter={k: v for k, v in target_of(req).items() if v},
        method=method,
    )


_HINT_LIMIT = 20


def _screen(
    session: Session,
    req: SubmitRequest,
    method: str,
    trusts: dict[str, str | None],
    now: float,
    task_id: str | None,
    caller: str | None,
    l3_cap: int,
) -> list[str]:
    """The eligible agents this caller may reach under the L3 rules; raises the refusal
    when there is none (an explicit L3 target refused, an L3 caller outside its
    allow-list, every agent of a route refused). Without an L3 agent at either end this
    costs nothing but, for an agent caller, one primary-key read of its trust level.

    A submission involving an L3 agent leaves one audit row, allowed or refused; which
    L3 instance a route ends at is recorded again at delivery."""
    any_l3 = any(map(is_l3, trusts.values()))
    if not any_l3 and trust.agent_of(caller) is None:
        return list(trusts)
    sender = trust.caller_party(session, caller)
    if not any_l3 and not is_l3(sender.trust):
        return list(trusts)
    invoked = trust.invoked_by(method, req.capability)
    allowed: list[str] = []
    refused: dict[str, ReachError] = {}
    for agent_id, level in trusts.items():
        target = trust.party(session, agent_id, level)
        refusal = trust.judge(sender, caller, target, invoked, req.payload, l3_cap)
        if refusal is None:
            allowed.append(agent_id)
        else:
            refused[agent_id] = refusal
    first = None if allowed else next(iter(refused.values()))
    named = trust.Party(req.agent_id, trusts[req.agent_id]) if req.agent_id else None
    trust.record_reach(
        session,
        identity=caller,
        caller=sender,
        target=named or trust.Party(None, None),
        invoked=invoked,
        now=now,
        task_id=task_id if first is None or req.task_id else None,  # no task: no made-up id
        refusal=first,
        extra={
            "route": {k: v for k, v in target_of(req).items() if v},
            **({"screened_out": sorted(refused)} if refused and allowed else {}),
        },
    )
    if first is not None:
        raise first
    return allowed


def _targets(
    flt: RouteFilter, method: str | None, limit: int = CANDIDATE_LIMIT
) -> tuple[Any, dict[str, Any]]:
    """The live instances (with their agents' declarations) that may be eligible: the
    statement and its parameters."""
    return _targets_statement(shape_of(flt, method), limit), prefilter_params(flt, method)


@lru_cache(maxsize=64)
def _targets_statement(shape: PrefilterShape, limit: int) -> Any:
    agents, instances = cast(Table, AgentRow.__table__), cast(Table, InstanceRow.__table__)
    return (
        select(
            agents.c.agent_id,
            agents.c.tags,
            agents.c.capabilities,
            agents.c["metadata"].label("meta"),
            agents.c.trust_level,
            instances.c.breaker_open_until,
            instances.c.status,
        )
        .join(agents, agents.c.agent_id == instances.c.agent_id)
        .where(instances.c.status != InstanceStatus.DEREGISTERED.value)
        .where(*prefilter_conditions(shape))
        # live before offline, closed before open: what may refuse a submit is kept
        .order_by(
            (instances.c.status == InstanceStatus.OFFLINE.value).asc(),
            instances.c.breaker_open_until.asc().nulls_first(),
            instances.c.instance_id,
        )
        .limit(limit)
    )


def _eligible_agents(flt: RouteFilter, method: str | None) -> tuple[Any, dict[str, Any]]:
    """Every agent with a registered instance that may be eligible (no window): the
    statement and its parameters."""
    return _agents_statement(shape_of(flt, method)), prefilter_params(flt, method)


@lru_cache(maxsize=64)
def _agents_statement(shape: PrefilterShape) -> Any:
    agents, instances = cast(Table, AgentRow.__table__), cast(Table, InstanceRow.__table__)
    registered = (
        select(instances.c.agent_id)
        .where(instances.c.status != InstanceStatus.DEREGISTERED.value)
        .where(*prefilter_conditions(shape))
    )
    return select(
        agents.c.agent_id,
        agents.c.tags,
        agents.c.capabilities,
        agents.c["metadata"].label("meta"),
        agents.c.trust_level,
    ).where(agents.c.agent_id.in_(registered))


def _is_open(until: float | None, now: float) -> bool:
    return until is not None and breaker_state(until, now) is BreakerState.OPEN


def _check_breakers(agent_ids: list[str], rows: list[tuple[str, float | None]], now: float) -> None:
    """Refuse with CircuitOpen when every instance in ``rows`` is open: the live instances
    of these agents and the offline ones whose breaker is open. None at all (every
    instance offline, no breaker open) is not refused: the task waits for one to return."""
    open_until = [until for _, until in rows if until is not None and _is_open(until, now)]
    if not rows or len(open_until) < len(rows):
        return
    next_trial = min(open_until)
    names = ", ".join(sorted(set(agent_ids)))
    raise CircuitOpen(
        f"the circuit breaker of every instance of {names} is open after repeated failures; "
        f"the next trial request is due in {max(0.0, next_trial - now):.1f}s",
        agents=sorted(set(agent_ids)),
        next_trial_at=next_trial,
        retry_after=max(1, math.ceil(next_trial - now)),
    )
