"""DAG runs in the store: the run, each node's state, and the step that advances a node.

A node never raises into the canvas: whatever happens (skipped by its condition, refused
at submit, failed, timed out, its task gone, the store refusing the step) becomes a
``NodeResult`` stored here, and the next level reads its ancestors' results from here — not
from chord arguments, which only carry the previous level. A run whose chord died anyway
(its messages lost with a worker or a broker) is resumed or finished by `sweep`.

A node whose task is parked for a human decision (``awaiting_approval``) waits without a
clock: its timeout counts from the decision, not from the submit, and the sweep neither
resumes nor abandons a run while one of its tasks is parked (the approval's own expiry,
enforced by the beat, bounds the wait) and leaves the time spent waiting out of the run's
age. Rejected or expired, the task is ``failed``: the node fails and the run follows its
failure branch like for any failed node.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from reach.core.ledger.statuses import TERMINAL, ApprovalStatus, DagRunStatus, TaskStatus
from reach.core.orchestration import dags
from reach.core.orchestration.dags import DagSpec, NodeResult, NodeStatus
from reach.core.orchestration.dags.sweep import RunClock, SweepAction, sweep_action
from reach.errors import DagError, ReachError, UnknownTask
from reach.hub import tracing
from reach.hub.flow import admission
from reach.hub.gates import approvals
from reach.hub.intake.submission import submit
from reach.hub.storage.models import ApprovalRow, DagNodeRunRow, DagRunRow, TaskRow
from reach.wire.schemas import SubmitRequest

log = logging.getLogger("reach.hub.orchestration.dagruns")

FINISHED = {s.value for s in NodeStatus}
# a node row before its result: not yet submitted, then waiting for its reach task
NODE_PENDING, NODE_RUNNING = "pending", "running"
MAX_RUN_RETRIES = 3  # node re-attempts per run, in total: a flaky branch cannot loop forever
SWEEP_BATCH = 200  # running runs looked at per sweep, oldest first


@dataclass(frozen=True, slots=True)
class Step:
    """What one pass of a node task did: finished (with a result) or still waiting."""

    result: NodeResult | None
    submitted_task: str | None = None
    parked: bool = False  # its task waits for a human: poll slowly, no timeout runs


def start_run(
    session: Session,
    spec: DagSpec,
    run_input: dict[str, Any],
    now: float,
    caller: str | None = None,
    traceparent: str | None = None,
) -> str:
    """Record a new run; ``caller`` (the identity starting it) owns it and its tasks.
    The run's span (a child of the caller's ``traceparent``) is the parent of its nodes'
    tasks: one trace per run."""
    run_id = f"dag-{uuid.uuid4().hex[:16]}"
    attributes = {"reach.dag_run_id": run_id, "reach.dag": spec.name}
    traced = tracing.task_context(traceparent, attributes, f"reach.dag_run {spec.name}")
    session.add(
        DagRunRow(
            run_id=run_id,
            name=spec.name,
            spec=spec.model_dump(mode="json"),
            input=run_input,
            status=DagRunStatus.RUNNING,
            reason="",
            created_at=now,
            updated_at=now,
            caller=caller,
            traceparent=traced,
        )
    )
    for node in spec.nodes:
        session.add(DagNodeRunRow(run_id=run_id, node_id=node.id, status=NODE_PENDING, reason=""))
    session.flush()
    return run_id


def load(session: Session, run_id: str) -> tuple[DagRunRow, dict[str, DagNodeRunRow]]:
    run = session.scalar(select(DagRunRow).where(DagRunRow.run_id == run_id))
    if run is None:
        raise UnknownTask(f"DAG run {run_id!r} does not exist", run_id=run_id)
    nodes = session.scalars(select(DagNodeRunRow).where(DagNodeRunRow.run_id == run_id)).all()
    return run, {n.node_id: n for n in nodes}


def results_of(nodes: dict[str, DagNodeRunRow]) -> dict[str, NodeResult]:
    return {
        node_id: NodeResult(
            status=NodeStatus(row.status), data=row.data, error=row.error, reason=row.reason
        )
        for node_id, row in nodes.items()
        if row.status in FINISHED
    }


def advance_node(
    session: Session,
    run_id: str,
    node_id: str,
    now: float,
    approval: approvals.ApprovalPolicy = approvals.DEFAULT_POLICY,
    limits: admission.Limits = admission.DEFAULT_LIMITS,
) -> Step:
    """Decide, submit, or collect one node; idempotent (a duplicate task finds it done).

    The node's row is locked for the step, so duplicate copies of a node task (and the
    sweep) take turns on it."""
    run, nodes = load(session, run_id)
    row = _lock_node(session, run_id, node_id)
    nodes[node_id] = row
    if row.status in FINISHED:
        return Step(results_of({node_id: row})[node_id])
    if run.status != DagRunStatus.RUNNING:  # the sweep settled the run meanwhile
        return Step(
            _finish(
                row,
                NodeResult(status=NodeStatus.SKIPPED, reason=f"run already {run.status}"),
                now,
            )
        )
    spec = DagSpec.model_validate(run.spec)
    node = spec.node(node_id)
    results = results_of(nodes)
    if row.task_id is None:
        decision = dags.decide(node, results)
        if not decision.run:
            return Step(
                _finish(row, NodeResult(status=NodeStatus.SKIPPED, reason=decision.reason), now)
            )
        try:
            payload = dags.build_payload(node, run.input, results)
            task, _ = submit(
                session,
                _node_request(run_id, node, f"{run_id}.{node_id}", payload),
                now,
                caller=run.caller,
                approval=approval,
                limits=limits,
                traceparent=run.traceparent,
            )
        except (DagError, ReachError) as exc:
            error = {"kind": type(exc).__name__, "message": exc.detail}
            return Step(
                _finish(
                    row,
                    NodeResult(
                        status=NodeStatus.FAILED, error=error, reason=f"not submitted: {exc.detail}"
                    ),
                    now,
                )
            )
        row.task_id = task["task_id"]
        row.status = NODE_RUNNING
        row.started_at = now
        return Step(None, submitted_task=task["task_id"])
    reach_task = session.scalar(select(TaskRow).where(TaskRow.task_id == row.task_id))
    if reach_task is None:  # deleted under the run (an operator, retention): a stated failure
        gone = UnknownTask(f"task {row.task_id!r} of node {node_id!r} vanished")
        return Step(_finish(row, failure_of(gone, "its task vanished"), now))
    if reach_task.status == TaskStatus.AWAITING_APPROVAL:
        return Step(None, parked=True)
    limit_s = node.timeout_ms / 1000
    late = (  # the cheap test first: the approval is read only past the timeout
        row.started_at is not None
        and now - row.started_at > limit_s
        and now - _clock_start(session, row.task_id, row.started_at) > limit_s
    )
    transient = reach_task.status == TaskStatus.DEAD or (reach_task.status not in TERMINAL and late)
    if transient and run.retries < MAX_RUN_RETRIES:
        # delivery gave up (or the node timed out): re-attempt it, from the run's budget
        run.retries += 1
        try:
            task, _ = submit(
                session,
                _node_request(
                    run_id, node, f"{run_id}.{node_id}.r{run.retries}", reach_task.payload
                ),
                now,
                caller=run.caller,
                approval=approval,
                limits=limits,
                traceparent=run.traceparent,
            )
        except ReachError as exc:  # e.g. the agent left since the first attempt
            return Step(_finish(row, failure_of(exc, f"not re-submitted: {exc.detail}"), now))
        row.task_id = task["task_id"]
        row.started_at = now
        return Step(None, submitted_task=task["task_id"])
    if reach_task.status in TERMINAL:
        if reach_task.status == TaskStatus.SUCCESS:
            result = NodeResult(
                status=NodeStatus.SUCCESS, data=reach_task.result, reason="succeeded"
            )
        else:
            result = NodeResult(
                status=NodeStatus.FAILED,
                error=reach_task.error,
                reason=f"task {reach_task.status}",
            )
        return Step(_finish(row, result, now))
    if late:
        return Step(
            _finish(
                row,
                NodeResult(
                    status=NodeStatus.TIMEOUT, reason=f"no result within {node.timeout_ms} ms"
                ),
                now,
            )
        )
    return Step(None)


def finish_run(session: Session, run_id: str, now: float) -> str:
    """Settle the run from its nodes' results; a run already settled (by a duplicate
    closing task, or by the sweep) keeps its outcome."""
    run, nodes = load(session, run_id)
    if run.status != DagRunStatus.RUNNING:
        return run.status
    bad = sorted(
        n for n, row in nodes.items() if row.status in (NodeStatus.FAILED, NodeStatus.TIMEOUT)
    )
    skipped = sorted(n for n, row in nodes.items() if row.status == NodeStatus.SKIPPED)
    unfinished = sorted(n for n, row in nodes.items() if row.status not in FINISHED)
    if unfinished:
        status, reason = DagRunStatus.FAILED, f"nodes never finished: {', '.join(unfinished)}"
    elif bad:
        why = "; ".join(f"{n}: {nodes[n].reason}" for n in bad)
        also = f"; skipped: {', '.join(skipped)}" if skipped else ""
        status, reason = DagRunStatus.FAILED, why + also
    else:
        status = DagRunStatus.SUCCESS
        reason = f"skipped: {', '.join(skipped)}" if skipped else "all nodes succeeded"
    if not _settle_run(session, run_id, status, reason, now):
        session.refresh(run)
        return run.status
    return status


def fail_node(
    session: Session, run_id: str, node_id: str, exc: BaseException, now: float
) -> NodeResult:
    """Store a node step that raised as the node's failure, so the chord goes on.

    A node that has its result meanwhile keeps it; a run that no longer exists gets an
    unstored failure (there is nothing left to record it on)."""
    try:
        _, nodes = load(session, run_id)
    except UnknownTask:
        return failure_of(exc, "its run no longer exists")
    if node_id not in nodes:
        return failure_of(exc, f"node {node_id!r} is not part of run {run_id}")
    row = _lock_node(session, run_id, node_id)
    if row.status in FINISHED:
        return results_of({node_id: row})[node_id]
    detail = exc.detail if isinstance(exc, ReachError) else str(exc)
    return _finish(row, failure_of(exc, f"step failed: {detail}"), now)


def view(session: Session, run_id: str) -> dict[str, Any]:
    run, nodes = load(session, run_id)
    order = [n["id"] for n in run.spec["nodes"]]
    return {
        "run_id": run.run_id,
        "name": run.name,
        "status": run.status,
        "reason": run.reason,
        "input": run.input,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "retries": run.retries,
        "nodes": [
            {
                "node_id": n,
                "status": nodes[n].status,
                "task_id": nodes[n].task_id,
                "data": nodes[n].data,
                "error": nodes[n].error,
                "reason": nodes[n].reason,
                "started_at": nodes[n].started_at,
                "finished_at": nodes[n].finished_at,
            }
            for n in order
        ],
    }


def _node_request(
    run_id: str, node: dags.NodeSpec, task_id: str, payload: dict[str, Any]
) -> SubmitRequest:
    """The reach task of one node attempt, traced under its run."""
    return SubmitRequest(
        task_id=task_id,
        agent_id=node.agent_id,
        tags=list(node.tags),
        capability=node.capability,
        rules=dict(node.rules),
        method=node.method,
        payload=payload,
        timeout_ms=node.timeout_ms,
        trace={"root_id": run_id, "parent_task_id": None, "hops": 0, "path": []},
    )


def _clock_start(session: Session, task_id: str | None, started_at: float) -> float:
    """When a node's timeout starts counting: at its submit, or at the human decision if
    its task was parked."""
    decided = session.scalar(select(ApprovalRow.decided_at).where(ApprovalRow.task_id == task_id))
    return max(started_at, decided or started_at)


def _finish(row: DagNodeRunRow, result: NodeResult, now: float) -> NodeResult:
    row.status = result.status.value
    row.data = result.data
    row.error = result.error
    row.reason = result.reason
    row.finished_at = now
    return result


def failure_of(exc: BaseException, reason: str) -> NodeResult:
    """A failed node result that names the exception (its class and message)."""
    message = exc.detail if isinstance(exc, ReachError) else str(exc)
    return NodeResult(
        status=NodeStatus.FAILED,
        error={"kind": type(exc).__name__, "message": message},
        reason=reason,
    )


def _lock_node(session: Session, run_id: str, node_id: str) -> DagNodeRunRow:
    row = session.scalar(
        select(DagNodeRunRow)
        .where(DagNodeRunRow.run_id == run_id, DagNodeRunRow.node_id == node_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if row is None:
        raise UnknownTask(f"node {node_id!r} is not part of run {run_id}", run_id=run_id)
    return row


def _settle_run(
    session: Session, run_id: str, status: DagRunStatus, reason: str, now: float
) -> bool:
    """Move the run out of ``running``: True in exactly one of the settlers that race."""
    done = session.execute(
        update(DagRunRow)
        .where(DagRunRow.run_id == run_id, DagRunRow.status == DagRunStatus.RUNNING)
        .values(status=status, reason=reason, finished_at=now, updated_at=now)
    )
    return _rowcount(done) == 1


def _rowcount(result: object) -> int:
    return int(cast(CursorResult[Any], result).rowcount)


def canvas_step(
    session: Session,
    task_id: str,
    method: str,
    payload: dict[str, Any],
    agent_id: str | None,
    tags: list[str],
    capability: str | None,
    timeout_ms: int,
    now: float,
    approval: approvals.ApprovalPolicy = approvals.DEFAULT_POLICY,
    limits: admission.Limits = admission.DEFAULT_LIMITS,
) -> Step:
    """A hand-composed canvas step: submit once, then report the task's outcome."""
    existing = session.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
    if existing is None:
        try:
            submit(
                session,
                SubmitRequest(
                    task_id=task_id,
                    agent_id=agent_id,
                    tags=tags,
                    capability=capability,
                    method=method,
                    payload=payload,
                    timeout_ms=timeout_ms,
                ),
                now,
                approval=approval,
                limits=limits,
            )
        except ReachError as exc:
            return Step(
                NodeResult(
                    status=NodeStatus.FAILED,
                    reason=f"not submitted: {exc}",
                    error={"kind": type(exc).__name__, "message": exc.detail},
                )
            )
        return Step(None, submitted_task=task_id)
    if existing.status == TaskStatus.AWAITING_APPROVAL:
        return Step(None, parked=True)
    if existing.status not in TERMINAL:
        limit_s = timeout_ms / 1000
        if (
            now - existing.created_at > limit_s
            and now - _clock_start(session, task_id, existing.created_at) > limit_s
        ):
            return Step(
                NodeResult(status=NodeStatus.TIMEOUT, reason=f"no result within {timeout_ms} ms")
            )
        return Step(None)
    if existing.status == TaskStatus.SUCCESS:
        return Step(NodeResult(status=NodeStatus.SUCCESS, data=existing.result, reason="succeeded"))
    return Step(
        NodeResult(status=NodeStatus.FAILED, error=existing.error, reason=f"task {existing.status}")
    )


