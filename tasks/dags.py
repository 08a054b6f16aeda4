"""DAG node and finish tasks (the canvas itself is built by ``reach.worker.canvas``).

Node tasks never hold a worker slot while an agent works: a node submits its reach task
and, until that task is terminal, retries itself with a countdown (the slot is free in
between), so 202-then-report agents can be slow without starving the pool.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from reach.hub import dagruns
from reach.hub.dagruns import canvas_step
from reach.hub.delivery import Publish

# Quick first looks for fast agents, then every 2 s for slow ones (bounded broker traffic).
POLL_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.0)


@shared_task(name="reach.dag_node", bind=True, max_retries=None, acks_late=True)
def dag_node(self: Any, run_id: str, node_id: str) -> dict[str, Any]:
    from reach.worker.app import runtime

    ctx = runtime()
    step = ctx.write(lambda s: dagruns.advance_node(s, run_id, node_id, ctx.clock.now()))
    return _settle(self, ctx, step)


@shared_task(name="reach.dag_finish", acks_late=True)
def dag_finish(run_id: str) -> str:
    from reach.worker.app import runtime

    ctx = runtime()
    return ctx.write(lambda s: dagruns.finish_run(s, run_id, ctx.clock.now()))


@shared_task(name="reach.reach_task", bind=True, max_retries=None, acks_late=True)
def reach_task(
    self: Any,
    method: str,
    payload: dict[str, Any] | None = None,
    agent_id: str | None = None,
    tags: list[str] | None = None,
    capability: str | None = None,
    timeout_ms: int = 30_000,
) -> dict[str, Any]:
    """One reach as a canvas step, for hand-composed canvases::

        chain(reach_task.si("sales.fetch", {"region": "east"}, capability="sales.fetch"),
              chord([reach_task.si(...), reach_task.si(...)], reach_task.si(...)))

    The hub tracks it like any task (task_id ``cv-<celery id>``, full audit trail). It
    returns ``{"status", "data", "error", "task_id"}`` and never raises into the canvas;
    while the agent works it waits without holding a worker slot.
    """
    from reach.worker.app import runtime

    ctx = runtime()
    task_id = f"cv-{self.request.id}"
    step = ctx.write(
        lambda s: canvas_step(
            s,
            task_id,
            method,
            payload or {},
            agent_id,
            tags or [],
            capability,
            timeout_ms,
            ctx.clock.now(),
        )
    )
    return {**_settle(self, ctx, step), "task_id": task_id}


def _settle(task: Any, ctx: Any, step: dagruns.Step) -> dict[str, Any]:
    """Publish what the step submitted; come back later (slot freed) until it has a result."""
    if step.submitted_task is not None:
        ctx.publish_attempts([Publish(step.submitted_task, 1, 0.0)])
    if step.result is None:
        delay = POLL_SECONDS[min(task.request.retries, len(POLL_SECONDS) - 1)]
        raise task.retry(countdown=delay)
    return step.result.model_dump(mode="json")
