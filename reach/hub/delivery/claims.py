"""An attempt's dispatch lease: claimed in one conditional UPDATE, renewed while its
exchange lasts, fenced by its token.

* `claim` moves a task from ``pending`` to ``dispatching`` only for the message's own
  ``attempt_seq`` and only if no live lease exists, so a duplicate broker message (Redis
  visibility timeout, relay republish) finds nothing to do while the first copy runs.
* The lease covers the exchange up to ``DeliveryPolicy.lease_s``; a longer exchange has
  its lease renewed by the process that holds it (`renew`, every third of ``lease_s``,
  one statement for all of them). A process that died renews nothing: its attempts'
  leases lapse and the outbox relay's net delivers them again.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, case, func, update
from sqlalchemy.orm import Session

from reach.core.flow.priority import ONLINE
from reach.core.ledger import lifecycle
from reach.core.ledger.lifecycle import TaskEvent
from reach.core.ledger.statuses import TaskStatus
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.ledger.tasks import TASKS as _T
from reach.hub.ledger.tasks import status_in


@dataclass(frozen=True, slots=True)
class Claimed:
    """The columns of a claimed task that routing and the agent's request need."""

    task_id: str
    attempt_seq: int
    lease_token: str
    target: dict[str, Any]
    method: str
    payload: Any
    idempotency_key: str | None
    trace: dict[str, Any] | None
    session_id: str | None
    timeout_ms: int
    instance_id: str | None
    retries: int
    caller: str | None = None  # who submitted it (``tasks.caller``): the token's ``sub``
    priority: str = ONLINE  # online | background (``reach.core.flow.priority``)
    payload_ref: str | None = None  # the blob carrying a large payload (``reach.hub.blobs``)


_SECONDS = _T.c.timeout_ms / 1000.0
_CLAIM = (
    update(_T)
    .where(
        _T.c.task_id == bindparam("b_task_id"),
        _T.c.attempt_seq == bindparam("b_seq"),
        status_in(TaskEvent.CLAIM)
        | (
            status_in(TaskEvent.RECLAIM)
            & (func.coalesce(_T.c.lease_until, 0) <= bindparam("b_now"))
        ),
    )
    .values(
        # CLAIM and RECLAIM lead to the same status
        status=lifecycle.target_of(TaskEvent.CLAIM),
        lease_token=bindparam("b_token"),
        lease_until=bindparam("b_lease_base")
        + case(
            (_SECONDS >= bindparam("b_read"), bindparam("b_read")),
            (_SECONDS <= 0.05, 0.05),
            else_=_SECONDS,
        ),
        updated_at=bindparam("b_now"),
        redeliveries=_T.c.redeliveries + case((status_in(TaskEvent.RECLAIM), 1), else_=0),
    )
    .returning(
        _T.c.target,
        _T.c.method,
        _T.c.payload,
        _T.c.idempotency_key,
        _T.c.trace,
        _T.c.session_id,
        _T.c.timeout_ms,
        _T.c.instance_id,
        _T.c.retries,
        _T.c.caller,
        _T.c.priority,
        _T.c.payload_ref,
    )
)
ASSIGN = (
    update(_T)
    .where(_T.c.task_id == bindparam("b_task_id"))
    .values(
        instance_id=bindparam("b_instance"),
        agent_id=bindparam("b_agent"),
        deadline=bindparam("b_deadline"),
    )
)
_RENEW = (
    update(_T)
    .where(
        _T.c.task_id.in_(bindparam("b_ids", expanding=True)),
        _T.c.lease_token.in_(bindparam("b_tokens", expanding=True)),
        _T.c.status == TaskStatus.DISPATCHING,
    )
    .values(lease_until=bindparam("b_until"))
)


def claim(
    session: Session, task_id: str, attempt_seq: int, now: float, dpolicy: DeliveryPolicy
) -> Claimed | None:
    """Take the attempt's dispatch lease in one conditional UPDATE.

    Only this ``attempt_seq``, only from ``pending`` or from ``dispatching`` whose lease
    lapsed (the holder died: counted as a redelivery); the lease lasts connect + the
    exchange (at most ``lease_s``, renewed beyond) + a margin: ``DeliveryPolicy.lease_for``.
    """
    token = uuid.uuid4().hex
    row = (
        session.connection()
        .execute(
            _CLAIM,
            {
                "b_task_id": task_id,
                "b_seq": attempt_seq,
                "b_now": now,
                "b_token": token,
                "b_lease_base": now + dpolicy.connect_timeout + dpolicy.lease_margin,
                "b_read": dpolicy.first_lease_s(),
            },
        )
        .first()
    )
    if row is None:
        return None  # stale or duplicate message, terminal, or another copy holds the lease
    return Claimed(task_id, attempt_seq, token, *row)


def renew(session: Session, leases: Sequence[tuple[str, str]], until: float) -> int:
    """Extend the leases ``(task_id, lease_token)`` still held to ``until``; how many
    were. A lease that moved on (answered, fenced out, lapsed and reclaimed) is left
    alone: its token no longer matches."""
    if not leases:
        return 0
    ids = sorted({task_id for task_id, _ in leases})
    tokens = sorted({token for _, token in leases})
    result = session.connection().execute(
        _RENEW, {"b_ids": ids, "b_tokens": tokens, "b_until": until}
    )
    return int(getattr(result, "rowcount", 0) or 0)
