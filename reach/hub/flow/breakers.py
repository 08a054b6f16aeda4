"""The circuit breaker's edge: hub-wide windows in, transitions out to the store.

The decisions are pure (``reach.core.flow.breakers``). Outcomes are counted per instance in the
hub-wide windows of ``reach.hub.flow.shared_counts`` (`Breakers` given a `SharedCounts`): every
worker process -- each prefork child is one -- adds to the same window, so a breaker opens
after about ``min_volume`` answers hub-wide, not that many per process. The counts are
buffered per process (a lag of about a second) and the window is judged on failures only,
so a successful delivery costs no read. Without a `SharedCounts` the windows are this
process's own, in memory. Only transitions reach the database, in short transactions of
their own, each leaving an ``instance_events`` row:

* **open** (``breaker_open``): a window tripped. ``breaker_open_until`` becomes
  ``now + trial_interval``; routing leaves the instance out until then, and a submit whose
  every instance is open fails fast (``CircuitOpen``).
* **trial**: once ``breaker_open_until`` has passed, the delivery that picks the instance
  claims the trial with a conditional UPDATE that also pushes ``breaker_open_until`` one
  trial interval on -- one process wins, the rest route elsewhere. A failed trial leaves
  it at that (still open); a successful one closes the breaker (``breaker_closed``) and
  clears the instance's consecutive-failure count (the trial was the success that resets
  it; the agent's next heartbeat says so too). It then recovers gradually
  (``reach.core.flow.breakers.recovery_share``): routing gives it a growing share for
  ``breaker_recovery_windows`` windows, and a failure meanwhile opens it again at once.

With ``streak`` set (`reach.core.flow.breakers.FailureStreak`) each process also keeps the
instance's current run of distinct failing tasks, in memory: the first process whose run
reaches ``streak`` opens the breaker, without waiting for the window.

Each window (and streak) is keyed by the instance's last opening (``breaker_opened_at``):
outcomes counted before the breaker last opened -- by any process -- are forgotten, and
opening is conditional on no opening since the evidence's, so failures seen before an
opening cannot trip the breaker again once it has closed.

Tasks meet an open breaker in two places (issue 14): a transient failure that finds it
open (`open_until`) and routing that finds nothing but instances held out by breakers
(`held_back_until`). Delivery then defers the attempt without spending a retry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar, cast

from cachetools import LRUCache
from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from reach.core.delivery.retry import Outcome
from reach.core.fleet.health import InstanceStatus
from reach.core.fleet.routing import Candidate
from reach.core.flow.breakers import (
    BreakerPolicy,
    BreakerState,
    FailureStreak,
    FailureWindow,
    Transition,
    counts_as_success,
    reopens,
    retry_at,
    state,
    trips,
)
from reach.hub import metrics
from reach.hub.flow.shared_counts import SharedCounts
from reach.hub.storage.models import InstanceEventRow, InstanceRow
from reach.hub.storage.outage import database_outage

log = logging.getLogger("reach.core.flow.breakers")


@dataclass(frozen=True, slots=True)
class Ticket:
    """What routing hands delivery about the chosen instance's breaker."""

    instance_id: str
    agent_id: str
    opened_at: float  # the breaker's last opening as routing saw it; 0.0 if it never opened
    trial: bool  # this attempt is the breaker's trial
    closed_at: float | None = None  # its last successful trial: a failure soon after reopens


WINDOW = "breaker"  # SharedCounts name; keys "<instance>@<opened_at>:all" and ":fail"


