"""The approval gate: park a dangerous task, let a named human decide it, expire the rest.

One service behind every channel (API, CLI, dashboard, webhook links): `park` is called by
`reach.hub.intake.submission.submit` inside the submitting transaction, so the task row, its
``approval_requested`` event and the approval row commit together and *no* outbox row is
written -- nothing is delivered and no worker slot is held until `approve` adds the first
attempt. `reject` and `expire_due` end the task as ``failed`` (with ``approval_rejected``
/ ``approval_expired`` errors the SDK turns into `ApprovalRejected` / `ApprovalExpired`)
and wake long-polls like any terminal task.

Two decisions racing on one approval: each is one conditional UPDATE ``... WHERE status =
'pending'``, and only the one whose UPDATE changed a row goes on; the other gets
`ApprovalDecided` with nothing written. The rules (what needs approval, what is refused)
are pure, in `reach.core.gates.approvals`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import CursorResult, Table, func, insert, select, update
from sqlalchemy.orm import Session

from reach.core.flow.priority import queue_for
from reach.core.gates import approvals as rules
from reach.core.ledger import lifecycle
from reach.core.ledger.lifecycle import TaskEvent
from reach.core.ledger.statuses import ApprovalStatus, TaskStatus
from reach.core.security.auth import HUB, Principal
from reach.errors import (
    ApprovalDecided,
    ApprovalError,
    ApprovalExpired,
    Forbidden,
    PayloadChanged,
    ReasonRequired,
    SelfApproval,
    UnknownApproval,
)
from reach.hub import metrics
from reach.hub.ledger.tasks import (
    Publish,
    attempt_message,
    load_for_update,
    record_event,
    target_key,
    task_view,
)
from reach.hub.ledger.wakeups import mark_finished
from reach.hub.notify import approval_webhook
from reach.hub.storage.models import ApiKeyRow, ApprovalRow, OutboxRow, TaskEventRow, TaskRow

if TYPE_CHECKING:
    from reach.hub.settings import Settings

__all__ = [
    "DEFAULT_POLICY",
    "ApprovalPolicy",
    "approve",
    "cancel",
    "expire_due",
    "get",
    "list_approvals",
    "park",
    "pending_gauges",
    "reject",
    "required",
    "view",
]

log = logging.getLogger(__name__)

MAX_LIST = 500
MAX_REASON = 2000
MAX_NAME = 128


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """The ``approval`` settings the gate needs (``reach.hub.settings.ApprovalSettings``)."""

    timeout_s: float = 3600.0
    patterns: tuple[str, ...] = ()
    forbid_self: bool = True
    # designated approvers: (capability pattern, the key names who alone may decide)
    approvers: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> ApprovalPolicy:
        a = settings.approval
        approvers = tuple((p, tuple(names)) for p, names in sorted(a.approvers.items()))
        return cls(a.timeout_s, tuple(a.capabilities), a.forbid_self_approval, approvers)


DEFAULT_POLICY = ApprovalPolicy()


def required(
    decls: Iterable[Mapping[str, Any] | None],
    method: str,
    capability: str | None,
    policy: ApprovalPolicy,
) -> bool:
    """Whether a submission needs a human decision, given the capability declarations of
    the agents it may reach (None for an agent declaring nothing).

    Conservative on purpose: a task routed by tags or capability needs approval when ANY
    candidate agent's declaration of that method needs it, since which instance takes it
    is decided only at delivery -- a route must not dodge the gate by landing elsewhere.
    """
    found = list(decls) or [None]
    return any(rules.needs_approval(d, method, capability, policy.patterns) for d in found)


def park(
    session: Session,
    values: dict[str, Any],
    now: float,
    policy: ApprovalPolicy,
    *,
    capability: str | None = None,
) -> str:
    """Write the task (``values``: the row submit built) parked in ``awaiting_approval``,
    its ``approval_requested`` event (actor: the caller) and the approval row; no outbox
    row. Returns the approval id. Runs in the submitting transaction."""
    task_id = str(values["task_id"])
    approval_id = f"ap-{uuid.uuid4().hex}"
    values = {
        **values,
        "status": TaskStatus.AWAITING_APPROVAL,
        "next_attempt_at": None,
        "last_published_at": None,
    }
    digest = rules.payload_hash(values["payload"])
    expires_at = now + policy.timeout_s
    conn = session.connection()
    conn.execute(_ADD_TASK, values)
    conn.execute(
        _ADD_APPROVAL,
        {
            "approval_id": approval_id,
            "task_id": task_id,
            "capability": capability or values["method"],
            "agent_id": values.get("agent_id"),
            "method": values["method"],
            "caller": values.get("caller"),
            "payload_hash": digest,
            "requested_at": now,
            "expires_at": expires_at,
            "status": ApprovalStatus.PENDING,
        },
    )
    conn.execute(
        _ADD_EVENT,
        {
            "task_id": task_id,
            "agent_id": values.get("agent_id"),
            "instance_id": None,
            "attempt_seq": values.get("attempt_seq", 1),
            "kind": "approval_requested",
            "detail": {
                "approval_id": approval_id,
                "target": values.get("target"),
                "capability": capability or values["method"],
                "payload_hash": digest,
                "expires_at": expires_at,
            },
            "at": now,
            "actor": values.get("caller"),
        },
    )
    metrics.APPROVALS_TOTAL.labels("requested").inc()
    approval_webhook.schedule(session, approval_id)  # sent after commit, if configured
    return approval_id


def get(session: Session, approval_id: str) -> ApprovalRow:
    row = session.scalar(select(ApprovalRow).where(ApprovalRow.approval_id == approval_id))
    if row is None:
        raise UnknownApproval(f"approval {approval_id!r} does not exist", approval_id=approval_id)
    return row


def for_task(session: Session, task_id: str) -> ApprovalRow | None:
    """The approval a task waits on (or waited on), if it was ever parked."""
    return session.scalar(select(ApprovalRow).where(ApprovalRow.task_id == task_id))


def list_approvals(
    session: Session, status: ApprovalStatus | None = ApprovalStatus.PENDING, limit: int = 100
) -> list[ApprovalRow]:
    """Newest first; ``status`` None lists every status."""
    query = select(ApprovalRow).order_by(ApprovalRow.id.desc()).limit(max(1, min(limit, MAX_LIST)))
    if status is not None:
        query = query.where(ApprovalRow.status == status)
    return list(session.scalars(query))


def pending_gauges(session: Session, now: float) -> tuple[int, float]:
    """How many approvals are pending, and how long the oldest has waited (0 if none):
    the gauges read at scrape time."""
    count, oldest = session.execute(
        select(func.count(), func.min(ApprovalRow.requested_at)).where(
            ApprovalRow.status == ApprovalStatus.PENDING
        )
    ).one()
    return int(count or 0), 0.0 if oldest is None else max(0.0, now - float(oldest))


def view(row: ApprovalRow) -> dict[str, Any]:
    return {
        "approval_id": row.approval_id,
        "task_id": row.task_id,
        "capability": row.capability,
        "agent_id": row.agent_id,
        "method": row.method,
        "caller": row.caller,
        "payload_hash": row.payload_hash,
        "requested_at": row.requested_at,
        "expires_at": row.expires_at,
        "status": row.status,
        "decided_by": row.decided_by,
        "decided_name": row.decided_name,
        "decided_at": row.decided_at,
        "reason": row.reason,
    }


def approve(
    session: Session,
    approval_id: str,
    decider: Principal,
    name: str | None,
    now: float,
    policy: ApprovalPolicy = DEFAULT_POLICY,
) -> Publish:
    """Approve: the task goes ``pending`` with its first attempt's outbox row, exactly as
    submit would have queued it. The caller publishes the returned attempt after commit
    (``HubContext.publish_attempts``); the relay does if that fails."""
    row, task = _decide(session, approval_id, decider, name, None, now, policy, "approve")
    task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.APPROVE)
    task.next_attempt_at = now
    task.updated_at = now
    session.add(
        OutboxRow(
            task_id=task.task_id,
            agent_id=_outbox_agent(task),
            attempt_seq=task.attempt_seq,
            message=attempt_message(task.task_id, task.attempt_seq, task.priority),
            created_at=now,
            available_at=now,
        )
    )
    record_event(session, task, "approval_granted", now, _decision(row), actor=decider.identity)
    metrics.APPROVALS_TOTAL.labels("approved").inc()
    return Publish(task.task_id, task.attempt_seq, 0.0, queue_for(task.priority))


def reject(
    session: Session,
    approval_id: str,
    decider: Principal,
    name: str | None,
    reason: str | None,
    now: float,
    policy: ApprovalPolicy = DEFAULT_POLICY,
) -> dict[str, Any]:
    """Reject (a reason is required): the task fails with ``approval_rejected`` saying who
    and why; the agent is never called. Returns the approval's view."""
    row, task = _decide(session, approval_id, decider, name, reason, now, policy, "reject")
    error = {
        "kind": "approval_rejected",
        "message": f"approval {approval_id} was rejected by {row.decided_name or row.decided_by}"
        f": {row.reason}",
        "approval_id": approval_id,
        "decided_by": row.decided_by,
        "decided_name": row.decided_name,
        "reason": row.reason,
    }
    _fail(session, task, now, error, "approval_rejected", _decision(row), decider.identity)
    metrics.APPROVALS_TOTAL.labels("rejected").inc()
    return view(row)


