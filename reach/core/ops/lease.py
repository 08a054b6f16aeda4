"""Single-holder leases: who holds a named lease after one attempt to take or keep it.

A lease is a record (holder, expires_at) its holder renews well before it expires. A holder
that dies stops renewing and the lease lapses; the next contender then takes it. Nothing
has to notice the death, so this works on every store the hub runs on. The store applies
``claim`` and ``release`` inside a transaction that locks the record, so two contenders
never both win; the decisions themselves are here, free of I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Lease:
    """A named lease as stored: ``holder`` is ``None`` once released."""

    holder: str | None
    expires_at: float

    def held_at(self, now: float) -> bool:
        """Someone holds it at ``now`` (a lapsed lease is free, whoever it names)."""
        return self.holder is not None and now < self.expires_at


class Outcome(StrEnum):
    ACQUIRED = "acquired"  # it was free or lapsed, and is now the contender's
    RENEWED = "renewed"  # the contender held it and extended it
    STANDBY = "standby"  # someone else holds it; nothing changes


@dataclass(frozen=True)
class LeaseDecision:
    outcome: Outcome
    lease: Lease  # the lease after the decision: what the store writes when it changed
    previous: str | None  # who held it before (a lapsed holder too), to log take-overs

    @property
    def ours(self) -> bool:
        return self.outcome is not Outcome.STANDBY


def claim(current: Lease | None, me: str, now: float, duration: float) -> LeaseDecision:
    """Take or keep the lease for ``duration`` seconds from ``now``, unless another holds it.

    A holder's own lapsed lease is *acquired* anew, not renewed: it may have stopped acting
    when its lease ran out, so it starts again as a new holder would.
    """
    if duration <= 0:
        raise ValueError("a lease lasts a positive number of seconds")
    previous = None if current is None else current.holder
    if current is not None and current.held_at(now):
        if current.holder != me:
            return LeaseDecision(Outcome.STANDBY, current, previous)
        return LeaseDecision(Outcome.RENEWED, Lease(me, now + duration), previous)
    return LeaseDecision(Outcome.ACQUIRED, Lease(me, now + duration), previous)


def release(current: Lease | None, me: str, now: float) -> Lease | None:
    """The lease after ``me`` lets go (free at once), or ``None`` when it is not ``me``'s."""
    if current is None or current.holder != me:
        return None
    return Lease(None, min(now, current.expires_at))