def worst_case_seconds(spec: DagSpec, plan: dags.Plan) -> float:
    """How long a run can take at most: each level waits for its slowest node, and the run's
    retry budget may re-run the slowest levels."""
    by_id = {n.id: n for n in spec.nodes}
    per_level = sorted(
        (max(by_id[n].timeout_ms for n in level) / 1000 for level in plan.levels), reverse=True
    )
    return sum(per_level) + sum(per_level[:MAX_RUN_RETRIES])


def check_fits_chord_lifetime(spec: DagSpec, plan: dags.Plan, lifetime_s: float) -> None:
    worst = worst_case_seconds(spec, plan)
    if worst >= lifetime_s:
        raise DagError(
            f"DAG {spec.name!r} may run {worst:.0f}s, longer than the {lifetime_s:.0f}s its "
            "chord state is kept; shorten node timeouts or split the DAG",
            node=max(spec.nodes, key=lambda n: n.timeout_ms).id,
        )


@dataclass(frozen=True, slots=True)
class Resume:
    """A stalled run to publish again, from its first level with an unfinished node."""

    run_id: str
    plan: dags.Plan
    from_level: int


@dataclass(slots=True)
class SweepReport:
    """What one sweep did, by run id."""

    finished: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)
    resumed: list[Resume] = field(default_factory=list)


