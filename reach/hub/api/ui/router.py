"""The dashboard's routes: ``/`` → ``/ui``, the static files, sign-in and sign-out, and
every page package (`install_ui` is what the app calls)."""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, FastAPI, Form, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from reach.core.security.auth import Scope
from reach.hub.api import signin
from reach.hub.api.auth import LOCKED_OUT, _log_refusal, client_host
from reach.hub.api.lockout import AuthLockout
from reach.hub.api.ui import alerts, approvals, dagruns, deadletters, fleet, tasks
from reach.hub.api.ui.pages import (
    LOGIN,
    NO_STORE,
    STATIC,
    DashboardHeaders,
    article,
    check_csrf,
    clear_cookie,
    install_handlers,
    new_session,
    render,
    set_cookie,
    viewer_of,
)
from reach.hub.context import HubContext
from reach.hub.ledger.streams import StreamHub
from reach.hub.security import apikeys
from reach.hub.security.apikeys import Refusal

APPROVALS = "/ui/approvals"
_STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
_STATIC_TYPES[".txt"] = "text/plain; charset=utf-8"
NOT_FOR_SIGN_IN = (
    "{scope} key cannot sign in to the dashboard: use an admin, viewer or approver key"
)


def install_ui(app: FastAPI, ctx: HubContext, stream_hub: StreamHub) -> None:
    """Mount the dashboard on ``app`` (its routes, its refusal pages and its headers)."""
    install_handlers(app)
    app.add_middleware(DashboardHeaders)  # outermost: refusals by AuthMiddleware too
    app.include_router(_base_router(ctx))
    app.include_router(fleet.router(ctx))
    app.include_router(tasks.router(ctx, stream_hub))
    app.include_router(dagruns.router(ctx))
    app.include_router(deadletters.router(ctx))
    app.include_router(approvals.router(ctx))
    app.include_router(alerts.router(ctx))


def _base_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(include_in_schema=False)
    files = {
        p.name: (p.read_bytes(), _STATIC_TYPES[p.suffix])
        for p in STATIC.iterdir()
        if p.suffix in _STATIC_TYPES
    }

    @router.get("/")
    def root() -> RedirectResponse:
        return RedirectResponse("/ui", status_code=307)

    @router.get("/ui/static/{name}")
    def static(name: str) -> Response:
        found = files.get(name)
        if found is None:
            return Response("not found", status_code=404, media_type="text/plain")
        body, media_type = found
        return Response(body, media_type=media_type, headers={"Cache-Control": "max-age=3600"})

    @router.get("/ui/login")
    def login_form(request: Request, next: str = "/ui") -> Response:
        viewer = viewer_of(request)
        if viewer is not None and viewer.signed_in:
            return RedirectResponse(_safe_next(next), status_code=303)
        return render(request, viewer, "login.html", {"next": _safe_next(next), "error": ""})

    @router.post("/ui/login")
    async def login(
        request: Request,
        api_key: Annotated[str, Form(max_length=256)] = "",
        next: Annotated[str, Form(max_length=2048)] = "/ui",
    ) -> Response:
        await check_csrf(request, getattr(request.state, "ui_session", None))
        lockout: AuthLockout = request.app.state.auth_lockout
        host, now = client_host(request.scope), ctx.clock.now()
        wait = lockout.locked_for(host, now)
        if wait is not None:  # the key is not even checked (reach.hub.api.auth)
            seconds = max(1, math.ceil(wait))
            said = LOCKED_OUT.format(seconds=seconds)
            _log_refusal("POST", LOGIN, Refusal("locked_out", said))
            context = {"next": _safe_next(next), "error": said}
            page = render(request, viewer_of(request), "login.html", context, status_code=429)
            page.headers["Retry-After"] = str(seconds)
            return page
        key_id, said, failed = await run_in_threadpool(_check_key, ctx, api_key.strip())
        if key_id is None:
            if failed:
                lockout.failed(host, now)
            context = {"next": _safe_next(next), "error": said}
            return render(request, viewer_of(request), "login.html", context, status_code=401)
        _, cookie = await run_in_threadpool(new_session, ctx, key_id)
        target = _safe_next(next)
        if said == Scope.APPROVER and target == "/ui":  # the approvals are what it may read
            target = APPROVALS
        response = RedirectResponse(target, status_code=303, headers=NO_STORE)
        set_cookie(request, response, cookie)  # a new session id: none is ever reused
        return response

    @router.post("/ui/logout")
    async def logout(request: Request) -> Response:
        session = getattr(request.state, "ui_session", None)
        await check_csrf(request, session)
        if isinstance(session, signin.UiSession) and session.key_id is not None:
            now = ctx.clock.now()
            await run_in_threadpool(ctx.write, lambda db: signin.sign_out(db, session, now))
        response = RedirectResponse(LOGIN, status_code=303, headers=NO_STORE)
        clear_cookie(request, response)
        return response

    return router


def _check_key(ctx: HubContext, secret: str) -> tuple[str | None, str, bool]:
    """The key id ``secret`` signs in as and its scope, or None, why not (for the sign-in
    page) and whether that was a failed authentication (an empty field is not, nor a
    valid key of a scope that may not sign in)."""
    if not secret:
        return _refuse(Refusal("missing", "enter an API key"))
    with ctx.reading() as session:
        checked = apikeys.check(session, secret, ctx.clock.now())
    if isinstance(checked, Refusal):
        return _refuse(checked)
    if checked.scope not in signin.SIGN_IN_SCOPES or checked.key_id is None:
        detail = NOT_FOR_SIGN_IN.format(scope=article(checked.scope.value))
        return _refuse(Refusal("scope", detail, checked.key_id))
    return checked.key_id, checked.scope.value, False


def _refuse(refusal: Refusal) -> tuple[None, str, bool]:
    _log_refusal("POST", LOGIN, refusal)
    return None, refusal.detail, refusal.reason not in ("missing", "scope")


def _safe_next(target: str) -> str:
    """Only a dashboard path: never another site (``//evil``) or anywhere else."""
    if target.startswith("/ui") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui"
