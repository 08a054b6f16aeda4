"""Task endpoints: submit, read (with long-poll), result and progress reports, audit trail,
and the operator's dead-letter queue."""

from __future__ import annotations

import random
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.flow.priority import queue_for
from reach.core.ledger.statuses import TERMINAL, TaskStatus
from reach.core.security.auth import HUB, Action, Principal, Scope, may_act_for, may_read_task
from reach.errors import (
    Backpressure,
    Forbidden,
    ReachError,
    RequestTooLarge,
    StaleReport,
    TaskConflict,
    UnknownTask,
)
from reach.hub import logs
from reach.hub.api import links
from reach.hub.api.auth import not_yours, require
from reach.hub.api.lanes import CallerLanes, caller_tokens
from reach.hub.context import HubContext
from reach.hub.delivery import reports
from reach.hub.flow import admission, loops
from reach.hub.intake import submission
from reach.hub.ledger import tasks as ledger
from reach.hub.ledger.longpoll import long_poll
from reach.hub.ledger.tasks import Publish
from reach.hub.ledger.wakeups import Waiters
from reach.hub.notify import callbacks
from reach.hub.ops import deadletters
from reach.hub.ops.alerts import BackpressureLog
from reach.hub.storage.models import TaskEventRow, TaskRow
from reach.wire.schemas import DB_INT_MAX, MAX_WAIT_S, ProgressReport, ResultReport, SubmitRequest

_rng = random.Random()  # the jitter of retries that agents' failure reports schedule

DeadLetterId = Annotated[int, Path(ge=1, le=DB_INT_MAX)]

Submits = Annotated[Principal, Depends(require(Action.SUBMIT))]
Reads = Annotated[Principal, Depends(require(Action.READ_TASK))]
Reports = Annotated[Principal, Depends(require(Action.REPORT))]
ReadsFleet = Depends(require(Action.READ_FLEET))
Administers = Annotated[Principal, Depends(require(Action.ADMINISTER))]


