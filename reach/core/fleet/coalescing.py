"""Which heartbeats may wait for the next batched write, and which must be written at once.

A fleet of idle instances sends a heartbeat every few seconds each, and almost none of them
change anything but ``last_heartbeat``. The API buffers those quiet beats and writes them as
one batch every ``flush_s`` (`reach.hub.api.heartbeats`); a beat that could move the
instance's status or raise an alert is written at once, so its transition is recorded as it
happens. The batch re-assesses every beat against the freshly locked row anyway: a
deferral decided on a stale view is only late by one flush, never wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from reach.core.fleet.health import InstanceStatus


@dataclass(frozen=True, slots=True)
class Known:
    """What this API process last saw of an instance in the database (at ``seen_at``)."""

    agent_id: str
    status: str
    alerted: bool  # any alert raised
    interval: float
    seen_at: float


@dataclass(frozen=True, slots=True)
class Quiet:
    """The facts of a heartbeat that decide whether it may wait."""

    agent_id: str
    in_flight: int
    consecutive_failure_count: int


def may_defer(
    known: Known | None, beat: Quiet, now: float, *, max_age: float, failure_threshold: int
) -> bool:
    """True when the beat can only confirm what is known: an ONLINE instance without alerts,
    seen no longer than ``max_age`` ago, reporting nothing in flight and fewer consecutive
    failures than take it out of routing.

    Anything else is written at once: an unknown (or another agent's) instance gets its 404
    from the database; a suspect or offline one comes back with its transition recorded; a
    busy one may be at capacity or stop consuming (DEGRADED), and its answer may name closed
    sessions among its reaches, which an idle instance has none of.
    """
    if known is None or known.agent_id != beat.agent_id:
        return False
    if now - known.seen_at > max_age or known.seen_at > now:
        return False
    if known.status != InstanceStatus.ONLINE.value or known.alerted:
        return False
    return beat.in_flight == 0 and beat.consecutive_failure_count < failure_threshold
