"""The alerts page: ``/ui/alerts``, newest first, filtered by kind and time, paged.

It reads `reach.hub.ops.alerts.list_alerts`, the service of ``GET /api/v1/alerts``: heartbeat
lost, business-unreachable, failing, offline / unreachable, breaker opened / closed,
dependency loop suspected / calmed, backpressure (429 refusals), dead letters. Kinds an
admin muted are hidden unless ``include_muted``, and named above the list. Reading needs
``read_fleet`` (admins and viewers).
"""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from reach.core.ops.paging import Page, parse_instant
from reach.core.security.auth import Action
from reach.errors import InvalidQuery
from reach.hub.api.ui.pages import Viewer, render, require_ui
from reach.hub.context import HubContext
from reach.hub.ops import alerts

ReadsFleet = Annotated[Viewer, Depends(require_ui(Action.READ_FLEET))]
PAGE_SIZE: Final = 100
KINDS: Final = sorted(alerts.KINDS)
SEVERITY: Final = {
    "breaker_closed": "alert-ok",
    "dependency_loop_calmed": "alert-ok",
    "heartbeat_lost": "alert-warn",
    "business_unreachable": "alert-warn",
    "backpressure": "alert-warn",
}
"""The pill class of a kind; the others (failing, offline, breaker opened ...) are bad."""


def router(ctx: HubContext) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/alerts")
    def alert_list(
        request: Request,
        viewer: ReadsFleet,
        kind: Annotated[str, Query(max_length=64)] = "",
        since: Annotated[str, Query(max_length=64)] = "",
        cursor: Annotated[str, Query(max_length=1024)] = "",
        include_muted: bool = False,
    ) -> HTMLResponse:
        error = ""
        page = Page([])
        try:
            start = parse_instant(since.strip() or None, ctx.clock.now(), name="since")
            kinds = alerts.parse_kinds(kind or None)
            page = alerts.list_alerts(
                ctx, set(kinds), start, cursor or None, PAGE_SIZE, include_muted=include_muted
            )
        except InvalidQuery as exc:  # an unknown kind, a bad time, a forged cursor
            error = exc.detail
        with ctx.reading() as session:
            muted = sorted(alerts.muted_kinds(session))
        context = {
            "items": page.items,
            "next_cursor": page.next_cursor,
            "muted_kinds": muted,
            "filters": {"kind": kind, "since": since, "include_muted": include_muted},
            "kinds": KINDS,
            "severity": SEVERITY,
            "error": error,
            "now": ctx.clock.now(),
        }
        return render(request, viewer, "alerts.html", context, active="alerts")

    return router