def task_router(ctx: HubContext, intake: Intake, waiters: Waiters | None = None) -> APIRouter:
    router = APIRouter(prefix="/v1/tasks", tags=["tasks"])

    @router.post(
        "",
        status_code=201,
        responses={
            **links.responses(links.SUBMITTED, 200, 201),
            **{code: {} for code in (404, 409, 413, 422, 429, 501, 503, 508)},
        },
    )
    async def submit(
        body: SubmitRequest,
        request: Request,
        principal: Submits,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    ) -> JSONResponse:
        """Accept the task; with ``wait`` > 0, also hold the request until it is terminal
        or time is up (one round trip for a caller that wants the answer).

        The task's caller is the principal's identity; an agent key sending from inside a
        handler (the trace's path ends with an agent it speaks for) sends as that agent."""
        path = body.trace.path if body.trace else []
        submitter = principal.acting_as(path[-1] if path else None)
        accepted = await intake.accept(body, submitter)
        view, created = accepted
        status = 201 if created else 200
        task_id = view["task_id"]
        queued = created and view["status"] != TaskStatus.AWAITING_APPROVAL  # parked: no attempt
        first_attempt = Publish(task_id, 1, 0.0, queue_for(view.get("priority")))
        lane = intake.lanes.of(body.priority)
        if not wait:
            if queued:
                await lane.run(ctx.publish_premarked, first_attempt)
            return JSONResponse(view, status_code=status)
        published = not queued
        views = iter([view])

        def read() -> dict[str, Any]:
            nonlocal published
            if not published:  # inside the watch: a fast answer cannot slip past the waiter
                ctx.publish_premarked(first_attempt)
                published = True
            first = next(views, None)
            return first if first is not None else read_task(ctx, task_id, request, submitter)

        final = await long_poll(
            read,
            _terminal,
            wait,
            waiters=waiters,
            keys=[task_id],
            carried=True,
            run=lane.run,
        )
        return JSONResponse(final, status_code=status)

    @router.get("/{task_id}", responses={404: {}})
    async def get_task(
        task_id: str,
        request: Request,
        principal: Reads,
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    ) -> dict[str, Any]:
        """The task; with ``wait`` > 0, hold the request until it is terminal or time is up."""
        return await long_poll(
            lambda: read_task(ctx, task_id, request, principal),
            _terminal,
            wait,
            waiters=waiters,
            keys=[task_id],
            carried=True,
            run=intake.lanes.online.run,  # a caller's read: never ahead of agents' reports
        )

    @router.post("/{task_id}/result", responses={404: {}, 409: {}})
    def report_result(
        task_id: str, body: ResultReport, request: Request, principal: Reports
    ) -> dict[str, Any]:
        """The agent's answer after a 202, for the attempt and instance it names: any
        other attempt or instance is refused (409 ``stale-report``) and recorded. Only a
        key of the task's agent may report (anyone else is told the task does not exist)."""

        transient = reports.Transient(ctx.delivery_policy, _rng) if body.transient else None

        def work(session: Session) -> dict[str, Any] | StaleReport | tuple[Publish, str]:
            reporter = _reporter(session, task_id, request, principal)
            decided = reports.record_report(
                session,
                task_id,
                body.code,
                body.data,
                body.message,
                ctx.clock.now(),
                attempt_seq=body.attempt_seq,
                instance_id=body.instance_id,
                actor=reporter.identity,
                transient=transient,
            )
            if isinstance(decided, StaleReport):
                return decided  # raised below, once its record is committed
            if decided is True and body.code == 0:
                return {"task_id": task_id, "decided": True, "status": "success"}
            status = session.scalar(select(TaskRow.status).where(TaskRow.task_id == task_id))
            if isinstance(decided, Publish):
                return decided, str(status)  # a retry, published below once committed
            return {"task_id": task_id, "decided": decided, "status": status}

        with logs.task_context(task_id, body.attempt_seq):  # the lines of this report
            answer = ctx.write(work, conflict=TaskConflict)
            if isinstance(answer, StaleReport):
                raise answer
            if isinstance(answer, tuple):
                retry, status = answer
                ctx.publish_attempts([retry])
                return {"task_id": task_id, "decided": False, "status": status}
            return answer

    @router.post("/{task_id}/progress", responses={404: {}, 409: {}})
    def report_progress(
        task_id: str, body: ProgressReport, request: Request, principal: Reports
    ) -> dict[str, Any]:
        detail = body.model_dump(
            exclude_none=True, exclude={"attempt_seq", "instance_id", "keepalive"}
        )

        def work(session: Session) -> StaleReport | None:
            reporter = _reporter(session, task_id, request, principal)
            return reports.report_progress(
                session,
                task_id,
                detail,
                ctx.clock.now(),
                attempt_seq=body.attempt_seq,
                instance_id=body.instance_id,
                actor=reporter.identity,
                keepalive=body.keepalive,
                grace=ctx.delivery_policy.watchdog_grace,
            )

        with logs.task_context(task_id, body.attempt_seq):
            refused = ctx.write(work, conflict=TaskConflict)
        if refused is not None:
            raise refused
        return {"task_id": task_id, "recorded": not body.keepalive}

    @router.get("/{task_id}/events", responses={404: {}})
    def task_events(task_id: str, request: Request, principal: Reads) -> dict[str, Any]:
        with ctx.reading() as session:
            owner = session.execute(
                select(TaskRow.caller, TaskRow.agent_id).where(TaskRow.task_id == task_id)
            ).first()
            if owner is None or not _visible(request, principal, task_id, *owner):
                raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
            rows = session.scalars(
                select(TaskEventRow)
                .where(TaskEventRow.task_id == task_id)
                .order_by(TaskEventRow.id)
            ).all()
            return {
                "task_id": task_id,
                "events": [
                    {
                        "kind": r.kind,
                        "at": r.at,
                        "attempt_seq": r.attempt_seq,
                        "agent_id": r.agent_id,
                        "instance_id": r.instance_id,
                        "detail": r.detail,
                        "actor": r.actor or HUB,  # NULL: a step of the hub's own
                    }
                    for r in rows
                ],
            }

    return router


class Intake:
    """Admission of a task, whichever door it came in by (``POST /v1/tasks``, the A2A
    endpoints): the SSRF guard, submission with its limits and loop guard, the 429's
    alert row. Returns the task's view and whether it was created; raises the refusal."""

    def __init__(self, ctx: HubContext) -> None:
        self.ctx = ctx
        self.limits = admission.Limits.of(ctx.settings)
        self.loop_guard = loops.LoopGuard.of(ctx.settings.router, ctx.shared_counts)
        self.refusals = BackpressureLog()
        self.lanes = CallerLanes(caller_tokens(ctx.settings.storage.pool_size))

    async def accept(
        self, body: SubmitRequest, submitter: Principal
    ) -> tuple[dict[str, Any], bool]:
        ctx = self.ctx
        lane = self.lanes.of(body.priority)  # a background flood never holds online's tokens
        if body.callback_url:  # SSRF guard, before anything is written (resolves: a thread)
            await lane.run(callbacks.check_url, body.callback_url, ctx.settings.callbacks)

        def accept() -> tuple[dict[str, Any], bool] | ReachError:
            attempts = 0
            guard = self.loop_guard.for_reach(submitter.identity, body, ctx.clock.now())

            def work(session: Session) -> tuple[dict[str, Any], bool] | ReachError:
                nonlocal attempts
                attempts += 1  # the first try is optimistic; a duplicate id comes back here
                now = ctx.clock.now()
                try:
                    return submission.submit(
                        session,
                        body,
                        now,
                        published_at=now,
                        look_first=attempts > 1,
                        caller=submitter.identity,
                        principal=submitter,
                        l3_cap=ctx.settings.security.l3_max_payload_bytes,
                        approval=ctx.approval_policy,
                        limits=self.limits,
                        loop_guard=guard,
                        matcher=ctx.matcher,
                    )
                except (Forbidden, RequestTooLarge) as refused:
                    return refused  # an L3 refusal: commit its audit row, then raise it

            try:
                done = ctx.write(work, conflict=TaskConflict)
            except Backpressure as full:  # the 429 rolled back: its alert row apart
                self.refusals.record(ctx, full, submitter.identity)
                raise
            if not isinstance(done, ReachError) and done[1]:
                guard.counted(ctx.clock.now())  # an agent-pair count, outside the transaction
                if body.intent is not None:  # matched to an agent: counted by that agent
                    guard.resolved(ctx.write, done[0].get("agent_id"), ctx.clock.now())
            return done

        accepted = await lane.run(accept)
        if isinstance(accepted, ReachError):
            raise accepted
        return accepted


