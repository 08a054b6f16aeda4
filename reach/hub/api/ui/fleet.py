"""Fleet pages: ``/ui`` (agents and their instances) and ``/ui/instances/{id}``.

They read what ``GET /api/v1/agents`` and ``/api/v1/instances/{id}/events`` read, through
the same service functions (`reach.hub.fleet.registry`, `reach.hub.fleet.reachability`).
The instance
page's chart is the probe window the hub keeps (the last ``probe.window`` probes): the RTT
of each probe, and the ReachScore those probes alone give (the heartbeat sub-score held at
its current value), drawn by `reach.core.ops.charts`.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from reach.core.fleet.scoring import ProbeWindow, reach_score
from reach.core.ledger.statuses import InstanceStatus
from reach.core.ops import charts, paging
from reach.core.security.auth import Action
from reach.errors import BadCursor, InvalidQuery
from reach.hub.api.ui.pages import PageNotFound, Viewer, render, require_ui
from reach.hub.context import HubContext
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.storage.models import AgentRow, InstanceRow

ReadsFleet = Annotated[Viewer, Depends(require_ui(Action.READ_FLEET))]
CHART = charts.Box(width=560, height=120, pad=4)
EVENT_LIMIT = 200
STATUSES = [s.value for s in InstanceStatus]
PAGE_SIZE = 100  # agents per fleet page


def router(ctx: HubContext) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui")
    def fleet(
        request: Request,
        viewer: ReadsFleet,
        tag: Annotated[str, Query(max_length=512)] = "",
        capability: Annotated[str, Query(max_length=256)] = "",
        status: Annotated[str, Query(max_length=32)] = "",
        cursor: Annotated[str, Query(max_length=512)] = "",
    ) -> HTMLResponse:
        tags = tuple(tag.split(","))  # AgentFilter trims them and drops the blank ones
        error = ""
        if status and status not in STATUSES:
            error = f"unknown status {status!r}: one of {', '.join(STATUSES)}"
            status = ""
        try:
            flt = registry.AgentFilter(
                tag=tags, capability=capability or None, status=status or None
            )
        except InvalidQuery as exc:  # e.g. a NUL in a filter: shown, never a 500
            error = str(exc)
            flt = registry.AgentFilter(status=status or None)
        now = ctx.clock.now()
        after = None
        if cursor:
            try:
                after = paging.decode_key_cursor(registry.AGENTS, cursor)
            except BadCursor as exc:
                error = str(exc)
        with ctx.reading() as session:  # one page: the fleet may be thousands of agents
            agents, last = registry.list_agents(
                session, flt, now, ctx.policy, after=after, limit=PAGE_SIZE
            )
        instances = sum(len(a["instances"]) for a in agents)
        shown = {"tag": tag, "capability": capability, "status": status}
        kept = {k: v for k, v in shown.items() if v}
        context = {
            "next_href": "/ui?"
            + urlencode({**kept, "cursor": paging.encode_key_cursor(registry.AGENTS, last)})
            if last
            else None,
            "agents": agents,
            "instance_count": instances,
            "filters": {"tag": tag, "capability": capability, "status": status},
            "statuses": STATUSES,
            "error": error,
            "now": now,
        }
        return render(request, viewer, "fleet.html", context, active="fleet")

    @router.get("/ui/instances/{instance_id}")
    def instance(request: Request, instance_id: str, viewer: ReadsFleet) -> HTMLResponse:
        now = ctx.clock.now()
        with ctx.reading() as session:
            row = session.get(InstanceRow, instance_id)
            if row is None:
                raise PageNotFound(f"instance {instance_id!r} is not registered")
            agent = session.get(AgentRow, row.agent_id)
            view = registry.instance_view(row, now, ctx.policy)
            events = [
                {"kind": e.kind, "at": e.at, "detail": e.detail}
                for e in monitoring.events(session, instance_id, EVENT_LIMIT)
            ]
            window = monitoring.window_of(row, ctx.policy.window)
        context = {
            "agent_id": row.agent_id,
            "trust_level": agent.trust_level if agent is not None else None,
            "inst": view,
            "events": events,
            "chart": probe_chart(window, view["heartbeat_age_s"], ctx.policy),
            "now": now,
        }
        return render(request, viewer, "instance.html", context, active="fleet")

    return router


def probe_chart(window: ProbeWindow, heartbeat_age_s: float, policy: Policy) -> dict[str, Any]:
    """The chart's paths and labels: RTT per probe, and the score after each probe."""
    samples = window.samples
    rtts: list[float | None] = [s.rtt_ms if s.ok else None for s in samples]
    scores: list[float | None] = []
    for i in range(len(samples)):
        prefix = ProbeWindow(samples[: i + 1], window.size)
        scores.append(
            reach_score(heartbeat_age_s, prefix.smoothed_rtt_ms, prefix.loss_rate, policy.score)
        )
    xs = [s.at for s in samples]
    rtt_top = charts.y_top(rtts)
    fails: list[tuple[float, float | None]] = []
    for s in samples:
        if not s.ok:
            fails += [(s.at, 0.0), (s.at, None)]
    return {
        "box": CHART,
        "samples": len(samples),
        "failed": sum(1 for s in samples if not s.ok),
        "rtt_path": charts.path(list(zip(xs, rtts, strict=True)), CHART, (0, rtt_top)),
        "score_path": charts.path(list(zip(xs, scores, strict=True)), CHART, (0, 100)),
        "rtt_top": rtt_top,
        "first_at": xs[0] if xs else None,
        "last_at": xs[-1] if xs else None,
        # a failed probe has no RTT: a dot on the axis where it happened
        "fail_path": charts.path(fails, CHART, (0, 1), (xs[0], xs[-1]) if xs else None),
    }
