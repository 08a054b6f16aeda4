"""Named leases in the hub's database: the lock that keeps one beat active.

One design for every store the hub runs on (SQLite or PostgreSQL, whichever broker): a
row per lease, read and rewritten in one transaction that locks it (``FOR UPDATE`` on
PostgreSQL; SQLite's write lock, taken at ``BEGIN IMMEDIATE``), with the decision from
``reach.core.ops.lease``. A dead holder is noticed by nobody: its lease simply lapses.

Time comes from the database where there is one server: on PostgreSQL every contender
compares against the server's clock, so clock skew between machines cannot let two hold
the lease at once. SQLite is one machine, whose clock it uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from reach.core.ops.lease import Lease, LeaseDecision, Outcome, claim, release
from reach.errors import HubUnavailable
from reach.hub.clock import Clock, SystemClock
from reach.hub.storage import read_session_factory, session_factory
from reach.hub.storage.models import LeaseRow


@dataclass
class LeaseStore:
    """Claims and releases one named lease for one contender (``holder``)."""

    engine: Engine
    name: str
    holder: str
    duration: float
    clock: Clock | None = None  # None: the database's clock (see the module docstring)

    def __post_init__(self) -> None:
        self._sessions = session_factory(self.engine)
        self._reads = read_session_factory(self.engine)

    def claim(self) -> LeaseDecision:
        """Take or keep the lease; raise ``HubUnavailable`` when the database is out of reach."""
        try:
            with self._sessions.begin() as session:
                row = self._locked_row(session)
                now = self._now(session)
                current = None if row is None else Lease(row.holder, row.expires_at)
                decision = claim(current, self.holder, now, self.duration)
                if row is not None and decision.ours:
                    if decision.outcome is Outcome.ACQUIRED:
                        row.acquired_at = now
                    row.holder = decision.lease.holder
                    row.expires_at = decision.lease.expires_at
                return decision
        except DBAPIError as exc:
            raise HubUnavailable(f"the hub's database is unavailable: {exc.orig}") from exc

    def release(self) -> bool:
        """Let go at once, so a standby need not wait for the lease to lapse."""
        try:
            with self._sessions.begin() as session:
                row = self._locked_row(session)
                current = None if row is None else Lease(row.holder, row.expires_at)
                after = release(current, self.holder, self._now(session))
                if row is None or after is None:
                    return False
                row.holder, row.expires_at = after.holder, after.expires_at
                return True
        except DBAPIError as exc:
            raise HubUnavailable(f"the hub's database is unavailable: {exc.orig}") from exc

    def current(self) -> Lease | None:
        """The lease as stored (for status output and tests)."""
        with self._reads.begin() as session:
            row = session.get(LeaseRow, self.name)
            return None if row is None else Lease(row.holder, row.expires_at)

    def _locked_row(self, session: Session) -> LeaseRow | None:
        """The lease's row, locked; created free on first use (any contender may win that)."""
        postgres = session.get_bind().dialect.name == "postgresql"
        insert = pg_insert if postgres else sqlite_insert
        query = select(LeaseRow).where(LeaseRow.name == self.name)
        if postgres:
            query = query.with_for_update()
        row = session.scalars(query).one_or_none()
        if row is None:
            session.execute(
                insert(LeaseRow)
                .values(name=self.name, holder=None, expires_at=0.0, acquired_at=0.0)
                .on_conflict_do_nothing(index_elements=["name"])
            )
            row = session.scalars(query).one_or_none()
        return row

    def _now(self, session: Session) -> float:
        if self.clock is not None:
            return self.clock.now()
        if session.get_bind().dialect.name == "postgresql":
            # clock_timestamp(), not now(): the row lock may have been waited for.
            epoch = func.extract("epoch", func.clock_timestamp())
            return float(session.execute(select(epoch)).scalar_one())
        return SystemClock().now()
