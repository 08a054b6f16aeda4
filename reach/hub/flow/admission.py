"""Admission at submit: the payload cap and the bounded per-agent queue, in the store.

The decisions are `reach.core.flow.admission`'s; this module counts. `admit` runs inside the
submit transaction, after `reach.hub.intake.submission` knows the eligible agents and before
anything of the task is written, so a refusal leaves nothing behind.

The count is exact across API replicas for a task naming its agent: PostgreSQL takes a
transaction-scoped advisory lock on the agent before counting (`pg_advisory_xact_lock`,
released at commit, after the task row is in), SQLite's write transactions are
serialised already (``BEGIN IMMEDIATE``, `reach.hub.storage.engine`). It is one indexed
count of plain rows (``ix_tasks_agent_live``, which holds only live task versions, so a
finished task adds nothing to walk); the completion rate behind a refusal's
``retry_after_ms`` is read only when refusing.

A task routed by tags or capability is assigned its agent at delivery, so until then it
counts toward no agent's queue: a route is refused when every eligible agent is full by
what was delivered to it, without locks (it cannot be exact before the choice is made).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import ColumnClause, Table, bindparam, func, literal_column, select
from sqlalchemy.orm import Session

from reach.core.flow import admission as decide
from reach.core.ledger.statuses import TERMINAL
from reach.core.security.trust import payload_size
from reach.errors import Backpressure, RequestTooLarge, UnknownAgent
from reach.hub import metrics
from reach.hub.security import audit
from reach.hub.settings import Settings
from reach.hub.storage.engine import advisory_xact_lock
from reach.hub.storage.models import LIVE_STATUSES, AgentRow, TaskRow

ENVELOPE_BYTES = 65_536
"""Room in a request body beyond its payload (the task's other fields, a trace, escaping):
the effective body limit (`body_limit`) never hides the payload cap behind a bare 413."""

_LOCK_SPACE = 0x71756575  # "queu": the first key of the agent-queue advisory locks
_DONE = sorted(s.value for s in TERMINAL)


@dataclass(frozen=True, slots=True)
class Limits:
    """The router's admission settings, passed to `reach.hub.intake.submission.submit`."""

    max_queue: int = 1000
    max_payload_bytes: int = 1_048_576

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        return cls(settings.router.max_queue, settings.router.max_payload_bytes)


DEFAULT_LIMITS = Limits()


def body_limit(settings: Settings) -> int:
    """The request-body limit the API enforces: ``server.max_body_bytes``, raised to the
    payload cap plus `ENVELOPE_BYTES` when below it, so an oversize payload meets the
    payload cap's 413 (which names size and limit) rather than a body limit's."""
    return max(settings.server.max_body_bytes, settings.router.max_payload_bytes + ENVELOPE_BYTES)


def check_payload(payload: Any, cap: int) -> None:
    """Raise `RequestTooLarge` for a payload over ``cap`` bytes of compact JSON."""
    size = payload_size(payload)
    refusal = decide.payload_refusal(size, cap)
    if refusal is not None:
        metrics.ADMISSION_REFUSALS_TOTAL.labels(reason="payload_too_large").inc()
        raise RequestTooLarge(refusal, size=size, limit=cap)


def admit(
    session: Session,
    agent_ids: Sequence[str],
    limits: Limits,
    now: float,
    *,
    named: bool,
    task_id: str | None = None,
) -> None:
    """Raise `Backpressure` when every agent of ``agent_ids`` is full; else return.

    ``named``: the task names its agent (count under the agent's lock); a route is
    checked without locks. ``task_id``: a caller's own id, which may be a resubmit of an
    accepted task: a full queue never refuses one of those (the submit finds it)."""
    if not agent_ids:
        return
    if named:
        for agent_id in sorted(set(agent_ids)):  # a stable order: no lock cycles
            advisory_xact_lock(session, _LOCK_SPACE, _lock_key(agent_id))
    queues = _queues(session, agent_ids, limits.max_queue)
    if decide.verdict(queues) is None:
        return
    if task_id is not None and session.scalar(_exists(task_id)) is not None:
        return  # a resubmit: the insert meets the unique index and the caller looks first
    rates = _completed(session, [q.agent_id for q in queues], now - decide.RATE_WINDOW_S)
    full = decide.verdict([_with_rate(q, rates.get(q.agent_id, 0)) for q in queues])
    assert full is not None  # the same queues, with rates: still all full
    wait_ms = decide.retry_after_ms(full)
    metrics.ADMISSION_REFUSALS_TOTAL.labels(reason="backpressure").inc()
    others = "" if len(queues) == 1 else f" (and every other of the {len(queues)} eligible)"
    raise Backpressure(
        f"agent {full.agent_id!r}{others} holds {full.depth} pending and in-flight tasks, "
        f"its limit is {full.limit}; retry in {wait_ms} ms",
        depth=full.depth,
        limit=full.limit,
        retry_after_ms=wait_ms,
        agent_id=full.agent_id,
    )


def queue_view(session: Session, agent_id: str, default: int) -> dict[str, Any]:
    """The agent's effective limit, where it comes from, and its current depth."""
    row = session.execute(_QUEUES.where(AgentRow.agent_id == agent_id)).first()
    if row is None:
        raise UnknownAgent(f"agent {agent_id!r} is not registered", agent_id=agent_id)
    source = (
        "override"
        if row.max_queue_override is not None
        else "declared"
        if row.max_queue is not None
        else "router.max_queue"
    )
    return {
        "limit": decide.effective_limit(row.max_queue_override, row.max_queue, default),
        "source": source,
        "depth": int(row.depth),
        "declared": row.max_queue,
        "override": row.max_queue_override,
    }


def set_override(
    session: Session, agent_id: str, value: int | None, *, actor: str, now: float, default: int
) -> dict[str, Any]:
    """Set (or with None, clear) the admin's bound on the agent's queue (audited)."""
    agent = session.get(AgentRow, agent_id, with_for_update=True)
    if agent is None:
        raise UnknownAgent(f"agent {agent_id!r} is not registered", agent_id=agent_id)
    previous = agent.max_queue_override
    agent.max_queue_override = value
    agent.updated_at = now
    audit.record(
        session,
        actor=actor,
        action="agent.max_queue",
        outcome=audit.ALLOWED,
        now=now,
        target=f"agent:{agent_id}",
        detail={"old": previous, "new": value},
    )
    session.flush()
    return {"agent_id": agent_id, "previous": previous, **queue_view(session, agent_id, default)}


# the statuses as literals, as ``ix_tasks_agent_live``'s predicate spells them: bound
# parameters would keep PostgreSQL's generic plan (psycopg prepares a statement on its
# fifth run) from proving the partial index applies
_LIVE_SQL: list[ColumnClause[str]] = [literal_column(f"'{s}'") for s in LIVE_STATUSES]
_DEPTH = (
    select(func.count())
    .where(TaskRow.agent_id == AgentRow.agent_id, TaskRow.status.in_(_LIVE_SQL))
    .correlate(AgentRow)
    .scalar_subquery()
)
_QUEUES = select(
    AgentRow.agent_id, AgentRow.max_queue, AgentRow.max_queue_override, _DEPTH.label("depth")
)
# the hot path's form of it (every submit): built once, as Core (no ORM compile step)
_AGENTS_T, _TASKS_T = cast(Table, AgentRow.__table__), cast(Table, TaskRow.__table__)
_QUEUES_OF = select(
    _AGENTS_T.c.agent_id,
    _AGENTS_T.c.max_queue,
    _AGENTS_T.c.max_queue_override,
    select(func.count())
    .where(_TASKS_T.c.agent_id == _AGENTS_T.c.agent_id, _TASKS_T.c.status.in_(_LIVE_SQL))
    .correlate(_AGENTS_T)
    .scalar_subquery()
    .label("depth"),
).where(_AGENTS_T.c.agent_id.in_(bindparam("b_agents", expanding=True)))


def _queues(session: Session, agent_ids: Sequence[str], default: int) -> list[decide.Queue]:
    rows = session.connection().execute(_QUEUES_OF, {"b_agents": sorted(set(agent_ids))})
    return [
        decide.Queue(
            agent_id=r.agent_id,
            depth=int(r.depth),
            limit=decide.effective_limit(r.max_queue_override, r.max_queue, default),
        )
        for r in rows
    ]


def _completed(session: Session, agent_ids: list[str], since: float) -> dict[str, int]:
    rows = session.execute(
        select(TaskRow.agent_id, func.count())
        .where(
            TaskRow.agent_id.in_(agent_ids),
            TaskRow.status.in_(_DONE),
            TaskRow.finished_at >= since,
        )
        .group_by(TaskRow.agent_id)
    )
    return {str(agent_id): int(n) for agent_id, n in rows}


def _with_rate(queue: decide.Queue, completed: int) -> decide.Queue:
    return decide.Queue(queue.agent_id, queue.depth, queue.limit, completed)


def _exists(task_id: str) -> Any:
    return select(TaskRow.task_id).where(TaskRow.task_id == task_id)


def _lock_key(agent_id: str) -> int:
    """A stable signed 32-bit key per agent (Python's ``hash`` changes per process)."""
    digest = hashlib.blake2b(agent_id.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big", signed=True)