def expire_due(session: Session, now: float, limit: int = 100) -> int:
    """Expire up to ``limit`` pending approvals past ``expires_at`` (the beat's sweep; it
    reads the store, so expiry holds across restarts): each task fails with
    ``approval_expired``, actor ``hub``. Returns how many expired."""
    due = list(
        session.scalars(
            select(ApprovalRow.approval_id)
            .where(ApprovalRow.status == ApprovalStatus.PENDING, ApprovalRow.expires_at <= now)
            .order_by(ApprovalRow.expires_at)
            .limit(limit)
        )
    )
    expired = 0
    for approval_id in due:
        if not _claim(session, approval_id, ApprovalStatus.EXPIRED, now, expired_only=True):
            continue  # decided between the read and now
        row = get(session, approval_id)
        task = load_for_update(session, row.task_id)
        if task is None or task.status != TaskStatus.AWAITING_APPROVAL:
            continue
        error = {
            "kind": "approval_expired",
            "message": f"approval {approval_id} expired: nobody decided within its time",
            "approval_id": approval_id,
            "expires_at": row.expires_at,
        }
        detail = {"approval_id": approval_id, "expires_at": row.expires_at}
        _fail(session, task, now, error, "approval_expired", detail, HUB)
        metrics.APPROVALS_TOTAL.labels("expired").inc()
        expired += 1
    return expired


