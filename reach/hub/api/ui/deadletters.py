"""Dead-letter pages: ``/ui/dead-letters`` (list, replay many) and ``/ui/dead-letters/{id}``.

They read and replay through `reach.hub.ops.deadletters`, the service of
``/api/v1/dead-letters``: a replay from here is the API's replay (one transaction per dead
letter, published after its commit, the operator recorded as the event's actor), and a
refusal (unknown, already replayed, its task no longer dead) is shown on the page with
nothing changed. Replaying needs ``administer`` (admins); reading, ``read_fleet``.

Every replay is confirmed: the buttons carry ``hx-confirm`` (the browser's dialog) and
send ``confirmed=1`` only after it; a plain form post without it (no JavaScript) gets a
confirmation page instead, whose button sends it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

from reach.core.security.auth import Action
from reach.errors import InvalidQuery
from reach.hub.api.ui.pages import PageNotFound, Viewer, render, require_ui, ui_action
from reach.hub.context import HubContext
from reach.hub.ops import deadletters
from reach.hub.ops.deadletters import MAX_REPLAY_MANY, ReplayOutcome
from reach.hub.storage.models import DeadLetterRow
from reach.wire.schemas import DB_INT_MAX

ReadsFleet = Annotated[Viewer, Depends(require_ui(Action.READ_FLEET))]
Replays = Annotated[Viewer, Depends(ui_action(Action.ADMINISTER))]
LIST_LIMIT: Final = 200


def router(ctx: HubContext) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui/dead-letters")
    def dead_letters(
        request: Request,
        viewer: ReadsFleet,
        show: Annotated[str, Query(max_length=16)] = "",
    ) -> HTMLResponse:
        return _list_page(ctx, request, viewer, show == "all")

    @router.get("/ui/dead-letters/{dead_id}")
    def dead_letter(request: Request, dead_id: str, viewer: ReadsFleet) -> HTMLResponse:
        return _detail_page(ctx, request, viewer, _id_or_404(dead_id))

    @router.post("/ui/dead-letters/replay")
    async def replay_many(request: Request, viewer: Replays) -> HTMLResponse:
        form = await request.form()
        show_all = form.get("show") == "all"
        try:
            ids = _ids(form.getlist("ids"))
            if not ids:
                raise InvalidQuery("select at least one dead letter to replay", name="ids")
            if len(ids) > MAX_REPLAY_MANY:
                raise InvalidQuery(
                    f"at most {MAX_REPLAY_MANY} dead letters per replay, not {len(ids)}",
                    name="ids",
                )
        except InvalidQuery as exc:
            return await run_in_threadpool(
                _list_page, ctx, request, viewer, show_all, error=exc.detail, status_code=422
            )
        if form.get("confirmed") != "1":
            return await run_in_threadpool(
                _confirm_page, ctx, request, viewer, ids, show_all, "/ui/dead-letters/replay"
            )
        outcomes = await run_in_threadpool(
            deadletters.replay_many, ctx, ids, viewer.principal.identity
        )
        return await run_in_threadpool(
            _list_page, ctx, request, viewer, show_all, outcomes=outcomes
        )

    @router.post("/ui/dead-letters/{dead_id}/replay")
    async def replay_one(request: Request, dead_id: str, viewer: Replays) -> HTMLResponse:
        number = _id_or_404(dead_id)
        form = await request.form()
        if form.get("confirmed") != "1":
            return await run_in_threadpool(
                _confirm_page, ctx, request, viewer, [number], False, request.url.path
            )
        (outcome,) = await run_in_threadpool(
            deadletters.replay_many, ctx, [number], viewer.principal.identity
        )
        if outcome.status == 404:
            raise PageNotFound(outcome.detail)
        return await run_in_threadpool(
            _detail_page, ctx, request, viewer, number, outcome, outcome.status
        )

    return router


def _id_or_404(raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= DB_INT_MAX:
        raise PageNotFound(f"dead letter {raw!r} does not exist")
    return int(raw)


def _ids(values: list[Any]) -> list[int]:
    """The dead-letter ids a form named, in order, once each; anything else is refused."""
    ids: list[int] = []
    for value in values:
        text = value.strip() if isinstance(value, str) else ""
        if not text.isdigit() or not 1 <= int(text) <= DB_INT_MAX:
            raise InvalidQuery(f"{text[:40]!r} is not a dead-letter id", name="ids")
        ids.append(int(text))
    return list(dict.fromkeys(ids))


def _list_page(
    ctx: HubContext,
    request: Request,
    viewer: Viewer,
    show_all: bool,
    *,
    outcomes: list[ReplayOutcome] | None = None,
    error: str = "",
    status_code: int = 200,
) -> HTMLResponse:
    with ctx.reading() as session:
        rows = [deadletters.view(r) for r in deadletters.list_dead(session, show_all, LIST_LIMIT)]
    context = {
        "rows": rows,
        "show_all": show_all,
        "outcomes": outcomes or [],
        "error": error,
        "limit": LIST_LIMIT,
        "now": ctx.clock.now(),
    }
    return render(
        request, viewer, "dead_letters.html", context, active="dead-letters",
        status_code=status_code,
    )  # fmt: skip


def _detail_page(
    ctx: HubContext,
    request: Request,
    viewer: Viewer,
    dead_id: int,
    outcome: ReplayOutcome | None = None,
    status_code: int = 200,
) -> HTMLResponse:
    with ctx.reading() as session:
        row = session.get(DeadLetterRow, dead_id)
        if row is None:
            raise PageNotFound(f"dead letter {dead_id} does not exist")
        view = deadletters.view(row)
    context = {"dl": view, "outcome": outcome}
    return render(
        request, viewer, "dead_letter.html", context, active="dead-letters",
        status_code=status_code,
    )  # fmt: skip


def _confirm_page(
    ctx: HubContext, request: Request, viewer: Viewer, ids: list[int], show_all: bool, action: str
) -> HTMLResponse:
    """Which dead letters a replay would revive, and a button that really replays them."""
    with ctx.reading() as session:
        rows = [session.get(DeadLetterRow, i) for i in ids]
    found = [deadletters.view(r) for r in rows if r is not None]
    missing = [i for i, r in zip(ids, rows, strict=True) if r is None]
    context = {
        "ids": ids,
        "rows": found,
        "missing": missing,
        "action": action,
        "show_all": show_all,
    }
    return render(request, viewer, "dead_letters_confirm.html", context, active="dead-letters")
