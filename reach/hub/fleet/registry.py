"""The registry: which agents exist, what they declared, and each instance's live state.

Functions here take an open SQLAlchemy ``Session`` and the hub's ``now``; the caller owns
the transaction, so a refused request leaves nothing half-written.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Final, Protocol, cast

from cachetools import LRUCache
from sqlalchemy import (
    ColumnElement,
    Table,
    bindparam,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm import Session

from reach.core.fleet.endpoints import Endpoint, parse_endpoint, refusal
from reach.core.fleet.health import HeartbeatFacts, InstanceStatus, heartbeat_age, liveness
from reach.core.fleet.reachability import Alert, HeartbeatState, assess, rise_streak
from reach.core.fleet.routing import Candidate, Declaration, RouteFilter, eligibility
from reach.core.fleet.scoring import ProbeWindow
from reach.core.flow.breakers import routable as breaker_routable
from reach.core.flow.breakers import state as breaker_state
from reach.core.interop.channel import INTERNAL_PATH, shown_endpoint
from reach.core.ops import paging
from reach.core.security.networks import NetworkRule
from reach.errors import (
    AddressRefused,
    InvalidRegistration,
    LoopbackAddress,
    RegistrationConflict,
    RegistryLimit,
    UnknownAgent,
    UnknownInstance,
)
from reach.hub.fleet.reachability import Policy, current, reassess
from reach.hub.security.networks import Resolve, judge_host, resolve
from reach.hub.storage.models import AgentCapabilityRow, AgentRow, AgentTagRow, InstanceRow
from reach.wire.schemas import (
    Capability,
    DeregisterRequest,
    HeartbeatRequest,
    RegisterRequest,
    RegisterResponse,
)

if TYPE_CHECKING:
    from reach.hub.settings import Settings

_LIVE = (InstanceStatus.ONLINE, InstanceStatus.DEGRADED, InstanceStatus.UNREACHABLE)
_INSTANCES_T = cast(Table, InstanceRow.__table__)
# At most this many instances are judged per candidate load: the best by stored score
# (routing takes one of the first two; a broadcast reaches at most this many).
CANDIDATE_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class AgentFilter:
    """Which agents to list; values are checked when built (`InvalidQuery`)."""

    tag: tuple[str, ...] = ()
    capability: str | None = None
    status: str | None = None

    def __post_init__(self) -> None:
        tags = tuple(t for t in (paging.check_text(t, "tag") for t in self.tag) if t)
        object.__setattr__(self, "tag", tags)
        object.__setattr__(self, "capability", paging.check_text(self.capability, "capability"))


@dataclass(frozen=True, slots=True)
class Limits:
    """What one agent, and one API key, may hold (``reach.hub.settings.RegistrySettings``)."""

    max_instances_per_agent: int = 100
    max_instances_per_key: int = 1000
    max_agents_per_key: int = 100
    max_capabilities_per_agent: int = 64
    max_tags_per_agent: int = 32
    max_declaration_bytes: int = 65_536

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        r = settings.registry
        return cls(
            max_instances_per_agent=r.max_instances_per_agent,
            max_instances_per_key=r.max_instances_per_key,
            max_agents_per_key=r.max_agents_per_key,
            max_capabilities_per_agent=r.max_capabilities_per_agent,
            max_tags_per_agent=r.max_tags_per_agent,
            max_declaration_bytes=r.max_declaration_bytes,
        )

    def check_declaration(self, agent_id: str, declaration: dict[str, Any]) -> None:
        """Refuse (`RegistryLimit`) a declaration past the per-agent bounds."""
        counted = (
            ("max_capabilities_per_agent", len(declaration["capabilities"]), "capabilities"),
            ("max_tags_per_agent", len(declaration["tags"]), "tags"),
            ("max_declaration_bytes", len(json.dumps(declaration)), "bytes of declaration"),
        )
        for name, count, what in counted:
            bound = getattr(self, name)
            if count > bound:
                raise RegistryLimit(
                    f"agent {agent_id!r} declares {count} {what}; at most {bound} "
                    f"(registry.{name})",
                    limit=name,
                    bound=bound,
                )


DEFAULT_LIMITS = Limits()


def register(
    session: Session,
    req: RegisterRequest,
    now: float,
    policy: Policy,
    limits: Limits = DEFAULT_LIMITS,
    owner: str | None = None,
    *,
    network: NetworkRule | None = None,
    resolver: Resolve = resolve,
    judged: bool = True,
) -> RegisterResponse:
    """Register (or refresh) one instance of an agent.

    A new instance past ``limits`` (live instances of the agent) is refused with
    `RegistryLimit`, nothing written. ``owner`` is the registering API key's id: a new
    agent is recorded as its own, and an address held by another owner's agent stays
    that agent's (`_check_endpoint_owner`). The address the hub will call is resolved
    and judged by ``network`` (default: the policy's rule for agents); ``judged=False``
    only for an address that is the hub's own (a channel instance's replica)."""
    endpoint = parse_endpoint(req.addr)
    public = parse_endpoint(req.public_endpoint) if req.public_endpoint else None
    reachable = public or endpoint
    refused = refusal(endpoint, public, req.allow_loopback)
    if refused is not None:
        raise refused.error()
    if judged:
        field = "public_endpoint" if public is not None else "addr"
        _judge_address(reachable, field, network or policy.network, resolver)

    declaration = _declaration(req)
    limits.check_declaration(req.agent_id, declaration)
    conn = session.connection()
    # a newcomer (the common registration in a growing fleet) is written with prebuilt
    # statements; only a known agent or instance is loaded into the ORM, which records
    # what changes (a load and flush cost several times a plain insert)
    known = conn.execute(_AGENT_EXISTS, {"b_id": req.agent_id}).first() is not None
    agent = session.get(AgentRow, req.agent_id, with_for_update=True) if known else None
    missed_intervals = policy.reach.missed_intervals
    live = _live_instances(session, req.agent_id, now, missed_intervals) if agent else []
    if agent is None:
        if owner is not None:
            _check_key_bound(conn, owner, "max_agents_per_key", limits, _AGENTS_OF, "agents")
        values = {"agent_id": req.agent_id, "created_at": now, "updated_at": now}
        values |= {_AGENT_KEYS.get(k, k): v for k, v in declaration.items()}
        conn.execute(_NEW_AGENT, {**values, "max_queue": req.max_queue, "owner": owner})
        _index_declaration(session, req.agent_id, declaration, new=True)
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
    if agent is not None:
        agent.max_queue = req.max_queue  # the latest registration's; the admin override wins

    endpoint_url = reachable.url if public is None else endpoint.url
    instance_id = req.instance_id or uuid.uuid4().hex
    existing = (
        session.get(InstanceRow, instance_id, with_for_update=True)
        if req.instance_id and conn.execute(_INSTANCE_EXISTS, {"b_id": instance_id}).first()
        else None
    )
    created = existing is None or existing.status == InstanceStatus.DEREGISTERED
    if created:
        held = sum(1 for i in live if i.instance_id != instance_id)
        if held >= limits.max_instances_per_agent:
            raise RegistryLimit(
                f"agent {req.agent_id!r} already has {held} live instances, the most one "
                f"agent may hold (registry.max_instances_per_agent); deregister one first",
                limit="max_instances_per_agent",
                bound=limits.max_instances_per_agent,
            )
        by = agent.owner if agent is not None else owner
        if by is not None:
            _check_key_bound(conn, by, "max_instances_per_key", limits, _INSTANCES_OF, "instances")
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
    owner = agent.owner if agent is not None else owner
    _check_endpoint_owner(session, req, instance_id, reachable.url, now, missed_intervals, owner)

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
    reassess(session, row, now, policy)
    if existing is None:  # the row never enters the session: one prebuilt insert
        conn.execute(_NEW_INSTANCE, _column_values(row))
    session.flush()  # an existing row's changes, the events reassess recorded
    return RegisterResponse(
        agent_id=req.agent_id,
        instance_id=instance_id,
        status=row.status,
        endpoint=row.public_endpoint or row.endpoint,
        heartbeat_interval=row.heartbeat_interval,
        created=created,
    )


def _judge_address(reachable: Endpoint, field: str, rule: NetworkRule, resolver: Resolve) -> None:
    """Refuse an address the hub would not call: what its name resolves to counts, not
    its spelling (`reach.core.security.networks`)."""
    if INTERNAL_PATH in f"{reachable.path}/":
        raise InvalidRegistration(
            f"{field} names the hub's internal channel path {INTERNAL_PATH}", field=field
        )
    try:
        _addresses, why = judge_host(reachable.host, reachable.port, rule, resolver)
    except OSError as exc:
        raise AddressRefused(
            f"{field} {reachable.host!r} does not resolve ({type(exc).__name__}): the hub "
            "judges where a name points before it calls it",
            field=field,
        ) from None
    if why is None:
        return
    if why == "a loopback address":
        raise LoopbackAddress(
            f"{reachable.url} resolves to a loopback address: this hub is not a "
            "local demo (it requires API keys or listens beyond loopback), so it calls "
            "loopback agents only if the operator sets security.allow_loopback_agents",
            field=field,
        )
    raise AddressRefused(
        f"{reachable.url} resolves to {why}. The hub calls public addresses, and private "
        "ones in the networks the operator declares (security.agent_networks); "
        "link-local addresses never",
        field=field,
    )


@dataclass(frozen=True, slots=True)
class Beat:
    """What a heartbeat's answer needs of its instance."""

    status: str
    heartbeat_interval: float
    alerted: bool = False  # any alert raised (`reach.core.fleet.coalescing.Known`)


