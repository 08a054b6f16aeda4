"""Reachability: an instance's status from two signals checked against each other.

The SDK's heartbeats say the process is alive and what it is doing; the hub's own TCP probes
say the hub can reach it. This module decides, purely (no I/O, the clock passed in as
``now``), what the two signals together mean. `assess` applies these rules, first match
wins:

1. deregistered                                     -> DEREGISTERED, not routable
2. heartbeat lost (age >= missed_intervals * interval):
   the newest probe succeeded, is at most ``probe_fresh_s`` old and the grace
   (``heartbeat_lost_grace_s`` past the loss) is not over
                                                    -> status from rules 4-6, alert
                                                       HEARTBEAT_LOST
   otherwise                                        -> OFFLINE, not routable
3. ``probe_fail_threshold`` trailing failed probes  -> UNREACHABLE, not routable
4. in_flight >= max_concurrency, or in_flight rose on ``degraded_rise_streak``
   successive heartbeats ("alive but not consuming")
                                                    -> DEGRADED, routable, alert
                                                       BUSINESS_UNREACHABLE
5. consecutive_failure_count >= ``routing_failure_threshold``
                                                    -> status unchanged, not routable,
                                                       alert FAILING
6. otherwise                                        -> ONLINE, routable

An instance with no probes yet is judged on its heartbeats alone. Alerts flag what the status
does not already say; OFFLINE, UNREACHABLE and DEREGISTERED carry none.

`next_probe_delay` turns a status, a ReachScore and a failure streak into the prober's
cadence, and `rise_streak` keeps the in_flight rise counter that rule 4 reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Final

from reach.core.fleet.health import HeartbeatFacts, InstanceStatus, heartbeat_age, liveness
from reach.core.fleet.scoring import DEFAULT_SCORE_CONFIG, ProbeWindow, ScoreConfig, reach_score

__all__ = [
    "DEFAULT_REACHABILITY_CONFIG",
    "Alert",
    "Assessment",
    "HeartbeatState",
    "ReachabilityConfig",
    "ReachabilityConfigError",
    "assess",
    "next_probe_delay",
    "rise_streak",
]


class ReachabilityConfigError(ValueError):
    """A ReachabilityConfig value is invalid; `field` names the offending setting."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def _is_int(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


# A grace of 0 is allowed: it means "offline as soon as the heartbeat is lost".
_MAY_BE_ZERO: Final = frozenset({"heartbeat_lost_grace_s"})


@dataclass(frozen=True, slots=True)
class ReachabilityConfig:
    """Thresholds and probe cadences of the reachability decision, validated on construction.

    Counts are ints >= 1; durations are finite seconds > 0 (``heartbeat_lost_grace_s`` may be
    0); ``fast_below_score`` is a ReachScore within [0, 100] (0 turns fast probing off).
    """

    missed_intervals: int = 3
    heartbeat_lost_grace_s: float = 60.0
    probe_fail_threshold: int = 3
    probe_interval_s: float = 5.0
    probe_fast_interval_s: float = 1.0
    probe_retry_interval_s: float = 30.0
    fast_below_score: float = 60.0
    degraded_rise_streak: int = 3
    routing_failure_threshold: int = 3
    probe_fresh_s: float = 15.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int):
                if not _is_int(value) or value < 1:
                    raise ReachabilityConfigError(f.name, f"must be an int >= 1, got {value!r}")
                continue
            if not _is_number(value) or not math.isfinite(value):
                raise ReachabilityConfigError(f.name, f"must be a finite number, got {value!r}")
            if f.name == "fast_below_score":
                if not 0 <= value <= 100:
                    raise ReachabilityConfigError(
                        f.name, f"is a ReachScore and must be within [0, 100], got {value!r}"
                    )
            elif f.name in _MAY_BE_ZERO:
                if value < 0:
                    raise ReachabilityConfigError(f.name, f"must not be negative, got {value!r}")
            elif value <= 0:
                raise ReachabilityConfigError(f.name, f"must be positive, got {value!r}")


DEFAULT_REACHABILITY_CONFIG: Final = ReachabilityConfig()


