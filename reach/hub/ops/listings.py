"""Operator listings: tasks and DAG runs, filtered, newest first, one keyset page at a time.

The pages and filters are `reach.core.ops.paging`'s (checked there); this module turns them
into queries on the read sessions (`HubContext.reading`: never SQLite's write lock) and
rows into compact views. A task's item is its ``GET /v1/tasks/{id}`` view without the
``result`` (a page of 500 results of up to 1 MB each is not a listing); a DAG run's is
its ``GET /api/v1/dag-runs/{id}`` view without ``input`` and node data, with its nodes
counted by status.

Who may see what is decided in the query, not after it: ``principal`` None (or an admin
or viewer) lists everything, a caller key what it submitted, an agent key what it
submitted and what was delivered to an agent it speaks for (`reach.core.security.auth`'s
``may_read_task``, as SQL). Rows are then checked against ``may_read_task`` once more, so
a mistake here can only shorten a page, never show another caller's task.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import ColumnElement, and_, false, or_, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from reach.core.ops.paging import (
    DagRunFilter,
    Page,
    Position,
    TaskFilter,
    check_limit,
    decode_cursor,
    encode_cursor,
)
from reach.core.security.auth import Principal, Scope, may_read_task
from reach.hub.storage.models import AgentRow, DagNodeRunRow, DagRunRow, TaskRow

if TYPE_CHECKING:
    from reach.hub.context import HubContext

__all__ = [
    "DAG_RUNS",
    "TASKS",
    "DagRunFilter",
    "Page",
    "TaskFilter",
    "list_dag_runs",
    "list_tasks",
]

TASKS: Final = "tasks"
DAG_RUNS: Final = "dag-runs"

TASK_COLUMNS: Final = (
    "task_id", "status", "method", "target", "agent_id", "instance_id", "attempt_seq",
    "retries", "error", "trace", "session_id", "timeout_ms", "created_at", "updated_at",
    "finished_at", "caller", "priority",
)  # fmt: skip
"""A listed task: `reach.hub.delivery.VIEW_COLUMNS` without ``result``."""


def list_tasks(
    ctx: HubContext,
    filters: TaskFilter,
    cursor: str | None = None,
    limit: int | None = None,
    *,
    principal: Principal | None = None,
) -> Page:
    """Tasks matching ``filters``, newest ``created_at`` first, visible to ``principal``
    (None: all). ``cursor`` is a previous page's ``next_cursor``; `BadCursor` if forged."""
    size = check_limit(limit)
    after = decode_cursor(TASKS, cursor) if cursor else None
    t = TaskRow
    stmt = select(t.id, *(getattr(t, c) for c in TASK_COLUMNS))
    if filters.statuses:
        stmt = stmt.where(t.status.in_(sorted(s.value for s in filters.statuses)))
    for column, value in (
        (t.agent_id, filters.agent_id),
        (t.method, filters.capability),
        (t.caller, filters.caller),
        (t.session_id, filters.session_id),
    ):
        if value is not None:
            stmt = stmt.where(column == value)
    stmt = _bounded(stmt, t.created_at, t.id, filters.since, filters.until, after)
    with ctx.reading() as session:
        owned = _visible(session, principal, t.caller, t.agent_id)
        if owned is not None:
            stmt = stmt.where(owned)
        rows = session.execute(
            stmt.order_by(t.created_at.desc(), t.id.desc()).limit(size + 1)
        ).all()
    more = len(rows) > size
    rows = rows[:size]
    items = [
        {c: getattr(r, c) for c in TASK_COLUMNS}
        for r in rows
        if principal is None or may_read_task(principal, r.caller, r.agent_id)
    ]
    return Page(items, _next(TASKS, rows[-1].created_at, rows[-1].id) if more else None)