def run_clock(
    run: DagRunRow,
    nodes: dict[str, DagNodeRunRow],
    plan: dags.Plan,
    waits: list[ApprovalRow] | None = None,
    now: float | None = None,
) -> RunClock:
    """The run's bounds from its spec, and its last sign of progress from its rows;
    ``waits``: the approvals its nodes' tasks waited on (a decision is progress too)."""
    waits = waits or []
    marks = [run.created_at, run.updated_at]
    marks += [t for row in nodes.values() for t in (row.started_at, row.finished_at) if t]
    marks += [a.decided_at for a in waits if a.decided_at]
    until = now if now is not None else max(marks)
    return RunClock(
        created_at=run.created_at,
        last_progress=max(marks),
        worst_case_s=worst_case_seconds(plan.spec, plan),
        longest_node_s=max(n.timeout_ms for n in plan.spec.nodes) / 1000,
        waited_s=sum(max(0.0, (a.decided_at or until) - a.requested_at) for a in waits),
        parked=any(a.status == ApprovalStatus.PENDING for a in waits),
    )


def sweep(session: Session, now: float, margin_s: float, limit: int = SWEEP_BATCH) -> SweepReport:
    """Settle or resume runs whose canvas stopped advancing (see
    `reach.core.orchestration.dags.sweep`).

    Safe with several beats and workers: every move is a conditional UPDATE on the run
    (still ``running``, not touched since we read it), so exactly one sweeper acts."""
    report = SweepReport()
    runs = session.scalars(
        select(DagRunRow)
        .where(DagRunRow.status == DagRunStatus.RUNNING)
        .order_by(DagRunRow.id)
        .limit(limit)
    ).all()
    rows = session.scalars(
        select(DagNodeRunRow).where(DagNodeRunRow.run_id.in_([r.run_id for r in runs]))
    ).all()
    by_run: dict[str, dict[str, DagNodeRunRow]] = {}
    for row in rows:
        by_run.setdefault(row.run_id, {})[row.node_id] = row
    waits = _approvals_of(session, [row for row in rows if row.task_id])
    for run in runs:
        nodes = by_run.get(run.run_id, {})
        plan = dags.compile_plan(DagSpec.model_validate(run.spec))
        clock = run_clock(run, nodes, plan, waits.get(run.run_id), now)
        unfinished = [n for level in plan.levels for n in level if nodes[n].status not in FINISHED]
        action = sweep_action(clock, not unfinished, now, margin_s)
        if action is SweepAction.FINISH:
            finish_run(session, run.run_id, now)
            report.finished.append(run.run_id)
        elif action is SweepAction.ABANDON:
            outcome = _abandon(session, run, plan, clock, now, margin_s)
            if outcome is SweepAction.ABANDON:
                report.abandoned.append(run.run_id)
            elif outcome is SweepAction.FINISH:
                report.finished.append(run.run_id)
        elif action is SweepAction.RESUME and _claim_resume(session, run, now):
            first = next(i for i, level in enumerate(plan.levels) if set(level) & set(unfinished))
            report.resumed.append(Resume(run.run_id, plan, first))
    if report.finished or report.abandoned or report.resumed:
        log.warning(
            "DAG sweep: finished %s, abandoned %s, resumed %s",
            report.finished,
            report.abandoned,
            [r.run_id for r in report.resumed],
        )
    return report


