"""The circuit breaker's edge: per-process windows in, transitions out to the store.

The decisions are pure (``reach.core.breaker``). Outcomes are counted in memory, per worker
process and per instance (`Breakers`): a delivery costs no extra write. Only transitions
reach the database, in short transactions of their own, each leaving an
``instance_events`` row:

* **open** (``breaker_open``): a window tripped. ``breaker_open_until`` becomes
  ``now + trial_interval``; routing leaves the instance out until then, and a submit whose
  every instance is open fails fast (``CircuitOpen``).
* **trial**: once ``breaker_open_until`` has passed, the delivery that picks the instance
  claims the trial with a conditional UPDATE that also pushes ``breaker_open_until`` one
  trial interval on -- one process wins, the rest route elsewhere. A failed trial leaves
  it at that (still open); a successful one closes the breaker (``breaker_closed``).

Each window is keyed by the instance's last opening (``breaker_opened_at``): outcomes
counted before the breaker last opened -- by any process -- are forgotten, so a process
that saw failures before an opening cannot trip the breaker again on that old evidence
once it has closed.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, cast

from cachetools import LRUCache
from sqlalchemy import CursorResult, update
from sqlalchemy.orm import Session, sessionmaker

from reach.core.breaker import (
    BreakerPolicy,
    BreakerState,
    FailureWindow,
    Transition,
    counts_as_success,
    state,
)
from reach.core.retry import Outcome
from reach.core.routing import Candidate
from reach.hub import metrics
from reach.hub.storage.models import InstanceEventRow, InstanceRow
from reach.hub.storage.outage import database_outage

log = logging.getLogger("reach.core.breaker")


@dataclass(frozen=True, slots=True)
class Ticket:
    """What routing hands delivery about the chosen instance's breaker."""

    instance_id: str
    agent_id: str
    opened_at: float  # the breaker's last opening as routing saw it; 0.0 if it never opened
    trial: bool  # this attempt is the breaker's trial


class Breakers:
    """This process's failure windows, one per instance (memory only, never written).

    At most ``maxsize`` instances are tracked, least recently answered dropped first:
    instance ids are fresh UUIDs on every agent restart, so a long-lived worker would
    otherwise keep a window for every instance it ever delivered to. A dropped window
    only forgets outcomes; the breaker's state itself lives in the store.
    """

    def __init__(self, maxsize: int = 4096) -> None:
        self._windows: LRUCache[str, tuple[float, FailureWindow]] = LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()

    def record(
        self, ticket: Ticket, success: bool, now: float, policy: BreakerPolicy
    ) -> Transition | None:
        """Count one outcome; a Transition when the instance's window trips."""
        with self._lock:
            epoch, window = self._windows.get(ticket.instance_id, (0.0, None))
            if ticket.opened_at < epoch:
                return None  # routed before the breaker last opened: old evidence
            if window is None or ticket.opened_at > epoch or window.policy != policy:
                window = FailureWindow(policy)
                self._windows[ticket.instance_id] = (ticket.opened_at, window)
            return window.record(success, now)

    def forget(self, instance_id: str) -> None:
        with self._lock:
            self._windows.pop(instance_id, None)

    def __len__(self) -> int:
        return len(self._windows)


def ticket(session: Session, instance_id: str, now: float, policy: BreakerPolicy) -> Ticket | None:
    """The ticket to deliver to the chosen instance, or None if its trial is someone else's.

    Routing left OPEN instances out already; a TRIAL_DUE one is ours only if this
    transaction wins the claim.
    """
    row = session.get(InstanceRow, instance_id)  # loaded by routing: no query
    if row is None:
        return None
    current = state(row.breaker_open_until, now)
    trial = current is not BreakerState.CLOSED
    if trial and not claim_trial(session, instance_id, now, policy):
        return None
    return Ticket(instance_id, row.agent_id, row.breaker_opened_at or 0.0, trial)


