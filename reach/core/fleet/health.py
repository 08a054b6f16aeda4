"""Liveness of an instance from the heartbeat signal: a pure function of facts and clock.

The hub stamps every heartbeat with its own clock, so the only inputs are the hub-side
time of the last heartbeat, the interval the instance promised and "now". An instance
is offline once ``missed_intervals`` whole intervals have passed without a heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass

from reach.core.ledger.statuses import InstanceStatus

__all__ = ["HeartbeatFacts", "InstanceStatus", "heartbeat_age", "liveness"]


@dataclass(frozen=True, slots=True)
class HeartbeatFacts:
    last_heartbeat: float
    interval: float
    deregistered: bool = False


def heartbeat_age(facts: HeartbeatFacts, now: float) -> float:
    """Seconds since the last heartbeat, never negative."""
    return max(0.0, now - facts.last_heartbeat)


def liveness(facts: HeartbeatFacts, now: float, missed_intervals: int = 3) -> InstanceStatus:
    """ONLINE while fewer than ``missed_intervals`` intervals passed silently, else OFFLINE."""
    if facts.deregistered:
        return InstanceStatus.DEREGISTERED
    if heartbeat_age(facts, now) >= missed_intervals * facts.interval:
        return InstanceStatus.OFFLINE
    return InstanceStatus.ONLINE