def heartbeat(session: Session, hb: HeartbeatRequest, now: float, policy: Policy) -> Beat:
    """Record a heartbeat, stamped with the hub's clock (the agent's ``sent_at`` is kept apart).

    The common heartbeat changes the instance's facts and nothing of its verdict: it is one
    locked read of the columns the verdict needs and one UPDATE, both prebuilt (the ORM's
    load and flush of the whole row cost several times more, and a fleet of 2,000 sends 200
    a second). A heartbeat that moves the status or raises an alert takes the ORM path,
    which records the transition (`reach.hub.fleet.reachability.reassess`)."""
    row = session.connection().execute(_HB_READ, {"b_id": hb.instance_id}).first()
    if row is None or row.agent_id != hb.agent_id or row.status == InstanceStatus.DEREGISTERED:
        raise UnknownInstance(
            f"instance {hb.instance_id!r} of agent {hb.agent_id!r} is not registered; "
            "register again",
            instance_id=hb.instance_id,
        )
    values = _quiet_values(row, hb, now, policy)
    if values is None:
        return _heartbeat_transition(session, hb, now, policy)
    session.connection().execute(_HB_WRITE["last_task_duration_ms" in values], values)
    return Beat(row.status, row.heartbeat_interval, bool(values["alerts"]))


def heartbeats(
    session: Session, beats: Sequence[tuple[HeartbeatRequest, float]], policy: Policy
) -> dict[str, Beat | None]:
    """Record a batch of buffered heartbeats, each stamped with the hub time it arrived at
    (`reach.hub.api.heartbeats`): one locked read of all their instances, one batched
    UPDATE of those whose verdict stays, the transition path for the others (as
    `heartbeat`). ``None`` for an instance no longer registered (its beat is dropped: the
    agent hears so on its next one). A beat older than the instance's recorded last
    heartbeat (another API process wrote a newer one) is skipped."""
    newest: dict[str, tuple[HeartbeatRequest, float]] = {}
    for hb, at in beats:
        if hb.instance_id not in newest or newest[hb.instance_id][1] < at:
            newest[hb.instance_id] = (hb, at)
    if not newest:
        return {}
    conn = session.connection()
    rows = {r.instance_id: r for r in conn.execute(_HB_READ_MANY, {"b_ids": sorted(newest)})}
    out: dict[str, Beat | None] = {}
    quiet: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    changed: list[tuple[HeartbeatRequest, float]] = []
    for iid, (hb, at) in newest.items():
        row = rows.get(iid)
        if row is None or row.agent_id != hb.agent_id or row.status == InstanceStatus.DEREGISTERED:
            out[iid] = None
            continue
        if row.last_heartbeat is not None and row.last_heartbeat >= at:
            out[iid] = Beat(row.status, row.heartbeat_interval, bool(row.alerts))
            continue
        values = _quiet_values(row, hb, at, policy)
        if values is None:
            changed.append((hb, at))
            continue
        quiet["last_task_duration_ms" in values].append(values)
        out[iid] = Beat(row.status, row.heartbeat_interval, bool(values["alerts"]))
    for duration in (False, True):
        if quiet[duration]:
            conn.execute(_HB_WRITE[duration], quiet[duration])
    for hb, at in changed:
        out[hb.instance_id] = _heartbeat_transition(session, hb, at, policy)
    return out


