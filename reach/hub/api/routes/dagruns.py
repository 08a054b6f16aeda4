"""DAG run endpoints: start a run from a DAG definition, read its state."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from reach.core import dags
from reach.core.routing import RouteFilter, matches
from reach.errors import DagError
from reach.hub import dagruns, registry
from reach.hub.api import links
from reach.hub.context import HubContext
from reach.worker.canvas import canvas
from reach.worker.factory import RESULT_EXPIRES_S


class StartRun(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dag: dict[str, Any] = Field(description="the DAG definition (as in dags/*.json)")
    input: dict[str, Any] = Field(default_factory=dict)


def dag_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/api/v1/dag-runs", tags=["dags"])

    @router.post(
        "", status_code=201, responses={**links.responses(links.STARTED_RUN, 201), 422: {}}
    )
    def start(body: StartRun) -> JSONResponse:
        spec = dags.parse_dag(body.dag)

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
            return dagruns.start_run(session, spec, body.input, now)

        plan = dags.compile_plan(spec)
        dagruns.check_fits_chord_lifetime(spec, plan, RESULT_EXPIRES_S)
        run_id = ctx.write(work, conflict=DagError)
        try:
            canvas(ctx.publisher.app, run_id, plan).apply_async()
        except Exception as exc:  # broker down: the run exists but cannot start
            raise DagError(f"run {run_id} recorded but not started: {exc}", run_id=run_id) from exc
        with ctx.transaction() as session:
            return JSONResponse(dagruns.view(session, run_id), status_code=201)

    @router.get("/{run_id}", responses={404: {}})
    def show(run_id: str) -> dict[str, Any]:
        with ctx.reading() as session:
            return dagruns.view(session, run_id)

    return router