def ticket_for(
    session: Session, candidate: Candidate, now: float, policy: BreakerPolicy
) -> Ticket | None:
    """``ticket`` from what routing loaded with the candidate (no read of its row)."""
    trial = state(candidate.breaker_open_until, now) is not BreakerState.CLOSED
    if trial and not claim_trial(session, candidate.instance_id, now, policy):
        return None
    return Ticket(candidate.instance_id, candidate.agent_id, candidate.breaker_opened_at, trial)


def claim_trial(session: Session, instance_id: str, now: float, policy: BreakerPolicy) -> bool:
    """Take the instance's due trial: True in exactly one of the deliveries that race for it."""
    claimed = _rowcount(
        session.execute(
            update(InstanceRow)
            .where(InstanceRow.instance_id == instance_id)
            .where(InstanceRow.breaker_open_until <= now)
            .values(breaker_open_until=now + policy.trial_interval_s)
        )
    )
    if claimed:
        log.info("breaker trial for %s", instance_id)
    return claimed == 1


@database_outage("a circuit breaker's transition")
def observe(
    sessions: sessionmaker[Session],
    breakers: Breakers,
    ticket: Ticket,
    outcome: Outcome,
    now: float,
    policy: BreakerPolicy,
) -> None:
    """Feed one agent answer to the instance's breaker; store a transition if there is one.

    A database failure while storing it is `HubUnavailable`, never SQLAlchemy's own."""
    success = counts_as_success(outcome)
    if success is None:
        return
    if ticket.trial:
        if success:
            close(sessions, ticket, now)
            breakers.forget(ticket.instance_id)
        else:
            log.info(
                "breaker trial for %s/%s failed (%s); open for another %gs",
                ticket.agent_id,
                ticket.instance_id,
                outcome.value,
                policy.trial_interval_s,
            )
        return
    transition = breakers.record(ticket, success, now, policy)
    if transition is not None and transition.to is BreakerState.OPEN:
        open_breaker(sessions, ticket, transition, now, policy)


def open_breaker(
    sessions: sessionmaker[Session],
    ticket: Ticket,
    transition: Transition,
    now: float,
    policy: BreakerPolicy,
) -> bool:
    """Open a closed breaker (one that is open already stays as it is); True if it opened."""
    until = now + policy.trial_interval_s
    with sessions.begin() as session:
        opened = _rowcount(
            session.execute(
                update(InstanceRow)
                .where(InstanceRow.instance_id == ticket.instance_id)
                .where(InstanceRow.breaker_open_until.is_(None))
                .values(breaker_open_until=until, breaker_opened_at=now)
            )
        )
        if not opened:
            return False
        detail = {
            "failures": transition.failures,
            "total": transition.total,
            "window_s": policy.window_s,
            "open_until": until,
        }
        _event(session, ticket, "breaker_open", now, detail)
    metrics.BREAKER_OPEN_TOTAL.labels(ticket.agent_id).inc()
    log.warning(
        "breaker OPEN for %s/%s: %d of %d answers failed within %ds; next trial in %gs",
        ticket.agent_id,
        ticket.instance_id,
        transition.failures,
        transition.total,
        policy.window_s,
        policy.trial_interval_s,
    )
    return True


def close(sessions: sessionmaker[Session], ticket: Ticket, now: float) -> bool:
    """Close the breaker after a successful trial; True if this call closed it."""
    with sessions.begin() as session:
        closed = _rowcount(
            session.execute(
                update(InstanceRow)
                .where(InstanceRow.instance_id == ticket.instance_id)
                .where(InstanceRow.breaker_open_until.is_not(None))
                .values(breaker_open_until=None)
            )
        )
        if not closed:
            return False
        _event(session, ticket, "breaker_closed", now, {"opened_at": ticket.opened_at})
    log.info("breaker closed for %s/%s: the trial succeeded", ticket.agent_id, ticket.instance_id)
    return True


def _event(session: Session, ticket: Ticket, kind: str, now: float, detail: dict[str, Any]) -> None:
    session.add(
        InstanceEventRow(
            instance_id=ticket.instance_id,
            agent_id=ticket.agent_id,
            kind=kind,
            detail=detail,
            at=now,
        )
    )


def _rowcount(result: object) -> int:
    return int(cast(CursorResult[Any], result).rowcount)