class _BeatRow(Protocol):
    @property
    def status(self) -> str: ...
    @property
    def heartbeat_interval(self) -> float: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def max_concurrency(self) -> int: ...
    @property
    def in_flight_rise_streak(self) -> int: ...
    @property
    def probe_window(self) -> list[Any] | None: ...
    @property
    def alerts(self) -> list[str] | None: ...


def _quiet_values(
    row: _BeatRow, hb: HeartbeatRequest, now: float, policy: Policy
) -> dict[str, Any] | None:
    """The UPDATE's values of a heartbeat that keeps its instance's verdict; ``None`` when
    it moves the status or raises an alert (the transition path records it)."""
    streak = rise_streak(row.in_flight, hb.in_flight, row.in_flight_rise_streak)
    max_concurrency = row.max_concurrency if hb.max_concurrency is None else hb.max_concurrency
    verdict = assess(
        HeartbeatState(
            last_heartbeat=now,
            interval=row.heartbeat_interval,
            in_flight=hb.in_flight,
            max_concurrency=max_concurrency,
            in_flight_rise_streak=streak,
            consecutive_failure_count=hb.consecutive_failure_count,
        ),
        ProbeWindow.from_list(row.probe_window or [], size=policy.window),
        now,
        policy.reach,
        policy.score,
    )
    alerts = [a.value for a in verdict.alerts]
    if verdict.status.value != row.status or not set(alerts) <= set(row.alerts or []):
        return None
    values: dict[str, Any] = {
        "b_id": hb.instance_id,
        "last_heartbeat": now,
        "current_load": hb.current_load,
        "in_flight_rise_streak": streak,
        "in_flight": hb.in_flight,
        "max_concurrency": max_concurrency,
        "consecutive_failure_count": hb.consecutive_failure_count,
        "agent_reported_at": hb.sent_at,
        "alerts": alerts,
        "reach_score": round(verdict.reach_score, 3),
        "routable": verdict.routable,
        "status_reason": verdict.reason,
    }
    if hb.last_task_duration_ms is not None:
        values["last_task_duration_ms"] = hb.last_task_duration_ms
    return values


