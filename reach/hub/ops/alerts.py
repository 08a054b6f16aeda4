"""Alerts: what an operator should look at, read from where the hub already records it.

Nothing here is a new store. Each kind comes from the record its decision leaves:

======================================  ==============================================
kind                                    recorded as
======================================  ==============================================
heartbeat_lost, business_unreachable,   ``instance_events`` kind ``alert``
failing                                 (`reach.hub.fleet.reachability`), ``detail.alert``
offline, unreachable                    ``instance_events`` kind ``status``, ``detail.to``
breaker_opened, breaker_closed          ``instance_events`` ``breaker_open`` /
                                        ``breaker_closed`` (`reach.hub.flow.breakers`)
dependency_loop_suspected, _calmed      ``audit_log`` rows (`reach.hub.flow.loops`)
backpressure                            ``audit_log`` action ``backpressure``
                                        (`BackpressureLog`, at the submit's 429)
dead_letter                             ``dead_letters`` rows (a task out of retries,
                                        ``reach.hub.ledger.tasks``), replayed or not
======================================  ==============================================

`list_alerts` merges the three tables newest first on one keyset cursor: ``(at, rank,
id)``, where ``rank`` says which table a row is from, so a page boundary between two rows
of the same instant is exact. A dead letter's alert names the task, its method, its
attempts and why; never its payload (the dead-letter queue keeps that for a replay).

An admin may *mute* a kind (`mute`, ``PUT /api/v1/alerts/mutes/{kind}``, audited): the
alert webhook does not push it and `list_alerts` leaves it out unless ``include_muted``
(then each item says ``muted``). Muting hides; the record stays where it was.

`alerts_after` reads the same records by each table's id, above a marker: the alert
webhook's scan (``reach.hub.ops.alert_webhook``).

A 429 refusal rolls its submit back, so `BackpressureLog` writes its audit row in a
transaction of its own, at most one per agent per `BackpressureLog.every_s` in a process
(a refusal storm must not become a write storm on the store it protects); the row counts
the refusals it stands for.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from reach.core.ops.paging import (
    Page,
    Position,
    check_limit,
    check_range,
    decode_cursor,
    encode_cursor,
    parse_choices,
)
from reach.errors import Backpressure, InvalidQuery
from reach.hub.security import audit
from reach.hub.storage.models import AlertMuteRow, AuditRow, DeadLetterRow, InstanceEventRow

if TYPE_CHECKING:
    from reach.hub.context import HubContext

__all__ = [
    "ALERTS",
    "KINDS",
    "BackpressureLog",
    "Marks",
    "Page",
    "alerts_after",
    "list_alerts",
    "list_mutes",
    "mute",
    "muted_kinds",
    "parse_kind",
    "parse_kinds",
    "rewound",
    "unmute",
]

log = logging.getLogger("reach.hub.ops.alerts")

ALERTS: Final = "alerts"
_HEALTH: Final = frozenset({"heartbeat_lost", "business_unreachable", "failing"})
_STATUS: Final = frozenset({"offline", "unreachable"})
_BREAKER: Final = {"breaker_opened": "breaker_open", "breaker_closed": "breaker_closed"}
_AUDITED: Final = frozenset({"dependency_loop_suspected", "dependency_loop_calmed", "backpressure"})
DEAD_LETTER: Final = "dead_letter"
KINDS: Final = _HEALTH | _STATUS | frozenset(_BREAKER) | _AUDITED | {DEAD_LETTER}
"""Every alert kind `list_alerts` knows."""

_EVENTS_RANK: Final = 0
_AUDIT_RANK: Final = 1
_DEAD_LETTER_RANK: Final = 2
BACKPRESSURE: Final = "backpressure"


def parse_kinds(values: Iterable[str] | str | None) -> frozenset[str]:
    """The alert kinds named (empty: all); an unknown one is `InvalidQuery` (422)."""
    return parse_choices(values, KINDS, name="kind")


def parse_kind(value: str) -> str:
    """One alert kind; an unknown one is `InvalidQuery` (422 ``invalid-query``)."""
    kind = value.strip().lower()
    if kind not in KINDS:
        listed = ", ".join(sorted(KINDS))
        raise InvalidQuery(f"kind: unknown kind {value[:64]!r}; known: {listed}")
    return kind


# -- mutes -------------------------------------------------------------------------------


def muted_kinds(session: Session) -> frozenset[str]:
    """The kinds an admin muted."""
    return frozenset(session.scalars(select(AlertMuteRow.kind)))


def list_mutes(session: Session) -> list[dict[str, Any]]:
    """The muted kinds, each with who muted it and when, by kind."""
    rows = session.scalars(select(AlertMuteRow).order_by(AlertMuteRow.kind))
    return [{"kind": r.kind, "muted_by": r.muted_by, "muted_at": r.muted_at} for r in rows]


def mute(session: Session, kind: str, *, actor: str, now: float) -> dict[str, Any]:
    """Mute ``kind`` (idempotent: muting a muted kind keeps who muted it first); audited."""
    kind = parse_kind(kind)
    row = session.get(AlertMuteRow, kind)
    if row is None:
        row = AlertMuteRow(kind=kind, muted_by=actor[:160], muted_at=now)
        session.add(row)
    audit.record(
        session, actor=actor, action="mute_alert_kind", outcome=audit.ALLOWED, now=now,
        target=f"alert_kind:{kind}",
    )  # fmt: skip
    return {"kind": row.kind, "muted": True, "muted_by": row.muted_by, "muted_at": row.muted_at}


def unmute(session: Session, kind: str, *, actor: str, now: float) -> dict[str, Any]:
    """Unmute ``kind`` (idempotent); audited. Alerts recorded while it was muted are not
    pushed afterwards: the webhook's marker went past them."""
    kind = parse_kind(kind)
    row = session.get(AlertMuteRow, kind)
    if row is not None:
        session.delete(row)
    audit.record(
        session, actor=actor, action="unmute_alert_kind", outcome=audit.ALLOWED, now=now,
        target=f"alert_kind:{kind}", detail={"was_muted": row is not None},
    )  # fmt: skip
    return {"kind": kind, "muted": False}


