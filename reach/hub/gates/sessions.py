"""Session liveness on the store: open, close (which cancels), read, and the checks that
submission and the heartbeat answer make (``reach.core.gates.sessions`` decides).

Closing is one transaction: the row says ``closed``, the session's pending and parked
reaches end ``cancelled`` (each with a ``session_closed`` event, their approvals
cancelled, their waiters woken), and a queued broker message for one of them then finds
nothing to claim. In-flight reaches are not killed: the next heartbeat answer of their
instance names the session (``X-Reach-Closed-Sessions``) and ``reach.session_alive()``
says False inside their handler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from reach.core.gates import sessions as rules
from reach.core.gates.sessions import CANCELLED_ON_CLOSE, IN_FLIGHT, SessionState
from reach.core.ledger.statuses import TaskStatus
from reach.core.security.auth import Principal, Scope
from reach.errors import Forbidden, SessionClosed, UnknownSession
from reach.hub.gates import approvals
from reach.hub.ledger.tasks import finish, record_event
from reach.hub.storage.models import SessionRow, TaskRow

log = logging.getLogger(__name__)

__all__ = [
    "bind",
    "cancel_if_closed",
    "check_open",
    "close",
    "closed_among_in_flight",
    "closed_header",
    "get",
    "open_session",
    "view",
]


NotYours = Callable[[str], None]
"""Told what a principal may not see before it is answered as unknown (the API logs and
counts it: ``reach.hub.api.auth.not_yours``)."""


def _quiet(what: str) -> None:
    log.warning("%s is not visible to this key", what)


def bind(session: Session, session_id: str | None, principal: Principal, now: float) -> None:
    """Let ``principal`` bind a new reach to ``session_id``: a session it does not own is
    refused (`Forbidden`), a closed or expired one too (`SessionClosed`); an unknown one is
    opened here, owned by ``principal``, with no TTL (so no other key can close it under
    the reaches it sends). One primary-key read for a known session; none without one."""
    if session_id is None:
        return
    row = session.get(SessionRow, session_id)
    if row is None:
        row = _claimed(session, session_id, principal, now)
        if row is None:
            return  # opened now, ours
    if not rules.may_manage(principal, row.owner):
        handling = (
            _agents_of(session, session_id, IN_FLIGHT) if principal.scope is Scope.AGENT else []
        )
        if not rules.may_bind(principal, row.owner, handling):
            raise Forbidden(
                f"session {session_id!r} belongs to another key: a reach may be bound only "
                "to a session its key opened (or first sent a reach in)",
                session_id=session_id,
            )
    state = rules.state_of(row.status, row.expires_at, now)
    if not state.alive:
        raise _closed(session_id, state, row)


def _claimed(
    session: Session, session_id: str, principal: Principal, now: float
) -> SessionRow | None:
    """Open the unknown session ``session_id`` for ``principal`` (None: done), or the row
    a concurrent first reach of another key created meanwhile."""
    postgres = session.get_bind().dialect.name == "postgresql"
    insert = pg_insert if postgres else sqlite_insert
    created = session.execute(
        insert(SessionRow)
        .values(
            session_id=session_id,
            status=rules.OPEN,
            owner=principal.identity,
            opened_at=now,
            expires_at=None,
        )
        .on_conflict_do_nothing(index_elements=["session_id"])
    )
    if getattr(created, "rowcount", 0) == 1:
        return None
    return session.scalars(
        select(SessionRow)
        .where(SessionRow.session_id == session_id)
        .execution_options(populate_existing=True)
    ).one()


def _agents_of(session: Session, session_id: str, statuses: frozenset[str]) -> list[str]:
    """The agents the session's reaches in ``statuses`` were routed to (at most 100)."""
    found = session.scalars(
        select(TaskRow.agent_id)
        .where(
            TaskRow.session_id == session_id,
            TaskRow.status.in_(sorted(statuses)),
            TaskRow.agent_id.is_not(None),
        )
        .distinct()
        .limit(100)
    ).all()
    return [a for a in found if a]


def check_open(session: Session, session_id: str | None, now: float) -> None:
    """Refuse a new reach bound to a closed or expired session (`SessionClosed`); one
    primary-key read, and none at all without a ``session_id``."""
    if session_id is None:
        return
    row = session.get(SessionRow, session_id)
    if row is None:
        return
    state = rules.state_of(row.status, row.expires_at, now)
    if not state.alive:
        raise _closed(session_id, state, row)