def _heartbeat_transition(
    session: Session, hb: HeartbeatRequest, now: float, policy: Policy
) -> Beat:
    """The ORM path of a heartbeat that changes the verdict (its transition recorded)."""
    row = session.get(InstanceRow, hb.instance_id, with_for_update=True, populate_existing=True)
    assert row is not None  # locked by the read before
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
    return Beat(row.status, row.heartbeat_interval, bool(row.alerts))


_HB_READ = (
    select(
        _INSTANCES_T.c.agent_id,
        _INSTANCES_T.c.status,
        _INSTANCES_T.c.heartbeat_interval,
        _INSTANCES_T.c.in_flight,
        _INSTANCES_T.c.max_concurrency,
        _INSTANCES_T.c.in_flight_rise_streak,
        _INSTANCES_T.c.probe_window,
        _INSTANCES_T.c.alerts,
    )
    .where(_INSTANCES_T.c.instance_id == bindparam("b_id"))
    .with_for_update()
)


# the same columns for a batch of instances, locked in key order (two batches never deadlock)
_HB_READ_MANY = (
    select(
        _INSTANCES_T.c.instance_id,
        _INSTANCES_T.c.last_heartbeat,
        *(c for c in _HB_READ.selected_columns),
    )
    .where(_INSTANCES_T.c.instance_id.in_(bindparam("b_ids", expanding=True)))
    .order_by(_INSTANCES_T.c.instance_id)
    .with_for_update()
)