@dataclass(frozen=True, slots=True)
class HeartbeatState:
    """What the heartbeat signal last told the hub, stamped with the hub's clock.

    ``in_flight_rise_streak`` is maintained with `rise_streak` at each heartbeat. Values are
    checked (the API schemas enforce the same ranges at the boundary); a bad one raises
    ValueError naming the field.
    """

    last_heartbeat: float
    interval: float
    in_flight: int
    max_concurrency: int
    in_flight_rise_streak: int
    consecutive_failure_count: int
    deregistered: bool = False

    def __post_init__(self) -> None:
        if not _is_number(self.last_heartbeat) or not math.isfinite(self.last_heartbeat):
            raise ValueError(
                f"last_heartbeat: must be a finite number, got {self.last_heartbeat!r}"
            )
        if not _is_number(self.interval) or not math.isfinite(self.interval) or self.interval <= 0:
            raise ValueError(f"interval: must be a positive number, got {self.interval!r}")
        for name, minimum in (
            ("in_flight", 0),
            ("max_concurrency", 1),
            ("in_flight_rise_streak", 0),
            ("consecutive_failure_count", 0),
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                raise ValueError(f"{name}: must be an int >= {minimum}, got {value!r}")
        if not isinstance(self.deregistered, bool):
            raise ValueError(f"deregistered: must be a bool, got {self.deregistered!r}")


class Alert(StrEnum):
    """Something an operator should know that the status alone does not say."""

    HEARTBEAT_LOST = "heartbeat_lost"  # heartbeats stopped, probes still succeed
    BUSINESS_UNREACHABLE = "business_unreachable"  # alive but not consuming (DEGRADED)
    FAILING = "failing"  # task failures took it out of the routing pool


@dataclass(frozen=True, slots=True)
class Assessment:
    """The verdict of `assess`: status, ReachScore, whether routing may use it, and why."""

    status: InstanceStatus
    reach_score: float
    routable: bool
    alerts: tuple[Alert, ...]
    reason: str


def rise_streak(previous_in_flight: int, new_in_flight: int, previous_streak: int) -> int:
    """The in_flight rise streak after a heartbeat reporting ``new_in_flight``.

    +1 when in_flight strictly rose; 0 when it fell or is 0; unchanged when it stayed equal
    (and above 0). Only a fall, i.e. visible consumption, or an empty queue clears the streak.
    Resetting on a plateau instead would make a stuck instance flap: DEGRADED demotes it in
    routing, no new work arrives, in_flight stays flat, the streak would clear, it would be
    routed to again and climb again. A healthy instance at a flat load stays DEGRADED only
    until its next completion.
    """
    for name, value in (
        ("previous_in_flight", previous_in_flight),
        ("new_in_flight", new_in_flight),
        ("previous_streak", previous_streak),
    ):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name}: must be an int >= 0, got {value!r}")
    if new_in_flight == 0 or new_in_flight < previous_in_flight:
        return 0
    if new_in_flight > previous_in_flight:
        return previous_streak + 1
    return previous_streak


def _business_state(
    hb: HeartbeatState, cfg: ReachabilityConfig
) -> tuple[InstanceStatus, bool, list[Alert], list[str]]:
    """Rules 4-6 on the last heartbeat's facts: (status, routable, alerts, reasons)."""
    status, routable = InstanceStatus.ONLINE, True
    alerts: list[Alert] = []
    reasons: list[str] = []
    if hb.in_flight >= hb.max_concurrency:
        status = InstanceStatus.DEGRADED
        reasons.append(f"at capacity (in_flight {hb.in_flight} of {hb.max_concurrency})")
    elif hb.in_flight_rise_streak >= cfg.degraded_rise_streak:
        status = InstanceStatus.DEGRADED
        reasons.append(
            f"not consuming (in_flight rose on {hb.in_flight_rise_streak} successive "
            f"heartbeats, to {hb.in_flight})"
        )
    if status is InstanceStatus.DEGRADED:
        alerts.append(Alert.BUSINESS_UNREACHABLE)
    if hb.consecutive_failure_count >= cfg.routing_failure_threshold:
        routable = False
        alerts.append(Alert.FAILING)
        reasons.append(
            f"out of the routing pool after {hb.consecutive_failure_count} consecutive "
            "task failures"
        )
    return status, routable, alerts, reasons


