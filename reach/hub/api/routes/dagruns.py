"""DAG run endpoints: start a run from a DAG definition, read its state."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.fleet.routing import RouteFilter, matches
from reach.core.orchestration import dags
from reach.core.security.auth import Action, Principal, may_read_task
from reach.errors import DagError, UnknownTask
from reach.hub import tracing
from reach.hub.api import links
from reach.hub.api.auth import not_yours, require
from reach.hub.context import HubContext
from reach.hub.fleet import registry
from reach.hub.orchestration import dagruns
from reach.hub.storage.models import DagRunRow

Submits = Annotated[Principal, Depends(require(Action.SUBMIT))]
Reads = Annotated[Principal, Depends(require(Action.READ_TASK))]


class StartRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dag: dict[str, Any] = Field(description="the DAG definition (as in dags/*.json)")
    input: dict[str, Any] = Field(default_factory=dict)


def dag_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/api/v1/dag-runs", tags=["dags"])

    @router.post(
        "", status_code=201, responses={**links.responses(links.STARTED_RUN, 201), 422: {}}
    )
    def start(body: StartRun, request: Request, principal: Submits) -> JSONResponse:
        spec = dags.parse_dag(body.dag)
        traced = tracing.checked(request.headers.get("traceparent"))

        def work(session: Session) -> str:
            now = ctx.clock.now()

            def target_exists(node: dags.NodeSpec) -> bool:
                flt = RouteFilter(
                    agent_id=node.agent_id,
                    tags=tuple(node.tags),
                    capability=node.capability,
                    rules=tuple(node.rules.items()),
                )
                candidates = registry.load_candidates(session, flt, now, ctx.policy, node.method)
                return any(matches(c, flt) for c in candidates)

            dags.validate(spec, target_exists=target_exists)
            return dagruns.start_run(
                session, spec, body.input, now, caller=principal.identity, traceparent=traced
            )

        plan = dags.compile_plan(spec)
        dagruns.check_fits_chord_lifetime(spec, plan, ctx.dispatcher.run_lifetime_s)
        run_id = ctx.write(work, conflict=DagError)
        try:
            ctx.dispatcher.start_run(run_id, plan)
        except Exception as exc:  # broker down: the run exists but cannot start
            raise DagError(f"run {run_id} recorded but not started: {exc}", run_id=run_id) from exc
        with ctx.transaction() as session:
            return JSONResponse(dagruns.view(session, run_id), status_code=201)

    @router.get("/{run_id}", responses={404: {}})
    def show(run_id: str, request: Request, principal: Reads) -> dict[str, Any]:
        """The run, for admins, viewers and whoever started it (anyone else is told, as
        for an unknown id, that it does not exist)."""
        with ctx.reading() as session:
            owner = session.execute(
                select(DagRunRow.caller).where(DagRunRow.run_id == run_id)
            ).first()
            if owner is not None and not may_read_task(principal, owner.caller, None):
                not_yours(request, principal, f"DAG run {run_id!r}")
                raise UnknownTask(f"DAG run {run_id!r} does not exist", run_id=run_id)
            return dagruns.view(session, run_id)

    return router