def _hb_write(duration: bool) -> Any:
    columns = (
        "last_heartbeat", "current_load", "in_flight_rise_streak", "in_flight",
        "max_concurrency", "consecutive_failure_count", "agent_reported_at", "alerts",
        "reach_score", "routable", "status_reason",
        *(("last_task_duration_ms",) if duration else ()),
    )  # fmt: skip
    return (
        update(_INSTANCES_T)
        .where(_INSTANCES_T.c.instance_id == bindparam("b_id"))
        .values(
            heartbeat_count=_INSTANCES_T.c.heartbeat_count + 1,
            **{c: bindparam(c, type_=_INSTANCES_T.c[c].type) for c in columns},
        )
    )


_HB_WRITE = (_hb_write(False), _hb_write(True))  # without, with last_task_duration_ms


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


AGENTS: Final = "agents"  # the fleet listing's cursor kind (`reach.core.ops.paging`)
FLEET_PAGE: Final = 100  # agents per page of ``GET /api/v1/agents`` unless ``limit`` says


def list_agents(
    session: Session,
    flt: AgentFilter,
    now: float,
    policy: Policy,
    *,
    after: str | None = None,
    limit: int = FLEET_PAGE,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the fleet, by agent ID after ``after``: (agent views, the last agent ID
    shown when more follow, else None).

    Reads the page's agents (by primary key; a tag or capability filter through its
    index table) and their instances (``ix_instances_agent_status``), never the fleet:
    a page costs the same with 20 agents or 20,000. A status filter is applied to each
    instance's verdict as of ``now`` (stored statuses may lag it), so a page is filled
    from successive batches until it is full or the fleet ends."""
    out: list[dict[str, Any]] = []
    cursor = after
    batch = limit + 1
    while True:
        query = select(AgentRow).order_by(AgentRow.agent_id).limit(batch)
        if cursor is not None:
            query = query.where(AgentRow.agent_id > cursor)
        if flt.capability:
            query = query.where(AgentRow.agent_id.in_(_declaring(flt.capability)))
        for tag in flt.tag:
            tagged = select(_TAGS.c.agent_id).where(_TAGS.c.tag == tag)
            query = query.where(AgentRow.agent_id.in_(tagged))
        agents = session.scalars(query).all()
        if not agents:
            return out, None
        by_agent: dict[str, list[InstanceRow]] = {}
        for inst in session.scalars(
            select(InstanceRow)
            .where(InstanceRow.agent_id.in_([a.agent_id for a in agents]))
            .order_by(InstanceRow.registered_at)
        ):
            by_agent.setdefault(inst.agent_id, []).append(inst)
        for agent in agents:
            views = [instance_view(i, now, policy) for i in by_agent.get(agent.agent_id, [])]
            if flt.status:
                views = [v for v in views if v["status"] == flt.status]
                if not views:
                    cursor = agent.agent_id
                    continue
            else:
                views = [v for v in views if v["status"] != InstanceStatus.DEREGISTERED]
            if len(out) == limit:
                return out, out[-1]["agent_id"]  # a next agent exists: another page
            out.append(agent_view(agent, views))
            cursor = agent.agent_id
        if len(agents) < batch:
            return out, None


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

    Eligibility is `reach.core.fleet.routing.eligibility`, the rule submission checks too."""
    return [c for c, _ in load_offers(session, flt, now, policy, method)]


def load_offers(
    session: Session, flt: RouteFilter, now: float, policy: Policy, method: str | None = None
) -> list[tuple[Candidate, list[dict[str, Any]]]]:
    """`load_candidates`, each with its agent's declared capabilities (what semantic
    matching compares an intent with: descriptions and examples)."""
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
    for inst, agent in session.execute(query, prefilter_params(flt, method or None)).all():
        declared = Declaration(
            agent_id=inst.agent_id,
            tags=tuple(agent.tags),
            capabilities=tuple(c["type"] for c in agent.capabilities),
            metadata=tuple(sorted(agent.meta.items())),
        )
        eligible = eligibility(declared, flt, method or None)
        if eligible is None:
            continue
        invoked = eligible.capability
        declaration = next(
            (c for c in agent.capabilities if invoked is not None and c["type"] == invoked), None
        )
        verdict = current(inst, now, policy)
        # an open breaker takes the instance out of the pool (not merely to the back);
        # once its trial is due, the delivery that picks it must claim the trial, even if
        # the agent's consecutive failures hold it out (else it could never come back)
        routable = breaker_routable(
            verdict.routable,
            Alert.FAILING in verdict.alerts,
            breaker_state(inst.breaker_open_until, now),
        )
        candidate = Candidate(
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
            breaker_closed_at=inst.breaker_closed_at,
            trust_level=agent.trust_level or "L2",
            protocol=inst.protocol or "reach",
            current_load=inst.current_load or 0.0,
            last_task_duration_ms=inst.last_task_duration_ms,
            estimated_latency_ms=_estimated_latency(agent.capabilities, method),
            declaration=declaration,
        )
        out.append((candidate, agent.capabilities))
    return out


