"""The registry: which agents exist, what they declared, and each instance's live state.

Functions here take an open SQLAlchemy ``Session`` and the hub's ``now``; the caller owns
the transaction, so a refused request leaves nothing half-written.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cachetools import LRUCache
from sqlalchemy import ColumnElement, delete, exists, insert, or_, select
from sqlalchemy.orm import Session

from reach.core.breaker import routable as breaker_routable
from reach.core.breaker import state as breaker_state
from reach.core.channel import shown_endpoint
from reach.core.endpoints import parse_endpoint, refusal
from reach.core.health import HeartbeatFacts, InstanceStatus, heartbeat_age, liveness
from reach.core.reachability import Alert, rise_streak
from reach.core.routing import Candidate, Declaration, RouteFilter, eligibility
from reach.errors import (
    RegistrationConflict,
    UnknownAgent,
    UnknownInstance,
)
from reach.hub.monitoring import Policy, current, reassess
from reach.hub.storage.models import AgentCapabilityRow, AgentRow, AgentTagRow, InstanceRow
from reach.schemas import DeregisterRequest, HeartbeatRequest, RegisterRequest, RegisterResponse

_LIVE = (InstanceStatus.ONLINE, InstanceStatus.DEGRADED, InstanceStatus.UNREACHABLE)
# At most this many instances are judged per candidate load: the best by stored score
# (routing takes one of the first two; a broadcast reaches at most this many).
CANDIDATE_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class AgentFilter:
    tag: tuple[str, ...] = ()
    capability: str | None = None
    status: str | None = None


def register(
    session: Session, req: RegisterRequest, now: float, policy: Policy
) -> RegisterResponse:
    """Register (or refresh) one instance of an agent."""
    endpoint = parse_endpoint(req.addr)
    public = parse_endpoint(req.public_endpoint) if req.public_endpoint else None
    reachable = public or endpoint
    refused = refusal(endpoint, public, req.allow_loopback)
    if refused is not None:
        raise refused.error()

    declaration = _declaration(req)
    agent = session.get(AgentRow, req.agent_id, with_for_update=True)
    missed_intervals = policy.reach.missed_intervals
    live = _live_instances(session, req.agent_id, now, missed_intervals) if agent else []
    if agent is None:
        agent = AgentRow(agent_id=req.agent_id, created_at=now, updated_at=now, **declaration)
        session.add(agent)
        session.flush()  # the agent row first: the declaration index refers to it
        _index_declaration(session, req.agent_id, declaration)
    elif _declared(agent) != declaration:
        others = [i for i in live if i.instance_id != req.instance_id]
        if others:
            differing = sorted(k for k, v in declaration.items() if _declared(agent)[k] != v)
            raise RegistrationConflict(
                f"agent {req.agent_id!r} is registered with different {', '.join(differing)} "
                f"by {len(others)} live instance(s); deregister them first or declare the same",
                fields=differing,
            )
        for key, value in declaration.items():
            setattr(agent, key, value)
        agent.updated_at = now
        _index_declaration(session, req.agent_id, declaration)
    agent.max_queue = req.max_queue  # the latest registration's; the admin override wins

    endpoint_url = reachable.url if public is None else endpoint.url
    instance_id = req.instance_id or uuid.uuid4().hex
    existing = session.get(InstanceRow, instance_id, with_for_update=True)
    created = existing is None or existing.status == InstanceStatus.DEREGISTERED
    if existing is not None:
        if existing.agent_id != req.agent_id:
            raise RegistrationConflict(
                f"instance {instance_id!r} belongs to agent {existing.agent_id!r}",
                fields=["agent_id"],
            )
        if existing.status != InstanceStatus.DEREGISTERED and (
            existing.endpoint != endpoint_url or existing.public_endpoint != _url(public)
        ):
            raise RegistrationConflict(
                f"instance {instance_id!r} is registered at {existing.endpoint}; "
                "deregister it before moving it",
                fields=["addr"],
            )
    _check_endpoint_owner(session, req, instance_id, reachable.url, now, missed_intervals)

    row = existing or InstanceRow(instance_id=instance_id, agent_id=req.agent_id)
    row.endpoint = endpoint_url
    row.public_endpoint = _url(public)
    row.version = req.version
    row.max_concurrency = req.max_concurrency
    row.heartbeat_interval = req.heartbeat_interval
    row.allow_loopback = req.allow_loopback
    if created:
        row.registered_at = now
        row.heartbeat_count = 0
        row.current_load = 0.0
        row.in_flight = 0
        row.in_flight_rise_streak = 0
        row.consecutive_failure_count = 0
        row.last_task_duration_ms = None
        row.probe_window = []
        row.probe_status = "unknown"
        row.rtt_ms = None
        row.loss_rate = 0.0
        row.last_probe_at = None
        row.last_probe_error = None
        row.alerts = []
        row.next_probe_at = now  # probe a newcomer at once
        row.breaker_open_until = None  # a new incarnation starts with a closed breaker
        row.status = InstanceStatus.ONLINE  # "registered"; the assessment below may refine it
        row.status_changed_at = now
    row.last_heartbeat = now
    if existing is None:
        session.add(row)
    reassess(session, row, now, policy)
    session.flush()
    return RegisterResponse(
        agent_id=req.agent_id,
        instance_id=instance_id,
        status=row.status,
        endpoint=row.public_endpoint or row.endpoint,
        heartbeat_interval=row.heartbeat_interval,
        created=created,
    )


def heartbeat(session: Session, hb: HeartbeatRequest, now: float, policy: Policy) -> InstanceRow:
    """Record a heartbeat, stamped with the hub's clock (the agent's ``sent_at`` is kept apart)."""
    row = session.get(InstanceRow, hb.instance_id, with_for_update=True)
    if row is None or row.agent_id != hb.agent_id or row.status == InstanceStatus.DEREGISTERED:
        raise UnknownInstance(
            f"instance {hb.instance_id!r} of agent {hb.agent_id!r} is not registered; "
            "register again",
            instance_id=hb.instance_id,
        )
    row.last_heartbeat = now
    row.heartbeat_count += 1
    row.current_load = hb.current_load
    row.in_flight_rise_streak = rise_streak(row.in_flight, hb.in_flight, row.in_flight_rise_streak)
    row.in_flight = hb.in_flight
    if hb.max_concurrency is not None:
        row.max_concurrency = hb.max_concurrency
    if hb.last_task_duration_ms is not None:
        row.last_task_duration_ms = hb.last_task_duration_ms
    row.consecutive_failure_count = hb.consecutive_failure_count
    row.agent_reported_at = hb.sent_at
    reassess(session, row, now, policy)
    session.flush()
    return row


def deregister(session: Session, req: DeregisterRequest, now: float) -> None:
    """Mark an instance as gone; the row stays for the audit trail."""
    row = session.get(InstanceRow, req.instance_id, with_for_update=True)
    if row is None or row.agent_id != req.agent_id:
        raise UnknownInstance(
            f"instance {req.instance_id!r} of agent {req.agent_id!r} is not registered",
            instance_id=req.instance_id,
        )
    if row.status != InstanceStatus.DEREGISTERED:
        row.status = InstanceStatus.DEREGISTERED
        row.status_changed_at = now
    session.flush()


def list_agents(
    session: Session, flt: AgentFilter, now: float, policy: Policy
) -> list[dict[str, Any]]:
    agents = session.scalars(select(AgentRow).order_by(AgentRow.agent_id)).all()
    instances = session.scalars(select(InstanceRow).order_by(InstanceRow.registered_at)).all()
    by_agent: dict[str, list[InstanceRow]] = {}
    for inst in instances:
        by_agent.setdefault(inst.agent_id, []).append(inst)
    out = []
    for agent in agents:
        if flt.tag and not set(flt.tag) <= set(agent.tags):
            continue
        if flt.capability and flt.capability not in {c["type"] for c in agent.capabilities}:
            continue
        views = [instance_view(i, now, policy) for i in by_agent.get(agent.agent_id, [])]
        if flt.status:
            views = [v for v in views if v["status"] == flt.status]
            if not views:
                continue
        elif flt.status is None:
            views = [v for v in views if v["status"] != InstanceStatus.DEREGISTERED]
        out.append(agent_view(agent, views))
    return out


def get_agent(session: Session, agent_id: str, now: float, policy: Policy) -> dict[str, Any]:
    agent = session.get(AgentRow, agent_id)
    if agent is None:
        raise UnknownAgent(f"agent {agent_id!r} is not registered", agent_id=agent_id)
    rows = session.scalars(
        select(InstanceRow)
        .where(InstanceRow.agent_id == agent_id)
        .order_by(InstanceRow.registered_at)
    ).all()
    return agent_view(agent, [instance_view(r, now, policy) for r in rows])


def load_candidates(
    session: Session, flt: RouteFilter, now: float, policy: Policy, method: str | None = None
) -> list[Candidate]:
    """Every registered instance eligible for ``flt`` (and ``method``), with its verdict.

    Eligibility is `reach.core.routing.eligibility`, the rule submission checks too."""
    query = (
        select(InstanceRow, AgentRow)
        .join(AgentRow, AgentRow.agent_id == InstanceRow.agent_id)
        .where(InstanceRow.status != InstanceStatus.DEREGISTERED.value)
        .where(*prefilter(flt, method or None))
        .order_by(
            InstanceRow.routable.desc(), InstanceRow.reach_score.desc(), InstanceRow.instance_id
        )
        .limit(CANDIDATE_LIMIT)
    )
    out = []
    for inst, agent in session.execute(query).all():
        declared = Declaration(
            agent_id=inst.agent_id,
            tags=tuple(agent.tags),
            capabilities=tuple(c["type"] for c in agent.capabilities),
            metadata=tuple(sorted(agent.meta.items())),
        )
        if eligibility(declared, flt, method or None) is None:
            continue
        verdict = current(inst, now, policy)
        # an open breaker takes the instance out of the pool (not merely to the back);
        # once its trial is due, the delivery that picks it must claim the trial, even if
        # the agent's consecutive failures hold it out (else it could never come back)
        routable = breaker_routable(
            verdict.routable,
            Alert.FAILING in verdict.alerts,
            breaker_state(inst.breaker_open_until, now),
        )
        out.append(
            Candidate(
                instance_id=inst.instance_id,
                agent_id=inst.agent_id,
                endpoint=inst.public_endpoint or inst.endpoint,
                status=verdict.status,
                routable=routable,
                reach_score=verdict.reach_score,
                in_flight=inst.in_flight,
                max_concurrency=inst.max_concurrency,
                tags=declared.tags,
                capabilities=declared.capabilities,
                metadata=declared.metadata,
                breaker_open_until=inst.breaker_open_until,
                breaker_opened_at=inst.breaker_opened_at or 0.0,
                trust_level=agent.trust_level or "L2",
            )
        )
    return out


def prefilter(flt: RouteFilter, method: str | None) -> list[ColumnElement[bool]]:
    """SQL conditions on ``instances.agent_id`` that keep only agents which may be eligible.

    Each uses an index (the agent's primary key, ``agent_tags``, ``agent_capabilities``),
    so a hot path reads the agents its filter names, never the fleet. They are necessary
    conditions of `reach.core.routing.eligibility` (metadata rules are left to it): the
    rule itself stays the judge of every row they let through."""
    agent = InstanceRow.agent_id
    conditions: list[ColumnElement[bool]] = []
    if flt.agent_id:
        conditions.append(agent == flt.agent_id)
    if flt.capability:
        conditions.append(agent.in_(_declaring(flt.capability)))
    for tag in flt.tags:
        conditions.append(agent.in_(select(AgentTagRow.agent_id).where(AgentTagRow.tag == tag)))
    if method:  # an agent that declares capabilities must declare the method
        declares = exists().where(AgentCapabilityRow.agent_id == agent)
        conditions.append(or_(agent.in_(_declaring(method)), ~declares))
    return conditions


def _declaring(capability: str) -> Any:
    return select(AgentCapabilityRow.agent_id).where(AgentCapabilityRow.capability == capability)


class CandidateCache:
    """Routing candidates per filter, reused for ``ttl`` seconds within one process.

    Loading candidates (instances joined with agents, each judged) is the costliest read
    of a delivery, and its inputs change by the second: heartbeats every few seconds,
    probes every 1-5 s. Reusing them for half a second saves that read on almost every
    delivery; a failed delivery or a breaker transition drops the cache at once.

    At most ``maxsize`` filters are kept (least recently used go first): filters come
    from submitted tasks (tags, metadata rules), so their number has no natural bound.
    """

    def __init__(self, ttl: float, maxsize: int = 1024) -> None:
        self.ttl = ttl
        self._entries: LRUCache[tuple[RouteFilter, str | None], tuple[float, list[Candidate]]]
        self._entries = LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()  # an LRU read reorders: not safe across threads

    def get(
        self, session: Session, flt: RouteFilter, now: float, policy: Policy, method: str | None
    ) -> list[Candidate]:
        key = (flt, method)
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None and 0 <= now - hit[0] < self.ttl:
            return hit[1]
        found = load_candidates(session, flt, now, policy, method=method)
        if self.ttl > 0:
            with self._lock:
                self._entries[key] = (now, found)
        return found

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def instance_gauges(session: Session, now: float, policy: Policy) -> list[dict[str, Any]]:
    """Per-instance values for the metrics endpoint (deregistered instances left out)."""
    rows = session.scalars(
        select(InstanceRow).where(InstanceRow.status != InstanceStatus.DEREGISTERED.value)
    ).all()
    out = []
    for row in rows:
        verdict = current(row, now, policy)
        out.append(
            {
                "agent_id": row.agent_id,
                "instance_id": row.instance_id,
                "reach_score": verdict.reach_score,
                "rtt_ms": row.rtt_ms,
                "loss_rate": row.loss_rate,
                "status": verdict.status.value,
            }
        )
    return out


def agent_view(agent: AgentRow, instances: Iterable[dict[str, Any]]) -> dict[str, Any]:
    views = list(instances)
    live = [v for v in views if v["status"] in _LIVE]
    return {
        "agent_id": agent.agent_id,
        "tags": agent.tags,
        "capabilities": agent.capabilities,
        "metadata": agent.meta,
        "trust_level": agent.trust_level,
        "status": "online"
        if any(v["status"] == "online" for v in live)
        else (live[0]["status"] if live else "offline"),
        "instances": views,
    }


def instance_view(row: InstanceRow, now: float, policy: Policy) -> dict[str, Any]:
    """The instance as of ``now``: the verdict is recomputed, so a read is never stale."""
    verdict = current(row, now, policy)
    return {
        "instance_id": row.instance_id,
        "endpoint": shown_endpoint(row.endpoint),
        "public_endpoint": row.public_endpoint,
        "version": row.version,
        "status": verdict.status.value,
        "status_reason": verdict.reason,
        "routable": verdict.routable,
        "alerts": [a.value for a in verdict.alerts],
        "reach_score": round(verdict.reach_score, 1),
        "registered_at": _iso(row.registered_at),
        "last_heartbeat": _iso(row.last_heartbeat),
        "heartbeat_age_s": round(heartbeat_age(_facts(row), now), 3),
        "heartbeat_interval": row.heartbeat_interval,
        "heartbeat_count": row.heartbeat_count,
        "current_load": row.current_load,
        "in_flight": row.in_flight,
        "max_concurrency": row.max_concurrency,
        "last_task_duration_ms": row.last_task_duration_ms,
        "consecutive_failure_count": row.consecutive_failure_count,
        "probe_status": row.probe_status,
        "rtt_ms": None if row.rtt_ms is None else round(row.rtt_ms, 2),
        "loss_rate": round(row.loss_rate, 4),
        "last_probe_at": _iso(row.last_probe_at),
        "last_probe_error": row.last_probe_error,
        "breaker": breaker_state(row.breaker_open_until, now).value,
        "breaker_open_until": _iso(row.breaker_open_until),
    }


def _facts(row: InstanceRow) -> HeartbeatFacts:
    return HeartbeatFacts(
        last_heartbeat=row.last_heartbeat,
        interval=row.heartbeat_interval,
        deregistered=row.status == InstanceStatus.DEREGISTERED,
    )


def _declaration(req: RegisterRequest) -> dict[str, Any]:
    return {
        "tags": list(req.tags),
        "capabilities": [c.model_dump(mode="json") for c in req.capabilities],
        "meta": dict(req.metadata),
    }


def _index_declaration(session: Session, agent_id: str, declaration: dict[str, Any]) -> None:
    """Rewrite the agent's rows in ``agent_tags`` / ``agent_capabilities`` (see `prefilter`)."""
    session.execute(delete(AgentTagRow).where(AgentTagRow.agent_id == agent_id))
    session.execute(delete(AgentCapabilityRow).where(AgentCapabilityRow.agent_id == agent_id))
    tags = sorted(set(declaration["tags"]))
    types = sorted({c["type"] for c in declaration["capabilities"]})
    if tags:
        session.execute(insert(AgentTagRow), [{"agent_id": agent_id, "tag": t} for t in tags])
    if types:
        session.execute(
            insert(AgentCapabilityRow), [{"agent_id": agent_id, "capability": t} for t in types]
        )


def _declared(agent: AgentRow) -> dict[str, Any]:
    return {"tags": agent.tags, "capabilities": agent.capabilities, "meta": agent.meta}


def _live_instances(
    session: Session, agent_id: str, now: float, missed_intervals: int
) -> list[InstanceRow]:
    rows = session.scalars(
        select(InstanceRow)
        .where(InstanceRow.agent_id == agent_id)
        .where(InstanceRow.status.in_([s.value for s in _LIVE]))
    ).all()
    return [
        r for r in rows if liveness(_facts(r), now, missed_intervals) is not InstanceStatus.OFFLINE
    ]


def _check_endpoint_owner(
    session: Session,
    req: RegisterRequest,
    instance_id: str,
    reachable_url: str,
    now: float,
    missed_intervals: int,
) -> None:
    """One live instance per reachable address; a restart of the same agent replaces it.

    Only the instances at that address are read (the endpoint indexes), not the fleet."""
    # two plain equalities, one index each (an IS NULL branch would read every instance
    # without a public endpoint); the exact address rule is applied below
    at_address = or_(
        InstanceRow.public_endpoint == reachable_url, InstanceRow.endpoint == reachable_url
    )
    rows = session.scalars(
        select(InstanceRow)
        .where(at_address)
        .where(InstanceRow.instance_id != instance_id)
        .where(InstanceRow.status.in_([s.value for s in _LIVE]))
    ).all()
    for other in rows:
        if (other.public_endpoint or other.endpoint) != reachable_url:
            continue
        if other.agent_id != req.agent_id and (
            liveness(_facts(other), now, missed_intervals) is not InstanceStatus.OFFLINE
        ):
            raise RegistrationConflict(
                f"{reachable_url} is already registered by live agent {other.agent_id!r}",
                fields=["addr"],
            )
        other.status = InstanceStatus.DEREGISTERED  # same address, new incarnation
        other.status_changed_at = now


def _url(endpoint: Any) -> str | None:
    return None if endpoint is None else str(endpoint.url)


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()