# -- the list ----------------------------------------------------------------------------


def list_alerts(
    ctx: HubContext,
    kinds: set[str] | frozenset[str] | None = None,
    since: float | None = None,
    cursor: str | None = None,
    limit: int | None = None,
    *,
    until: float | None = None,
    include_muted: bool = False,
) -> Page:
    """Alerts of ``kinds`` (None or empty: every kind), newest first, at or after
    ``since`` (epoch seconds) and before ``until``. Each item: ``kind``, ``at``,
    ``agent_id``, ``instance_id`` (None when it is not one instance's), ``summary`` (one
    line), ``details`` (the record's own detail), ``source`` (``instance_event`` or
    ``audit``, with ``source_id``) and ``muted``. Muted kinds are left out unless
    ``include_muted``."""
    wanted = parse_kinds(kinds) or KINDS
    check_range(since, until)
    size = check_limit(limit)
    after = decode_cursor(ALERTS, cursor) if cursor else None
    found: list[tuple[Position, dict[str, Any]]] = []
    ie, au = InstanceEventRow, AuditRow
    with ctx.reading() as session:
        muted = muted_kinds(session)
        if not include_muted:
            wanted = wanted - muted
        event_match = _event_match(wanted)
        if event_match is not None:
            stmt = select(ie).where(event_match)
            stmt = _window(stmt, ie.at, ie.id, _EVENTS_RANK, since, until, after)
            for row in session.scalars(stmt.order_by(ie.at.desc(), ie.id.desc()).limit(size + 1)):
                found.append((Position(row.at, _EVENTS_RANK, row.id), _from_event(row)))
        actions = sorted(wanted & _AUDITED)
        if actions:
            rows = select(au).where(au.action.in_(actions))
            rows = _window(rows, au.at, au.id, _AUDIT_RANK, since, until, after)
            for entry in session.scalars(rows.order_by(au.at.desc(), au.id.desc()).limit(size + 1)):
                found.append((Position(entry.at, _AUDIT_RANK, entry.id), _from_audit(entry)))
        if DEAD_LETTER in wanted:
            dl = DeadLetterRow
            letters = _window(
                select(dl), dl.created_at, dl.id, _DEAD_LETTER_RANK, since, until, after
            )
            ordered = letters.order_by(dl.created_at.desc(), dl.id.desc()).limit(size + 1)
            for letter in session.scalars(ordered):
                position = Position(letter.created_at, _DEAD_LETTER_RANK, letter.id)
                found.append((position, _from_dead_letter(letter)))
    found.sort(key=lambda pair: pair[0], reverse=True)
    page = found[:size]
    more = len(found) > size
    items = [{**item, "muted": item["kind"] in muted} for _, item in page]
    return Page(items, encode_cursor(ALERTS, page[-1][0]) if more else None)


