"""What every dashboard page shares: the templates, who is looking, rendering, refusals.

A page is a route that depends on `require_ui` (reads) or `ui_action` (POSTs: the CSRF
token is checked too) and returns `render`::

    @router.get("/ui/things")
    def things(request: Request, viewer: Annotated[Viewer, Depends(require_ui(Action.READ_FLEET))]):
        return render(request, viewer, "things.html", {"things": ...}, active="things")

Not signed in: a redirect to ``/ui/login``; a scope without the action: a 403 page; a POST
without this session's CSRF token: a 403 page, and the route never runs.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reach.core.security.auth import Action, Principal, permits
from reach.hub.api import signin
from reach.hub.api.auth import forbidden
from reach.hub.api.signin import UiSession
from reach.hub.context import HubContext

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
LOGIN = "/ui/login"

env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,  # every value is escaped; nothing in a template is marked safe
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who is looking at a page: their principal, their session (its CSRF token), and
    whether the hub runs open (no sign-in needed; the layout says so)."""

    principal: Principal
    session: UiSession | None
    open_hub: bool

    def may(self, action: Action) -> bool:
        """Whether this viewer's scope includes ``action`` (show or hide a button)."""
        return permits(self.principal, action)

    @property
    def csrf(self) -> str:
        """The CSRF token to put in every POST form (``csrf_field()`` in a template)."""
        return self.session.csrf_token() if self.session is not None else ""

    @property
    def signed_in(self) -> bool:
        return not self.principal.anonymous

    @property
    def label(self) -> str:
        """The signed-in identity as the layout shows it (never a secret)."""
        if self.principal.anonymous:
            return "anonymous (open hub)"
        name = f"{self.principal.name} " if self.principal.name else ""
        return f"{name}(key {self.principal.key_id}, {self.principal.scope.value})"


class SignInNeeded(Exception):
    """Not signed in: answered with a redirect to the sign-in page."""


class PageRefused(Exception):
    """Answered with the 403 page: the scope lacks the action, or the CSRF token is wrong."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class PageNotFound(Exception):
    """Answered with the 404 page."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def viewer_of(request: Request) -> Viewer | None:
    """The viewer `AuthMiddleware` resolved for this request, or None (sign in first)."""
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):
        return None
    session = getattr(request.state, "ui_session", None)
    return Viewer(
        principal,
        session if isinstance(session, UiSession) else None,
        not request.app.state.require_auth,
    )


def require_ui(action: Action) -> Callable[[Request], Awaitable[Viewer]]:
    """A dependency yielding the `Viewer` when signed in with a scope that includes
    ``action``; a redirect to the sign-in page or the 403 page otherwise."""

    async def dependency(request: Request) -> Viewer:
        viewer = viewer_of(request)
        if viewer is None:
            raise SignInNeeded()
        if not viewer.may(action):
            detail = f"{article(viewer.principal.scope.value)} key may not do this ({action.value})"
            await run_in_threadpool(forbidden, request, viewer.principal, action, detail)
            raise PageRefused(detail)
        return viewer

    dependency.__name__ = f"require_ui_{action.value}"
    return dependency


def ui_action(action: Action) -> Callable[[Request], Awaitable[Viewer]]:
    """`require_ui` for a POST: the form field ``csrf_token`` (or an ``X-CSRF-Token``
    header, for htmx requests) must be this session's token, else 403 and nothing runs."""
    allowed = require_ui(action)

    async def dependency(request: Request) -> Viewer:
        viewer = await allowed(request)
        await check_csrf(request, viewer.session)
        return viewer

    dependency.__name__ = f"ui_action_{action.value}"
    return dependency


async def check_csrf(request: Request, session: UiSession | None) -> None:
    presented = request.headers.get(signin.CSRF_HEADER)
    if presented is None:
        form = await request.form()
        value = form.get(signin.CSRF_FIELD)
        presented = value if isinstance(value, str) else None
    if session is None or not session.csrf_ok(presented):
        raise PageRefused("this form has expired or did not come from this dashboard: reload")


def render(
    request: Request,
    viewer: Viewer | None,
    template: str,
    context: Mapping[str, Any] | None = None,
    *,
    active: str = "",
    status_code: int = 200,
) -> HTMLResponse:
    """``template`` rendered with ``viewer``, ``active`` (the nav entry to highlight) and
    ``context``. A visitor without a session gets one (anonymous until they sign in),
    so every form has a CSRF token to carry."""
    ctx: HubContext = request.app.state.ctx
    cookie: str | None = None
    session = getattr(request.state, "ui_session", None)
    if not isinstance(session, UiSession):
        session, cookie = new_session(ctx, None)
        request.state.ui_session = session
        if viewer is not None:
            viewer = Viewer(viewer.principal, session, viewer.open_hub)
    values = {
        **(context or {}),
        "viewer": viewer,
        "active": active,
        "request_path": request.url.path,
        "csrf_token": session.csrf_token(),
    }
    html = env.get_template(template).render(values)
    response = HTMLResponse(html, status_code=status_code, headers=NO_STORE)
    if cookie is not None:
        set_cookie(request, response, cookie)
    return response