def _estimated_latency(capabilities: list[dict[str, Any]], method: str | None) -> float | None:
    """The ``estimated_latency`` (ms) the agent declared for the capability ``method``
    invokes; routing's service time until a heartbeat reports a real one."""
    for capability in capabilities:
        if capability.get("type") == method:
            value = capability.get("estimated_latency")
            return float(value) if isinstance(value, int | float) and value > 0 else None
    return None


def prefilter(flt: RouteFilter, method: str | None) -> list[ColumnElement[bool]]:
    """SQL conditions on ``instances.agent_id`` that keep only agents which may be eligible.

    Each uses an index (the agent's primary key, ``agent_tags``, ``agent_capabilities``),
    so a hot path reads the agents its filter names, never the fleet. They are necessary
    conditions of `reach.core.fleet.routing.eligibility` (metadata rules are left to it): the
    rule itself stays the judge of every row they let through. Its values are bound
    parameters named by `prefilter_params`: a statement built on it can be built once
    per `PrefilterShape` and executed with those parameters."""
    return list(prefilter_conditions(shape_of(flt, method)))


@dataclass(frozen=True, slots=True)
class PrefilterShape:
    """What a filter names, without the values: statements are built once per shape."""

    agent: bool
    capability: bool
    tags: int
    method: bool
    intent: bool = False


def shape_of(flt: RouteFilter, method: str | None) -> PrefilterShape:
    return PrefilterShape(
        bool(flt.agent_id), bool(flt.capability), len(flt.tags), bool(method), bool(flt.intent)
    )


def prefilter_params(flt: RouteFilter, method: str | None) -> dict[str, Any]:
    """The bound values of `prefilter`'s conditions for this filter."""
    params: dict[str, Any] = {}
    if flt.agent_id:
        params["pf_agent"] = flt.agent_id
    if flt.capability:
        params["pf_capability"] = flt.capability
    for n, tag in enumerate(flt.tags):
        params[f"pf_tag{n}"] = tag
    if method:
        params["pf_method"] = method
    return params


@lru_cache(maxsize=64)
def prefilter_conditions(shape: PrefilterShape) -> tuple[ColumnElement[bool], ...]:
    agent = _INSTANCES.c.agent_id
    conditions: list[ColumnElement[bool]] = []
    if shape.agent:
        conditions.append(agent == bindparam("pf_agent"))
    if shape.capability:
        conditions.append(agent.in_(_declaring(bindparam("pf_capability"))))
    for n in range(shape.tags):
        tagged = select(_TAGS.c.agent_id).where(_TAGS.c.tag == bindparam(f"pf_tag{n}"))
        conditions.append(agent.in_(tagged))
    declares = exists().where(_CAPABILITIES.c.agent_id == agent)
    if shape.method:  # an agent that declares capabilities must declare the method
        conditions.append(or_(agent.in_(_declaring(bindparam("pf_method"))), ~declares))
    if shape.intent:  # an intent is matched against declared capabilities: none, no match
        conditions.append(declares)
    return tuple(conditions)


_INSTANCES = _INSTANCES_T
_TAGS = cast(Table, AgentTagRow.__table__)
_CAPABILITIES = cast(Table, AgentCapabilityRow.__table__)


def _declaring(capability: Any) -> Any:
    return select(_CAPABILITIES.c.agent_id).where(_CAPABILITIES.c.capability == capability)


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
                "heartbeat_age_s": max(0.0, now - row.last_heartbeat),
                "breaker_open": row.breaker_open_until is not None and now < row.breaker_open_until,
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
        "protocol": row.protocol or "reach",
        **({"a2a": _a2a_view(row.a2a)} if row.protocol == "a2a" and row.a2a else {}),
        **({"mcp": _mcp_view(row.a2a)} if row.protocol == "mcp" and row.a2a else {}),
    }