# -- the webhook's scan ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Marks:
    """The highest id of each source table already seen by the alert webhook."""

    event_id: int = 0
    audit_id: int = 0
    dead_letter_id: int = 0

    def past(self, item: dict[str, Any]) -> Marks:
        """These marks moved past ``item`` (an alert of `alerts_after`)."""
        field = _MARK_OF[item["source"]]
        return replace(self, **{field: max(getattr(self, field), int(item["source_id"]))})


_MARK_OF: Final = {
    "instance_event": "event_id",
    "audit": "audit_id",
    "dead_letter": "dead_letter_id",
}


def current_marks(session: Session) -> Marks:
    """Marks at the newest row of each table: where a webhook that starts now begins
    (what was recorded before it existed is not sent)."""

    def top(column: InstrumentedAttribute[int]) -> int:
        return int(session.scalar(select(func.max(column))) or 0)

    return Marks(top(InstanceEventRow.id), top(AuditRow.id), top(DeadLetterRow.id))


def rewound(session: Session, marks: Marks, last_scan: float) -> Marks:
    """``marks`` with each table whose ids were reused set again: SQLite gives a new row
    the highest id + 1, so once retention deleted a table's newest rows, new ones may take
    ids the mark already passed. Reused, the table's newest id is below its mark, or the
    row at the mark's own id was recorded after ``last_scan`` (SQLite only, the store that
    reuses ids: the deleted rows were as many as the new ones, or fewer -- an emptied
    table's next row takes id 1 again). Such a mark moves down to the newest row recorded
    before ``last_scan`` (the rows after it are new). A row recorded in the moment between
    the last tick's start and its read was pushed then and is pushed again (at least
    once). One lookup by primary key per table: ticks stay cheap on large tables."""
    top = current_marks(session)
    reuses_ids = session.get_bind().dialect.name == "sqlite"
    tables = (
        ("event_id", InstanceEventRow.id, InstanceEventRow.at),
        ("audit_id", AuditRow.id, AuditRow.at),
        ("dead_letter_id", DeadLetterRow.id, DeadLetterRow.created_at),
    )
    for field, row_id, at in tables:
        mark = getattr(marks, field)
        reused = getattr(top, field) < mark
        if not reused and reuses_ids and mark > 0:
            at_mark = session.scalar(select(at).where(row_id == mark))
            reused = at_mark is not None and at_mark > last_scan
        if reused:
            seen = session.scalar(select(func.max(row_id)).where(at <= last_scan))
            log.warning("alert marker %s went back: ids were reused after a deletion", field)
            marks = replace(marks, **{field: int(seen or 0)})
    return marks