def _approvals_of(session: Session, rows: list[DagNodeRunRow]) -> dict[str, list[ApprovalRow]]:
    """The approvals the nodes' current tasks waited (or wait) on, by run: one read."""
    run_of = {row.task_id: row.run_id for row in rows}
    if not run_of:
        return {}
    found: dict[str, list[ApprovalRow]] = {}
    for approval in session.scalars(select(ApprovalRow).where(ApprovalRow.task_id.in_(run_of))):
        found.setdefault(run_of[approval.task_id], []).append(approval)
    return found


def _claim_resume(session: Session, run: DagRunRow, now: float) -> bool:
    """Stamp the run as resumed now, unless another sweeper (or a step) got there first."""
    seen = run.updated_at
    claimed = session.execute(
        update(DagRunRow)
        .where(
            DagRunRow.run_id == run.run_id,
            DagRunRow.status == DagRunStatus.RUNNING,
            DagRunRow.updated_at == seen,
        )
        .values(updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return _rowcount(claimed) == 1


def _abandon(
    session: Session,
    run: DagRunRow,
    plan: dags.Plan,
    clock: RunClock,
    now: float,
    margin_s: float,
) -> SweepAction | None:
    """Fail the run, naming the nodes that never finished, and mark those nodes: a node
    that was waiting for its task failed, one never submitted is skipped.

    The run's node rows are locked first (node steps lock theirs), so a node finishing
    at this moment is either seen finished here or finds the run settled; a run whose
    last node just finished is settled from its results instead."""
    locked = session.scalars(
        select(DagNodeRunRow)
        .where(DagNodeRunRow.run_id == run.run_id)
        .order_by(DagNodeRunRow.id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).all()
    nodes = {row.node_id: row for row in locked}
    unfinished = [n for level in plan.levels for n in level if nodes[n].status not in FINISHED]
    if not unfinished:
        finish_run(session, run.run_id, now)
        return SweepAction.FINISH
    stuck = ", ".join(f"{n} ({nodes[n].status})" for n in unfinished)
    reason = (
        f"abandoned: no progress for {now - clock.last_progress:.0f}s and older than the "
        f"{clock.worst_case_s + margin_s:.0f}s it could take (its canvas died); "
        f"never finished: {stuck}"
    )
    if not _settle_run(session, run.run_id, DagRunStatus.FAILED, reason, now):
        return None
    for node_id in unfinished:
        waiting = nodes[node_id].status == NODE_RUNNING
        session.execute(
            update(DagNodeRunRow)
            .where(
                DagNodeRunRow.run_id == run.run_id,
                DagNodeRunRow.node_id == node_id,
                DagNodeRunRow.status.in_((NODE_PENDING, NODE_RUNNING)),
            )
            .values(
                status=NodeStatus.FAILED if waiting else NodeStatus.SKIPPED,
                error={"kind": "RunAbandoned", "message": reason} if waiting else None,
                reason=(
                    "never finished: the run was abandoned"
                    if waiting
                    else "never started: the run was abandoned"
                ),
                finished_at=now,
            )
            .execution_options(synchronize_session=False)
        )
    return SweepAction.ABANDON
