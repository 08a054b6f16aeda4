"""DAG node, finish and sweep tasks (the canvas itself is built by ``reach.worker.canvas``).

Node tasks never hold a worker slot while an agent works: a node submits its reach task
and, until that task is terminal, retries itself with a countdown (the slot is free in
between), so 202-then-report agents can be slow without starving the pool.

Node tasks never raise into the chord either: Celery would then never run the next level
and the run would stay ``running``. Every failure of a step becomes a stated node result
(the database unavailable is retried a few times first); a chord that died anyway (its
messages lost with a worker or a broker) is found by the beat's `dag_sweep`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import shared_task

from reach.core.orchestration.dags import NodeResult
from reach.errors import HubUnavailable
from reach.hub.flow.admission import Limits
from reach.hub.ledger.tasks import Publish
from reach.hub.orchestration import dagruns
from reach.hub.orchestration.dagruns import canvas_step
from reach.worker.canvas import canvas

log = logging.getLogger("reach.tasks.dags")

# Quick first looks for fast agents, then every 2 s for slow ones (bounded broker traffic).
POLL_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.0)
# A node whose task waits for a human decision: looked at this often (a decision takes
# minutes, not milliseconds; the slot is free in between either way).
PARKED_POLL_S = 5.0
# The hub's database unavailable: a step is tried again after each of these (about 30 s
# in all, slot freed in between), then it is a stated failure.
UNAVAILABLE_RETRY_S = (1.0, 2.0, 4.0, 8.0, 15.0)


@shared_task(name="reach.dag_node", bind=True, max_retries=None, acks_late=True)
def dag_node(self: Any, run_id: str, node_id: str, unavailable: int = 0) -> dict[str, Any]:
    from reach.worker.app import runtime

    ctx = runtime()

    def stated(exc: BaseException) -> NodeResult:
        return ctx.write(lambda s: dagruns.fail_node(s, run_id, node_id, exc, ctx.clock.now()))

    return _guarded(
        self,
        ctx,
        unavailable,
        lambda: ctx.write(
            lambda s: dagruns.advance_node(
                s, run_id, node_id, ctx.clock.now(), ctx.approval_policy, Limits.of(ctx.settings)
            )
        ),
        stated,
        what=f"node {node_id} of {run_id}",
    )


@shared_task(name="reach.dag_finish", bind=True, max_retries=None, acks_late=True)
def dag_finish(self: Any, run_id: str) -> str:
    """Settle the run; if the store refuses, the sweep settles it later (it never hangs)."""
    from reach.worker.app import runtime

    ctx = runtime()
    try:
        return ctx.write(lambda s: dagruns.finish_run(s, run_id, ctx.clock.now()))
    except HubUnavailable as exc:
        if self.request.retries < len(UNAVAILABLE_RETRY_S):
            raise self.retry(countdown=UNAVAILABLE_RETRY_S[self.request.retries]) from exc
        log.error("run %s not settled (the sweep will): %s", run_id, exc)
    except Exception:
        log.exception("run %s not settled (the sweep will)", run_id)
    return "unsettled"


@shared_task(name="reach.dag_sweep", bind=True, ignore_result=True)
def dag_sweep(self: Any) -> dict[str, list[str]]:
    """Finish, resume or abandon runs whose canvas stopped advancing."""
    from reach.worker.app import runtime

    ctx = runtime()
    margin = ctx.settings.dags.sweep_margin
    report = ctx.write(lambda s: dagruns.sweep(s, ctx.clock.now(), margin))
    for resume in report.resumed:
        try:
            canvas(self.app, resume.run_id, resume.plan, resume.from_level).apply_async()
        except Exception as exc:  # broker down: a later sweep resumes it (or abandons it)
            log.warning("run %s not resumed: %s", resume.run_id, exc)
    return {
        "finished": report.finished,
        "abandoned": report.abandoned,
        "resumed": [r.run_id for r in report.resumed],
    }


@shared_task(name="reach.reach_task", bind=True, max_retries=None, acks_late=True)
def reach_task(
    self: Any,
    method: str,
    payload: dict[str, Any] | None = None,
    agent_id: str | None = None,
    tags: list[str] | None = None,
    capability: str | None = None,
    timeout_ms: int = 30_000,
    unavailable: int = 0,
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
    result = _guarded(
        self,
        ctx,
        unavailable,
        lambda: ctx.write(
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
                ctx.approval_policy,
                Limits.of(ctx.settings),
            )
        ),
        lambda exc: dagruns.failure_of(exc, f"step failed: {exc}"),
        what=f"canvas step {task_id}",
    )
    return {**result, "task_id": task_id}


def _guarded(
    task: Any,
    ctx: Any,
    unavailable: int,
    step: Callable[[], dagruns.Step],
    stated: Callable[[BaseException], NodeResult],
    what: str,
) -> dict[str, Any]:
    """Run one step; whatever it raises ends as a result, so the chord always proceeds.

    The database unavailable is retried ``UNAVAILABLE_RETRY_S`` times (counted in the
    task's ``unavailable`` argument, apart from the polls); ``stated`` turns any other
    failure, or the last unavailability, into the result (stored where it can be)."""
    try:
        done = step()
    except HubUnavailable as exc:
        if unavailable < len(UNAVAILABLE_RETRY_S):
            log.warning("%s: database unavailable, retrying: %s", what, exc)
            raise task.retry(
                countdown=UNAVAILABLE_RETRY_S[unavailable],
                kwargs={**(task.request.kwargs or {}), "unavailable": unavailable + 1},
            ) from exc
        return _state(stated, exc, what)
    except Exception as exc:
        return _state(stated, exc, what)
    return _settle(task, ctx, done)


def _state(
    stated: Callable[[BaseException], NodeResult], exc: BaseException, what: str
) -> dict[str, Any]:
    log.warning("%s failed: %s: %s", what, type(exc).__name__, exc)
    try:
        result = stated(exc)
    except Exception as again:  # the store refuses even that: the sweep settles the run
        log.error("%s: failure not recorded: %s", what, again)
        result = dagruns.failure_of(exc, f"step failed (not recorded: {again}): {exc}")
    return result.model_dump(mode="json")


def _settle(task: Any, ctx: Any, step: dagruns.Step) -> dict[str, Any]:
    """Publish what the step submitted; come back later (slot freed) until it has a result."""
    if step.submitted_task is not None:
        try:
            ctx.publish_attempts([Publish(step.submitted_task, 1, 0.0)])
        except HubUnavailable as exc:  # unmarked in the outbox: the relay publishes it
            log.warning("attempt of %s left to the relay: %s", step.submitted_task, exc)
    if step.result is None:
        delay = POLL_SECONDS[min(task.request.retries, len(POLL_SECONDS) - 1)]
        raise task.retry(countdown=PARKED_POLL_S if step.parked else delay)
    return step.result.model_dump(mode="json")