def open_session(
    session: Session,
    session_id: str,
    principal: Principal,
    now: float,
    *,
    ttl_s: float | None,
    default_ttl_s: float | None,
    max_ttl_s: float,
    not_yours: NotYours = _quiet,
) -> tuple[dict[str, Any], bool]:
    """Open the session (or renew an open one's TTL): (its view, created). Closed or
    expired is final: `SessionClosed`. Someone else's session answers as unknown."""
    ttl = rules.resolve_ttl(ttl_s, default_ttl_s, max_ttl_s)
    row = _locked(session, session_id)
    if row is None:
        row = SessionRow(
            session_id=session_id,
            status=rules.OPEN,
            owner=principal.identity,
            opened_at=now,
            expires_at=rules.expiry(now, ttl),
        )
        session.add(row)
        session.flush()  # a concurrent open of the same id loses here (IntegrityError)
        return view(session, row, now), True
    _demand_manage(principal, row, not_yours)
    state = rules.state_of(row.status, row.expires_at, now)
    if not state.alive:
        raise _closed(session_id, state, row, verb="reopened")
    if ttl is not None and (ttl_s is not None or row.expires_at is not None):
        row.expires_at = rules.expiry(now, ttl)  # renewed (without ttl_s, no TTL stays none)
    return view(session, row, now), False


def close(
    session: Session,
    session_id: str,
    principal: Principal,
    now: float,
    *,
    reason: str | None,
    not_yours: NotYours = _quiet,
) -> dict[str, Any]:
    """Close the session and cancel its pending and parked reaches, in this transaction.

    An unknown session is recorded closed (owned by whoever closed it), so reaches sent
    for it later are refused; closing a closed session again sweeps again (a reach that
    raced the first close is caught) and keeps the first close's who and why."""
    row = _locked(session, session_id)
    if row is None:
        # reaches sent before sessions were opened on first use name no row: they are
        # still their callers', not whoever closes first
        callers = session.scalars(
            select(TaskRow.caller).where(TaskRow.session_id == session_id).distinct().limit(100)
        ).all()
        if any(not rules.may_manage(principal, c) for c in callers):
            not_yours(f"session {session_id!r}")
            raise _unknown(session_id)
        row = SessionRow(
            session_id=session_id,
            status=rules.CLOSED,
            owner=principal.identity,
            opened_at=now,
            closed_at=now,
            closed_by=principal.identity,
            reason=reason,
        )
        session.add(row)
        session.flush()
    else:
        _demand_manage(principal, row, not_yours)
        if row.status != rules.CLOSED:
            row.status = rules.CLOSED
            row.closed_at = now
            row.closed_by = principal.identity
            row.reason = reason
    cancelled = _cancel_reaches(session, row, now, principal.identity)
    told = session.scalar(
        select(func.count())
        .select_from(TaskRow)
        .where(TaskRow.session_id == session_id, TaskRow.status.in_(IN_FLIGHT))
    )
    log.info(
        "session %s closed by %s: %d reach(es) cancelled, %d in flight told",
        session_id,
        principal.identity,
        len(cancelled),
        told or 0,
    )
    return {**view(session, row, now), "cancelled": cancelled, "in_flight": int(told or 0)}


def get(
    session: Session,
    session_id: str,
    principal: Principal,
    now: float,
    not_yours: NotYours = _quiet,
) -> dict[str, Any]:
    """The session's state, TTL and its reaches counted by status; unknown or not
    visible to ``principal``: `UnknownSession`."""
    row = session.get(SessionRow, session_id)
    if row is None:
        raise _unknown(session_id)
    if not rules.may_read(principal, row.owner):
        agents = session.scalars(
            select(TaskRow.agent_id)
            .where(TaskRow.session_id == session_id, TaskRow.agent_id.is_not(None))
            .distinct()
            .limit(100)
        ).all()
        if not rules.may_read(principal, row.owner, [a for a in agents if a]):
            not_yours(f"session {session_id!r}")
            raise _unknown(session_id)
    return view(session, row, now)


def closed_among_in_flight(
    session: Session, agent_id: str, instance_id: str, now: float
) -> list[str]:
    """The closed (or expired) sessions among the instance's in-flight reaches: what its
    heartbeat answer names. One indexed read (the agent's in-flight tasks) joined to
    their sessions."""
    rows = (
        session.connection()
        .execute(_CLOSED_AMONG, {"b_agent": agent_id, "b_instance": instance_id})
        .all()
    )
    return sorted(
        sid for sid, status, expires in rows if not rules.state_of(status, expires, now).alive
    )


_SESSIONS_T, _TASKS_T = cast(Table, SessionRow.__table__), cast(Table, TaskRow.__table__)
# every heartbeat asks it: built once, as Core (an ORM select built per call cost more
# than the heartbeat's own read and write together)
_CLOSED_AMONG = (
    select(_SESSIONS_T.c.session_id, _SESSIONS_T.c.status, _SESSIONS_T.c.expires_at)
    .join(_TASKS_T, _TASKS_T.c.session_id == _SESSIONS_T.c.session_id)
    .where(
        _TASKS_T.c.agent_id == bindparam("b_agent"),
        _TASKS_T.c.status.in_(sorted(IN_FLIGHT)),
        _TASKS_T.c.instance_id == bindparam("b_instance"),
    )
    .distinct()
)


