"""Applying the two signals to the registry: heartbeats and probe results in, verdicts out.

The decisions are pure (``reach.core.fleet.reachability``); this module loads an instance's facts,
asks for the assessment, stores it, and leaves a trail: an ``instance_events`` row and a
metric for every status transition and every newly raised alert.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from sqlalchemy import func, or_, select, text
from sqlalchemy.orm import Session

from reach.core.fleet.health import InstanceStatus
from reach.core.fleet.reachability import (
    Assessment,
    HeartbeatState,
    ReachabilityConfig,
    assess,
    next_probe_delay,
)
from reach.core.fleet.scoring import ProbeWindow, ScoreConfig
from reach.core.security.networks import NetworkRule, is_demo_hub, parse_networks
from reach.hub import metrics
from reach.hub.fleet.probing import ProbeOutcome, ProbeTarget
from reach.hub.settings import Settings
from reach.hub.storage.engine import skip_locked as _skip_locked
from reach.hub.storage.models import PROBED, InstanceEventRow, InstanceRow

log = logging.getLogger("reach.hub.fleet.reachability")
_UNPROBED = (InstanceStatus.DEREGISTERED.value,)
_SKIPPED_COUNT_CAP = 10_000  # the metric counts skipped probes; past this it only says "many"


@dataclass(frozen=True, slots=True)
class Policy:
    """Settings resolved once into the pure modules' config objects."""

    reach: ReachabilityConfig
    score: ScoreConfig
    window: int
    probe_timeout: float
    probe_limit: int
    network: NetworkRule  # the addresses of agents the hub will probe and call

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        hb, probe = settings.heartbeat, settings.probe
        return cls(
            reach=ReachabilityConfig(
                missed_intervals=hb.missed_intervals,
                heartbeat_lost_grace_s=hb.lost_grace,
                probe_fail_threshold=probe.fail_threshold,
                probe_interval_s=probe.interval,
                probe_fast_interval_s=probe.fast_interval,
                probe_retry_interval_s=probe.retry_interval,
                fast_below_score=probe.fast_below_score,
                degraded_rise_streak=hb.degraded_rise_streak,
                routing_failure_threshold=settings.router.failure_threshold,
                probe_fresh_s=probe.fresh,
            ),
            score=ScoreConfig(**settings.score.model_dump()),
            window=probe.window,
            probe_timeout=probe.timeout,
            probe_limit=probe.max_concurrent,
            network=agent_rule(settings),
        )


def agent_rule(settings: Settings, demo: bool | None = None) -> NetworkRule:
    """Which agent addresses this hub calls (``reach.core.security.networks``): a local demo (or
    ``security.allow_loopback_agents``) takes loopback agents, a demo private ones too,
    and every hub the networks the operator declared. ``demo``: as the API resolved it
    against the address it really binds (``reach api --host``); default: from the
    settings (``server.host``, ``security.require_auth``)."""
    security = settings.security
    if demo is None:
        demo = is_demo_hub(security.require_auth, settings.server.host)
    return NetworkRule(
        loopback=demo or security.allow_loopback_agents,
        private=demo,
        networks=parse_networks(security.agent_networks),
    )


def window_of(row: InstanceRow, size: int) -> ProbeWindow:
    return ProbeWindow.from_list(row.probe_window or [], size=size)


def heartbeat_state(row: InstanceRow) -> HeartbeatState:
    return HeartbeatState(
        last_heartbeat=row.last_heartbeat,
        interval=row.heartbeat_interval,
        in_flight=row.in_flight,
        max_concurrency=row.max_concurrency,
        in_flight_rise_streak=row.in_flight_rise_streak,
        consecutive_failure_count=row.consecutive_failure_count,
        deregistered=row.status == InstanceStatus.DEREGISTERED,
    )


def current(row: InstanceRow, now: float, policy: Policy) -> Assessment:
    """The verdict as of ``now`` without writing anything (for reads)."""
    return assess(
        heartbeat_state(row), window_of(row, policy.window), now, policy.reach, policy.score
    )


def reassess(session: Session, row: InstanceRow, now: float, policy: Policy) -> Assessment:
    """Decide, store, and record transitions and new alerts."""
    verdict = current(row, now, policy)
    previous = row.status
    if verdict.status != previous:
        row.status = verdict.status.value
        row.status_changed_at = now
        _event(
            session,
            row,
            "status",
            now,
            {"from": previous, "to": verdict.status.value, "reason": verdict.reason},
        )
        metrics.STATUS_TRANSITIONS_TOTAL.labels(previous, verdict.status.value).inc()
        log.info(
            "%s/%s %s -> %s: %s",
            row.agent_id,
            row.instance_id,
            previous,
            verdict.status.value,
            verdict.reason,
        )
    raised = [a.value for a in verdict.alerts if a.value not in (row.alerts or [])]
    for alert in raised:
        _event(session, row, "alert", now, {"alert": alert, "reason": verdict.reason})
        metrics.ALERTS_TOTAL.labels(alert).inc()
        log.warning("ALERT %s on %s/%s: %s", alert, row.agent_id, row.instance_id, verdict.reason)
    row.alerts = [a.value for a in verdict.alerts]
    row.reach_score = round(verdict.reach_score, 3)
    row.routable = verdict.routable
    row.status_reason = verdict.reason
    return verdict