NO_STORE = {"Cache-Control": "no-store", "X-Frame-Options": "DENY"}

# What a dashboard page may load: scripts, styles and connections (htmx's requests, its SSE
# extension's streams) from the hub itself only; no inline script or style, no eval, no
# plugin, no framing; forms post back here only. Everything the pages use is a file under
# /ui/static; the templates carry no inline script or style attribute.
CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    )
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


class DashboardHeaders:
    """Every answer under ``/`` and ``/ui`` (pages, fragments, streams, redirects and
    refusals alike) carries `CSP` and its companions: a middleware, so no route can
    forget them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path") or ""
        dashboard = path in ("/", signin.COOKIE_PATH) or path.startswith(signin.COOKIE_PATH + "/")
        if scope["type"] != "http" or not dashboard:
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in PAGE_HEADERS.items():
                    if name not in headers:
                        headers.append(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def new_session(ctx: HubContext, key_id: str | None) -> tuple[UiSession, str]:
    """A new session and its cookie (nothing is read or written: anyone may ask for a
    page, and must not be able to touch the database by it)."""
    return signin.new_session(signin.mac_key(ctx.seal), key_id, ctx.clock.now())


def set_cookie(request: Request, response: Response, value: str) -> None:
    response.set_cookie(
        signin.COOKIE,
        value,
        max_age=int(signin.SESSION_TTL_S),
        path=signin.COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def clear_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        signin.COOKIE,
        path=signin.COOKIE_PATH,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


def install_handlers(app: FastAPI) -> None:
    """Answer the dashboard's refusals as pages (a browser, not an API client, asked)."""

    async def sign_in(request: Request, exc: Exception) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        response = RedirectResponse(f"{LOGIN}?next={quote(target, safe='')}", status_code=303)
        if getattr(request.state, "ui_session", None) is not None:
            clear_cookie(request, response)  # its key was revoked or expired
        return response

    async def refused(request: Request, exc: Exception) -> Response:
        detail = exc.detail if isinstance(exc, PageRefused) else "forbidden"
        return render(
            request, viewer_of(request), "error.html", _error(403, detail), status_code=403
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        detail = exc.detail if isinstance(exc, PageNotFound) else "not found"
        return render(
            request, viewer_of(request), "error.html", _error(404, detail), status_code=404
        )

    app.add_exception_handler(SignInNeeded, sign_in)
    app.add_exception_handler(PageRefused, refused)
    app.add_exception_handler(PageNotFound, not_found)


def article(word: str) -> str:
    """``a viewer``, ``an admin``."""
    return f"{'an' if word[:1] in 'aeiou' else 'a'} {word}"


def _error(status: int, detail: str) -> dict[str, Any]:
    title = {403: "Forbidden", 404: "Not found"}.get(status, "Error")
    return {"status": status, "title": title, "detail": detail}


# -- template filters ------------------------------------------------------------------


def _when(ts: float | None) -> str:
    if ts is None:
        return "—"
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "never"
    secs = max(0.0, now - float(ts))
    if secs < 120:
        return f"{secs:.0f}s ago"
    if secs < 7200:
        return f"{secs / 60:.0f}m ago"
    return f"{secs / 3600:.1f}h ago"


def _pretty(value: Any) -> str:
    """JSON, indented, for a <pre> (escaped by the template like everything else)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    try:
        return f"{float(value):.{digits}f}"
    except (TypeError, ValueError):
        return str(value)


def _pct(value: Any) -> str:
    if value is None:
        return "—"
    try:
        return f"{float(value) * 100:.0f}%"
    except (TypeError, ValueError):
        return str(value)


@jinja2.pass_context
def _csrf_field(context: jinja2.runtime.Context) -> Markup:
    """``{{ csrf_field() }}``: the hidden input every POST form carries."""
    token = context.get("csrf_token", "")
    return Markup('<input type="hidden" name="{}" value="{}">').format(signin.CSRF_FIELD, token)


env.filters.update(when=_when, ago=_ago, pretty=_pretty, num=_num, pct=_pct)
env.globals.update(csrf_field=_csrf_field, Action=Action, csrf_header=signin.CSRF_HEADER)