class ReplayMany(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[Annotated[int, Field(ge=1, le=DB_INT_MAX)]] = Field(
        min_length=1, max_length=deadletters.MAX_REPLAY_MANY, description="dead-letter ids"
    )


def dead_letter_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/api/v1/dead-letters", tags=["admin"])

    @router.get("", dependencies=[ReadsFleet])
    def list_dead(
        include_replayed: bool = False, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> dict[str, Any]:
        with ctx.reading() as session:
            rows = deadletters.list_dead(session, include_replayed, limit)
            return {"dead_letters": [deadletters.view(r) for r in rows]}

    @router.get("/{dead_id}", responses={404: {}}, dependencies=[ReadsFleet])
    def show(dead_id: DeadLetterId) -> dict[str, Any]:
        with ctx.reading() as session:
            return deadletters.view(deadletters.get(session, dead_id))

    @router.post("/replay", responses={422: {}})
    def replay_many(body: ReplayMany, principal: Administers) -> dict[str, Any]:
        """Replay several dead letters, each as ``POST /{id}/replay`` would (its own
        transaction): 200 with each one's outcome, ``replayed`` or ``refused`` (the
        problem type and detail: unknown, already replayed, task no longer dead)."""
        outcomes = deadletters.replay_many(ctx, body.ids, actor=principal.identity)
        return {
            "results": [o.to_json() for o in outcomes],
            "replayed": sum(o.replayed for o in outcomes),
            "refused": sum(not o.replayed for o in outcomes),
        }

    @router.post("/{dead_id}/replay", responses={404: {}, 409: {}})
    def replay(dead_id: DeadLetterId, principal: Administers) -> dict[str, Any]:
        item = ctx.write(
            lambda s: deadletters.replay(s, dead_id, ctx.clock.now(), actor=principal.identity),
            conflict=TaskConflict,
        )
        ctx.publish_attempts([item])
        return {
            "dead_letter_id": dead_id,
            "task_id": item.task_id,
            "attempt_seq": item.attempt_seq,
            "status": TaskStatus.PENDING,
        }

    return router


def _terminal(view: dict[str, Any]) -> bool:
    return view["status"] in TERMINAL


def read_task(
    ctx: HubContext, task_id: str, request: Request, principal: Principal
) -> dict[str, Any]:
    """The task as ``principal`` may see it (`UnknownTask` if not: not found and not yours
    look the same); the A2A edge reads through it too."""
    with ctx.reading() as session:
        row = session.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        if row is None or not _visible(request, principal, task_id, row.caller, row.agent_id):
            raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
        return ledger.task_view(row)


def _visible(
    request: Request, principal: Principal, task_id: str, caller: str | None, agent: str | None
) -> bool:
    """Whether ``principal`` may read the task (a refusal is logged; the caller then
    answers as for an unknown task: not found and not yours look the same)."""
    if may_read_task(principal, caller, agent):
        return True
    not_yours(request, principal, f"task {task_id!r}")
    return False


def _reporter(session: Session, task_id: str, request: Request, principal: Principal) -> Principal:
    """Who reports for the task: a key of the agent it was delivered to, acting as that
    agent. An admin reports for any (no read: the report itself finds an unknown task);
    anyone else is told the task does not exist, and nothing is written."""
    if principal.scope is Scope.ADMIN:
        return principal
    agent = session.scalar(select(TaskRow.agent_id).where(TaskRow.task_id == task_id))
    if agent is None or not may_act_for(principal, agent):
        if agent is not None:
            not_yours(request, principal, f"task {task_id!r}")
        raise UnknownTask(f"task {task_id!r} does not exist", task_id=task_id)
    return principal.acting_as(agent)