def cancel(session: Session, task_id: str, now: float, actor: str | None = None) -> bool:
    """Mark a cancelled task's pending approval ``cancelled`` (for a cancel path that
    moves the task itself); False when it had none pending."""
    result = session.execute(
        update(ApprovalRow)
        .where(ApprovalRow.task_id == task_id, ApprovalRow.status == ApprovalStatus.PENDING)
        .values(status=ApprovalStatus.CANCELLED, decided_at=now, decided_by=actor)
    )
    if cast(CursorResult[Any], result).rowcount != 1:
        return False
    metrics.APPROVALS_TOTAL.labels("cancelled").inc()
    return True


# -- internals ----------------------------------------------------------------------------


_ADD_TASK = insert(cast(Table, TaskRow.__table__))
_ADD_EVENT = insert(cast(Table, TaskEventRow.__table__))
_ADD_APPROVAL = insert(cast(Table, ApprovalRow.__table__))

_REFUSALS: dict[str, type[ApprovalError]] = {
    rules.DECIDED: ApprovalDecided,
    rules.EXPIRED: ApprovalExpired,
    rules.SELF_APPROVAL: SelfApproval,
    rules.NO_REASON: ReasonRequired,
}


def _decide(
    session: Session,
    approval_id: str,
    decider: Principal,
    name: str | None,
    reason: str | None,
    now: float,
    policy: ApprovalPolicy,
    verb: str,
) -> tuple[ApprovalRow, TaskRow]:
    """Check, then win the decision with one conditional UPDATE; raise (nothing written)
    if it is refused or another decision won. Returns the decided row and the locked task.

    The decider is its key: ``decided_by`` its identity and ``decided_name`` its name
    (the key's holder, as the admin named it), never a name the request sends (``name``
    is ignored). Where ``approval.approvers`` designates holders for the capability, only
    their keys may decide (`Forbidden` otherwise); and no holder decides a request made
    with another of their own keys."""
    del name  # free text names nobody: the key's own name is recorded
    row = get(session, approval_id)
    holder = None if decider.anonymous else (decider.name or None)
    refusal = rules.decision_refusal(
        row.status,
        row.expires_at,
        now,
        decider.identity,
        row.caller,
        policy.forbid_self,
        reason,
        verb,
        decider_holder=holder,
        requester_holder=_holder_of(session, row.caller),
    )
    if refusal is not None:
        raise _refused(refusal, row, verb)
    allowed = rules.designated(policy.approvers, row.capability)
    if allowed is not None and not decider.anonymous and holder not in allowed:
        raise Forbidden(
            f"{decider.identity} ({holder or 'unnamed key'}) is not a designated approver "
            f"of {row.capability!r} (approval.approvers); nothing was decided",
            approval_id=approval_id,
            capability=row.capability,
        )
    task = session.scalar(select(TaskRow).where(TaskRow.task_id == row.task_id))
    if task is None or rules.payload_hash(task.payload) != row.payload_hash:
        raise PayloadChanged(
            f"task {row.task_id!r} no longer carries the payload put up for approval "
            f"{approval_id}; nothing was decided",
            approval_id=approval_id,
            task_id=row.task_id,
        )
    target = ApprovalStatus.APPROVED if verb == "approve" else ApprovalStatus.REJECTED
    won = _claim(
        session,
        approval_id,
        target,
        now,
        decided_by=decider.identity,
        decided_name=(holder or "").strip()[:MAX_NAME] or None,
        reason=(reason or "").strip()[:MAX_REASON] or None,
    )
    if not won:
        session.expire(row)
        current = get(session, approval_id)
        raise _refused(rules.DECIDED, current, verb)
    session.refresh(row)
    locked = load_for_update(session, row.task_id)
    if locked is None:  # pragma: no cover - approvals outlive no task (retention keeps both)
        raise PayloadChanged(f"task {row.task_id!r} is gone", approval_id=approval_id)
    return row, locked