def alerts_after(session: Session, marks: Marks, limit: int) -> list[dict[str, Any]]:
    """Alerts of every kind recorded above ``marks`` (at most ``limit`` of each table),
    oldest first: each table's in id order (so moving its mark past one is exact), the
    three merged by time."""
    ie, au, dl = InstanceEventRow, AuditRow, DeadLetterRow
    event_match = _event_match(KINDS)
    assert event_match is not None
    events = session.scalars(
        select(ie).where(ie.id > marks.event_id, event_match).order_by(ie.id).limit(limit)
    )
    audited = session.scalars(
        select(au)
        .where(au.id > marks.audit_id, au.action.in_(sorted(_AUDITED)))
        .order_by(au.id)
        .limit(limit)
    )
    letters = session.scalars(
        select(dl).where(dl.id > marks.dead_letter_id).order_by(dl.id).limit(limit)
    )
    streams = (
        [_from_event(r) for r in events],
        [_from_audit(r) for r in audited],
        [_from_dead_letter(r) for r in letters],
    )
    return list(heapq.merge(*streams, key=lambda item: float(item["at"])))


def _event_match(wanted: frozenset[str]) -> ColumnElement[bool] | None:
    ie = InstanceEventRow
    clauses: list[ColumnElement[bool]] = []
    if health := sorted(wanted & _HEALTH):
        clauses.append(and_(ie.kind == "alert", ie.detail["alert"].as_string().in_(health)))
    if status := sorted(wanted & _STATUS):
        clauses.append(and_(ie.kind == "status", ie.detail["to"].as_string().in_(status)))
    if breaker := sorted(_BREAKER[k] for k in wanted & frozenset(_BREAKER)):
        clauses.append(ie.kind.in_(breaker))
    return or_(*clauses) if clauses else None


def _window(
    stmt: Any,
    at: InstrumentedAttribute[float],
    row_id: InstrumentedAttribute[int],
    rank: int,
    since: float | None,
    until: float | None,
    after: Position | None,
) -> Any:
    """The time range, and past the cursor in (at, rank, id) descending order."""
    if since is not None:
        stmt = stmt.where(at >= since)
    if until is not None:
        stmt = stmt.where(at < until)
    if after is None:
        return stmt
    if rank < after.rank:  # this table sorts after the cursor's at the same instant
        return stmt.where(at <= after.at)
    if rank > after.rank:
        return stmt.where(at < after.at)
    return stmt.where(at <= after.at, or_(at < after.at, row_id < after.id))


def _short(instance_id: str | None) -> str:
    return (instance_id or "")[:12]


def _from_event(row: InstanceEventRow) -> dict[str, Any]:
    detail = dict(row.detail or {})
    where = f"{row.agent_id}/{_short(row.instance_id)}"
    reason = str(detail.get("reason") or "")
    if row.kind == "alert":
        kind = str(detail.get("alert"))
        headline = {
            "heartbeat_lost": "heartbeats lost while probes still succeed",
            "business_unreachable": "alive but not consuming its tasks",
            "failing": "out of the routing pool after consecutive task failures",
        }.get(kind, kind)
    elif row.kind == "status":
        kind = str(detail.get("to"))
        headline = f"{detail.get('from')} -> {kind}"
    elif row.kind == "breaker_open":
        kind = "breaker_opened"
        if "failures" in detail:
            headline = (
                f"breaker opened: {detail.get('failures')} of {detail.get('total')} answers "
                f"failed within {detail.get('window_s')} s"
            )
        else:
            headline = f"breaker opened: {detail.get('reason') or 'failures'}"
        reason = ""
    else:
        kind = "breaker_closed"
        headline = "breaker closed: the trial request succeeded"
    summary = f"{where}: {headline}" + (f" ({reason})" if reason else "")
    return _item(
        kind, row.at, row.agent_id, row.instance_id, summary, detail, "instance_event", row.id
    )