_A2A_SHOWN = ("card_url", "rpc_url", "streaming", "name", "skills", "read_at", "card_error")


def _a2a_view(a2a: dict[str, Any]) -> dict[str, Any]:
    """What the fleet shows of an A2A instance's card (never the credential: it is kept
    in its own column, ``instances.a2a_credential``, which no view reads)."""
    shown = {k: a2a[k] for k in _A2A_SHOWN if k in a2a}
    shown["security"] = (a2a.get("scheme") or {}).get("kind", "none")
    return shown


_MCP_SHOWN = ("url", "name", "tools", "skipped", "held", "read_at", "read_error")


def _mcp_view(read: dict[str, Any]) -> dict[str, Any]:
    """What the fleet shows of an MCP server, as the hub last read it."""
    return {k: read[k] for k in _MCP_SHOWN if k in read}


class _Beating(Protocol):
    """What liveness reads of an instance: an ORM row or a row of `_AT_ADDRESS`."""

    @property
    def last_heartbeat(self) -> float: ...
    @property
    def heartbeat_interval(self) -> float: ...
    @property
    def status(self) -> str: ...


def _facts(row: _Beating) -> HeartbeatFacts:
    return HeartbeatFacts(
        last_heartbeat=row.last_heartbeat,
        interval=row.heartbeat_interval,
        deregistered=row.status == InstanceStatus.DEREGISTERED,
    )


def _declaration(req: RegisterRequest) -> dict[str, Any]:
    return {
        "tags": list(req.tags),
        "capabilities": [_capability(c) for c in req.capabilities],
        "meta": dict(req.metadata),
    }


def _capability(cap: Capability) -> dict[str, Any]:
    """As stored; no ``examples`` key when there are none, so a declaration stored before
    capabilities had examples still equals the same declaration sent again."""
    stored = cap.model_dump(mode="json")
    if not stored["examples"]:
        del stored["examples"]
    return stored


def _index_declaration(
    session: Session, agent_id: str, declaration: dict[str, Any], *, new: bool = False
) -> None:
    """Rewrite the agent's rows in ``agent_tags`` / ``agent_capabilities`` (see `prefilter`);
    a ``new`` agent has none to delete."""
    conn = session.connection()
    if not new:
        conn.execute(_UNTAG, {"b_agent": agent_id})
        conn.execute(_UNDECLARE, {"b_agent": agent_id})
    tags = sorted(set(declaration["tags"]))
    types = sorted({c["type"] for c in declaration["capabilities"]})
    if tags:
        conn.execute(_TAG, [{"agent_id": agent_id, "tag": t} for t in tags])
    if types:
        conn.execute(_DECLARE, [{"agent_id": agent_id, "capability": t} for t in types])


_AGENTS = cast(Table, AgentRow.__table__)
_AGENT_KEYS = {p.key: p.columns[0].key for p in sa_inspect(AgentRow).column_attrs}
_INSTANCE_KEYS = {p.key: p.columns[0].key for p in sa_inspect(InstanceRow).column_attrs}
# FOR UPDATE: a known agent's row is locked before it is read (a concurrent registration
# of the same agent waits); a missing one locks nothing, and two newcomers racing meet
# the primary key (`HubContext.write` retries the loser once, which then finds it)
_AGENT_EXISTS = (
    select(_AGENTS.c.agent_id).where(_AGENTS.c.agent_id == bindparam("b_id")).with_for_update()
)
_INSTANCE_EXISTS = (
    select(_INSTANCES_T.c.instance_id)
    .where(_INSTANCES_T.c.instance_id == bindparam("b_id"))
    .with_for_update()
)
_NEW_AGENT, _NEW_INSTANCE = insert(_AGENTS), insert(_INSTANCES_T)


def _column_values(row: InstanceRow) -> dict[str, Any]:
    """The attributes set on a new (transient) row, by column: what the ORM would insert;
    the columns left unset take their defaults."""
    return {_INSTANCE_KEYS[k]: v for k, v in sa_inspect(row).dict.items() if k in _INSTANCE_KEYS}