class Breakers:
    """The failure windows, one per instance: hub-wide with ``shared``, else this process's.

    At most ``maxsize`` instances are tracked, least recently answered dropped first:
    instance ids are fresh UUIDs on every agent restart, so a long-lived worker would
    otherwise keep a window for every instance it ever delivered to. A dropped window
    only forgets outcomes; the breaker's state itself lives in the store.
    """

    def __init__(self, maxsize: int = 4096, shared: SharedCounts | None = None) -> None:
        self._windows: LRUCache[str, tuple[float, FailureWindow]] = LRUCache(maxsize=maxsize)
        self._streaks: LRUCache[str, tuple[float, FailureStreak]] = LRUCache(maxsize=maxsize)
        self._tripped: LRUCache[str, bool] = LRUCache(maxsize=maxsize)
        self._lock = threading.Lock()
        self.shared = shared

    def record(
        self,
        ticket: Ticket,
        success: bool,
        now: float,
        policy: BreakerPolicy,
        shared: SharedCounts | None = None,
        task_id: str | None = None,
    ) -> Transition | None:
        """Count one outcome (of ``task_id``, for the streak); a Transition when the
        instance's streak or window trips.

        ``shared`` (or the one given at construction) makes the window hub-wide."""
        shared = shared or self.shared
        if shared is not None:
            return self._record_shared(shared, ticket, success, now, policy, task_id)
        with self._lock:
            window = _current(self._windows, ticket, policy, FailureWindow)
            if window is None:
                return None  # routed before the breaker last opened: old evidence
            streak = self._streak(ticket, success, now, policy, task_id)
            if streak is not None:
                window.clear()
                return streak
            return window.record(success, now)

    def _streak(
        self, ticket: Ticket, success: bool, now: float, policy: BreakerPolicy, task_id: str | None
    ) -> Transition | None:
        """The instance's streak, fed one outcome (called with the lock held)."""
        if task_id is None or not policy.streak:
            return None
        streak = _current(self._streaks, ticket, policy, FailureStreak)
        return None if streak is None else streak.record(task_id, success, now)

    def _record_shared(
        self,
        shared: SharedCounts,
        ticket: Ticket,
        success: bool,
        now: float,
        policy: BreakerPolicy,
        task_id: str | None,
    ) -> Transition | None:
        key = f"{ticket.instance_id}@{ticket.opened_at!r}"
        shared.add(WINDOW, key + ":all", now)
        if success or not policy.enabled:
            if success and policy.streak:
                with self._lock:
                    self._streak(ticket, True, now, policy, task_id)
            return None  # a success never trips it: judged on failures, which read
        shared.add(WINDOW, key + ":fail", now)
        with self._lock:
            if key in self._tripped:
                return None  # this evidence opened it already: one transition per run
            streak = self._streak(ticket, False, now, policy, task_id)
            if streak is not None:
                self._tripped[key] = True
                return streak
        sums = shared.totals(WINDOW, [key + ":all", key + ":fail"], now, policy.window_s)
        total = sums[key + ":all"]
        transition = trips(min(sums[key + ":fail"], total), total, policy)
        if transition is not None:
            with self._lock:
                self._tripped[key] = True
        return transition

    def forget(self, instance_id: str) -> None:
        with self._lock:
            self._windows.pop(instance_id, None)
            self._streaks.pop(instance_id, None)

    def __len__(self) -> int:
        return len(self._windows)


class _Counter(Protocol):
    policy: BreakerPolicy


_C = TypeVar("_C", bound=_Counter)


def _current(
    book: LRUCache[str, tuple[float, _C]],
    ticket: Ticket,
    policy: BreakerPolicy,
    make: Callable[[BreakerPolicy], _C],
) -> _C | None:
    """The instance's counter for the ticket's opening: None for evidence from before the
    breaker last opened; a fresh one after a newer opening or a policy change."""
    epoch, counter = book.get(ticket.instance_id, (0.0, None))
    if ticket.opened_at < epoch:
        return None
    if counter is None or ticket.opened_at > epoch or counter.policy != policy:
        counter = make(policy)
        book[ticket.instance_id] = (ticket.opened_at, counter)
    return counter


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
    return Ticket(
        instance_id, row.agent_id, row.breaker_opened_at or 0.0, trial, row.breaker_closed_at
    )


def ticket_for(
    session: Session, candidate: Candidate, now: float, policy: BreakerPolicy
) -> Ticket | None:
    """``ticket`` from what routing loaded with the candidate (no read of its row)."""
    trial = state(candidate.breaker_open_until, now) is not BreakerState.CLOSED
    if trial and not claim_trial(session, candidate.instance_id, now, policy):
        return None
    return Ticket(
        candidate.instance_id,
        candidate.agent_id,
        candidate.breaker_opened_at,
        trial,
        candidate.breaker_closed_at,
    )


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
    db: sessionmaker[Session],
    breakers: Breakers,
    ticket: Ticket,
    outcome: Outcome,
    now: float,
    policy: BreakerPolicy,
    shared: SharedCounts | None = None,
    task_id: str | None = None,
) -> None:
    """Feed one agent answer (to ``task_id``'s delivery) to the instance's breaker; store a
    transition if there is one.

    ``shared``: count it in the hub-wide window (`Breakers.record`). A database failure
    while storing it is `HubUnavailable`, never SQLAlchemy's own."""
    success = counts_as_success(outcome)
    if success is None:
        return
    if ticket.trial:
        if success:
            close(db, ticket, now)
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
    if not success and reopens(ticket.closed_at, now, policy):
        # still recovering from its last opening: one failure is evidence enough
        recovering = Transition(BreakerState.OPEN, 1, 1, "recovery")
        open_breaker(db, ticket, recovering, now, policy)
        return
    transition = breakers.record(ticket, success, now, policy, shared, task_id)
    if transition is not None and transition.to is BreakerState.OPEN:
        open_breaker(db, ticket, transition, now, policy)