def claim_due_probes(session: Session, now: float, policy: Policy) -> tuple[list[ProbeTarget], int]:
    """Lease up to the free probe slots among due instances; the rest are skipped (counted).

    Bounded whatever the fleet: the leases in use are counted on their index, the due
    instances are read (most overdue first) only up to the free slots, through a partial
    index that leaves deregistered instances out, and the skipped ones are counted up to
    ``_SKIPPED_COUNT_CAP``."""
    in_use = (
        session.scalar(
            select(func.count()).select_from(InstanceRow).where(InstanceRow.probe_lease_until > now)
        )
        or 0
    )
    free = max(0, policy.probe_limit - in_use)
    conditions = (
        text(PROBED),  # the partial index's own predicate, word for word
        InstanceRow.next_probe_at <= now,
        or_(InstanceRow.probe_lease_until.is_(None), InstanceRow.probe_lease_until <= now),
    )
    claimed: list[InstanceRow] = []
    if free:
        due = select(InstanceRow).where(*conditions).order_by(InstanceRow.next_probe_at)
        claimed = list(session.scalars(_skip_locked(session, due.limit(free))))
    waiting = session.scalar(
        select(func.count()).select_from(
            select(InstanceRow.instance_id).where(*conditions).limit(_SKIPPED_COUNT_CAP).subquery()
        )
    )
    skipped = max(0, (waiting or 0) - len(claimed))
    lease = now + policy.probe_timeout + 5.0
    for row in claimed:
        row.probe_lease_until = lease
    if skipped:
        metrics.PROBE_SKIPPED_TOTAL.inc(skipped)
    return [_target(r) for r in claimed], skipped


def _target(row: InstanceRow) -> ProbeTarget:
    """What a probe asks: ``/healthz`` of an SDK agent, the card of an A2A agent, a ping
    of an MCP server."""
    if row.protocol == "mcp":
        return ProbeTarget(row.instance_id, row.endpoint, protocol="mcp")
    card = (row.a2a or {}).get("card_url") if row.protocol == "a2a" else None
    if card:
        parts = urlsplit(str(card))
        return ProbeTarget(row.instance_id, f"{parts.scheme}://{parts.netloc}", parts.path)
    return ProbeTarget(row.instance_id, row.public_endpoint or row.endpoint)


def record_probe(session: Session, outcome: ProbeOutcome, now: float, policy: Policy) -> None:
    """Push one probe result into the window, reassess, schedule the next probe."""
    row = session.get(InstanceRow, outcome.instance_id, with_for_update=True)
    metrics.PROBE_TOTAL.labels("success" if outcome.sample.ok else "failure").inc()
    if row is None:
        return
    window = window_of(row, policy.window).push(outcome.sample)
    row.probe_window = window.to_list()
    row.rtt_ms = window.smoothed_rtt_ms
    row.loss_rate = window.loss_rate
    row.last_probe_at = outcome.sample.at
    row.last_probe_error = outcome.error
    row.probe_lease_until = None
    if outcome.sample.ok:
        row.probe_status = "ok"
    elif window.consecutive_failures >= policy.reach.probe_fail_threshold:
        row.probe_status = "unreachable"
    else:
        row.probe_status = "failing"
    verdict = reassess(session, row, now, policy)
    row.next_probe_at = now + next_probe_delay(
        verdict.status, verdict.reach_score, policy.reach, failures=window.consecutive_failures
    )


def sweep(session: Session, now: float, policy: Policy) -> list[str]:
    """Reassess every instance that is not deregistered; return the ids whose status changed."""
    rows = session.scalars(
        _skip_locked(session, select(InstanceRow).where(InstanceRow.status.not_in(_UNPROBED)))
    ).all()
    changed = []
    for row in rows:
        before = row.status
        verdict = reassess(session, row, now, policy)
        if verdict.status != before:
            changed.append(row.instance_id)
    return changed


def events(session: Session, instance_id: str, limit: int = 100) -> list[InstanceEventRow]:
    return list(
        session.scalars(
            select(InstanceEventRow)
            .where(InstanceEventRow.instance_id == instance_id)
            .order_by(InstanceEventRow.id.desc())
            .limit(limit)
        )
    )


def _event(
    session: Session, row: InstanceRow, kind: str, now: float, detail: dict[str, object]
) -> None:
    session.add(
        InstanceEventRow(
            instance_id=row.instance_id, agent_id=row.agent_id, kind=kind, detail=detail, at=now
        )
    )