_UNTAG = delete(_TAGS).where(_TAGS.c.agent_id == bindparam("b_agent"))
_UNDECLARE = delete(_CAPABILITIES).where(_CAPABILITIES.c.agent_id == bindparam("b_agent"))
_TAG, _DECLARE = insert(_TAGS), insert(_CAPABILITIES)


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
    owner: str | None = None,
) -> None:
    """One instance per reachable address: another agent's instance there refuses the
    newcomer, live or offline (issue 37: a live agent registering at an offline
    instance's address would deregister the victim, which then found its own address
    taken), unless both agents belong to the same API key; the same agent's (a restart)
    is retired, so a dead incarnation does not stay registered beside its successor.
    An offline instance leaves its address when its agent deregisters it or retention
    removes it.

    Only the instances at that address are read (the endpoint indexes), not the fleet:
    the few columns the rule needs, and a replaced one is marked with a plain UPDATE."""
    conn = session.connection()
    rows = conn.execute(_AT_ADDRESS, {"b_url": reachable_url, "b_instance": instance_id}).all()
    for other in rows:
        if (other.public_endpoint or other.endpoint) != reachable_url:
            continue
        if other.agent_id != req.agent_id:
            live = liveness(_facts(other), now, missed_intervals) is not InstanceStatus.OFFLINE
            if live:
                raise RegistrationConflict(
                    f"{reachable_url} is already registered by live agent {other.agent_id!r}",
                    fields=["addr"],
                )
            if owner is None or other.owner != owner:
                raise RegistrationConflict(
                    f"{reachable_url} is registered by agent {other.agent_id!r} (offline); "
                    "it stays that agent's until the agent deregisters it or retention "
                    "removes it",
                    fields=["addr"],
                )
        # same address, new incarnation
        conn.execute(_REPLACED, {"b_id": other.instance_id, "b_now": now})


# two plain equalities, one index each (an IS NULL branch would read every instance
# without a public endpoint); the exact address rule is applied by the caller. Built once.
_AT_ADDRESS = (
    select(
        _INSTANCES_T.c.instance_id,
        _INSTANCES_T.c.agent_id,
        _INSTANCES_T.c.endpoint,
        _INSTANCES_T.c.public_endpoint,
        _INSTANCES_T.c.last_heartbeat,
        _INSTANCES_T.c.heartbeat_interval,
        _INSTANCES_T.c.status,
        select(_AGENTS.c.owner)
        .where(_AGENTS.c.agent_id == _INSTANCES_T.c.agent_id)
        .scalar_subquery()
        .label("owner"),
    )
    .where(
        or_(
            _INSTANCES_T.c.public_endpoint == bindparam("b_url"),
            _INSTANCES_T.c.endpoint == bindparam("b_url"),
        )
    )
    .where(_INSTANCES_T.c.instance_id != bindparam("b_instance"))
    .where(_INSTANCES_T.c.status != InstanceStatus.DEREGISTERED.value)
)
_REPLACED = (
    update(_INSTANCES_T)
    .where(_INSTANCES_T.c.instance_id == bindparam("b_id"))
    .values(status=InstanceStatus.DEREGISTERED.value, status_changed_at=bindparam("b_now"))
)


_AGENTS_OF = (
    select(func.count()).select_from(_AGENTS).where(_AGENTS.c.owner == bindparam("b_owner"))
)
_INSTANCES_OF = (
    select(func.count())
    .select_from(_INSTANCES_T.join(_AGENTS, _AGENTS.c.agent_id == _INSTANCES_T.c.agent_id))
    .where(_AGENTS.c.owner == bindparam("b_owner"))
    .where(_INSTANCES_T.c.status.in_([s.value for s in _LIVE]))
)


def _check_key_bound(
    conn: Any, owner: str, name: str, limits: Limits, statement: Any, what: str
) -> None:
    """Refuse (`RegistryLimit`) one more of ``what`` for the agents key ``owner`` owns."""
    bound = getattr(limits, name)
    held = int(conn.execute(statement, {"b_owner": owner}).scalar_one())
    if held >= bound:
        raise RegistryLimit(
            f"API key {owner} already holds {held} {what}, the most one key may (registry.{name})",
            limit=name,
            bound=bound,
        )


def _url(endpoint: Any) -> str | None:
    return None if endpoint is None else str(endpoint.url)


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat()