def _from_audit(row: AuditRow) -> dict[str, Any]:
    detail = dict(row.detail or {})
    agent_id: str | None = None
    if row.action == BACKPRESSURE:
        agent_id = detail.get("agent_id")
        refused = int(detail.get("refused") or 1)
        times = "1 submit" if refused == 1 else f"{refused} submits"
        summary = (
            f"{agent_id}: queue full ({detail.get('depth')} of {detail.get('limit')}), "
            f"{times} refused with 429"
        )
    else:
        counts = detail.get("counts") or {}
        traffic = ", ".join(f"{pair} {n}" for pair, n in sorted(counts.items()))
        verb = "suspected" if row.action == "dependency_loop_suspected" else "calmed"
        summary = (
            f"dependency loop {verb} on {row.target} ({traffic} in "
            f"{detail.get('window_s')} s, threshold {detail.get('threshold')})"
        )
    return _item(row.action, row.at, agent_id, None, summary, detail, "audit", row.id)


def _from_dead_letter(row: DeadLetterRow) -> dict[str, Any]:
    error = dict(row.last_error or {})
    reason = row.reason or str(error.get("kind") or "retries spent")
    replayed = f"; replayed at {row.replayed_at:.0f}" if row.replayed_at is not None else ""
    summary = (
        f"{row.agent_id or 'no agent'}: task {row.task_id} ({row.method}) dead-lettered after "
        f"{row.attempts} attempts: {reason}{replayed}"
    )
    details = {  # never the payload: the dead-letter queue keeps it for a replay
        "task_id": row.task_id,
        "method": row.method,
        "attempts": row.attempts,
        "reason": row.reason,
        "last_error": error,
        "replayed_at": row.replayed_at,
    }
    return _item(
        DEAD_LETTER, row.created_at, row.agent_id, None, summary, details, "dead_letter", row.id
    )


def _item(
    kind: str,
    at: float,
    agent_id: str | None,
    instance_id: str | None,
    summary: str,
    details: dict[str, Any],
    source: str,
    source_id: int,
) -> dict[str, Any]:
    return {
        "kind": kind,
        "at": at,
        "agent_id": agent_id,
        "instance_id": instance_id,
        "summary": summary,
        "details": details,
        "source": source,
        "source_id": source_id,
    }


class BackpressureLog:
    """Records the hub's 429 refusals as ``backpressure`` audit rows (see the module
    docstring): the first refusal of an agent in each ``every_s`` writes one, the next
    row says how many refusals it stands for. Safe to share between request threads."""

    def __init__(self, every_s: float = 10.0, max_agents: int = 4096) -> None:
        self.every_s = every_s
        self.max_agents = max_agents
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._pending: dict[str, int] = {}

    def record(self, ctx: HubContext, refused: Backpressure, actor: str) -> None:
        """Note one refusal; write its audit row unless one was written just now."""
        agent_id = str(refused.extra.get("agent_id") or "")
        now = ctx.clock.now()
        with self._lock:
            count = self._pending.get(agent_id, 0) + 1
            last = self._last.get(agent_id)
            if last is not None and now - last < self.every_s:
                self._pending[agent_id] = count
                return
            if len(self._last) >= self.max_agents:  # bounded: forget the oldest agents
                for stale in sorted(self._last, key=self._last.__getitem__)[: self.max_agents // 2]:
                    self._last.pop(stale, None)
                    self._pending.pop(stale, None)
            self._last[agent_id] = now
            self._pending[agent_id] = 0
        detail = {
            "agent_id": agent_id,
            "depth": refused.extra.get("depth"),
            "limit": refused.extra.get("limit"),
            "retry_after_ms": refused.extra.get("retry_after_ms"),
            "refused": count,
        }
        try:
            ctx.write(
                lambda s: audit.record(
                    s,
                    actor=actor,
                    action=BACKPRESSURE,
                    outcome=audit.REFUSED,
                    now=now,
                    target=f"agent:{agent_id}",
                    detail=detail,
                )
            )
        except Exception:  # the 429 stands even if its record cannot be written
            log.exception("could not audit a backpressure refusal for agent %s", agent_id)