def list_dag_runs(
    ctx: HubContext,
    filters: DagRunFilter,
    cursor: str | None = None,
    limit: int | None = None,
    *,
    principal: Principal | None = None,
) -> Page:
    """DAG runs matching ``filters``, newest first, visible to ``principal`` (None: all)."""
    size = check_limit(limit)
    after = decode_cursor(DAG_RUNS, cursor) if cursor else None
    d = DagRunRow
    stmt = select(
        d.id, d.run_id, d.name, d.status, d.reason, d.retries, d.created_at, d.updated_at,
        d.finished_at, d.caller,
    )  # fmt: skip
    if filters.statuses:
        stmt = stmt.where(d.status.in_(sorted(s.value for s in filters.statuses)))
    if filters.name is not None:
        stmt = stmt.where(d.name == filters.name)
    stmt = _bounded(stmt, d.created_at, d.id, filters.since, filters.until, after)
    with ctx.reading() as session:
        owned = _visible(session, principal, d.caller, None)
        if owned is not None:
            stmt = stmt.where(owned)
        rows = session.execute(
            stmt.order_by(d.created_at.desc(), d.id.desc()).limit(size + 1)
        ).all()
        more = len(rows) > size
        rows = rows[:size]
        counts: dict[str, Counter[str]] = {r.run_id: Counter() for r in rows}
        if rows:
            for run_id, status in session.execute(
                select(DagNodeRunRow.run_id, DagNodeRunRow.status).where(
                    DagNodeRunRow.run_id.in_(list(counts))
                )
            ):
                counts[run_id][status] += 1
    items = [
        {
            "run_id": r.run_id,
            "name": r.name,
            "status": r.status,
            "reason": r.reason,
            "retries": r.retries,
            "created_at": r.created_at,
            "updated_at": r.updated_at,
            "finished_at": r.finished_at,
            "caller": r.caller,
            "nodes": dict(sorted(counts[r.run_id].items())),
        }
        for r in rows
        if principal is None or may_read_task(principal, r.caller, None)
    ]
    return Page(items, _next(DAG_RUNS, rows[-1].created_at, rows[-1].id) if more else None)


def _next(kind: str, at: float, row_id: int) -> str:
    return encode_cursor(kind, Position(at, 0, row_id))


def _bounded(
    stmt: Any,
    at: InstrumentedAttribute[float],
    row_id: InstrumentedAttribute[int],
    since: float | None,
    until: float | None,
    after: Position | None,
) -> Any:
    """The time range, and strictly past the cursor's row in (at desc, id desc) order.

    Written as ``at <= :at AND (at < :at OR id < :id)``: the first half is a plain range
    both databases serve from an index on ``at``, the second drops the rows already shown."""
    if since is not None:
        stmt = stmt.where(at >= since)
    if until is not None:
        stmt = stmt.where(at < until)
    if after is not None:
        stmt = stmt.where(
            at <= after.at, or_(at < after.at, and_(at == after.at, row_id < after.id))
        )
    return stmt


def _visible(
    session: Session,
    principal: Principal | None,
    caller: InstrumentedAttribute[str | None],
    agent: InstrumentedAttribute[str | None] | None,
) -> ColumnElement[bool] | None:
    """``may_read_task`` as a WHERE clause for ``principal`` (None: no restriction)."""
    if principal is None or principal.scope in (Scope.ADMIN, Scope.VIEWER):
        return None
    if principal.scope not in (Scope.CALLER, Scope.AGENT):
        return false()
    callers = {principal.identity}
    if principal.key_id is not None:
        callers.add(f"key:{principal.key_id}")
    agents: set[str] = set()
    if principal.scope is Scope.AGENT and principal.agent_pattern:
        # the agents this key speaks for, by its glob: matched here, not in SQL LIKE
        agents = {
            a for a in session.scalars(select(AgentRow.agent_id)) if principal.matches_agent(a)
        }
        if not any(ch in principal.agent_pattern for ch in "*?["):
            agents.add(principal.agent_pattern)  # its one agent, registered or not
        callers |= {f"agent:{a}" for a in agents}
    clauses = [caller.in_(sorted(callers))]
    if agent is not None and agents:
        clauses.append(agent.in_(sorted(agents)))
    return or_(*clauses)
