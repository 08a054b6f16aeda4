"""DAG runs in the store: the run, each node's state, and the step that advances a node.

A node never raises into the canvas: whatever happens (skipped by its condition, refused
at submit, failed, timed out) becomes a ``NodeResult`` stored here, and the next level
reads its ancestors' results from here — not from chord arguments, which only carry the
previous level.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core import dags
from reach.core.dags import DagSpec, NodeResult, NodeStatus
from reach.core.statuses import TERMINAL, TaskStatus
from reach.errors import DagError, ReachError, UnknownTask
from reach.hub.storage.models import DagNodeRunRow, DagRunRow, TaskRow
from reach.hub.submission import submit
from reach.schemas import SubmitRequest

FINISHED = {s.value for s in NodeStatus}
MAX_RUN_RETRIES = 3  # node re-attempts per run, in total: a flaky branch cannot loop forever


@dataclass(frozen=True, slots=True)
class Step:
    """What one pass of a node task did: finished (with a result) or still waiting."""

    result: NodeResult | None
    submitted_task: str | None = None


def start_run(session: Session, spec: DagSpec, run_input: dict[str, Any], now: float) -> str:
    run_id = f"dag-{uuid.uuid4().hex[:16]}"
    session.add(
        DagRunRow(
            run_id=run_id,
            name=spec.name,
            spec=spec.model_dump(mode="json"),
            input=run_input,
            status="running",
            reason="",
            created_at=now,
            updated_at=now,
        )
    )
    for node in spec.nodes:
        session.add(DagNodeRunRow(run_id=run_id, node_id=node.id, status="pending", reason=""))
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


def advance_node(session: Session, run_id: str, node_id: str, now: float) -> Step:
    """Decide, submit, or collect one node; idempotent (a duplicate task finds it done)."""
    run, nodes = load(session, run_id)
    row = nodes[node_id]
    if row.status in FINISHED:
        return Step(results_of({node_id: row})[node_id])
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
        row.status = "running"
        row.started_at = now
        return Step(None, submitted_task=task["task_id"])
    reach_task = session.scalar(select(TaskRow).where(TaskRow.task_id == row.task_id))
    if reach_task is None:
        raise UnknownTask(f"task {row.task_id!r} of node {node_id!r} vanished")
    transient = reach_task.status == TaskStatus.DEAD or (
        reach_task.status not in TERMINAL
        and row.started_at is not None
        and now - row.started_at > node.timeout_ms / 1000
    )
    if transient and run.retries < MAX_RUN_RETRIES:
        # delivery gave up (or the node timed out): re-attempt it, from the run's budget
        run.retries += 1
        task, _ = submit(
            session,
            _node_request(run_id, node, f"{run_id}.{node_id}.r{run.retries}", reach_task.payload),
            now,
        )
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
    if row.started_at is not None and now - row.started_at > node.timeout_ms / 1000:
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
    run, nodes = load(session, run_id)
    bad = sorted(n for n, row in nodes.items() if row.status in ("failed", "timeout"))
    skipped = sorted(n for n, row in nodes.items() if row.status == "skipped")
    unfinished = sorted(n for n, row in nodes.items() if row.status not in FINISHED)
    if unfinished:
        run.status, run.reason = "failed", f"nodes never finished: {', '.join(unfinished)}"
    elif bad:
        why = "; ".join(f"{n}: {nodes[n].reason}" for n in bad)
        also = f"; skipped: {', '.join(skipped)}" if skipped else ""
        run.status, run.reason = "failed", why + also
    else:
        run.status = "success"
        run.reason = f"skipped: {', '.join(skipped)}" if skipped else "all nodes succeeded"
    run.finished_at = run.updated_at = now
    return run.status


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


def _finish(row: DagNodeRunRow, result: NodeResult, now: float) -> NodeResult:
    row.status = result.status.value
    row.data = result.data
    row.error = result.error
    row.reason = result.reason
    row.finished_at = now
    return result


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
    if existing.status not in TERMINAL:
        if now - existing.created_at > timeout_ms / 1000:
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