def assess(
    hb: HeartbeatState,
    probes: ProbeWindow,
    now: float,
    cfg: ReachabilityConfig = DEFAULT_REACHABILITY_CONFIG,
    score_cfg: ScoreConfig = DEFAULT_SCORE_CONFIG,
) -> Assessment:
    """Status, ReachScore, routability and alerts of one instance at hub time ``now``.

    See the module docstring for the rules and their precedence.
    """
    facts = HeartbeatFacts(last_heartbeat=hb.last_heartbeat, interval=hb.interval)
    age = heartbeat_age(facts, now)
    score = reach_score(age, probes.smoothed_rtt_ms, probes.loss_rate, score_cfg)

    def verdict(
        status: InstanceStatus, routable: bool, alerts: list[Alert], reason: str
    ) -> Assessment:
        return Assessment(status, score, routable, tuple(alerts), reason)

    if hb.deregistered:
        return verdict(InstanceStatus.DEREGISTERED, False, [], "the instance deregistered")

    # Same boundary as health.liveness, so the registry sweep and this decision agree.
    if liveness(facts, now, cfg.missed_intervals) is InstanceStatus.OFFLINE:
        lost_for = (
            f"no heartbeat for {age:.1f} s (lost after {cfg.missed_intervals} x {hb.interval:g} s)"
        )
        newest = probes.samples[-1] if probes.samples else None
        grace_ends = cfg.missed_intervals * hb.interval + cfg.heartbeat_lost_grace_s
        if newest is None:
            return verdict(InstanceStatus.OFFLINE, False, [], f"{lost_for} and no probe yet")
        if not newest.ok:
            return verdict(
                InstanceStatus.OFFLINE, False, [], f"{lost_for} and the last probe failed"
            )
        probe_age = now - newest.at
        if probe_age > cfg.probe_fresh_s:
            return verdict(
                InstanceStatus.OFFLINE,
                False,
                [],
                f"{lost_for} and the last successful probe is stale ({probe_age:.1f} s old)",
            )
        if age >= grace_ends:
            return verdict(
                InstanceStatus.OFFLINE,
                False,
                [],
                f"{lost_for}; probes still succeed but the {cfg.heartbeat_lost_grace_s:g} s "
                "grace is over",
            )
        status, routable, alerts, reasons = _business_state(hb, cfg)
        reason = (
            f"{lost_for} but a probe {probe_age:.1f} s ago succeeded; kept for up to "
            f"{grace_ends - age:.1f} s more"
        )
        return verdict(
            status, routable, [Alert.HEARTBEAT_LOST, *alerts], "; ".join([reason, *reasons])
        )

    failures = probes.consecutive_failures
    if failures >= cfg.probe_fail_threshold:
        return verdict(
            InstanceStatus.UNREACHABLE,
            False,
            [],
            f"{failures} consecutive probes failed (threshold {cfg.probe_fail_threshold})",
        )

    status, routable, alerts, reasons = _business_state(hb, cfg)
    if not reasons:
        probe_part = "no probe yet" if not probes.samples else "probes succeed"
        reasons.append(f"heartbeat {age:.1f} s old, {probe_part}")
    return verdict(status, routable, alerts, "; ".join(reasons))


def next_probe_delay(
    status: InstanceStatus,
    reach_score: float,
    cfg: ReachabilityConfig = DEFAULT_REACHABILITY_CONFIG,
    *,
    failures: int = 0,
) -> float:
    """Seconds until the next probe of an instance with this status and ReachScore.

    DEREGISTERED: never again (``math.inf``). OFFLINE: the slow retry cadence; it is not
    routable and comes back through its heartbeat. UNREACHABLE (its heartbeats still come:
    the process lives, the hub's path to it failed) backs off from the fast cadence,
    doubling per trailing failed probe (``failures``) past the threshold, up to the retry
    cadence: an agent too busy to answer three probes in a row is back within a second or
    two, not after the whole retry interval while its tasks run out of retries, and an
    address that never answers costs a probe per retry interval soon after. Otherwise the
    fast cadence while the score is below ``fast_below_score`` (this includes an instance
    kept routable while its heartbeat is lost, whose score has no heartbeat credit), else
    the normal one.
    """
    if status is InstanceStatus.DEREGISTERED:
        return math.inf
    if status is InstanceStatus.OFFLINE:
        return cfg.probe_retry_interval_s
    if status is InstanceStatus.UNREACHABLE:
        past = min(max(0, failures - cfg.probe_fail_threshold), 30)  # 2**30 s caps anyway
        return min(cfg.probe_retry_interval_s, cfg.probe_fast_interval_s * 2.0**past)
    if reach_score < cfg.fast_below_score:
        return cfg.probe_fast_interval_s
    return cfg.probe_interval_s
