"""DAG run pages: ``/ui/dag-runs`` (filtered, paged) and ``/ui/dag-runs/{id}`` (the graph).

The list reads what ``GET /api/v1/dag-runs`` reads (`reach.hub.ops.listings.list_dag_runs`),
the run page what ``GET /api/v1/dag-runs/{id}`` reads (`reach.hub.orchestration.dagruns.view`), plus
the status of each node's task, so a node whose task is parked for a human shows as
``awaiting_approval``. The graph is `reach.core.orchestration.dags.drawing`'s SVG, drawn here on the
server. While the run is ``running`` its live part (status, graph, nodes) reloads itself
from ``/ui/dag-runs/{id}/live`` every `POLL_S` seconds (htmx); the fragment of a finished
run carries no trigger, so the polling stops with the run.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup
from sqlalchemy import select

from reach.core.ledger.statuses import DagRunStatus, TaskStatus
from reach.core.ops.paging import DagRunFilter, Page
from reach.core.orchestration.dags import DagSpec
from reach.core.orchestration.dags.drawing import GraphNode, render_svg
from reach.core.security.auth import Action
from reach.errors import InvalidQuery, UnknownTask
from reach.hub.api.ui.pages import PageNotFound, Viewer, render, require_ui
from reach.hub.context import HubContext
from reach.hub.ops import listings
from reach.hub.orchestration import dagruns
from reach.hub.storage.models import TaskRow

ReadsFleet = Annotated[Viewer, Depends(require_ui(Action.READ_FLEET))]
PAGE_SIZE: Final = 50
POLL_S: Final = 1
STATUSES: Final = [s.value for s in DagRunStatus]
AWAITING: Final = "awaiting_approval"


def router(ctx: HubContext) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/dag-runs")
    def runs(
        request: Request,
        viewer: ReadsFleet,
        status: Annotated[str, Query(max_length=64)] = "",
        name: Annotated[str, Query(max_length=256)] = "",
        cursor: Annotated[str, Query(max_length=1024)] = "",
    ) -> HTMLResponse:
        error = ""
        page = Page([])
        try:
            filters = DagRunFilter.parse(
                ctx.clock.now(), status=status or None, name=name.strip() or None
            )
            page = listings.list_dag_runs(
                ctx, filters, cursor or None, PAGE_SIZE, principal=viewer.principal
            )
        except InvalidQuery as exc:  # a bad status or a forged cursor: say so, list nothing
            error = exc.detail
        context = {
            "runs": page.items,
            "next_cursor": page.next_cursor,
            "filters": {"status": status, "name": name},
            "statuses": STATUSES,
            "error": error,
        }
        return render(request, viewer, "dag_runs.html", context, active="dag-runs")

    @router.get("/ui/dag-runs/{run_id}")
    def run(request: Request, run_id: str, viewer: ReadsFleet) -> HTMLResponse:
        context = _live_context(ctx, run_id)
        return render(request, viewer, "dag_run.html", context, active="dag-runs")

    @router.get("/ui/dag-runs/{run_id}/live")
    def live(request: Request, run_id: str, viewer: ReadsFleet) -> HTMLResponse:
        """The run page's live part alone (htmx swaps it in place)."""
        context = _live_context(ctx, run_id)
        return render(request, viewer, "dag_run_live.html", context, active="dag-runs")

    return router


def _live_context(ctx: HubContext, run_id: str) -> dict[str, Any]:
    with ctx.reading() as session:
        try:
            view = dagruns.view(session, run_id)
        except UnknownTask:
            raise PageNotFound(f"DAG run {run_id!r} does not exist") from None
        run, _ = dagruns.load(session, run_id)
        spec = DagSpec.model_validate(run.spec)
        task_ids = [n["task_id"] for n in view["nodes"] if n["task_id"]]
        task_status: dict[str, str] = {}
        if task_ids:
            found = select(TaskRow.task_id, TaskRow.status).where(TaskRow.task_id.in_(task_ids))
            task_status = {row.task_id: row.status for row in session.execute(found)}
    nodes = []
    for n in view["nodes"]:
        state = str(n["status"])
        if (
            state == dagruns.NODE_RUNNING
            and task_status.get(n["task_id"]) == TaskStatus.AWAITING_APPROVAL
        ):
            state = AWAITING
        nodes.append({**n, "state": state, "task_status": task_status.get(n["task_id"])})
    states = {n["node_id"]: n for n in nodes}
    graph = [
        GraphNode(
            id=node.id,
            dependencies=tuple(node.dependencies),
            state=states[node.id]["state"],
            task_id=states[node.id]["task_id"],
            detail=str(states[node.id]["reason"] or ""),
        )
        for node in spec.nodes
    ]
    # render_svg escapes every name and detail it writes: its output is markup, not data
    svg = Markup(render_svg(graph, title=f"DAG run {run_id} ({view['name']})"))
    live = view["status"] == DagRunStatus.RUNNING
    return {"run": view, "nodes": nodes, "svg": svg, "live": live, "poll_s": POLL_S}