def closed_header(session: Session, agent_id: str, instance_id: str, now: float) -> dict[str, str]:
    """The header a heartbeat answer carries: the closed sessions among the instance's
    in-flight reaches (`rules.CLOSED_SESSIONS_HEADER`); empty when there are none."""
    closed = closed_among_in_flight(session, agent_id, instance_id, now)
    return {rules.CLOSED_SESSIONS_HEADER: rules.format_closed(closed)} if closed else {}


def view(session: Session, row: SessionRow, now: float) -> dict[str, Any]:
    state = rules.state_of(row.status, row.expires_at, now)
    counts = dict(
        session.execute(  # the (session_id, status) index answers this
            select(TaskRow.status, func.count())
            .where(TaskRow.session_id == row.session_id)
            .group_by(TaskRow.status)
        ).all()
    )
    live = sum(n for status, n in counts.items() if status in CANCELLED_ON_CLOSE | IN_FLIGHT)
    remaining = None
    if state.alive and row.expires_at is not None:
        remaining = round(max(0.0, row.expires_at - now), 3)
    return {
        "session_id": row.session_id,
        "state": state.value,
        "alive": state.alive,
        "owner": row.owner,
        "opened_at": row.opened_at,
        "expires_at": row.expires_at,
        "ttl_remaining_s": remaining,
        "closed_at": row.closed_at,
        "closed_by": row.closed_by,
        "reason": row.reason,
        "reaches": {
            "live": live,
            "cancelled": int(counts.get(TaskStatus.CANCELLED, 0)),
            "by_status": {str(k): int(v) for k, v in sorted(counts.items())},
        },
    }


def _cancel_reaches(session: Session, row: SessionRow, now: float, actor: str) -> list[str]:
    """End every pending or parked reach of the session ``cancelled`` (locked, so a
    worker's claim of the same task waits for this transaction and then finds it done)."""
    tasks = session.scalars(
        select(TaskRow)
        .where(TaskRow.session_id == row.session_id, TaskRow.status.in_(CANCELLED_ON_CLOSE))
        .order_by(TaskRow.id)
        .with_for_update()
    ).all()
    for task in tasks:
        _cancel(session, task, row, now, actor)
    return [task.task_id for task in tasks]


def _cancel(
    session: Session, task: TaskRow, row: SessionRow, now: float, actor: str | None
) -> None:
    """End one reach ``cancelled`` because its session closed (``actor``: who closed it;
    None: the hub noticed, at claim). Its waiters wake and read `SessionClosed`."""
    state = rules.state_of(row.status, row.expires_at, now)
    why = "was closed" if state is SessionState.CLOSED else "expired"
    error = {
        "kind": "session_closed",
        "message": f"session {row.session_id!r} {why}" + (f": {row.reason}" if row.reason else ""),
        "session_id": row.session_id,
        "closed_by": row.closed_by,
        "reason": row.reason,
    }
    if task.status == TaskStatus.AWAITING_APPROVAL:
        approvals.cancel(session, task.task_id, now, actor)
    detail = {"session_id": row.session_id, "reason": row.reason, "state": state.value}
    record_event(session, task, "session_closed", now, detail, actor=actor)
    finish(session, task, TaskStatus.CANCELLED, now, error=error, detail=detail, actor=actor)


def _locked(session: Session, session_id: str) -> SessionRow | None:
    return session.scalar(
        select(SessionRow).where(SessionRow.session_id == session_id).with_for_update()
    )


def _demand_manage(principal: Principal, row: SessionRow, not_yours: NotYours) -> None:
    if not rules.may_manage(principal, row.owner):
        not_yours(f"session {row.session_id!r}")
        raise _unknown(row.session_id)


def _unknown(session_id: str) -> UnknownSession:
    return UnknownSession(f"session {session_id!r} does not exist", session_id=session_id)


def _closed(
    session_id: str, state: SessionState, row: SessionRow, verb: str = "sent to"
) -> SessionClosed:
    why = "closed" if state is SessionState.CLOSED else "expired (its TTL ran out)"
    return SessionClosed(
        f"session {session_id!r} is {why}: it cannot be {verb}"
        if verb != "sent to"
        else f"session {session_id!r} is {why}: no new reach may be bound to it",
        session_id=session_id,
        state=state.value,
        closed_at=row.closed_at if state is SessionState.CLOSED else row.expires_at,
    )


def cancel_if_closed(session: Session, task_id: str, session_id: str, now: float) -> bool:
    """At claim: a reach whose session closed (or expired) since it was queued is
    cancelled instead of delivered -- it raced the close, or was in flight at the close
    and came back for a retry. One primary-key read, for session-bound tasks only."""
    row = session.get(SessionRow, session_id)
    if row is None or rules.state_of(row.status, row.expires_at, now).alive:
        return False
    task = session.scalar(select(TaskRow).where(TaskRow.task_id == task_id).with_for_update())
    if task is None or task.status not in rules.CANCELLED_ON_CLOSE | IN_FLIGHT:
        return False
    _cancel(session, task, row, now, None)
    return True