def open_breaker(
    db: sessionmaker[Session],
    ticket: Ticket,
    transition: Transition,
    now: float,
    policy: BreakerPolicy,
) -> bool:
    """Open a closed breaker (one that is open already stays as it is); True if it opened."""
    until = now + policy.trial_interval_s
    with db.begin() as session:
        opened = _rowcount(
            session.execute(
                update(InstanceRow)
                .where(InstanceRow.instance_id == ticket.instance_id)
                .where(InstanceRow.breaker_open_until.is_(None))
                # evidence from before the last opening opens nothing
                .where(func.coalesce(InstanceRow.breaker_opened_at, 0.0) <= ticket.opened_at)
                .values(breaker_open_until=until, breaker_opened_at=now)
            )
        )
        if not opened:
            return False
        detail = {
            "rule": transition.rule,
            "failures": transition.failures,
            "total": transition.total,
            "window_s": policy.window_s,
            "open_until": until,
        }
        _event(session, ticket, "breaker_open", now, detail)
    metrics.BREAKER_OPEN_TOTAL.labels(ticket.agent_id).inc()
    if transition.rule == "recovery":
        log.warning(
            "breaker OPEN again for %s/%s: it failed while recovering; next trial in %gs",
            ticket.agent_id,
            ticket.instance_id,
            policy.trial_interval_s,
        )
        return True
    if transition.rule == "streak":
        log.warning(
            "breaker OPEN for %s/%s: %d distinct tasks failed in a row; next trial in %gs",
            ticket.agent_id,
            ticket.instance_id,
            transition.failures,
            policy.trial_interval_s,
        )
        return True
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


def close(db: sessionmaker[Session], ticket: Ticket, now: float) -> bool:
    """Close the breaker after a successful trial; True if this call closed it."""
    with db.begin() as session:
        closed = _rowcount(
            session.execute(
                update(InstanceRow)
                .where(InstanceRow.instance_id == ticket.instance_id)
                .where(InstanceRow.breaker_open_until.is_not(None))
                .values(breaker_open_until=None, consecutive_failure_count=0, breaker_closed_at=now)
            )
        )
        if not closed:
            return False
        _event(session, ticket, "breaker_closed", now, {"opened_at": ticket.opened_at})
    log.info("breaker closed for %s/%s: the trial succeeded", ticket.agent_id, ticket.instance_id)
    return True


LIVE = frozenset({InstanceStatus.ONLINE, InstanceStatus.DEGRADED})


def held_back_until(candidates: list[Candidate], now: float, recheck_s: float) -> float | None:
    """When routing found no instance: the time to look again if only breakers held the
    live candidates out (``reach.core.flow.breakers.retry_at``); None if something else did."""
    live = [c.breaker_open_until for c in candidates if c.status in LIVE]
    return retry_at(live, now, recheck_s)


def open_failing(
    session: Session, candidates: list[Candidate], now: float, policy: BreakerPolicy
) -> list[Candidate]:
    """Open the breaker of each live instance held out only by its own failure reports.

    An agent that reports ``failure_threshold`` consecutive task failures leaves routing
    (reachability rule 5) and, with no delivery to succeed, would never come back; its
    breaker gives it the way back: trials (`routable` lets a due trial through). Written in
    the caller's transaction; the candidates come back with the breakers as now stored."""
    out = []
    for c in candidates:
        if c.status in LIVE and not c.routable and c.breaker_open_until is None:
            until = now + policy.trial_interval_s
            opened = _rowcount(
                session.execute(
                    update(InstanceRow)
                    .where(InstanceRow.instance_id == c.instance_id)
                    .where(InstanceRow.breaker_open_until.is_(None))
                    .values(breaker_open_until=until, breaker_opened_at=now)
                )
            )
            if opened:
                detail = {"reason": "consecutive task failures", "open_until": until}
                ticket = Ticket(c.instance_id, c.agent_id, 0.0, False)
                _event(session, ticket, "breaker_open", now, detail)
                metrics.BREAKER_OPEN_TOTAL.labels(c.agent_id).inc()
                log.warning(
                    "breaker OPEN for %s/%s: it reports consecutive task failures; "
                    "next trial in %gs", c.agent_id, c.instance_id, policy.trial_interval_s,
                )  # fmt: skip
            else:  # opened meanwhile (the candidates are a moment old): as stored
                until = session.scalar(
                    select(InstanceRow.breaker_open_until).where(
                        InstanceRow.instance_id == c.instance_id
                    )
                )
            c = replace(c, breaker_open_until=until)
        out.append(c)
    return out


def open_until(session: Session, instance_id: str, now: float) -> float | None:
    """The instance's ``breaker_open_until`` if its breaker is OPEN now (a fresh read)."""
    until = session.scalar(
        select(InstanceRow.breaker_open_until).where(InstanceRow.instance_id == instance_id)
    )
    return until if state(until, now) is BreakerState.OPEN else None


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
