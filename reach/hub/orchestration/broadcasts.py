"""Broadcast and aggregate: one request to every matching instance, results gathered.

Each target gets its own task pinned to its instance (so it has the whole delivery
contract: fencing, audit trail, dead letters), with a small retry budget. The aggregate
is complete once ``min_results`` succeeded, every target is terminal, or the deadline
passed — a target that is down or slow shows as such and never makes the caller hang.
Late results of stragglers are still recorded on their tasks.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.fleet.routing import RouteFilter, matches
from reach.core.ledger.statuses import TERMINAL, InstanceStatus, TaskStatus
from reach.core.security.trust import is_l3
from reach.errors import NoSuitableAgent, UnknownTask
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.flow import admission
from reach.hub.gates import approvals
from reach.hub.intake.submission import submit
from reach.hub.security import trust
from reach.hub.storage.models import BroadcastRow, TaskRow
from reach.wire.schemas import BroadcastRequest, SubmitRequest

_TAKING_WORK = (InstanceStatus.ONLINE, InstanceStatus.DEGRADED)


def start(
    session: Session,
    req: BroadcastRequest,
    now: float,
    policy: Policy,
    *,
    published_at: float | None = None,
    caller: str | None = None,
    l3_cap: int = trust.DEFAULT_L3_CAP,
    approval: approvals.ApprovalPolicy = approvals.DEFAULT_POLICY,
    limits: admission.Limits = admission.DEFAULT_LIMITS,
) -> BroadcastRow:
    """One pinned task per routable matching instance, all in this transaction.

    ``caller`` (the authenticated identity starting it) owns the broadcast and its tasks.
    L3 instances it may not reach (`reach.hub.security.trust`) are left out; if that leaves none,
    the first refusal is raised.

    ``published_at`` marks the targets' first attempts published at commit (the caller
    publishes right after and un-marks them if the broker refuses).

    Admission as for one task (``limits``): an oversize payload or a target agent whose
    queue is full refuses the whole broadcast (`RequestTooLarge`, `Backpressure`) and
    nothing of it is written -- a fan-out with silent holes would read as fewer matches."""
    flt = RouteFilter(
        tags=tuple(sorted(req.tags)),
        capability=req.capability,
        rules=tuple(sorted(req.rules.items())),
    )
    targets = [
        c
        for c in registry.load_candidates(session, flt, now, policy, method=req.method)
        if matches(c, flt) and c.routable and c.status in _TAKING_WORK
    ]
    if not targets:
        raise NoSuitableAgent(
            f"no routable instance matches {flt.describe()} for a broadcast", method=req.method
        )
    if trust.agent_of(caller) is not None or any(is_l3(c.trust_level) for c in targets):
        screened = trust.screen_candidates(
            session, caller, targets, req.method, req.capability, req.payload, l3_cap
        )
        if not screened.allowed:
            raise next(iter(screened.refused.values()))
        targets = screened.allowed
    broadcast_id = f"b-{uuid.uuid4().hex[:16]}"
    rows = []
    for c in sorted(targets, key=lambda c: c.instance_id):
        task, _ = submit(
            session,
            SubmitRequest(
                task_id=f"{broadcast_id}.{c.instance_id}",
                agent_id=c.agent_id,
                method=req.method,
                payload=req.payload,
                timeout_ms=req.timeout_ms,
            ),
            now,
            pin_instance=c.instance_id,
            max_retry=req.max_retry,
            look_first=False,  # a fresh broadcast id: no task can exist yet
            published_at=published_at,
            caller=caller,
            l3_cap=l3_cap,
            approval=approval,
            limits=limits,
        )
        rows.append(
            {"instance_id": c.instance_id, "agent_id": c.agent_id, "task_id": task["task_id"]}
        )
    row = BroadcastRow(
        broadcast_id=broadcast_id,
        request=req.model_dump(mode="json"),
        targets=rows,
        min_results=min(req.min_results or len(rows), len(rows)),
        created_at=now,
        deadline=now + req.timeout_ms / 1000,
        caller=caller,
    )
    session.add(row)
    session.flush()
    return row


def aggregate(session: Session, broadcast_id: str, now: float) -> dict[str, Any]:
    row = session.scalar(select(BroadcastRow).where(BroadcastRow.broadcast_id == broadcast_id))
    if row is None:
        raise UnknownTask(f"broadcast {broadcast_id!r} does not exist", broadcast_id=broadcast_id)
    ids = [t["task_id"] for t in row.targets]
    tasks = {t.task_id: t for t in session.scalars(select(TaskRow).where(TaskRow.task_id.in_(ids)))}
    results = []
    for target in row.targets:
        task = tasks[target["task_id"]]
        results.append(
            {
                **target,
                "status": task.status,
                "data": task.result,
                "error": task.error,
                "finished_at": task.finished_at,
            }
        )
    succeeded = sum(1 for r in results if r["status"] == TaskStatus.SUCCESS)
    all_done = all(r["status"] in TERMINAL for r in results)
    if succeeded >= row.min_results:
        complete, reason = (
            True,
            f"{succeeded} of {len(results)} succeeded (needed {row.min_results})",
        )
    elif all_done:
        complete, reason = True, f"all targets finished; {succeeded} succeeded"
    elif now >= row.deadline:
        complete, reason = True, f"deadline passed with {succeeded} of {row.min_results} results"
    else:
        complete, reason = False, f"{succeeded} of {row.min_results} results so far"
    return {
        "broadcast_id": broadcast_id,
        "complete": complete,
        "reason": reason,
        "min_results": row.min_results,
        "succeeded": succeeded,
        "deadline": row.deadline,
        "results": results,
    }