def _holder_of(session: Session, identity: str | None) -> str | None:
    """The holder (the key's name) of a ``key:<id>`` identity, or None."""
    if identity is None or not identity.startswith("key:"):
        return None
    name = session.scalar(select(ApiKeyRow.name).where(ApiKeyRow.key_id == identity[len("key:") :]))
    return name or None


def _claim(
    session: Session,
    approval_id: str,
    status: ApprovalStatus,
    now: float,
    *,
    expired_only: bool = False,
    decided_by: str | None = None,
    decided_name: str | None = None,
    reason: str | None = None,
) -> bool:
    """The race's referee: move a still-pending approval to ``status``; True if this call
    did it (a concurrent decision, or expiry, makes the WHERE miss)."""
    window = ApprovalRow.expires_at <= now if expired_only else ApprovalRow.expires_at > now
    result = session.execute(
        update(ApprovalRow)
        .where(
            ApprovalRow.approval_id == approval_id,
            ApprovalRow.status == ApprovalStatus.PENDING,
            window,
        )
        .values(
            status=status,
            decided_at=now,
            decided_by=decided_by or (HUB if expired_only else None),
            decided_name=decided_name,
            reason=reason,
        )
        .execution_options(synchronize_session=False)
    )
    return cast(CursorResult[Any], result).rowcount == 1


def _refused(refusal: str, row: ApprovalRow, verb: str) -> ApprovalError:
    extra = {"approval_id": row.approval_id, "task_id": row.task_id}
    if refusal == rules.DECIDED:
        who = f" by {row.decided_name or row.decided_by}" if row.decided_by else ""
        return ApprovalDecided(
            f"approval {row.approval_id} was already {row.status}{who}; it cannot be {verb}d",
            approval_status=row.status,
            decided_by=row.decided_by,
            **extra,
        )
    if refusal == rules.EXPIRED:
        return ApprovalExpired(
            f"approval {row.approval_id} expired at {row.expires_at:.0f}; its task failed "
            "and nobody may decide it",
            expires_at=row.expires_at,
            **extra,
        )
    if refusal == rules.SELF_APPROVAL:
        return SelfApproval(
            f"{row.caller} requested approval {row.approval_id} and may not decide it "
            "(approval.forbid_self_approval)",
            **extra,
        )
    return ReasonRequired(f"rejecting approval {row.approval_id} needs a reason", **extra)


def _decision(row: ApprovalRow) -> dict[str, Any]:
    return {
        "approval_id": row.approval_id,
        "decided_by": row.decided_by,
        "decided_name": row.decided_name,
        **({"reason": row.reason} if row.reason else {}),
    }


def _fail(
    session: Session,
    task: TaskRow,
    now: float,
    error: dict[str, Any],
    kind: str,
    detail: dict[str, Any],
    actor: str,
) -> None:
    """End a parked task as failed (REJECT) and wake whoever waits on it, as finish does."""
    task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.REJECT)
    task.error = error
    task.finished_at = now
    task.updated_at = now
    record_event(session, task, kind, now, detail, actor=actor)
    record_event(session, task, "terminal_failure", now, {"error": error}, actor=actor)
    mark_finished(session, task.task_id, task_view(task))
    metrics.TASKS_TOTAL.labels(TaskStatus.FAILED).inc()


def _outbox_agent(task: TaskRow) -> str:
    return target_key(task.target or {})
