"""Who is asking: every API request's `Principal`, and the refusals when it may not.

`AuthMiddleware` authenticates each request before its body is read (a request without a
valid credential is refused with 401 whatever it carries) and leaves the principal on
``request.state.principal``. Routes then demand what they do::

    def submit(principal: Annotated[Principal, Depends(require(Action.SUBMIT))]) ...

and check ownership with `reach.core.security.auth` (`may_act_for`, `may_read_task`), refusing
with `forbidden` (403) or `not_yours` (logged, then the route's usual 404).

An open hub (``require_auth`` off) gives a request without credentials the `OPEN`
principal; a credential that *is* presented is checked all the same, so a typo'd or
revoked key fails loudly instead of silently running as anonymous admin.

The dashboard (``/``, ``/ui/...``; `reach.hub.api.ui`) also takes its session cookie, and
lets a request without any credential through with no principal: its pages answer a
browser with a redirect to ``/ui/login``, not a 401 problem; ``/ui/static/`` is public.

Refusals are logged to ``reach.security`` (method, path, reason and the key id, never
the secret) and counted in ``agentreach_auth_refusals_total{reason}``. Each failed
credential is also a failure of the client's address: past ``security.auth_failures_max``
within ``security.auth_failures_window_s`` the address is locked out (`AuthLockout`): its
credentials are not checked, and it gets 429 ``too-many-auth-failures`` with
``Retry-After`` (reason ``locked_out``) until the window frees. The dashboard's sign-in
form counts on the same record.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Receive, Scope, Send

from reach.core.security.auth import (
    OPEN,
    Action,
    Principal,
    bearer_of,
    may_act_for,
    permits,
    undeclarable,
)
from reach.errors import Forbidden, ReachError, TooManyAuthFailures, Unauthenticated
from reach.hub import metrics
from reach.hub.api import signin
from reach.hub.api.lockout import AuthLockout
from reach.hub.api.problems import PROBLEM_JSON
from reach.hub.context import HubContext
from reach.hub.security import apikeys, audit
from reach.hub.security.apikeys import Refusal
from reach.wire.schemas import RegisterRequest

log = logging.getLogger("reach.security")

# Paths anyone may read: liveness and the public keys agents verify reach tokens with.
# The API's description (``/openapi.json``) takes any valid key once auth is on; its
# browsable pages (``/docs``, ``/redoc``) are not served then at all (`reach.hub.api.app`).
OPEN_PATHS = frozenset({"/healthz", "/.well-known/jwks.json"})

INTERNAL_CHANNEL = "/internal/channel/"  # reach.hub.interop.channel.INTERNAL_PREFIX
BLOB_LINKS = "/v1/blobs/"  # a signed read of a blob (reach.hub.api.routes.blobs) needs no key
MISSING = "an API key is required: send 'Authorization: Bearer <key>'"
MALFORMED = "malformed Authorization header: expected 'Bearer <key>'"
LOCKED_OUT = "too many failed authentications from this address: try again in {seconds} s"


class AuthMiddleware:
    """Resolve the principal of every request (see the module docstring)."""

    def __init__(
        self, app: ASGIApp, ctx: HubContext, require_auth: bool, lockout: AuthLockout
    ) -> None:
        self.app = app
        self.ctx = ctx
        self.require_auth = require_auth
        self.lockout = lockout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path") or ""
        # the channel's internal deliveries check their own per-socket secret
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith(INTERNAL_CHANNEL):
            await self.app(scope, receive, send)
            return
        if is_signed_read(scope):  # the link is the credential: its route checks it
            await self.app(scope, receive, send)
            return
        if path == "/" or path == signin.COOKIE_PATH or path.startswith(signin.COOKIE_PATH + "/"):
            await self._dashboard(scope, receive, send)
            return
        header = _authorization(scope)
        if header is None and not self.require_auth:
            principal: Principal | ReachError = OPEN
        elif header is None:
            missing = Refusal("missing", MISSING)
            _log_refusal(scope.get("method", ""), scope.get("path", ""), missing)
            principal = missing.error()
        else:
            principal = await self._authenticate(scope, header)
        if isinstance(principal, ReachError):
            await _answer(principal, scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)

    async def _authenticate(self, scope: Scope, header: str) -> Principal | ReachError:
        """The principal ``header`` stands for, or the error to answer with: a refusal
        (logged, counted, and a failure of this client address), 429 while the address is
        locked out (`reach.hub.api.lockout`; the header is not even checked), or 503 when
        the database is down."""
        host = client_host(scope)
        now = self.ctx.clock.now()
        wait = self.lockout.locked_for(host, now)
        if wait is not None:
            seconds = max(1, math.ceil(wait))
            _log_refusal(
                scope.get("method", ""),
                scope.get("path", ""),
                Refusal("locked_out", LOCKED_OUT.format(seconds=seconds)),
            )
            return TooManyAuthFailures(LOCKED_OUT.format(seconds=seconds), retry_after=seconds)
        try:
            checked = await run_in_threadpool(self._check, header)
        except ReachError as exc:  # the database is down: 503, as any other request
            return exc
        if isinstance(checked, Refusal):
            self.lockout.failed(host, now)
            _log_refusal(scope.get("method", ""), scope.get("path", ""), checked)
            return checked.error()
        return checked

    async def _dashboard(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The dashboard (``reach.hub.api.ui``): a bearer key is checked as anywhere; otherwise
        the session cookie names the principal. Without either the request goes on with
        no principal (an open hub's: `OPEN`), and the page redirects to the sign-in."""
        if scope["path"].startswith(signin.COOKIE_PATH + "/static/"):  # htmx, css: public
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        header = _authorization(scope)
        if header is not None:
            checked = await self._authenticate(scope, header)
            if isinstance(checked, ReachError):
                await _answer(checked, scope, receive, send)
                return
            state["principal"] = checked
            await self.app(scope, receive, send)
            return
        cookie = cookie_parser(_header(scope, b"cookie") or "").get(signin.COOKIE)
        principal: Principal | None = None
        if cookie:
            try:
                ui, principal = await run_in_threadpool(self._session, cookie)
            except ReachError as exc:
                await _answer(exc, scope, receive, send)
                return
            if ui is not None:
                state["ui_session"] = ui
        if principal is None and not self.require_auth:
            principal = OPEN
        if principal is not None:
            state["principal"] = principal
        await self.app(scope, receive, send)

    def _session(self, cookie: str) -> tuple[signin.UiSession | None, Principal | None]:
        now = self.ctx.clock.now()
        with self.ctx.reading() as session:
            ui = signin.open_session(session, cookie, now, signin.mac_key(self.ctx.seal))
            return ui, (signin.principal_of(session, ui, now) if ui is not None else None)

    def _check(self, header: str) -> Principal | Refusal:
        secret = bearer_of(header)
        if secret is None:
            return Refusal("malformed", MALFORMED)
        with self.ctx.reading() as session:
            return apikeys.check(session, secret, self.ctx.clock.now())


def is_signed_read(scope: Scope) -> bool:
    """A GET of one blob that carries a link's signature (``?exp=..&sig=..``)."""
    path: str = scope.get("path") or ""
    query: bytes = scope.get("query_string") or b""
    return scope.get("method") == "GET" and path.startswith(BLOB_LINKS) and b"sig=" in query


def principal_of(request: Request) -> Principal:
    """The request's principal (`AuthMiddleware` put it there; a route outside the app's
    middleware, which should not exist, is refused rather than run as anyone)."""
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):
        raise Unauthenticated(MISSING)
    return principal


def require(action: Action) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency yielding the request's principal if its scope includes ``action``;
    403 ``forbidden`` (logged, counted, audited) otherwise."""

    async def dependency(request: Request) -> Principal:
        principal = principal_of(request)
        if not permits(principal, action):
            raise await run_in_threadpool(
                forbidden,
                request,
                principal,
                action,
                f"a {principal.scope.value} key may not {_VERBS[action]}",
            )
        return principal

    dependency.__name__ = f"require_{action.value}"
    return dependency


def forbidden(
    request: Request,
    principal: Principal,
    action: Action,
    detail: str,
    *,
    target: str = "",
    task_id: str | None = None,
    reason: str = "forbidden",
) -> Forbidden:
    """The 403 to raise for ``principal``, logged, counted, and written to the audit log
    (in its own transaction: the refused request's own work rolls back when it raises).

    Only forbidden attempts of a known key reach the audit log. Unauthenticated ones are
    logged and counted but not stored: anyone can send them, as fast as they like, and a
    table anyone can grow (holding the write lock on SQLite as they do) is a way to take
    the hub down; a forbidden attempt names a real key an admin can look up and revoke.
    """
    method, path = request.method, request.url.path
    key_id = principal.key_id
    _log_refusal(method, path, Refusal(reason, detail, key_id))
    if key_id is not None:
        ctx: HubContext = request.app.state.ctx
        try:
            ctx.write(
                lambda s: audit.record(
                    s,
                    actor=principal.identity,
                    action=action.value,
                    outcome=audit.REFUSED,
                    now=ctx.clock.now(),
                    target=target or path,
                    task_id=task_id,
                    detail={"method": method, "path": path, "reason": reason, "detail": detail},
                )
            )
        except Exception:  # the refusal stands even if its record cannot be written
            log.exception("could not audit a refused %s %s (key %s)", method, path, key_id)
    return Forbidden(detail)


def demand_agent(request: Request, principal: Principal, agent_id: str, action: Action) -> None:
    """403 unless ``principal`` may act for ``agent_id`` (register, heartbeat, deregister)."""
    if not may_act_for(principal, agent_id):
        raise forbidden(
            request,
            principal,
            action,
            f"this key may not act for agent {agent_id!r}",
            target=f"agent:{agent_id}",
            reason="wrong_agent",
        )


def check_declarable(principal: Principal, declared: RegisterRequest) -> None:
    """`Forbidden` (403) when a registration declares a capability or tag beyond its
    key's allow-lists (``reach keys allow``, issue 37: no squatting on another team's tag
    or capability); an admin widens the lists, nothing else does."""
    beyond = undeclarable(principal, declared.tags, [c.type for c in declared.capabilities])
    if beyond:
        raise Forbidden(
            f"this key may not declare {', '.join(beyond)}: an admin allows them "
            "(reach keys allow)",
            undeclarable=beyond,
        )


def not_yours(request: Request, principal: Principal, what: str) -> None:
    """Log and count a read or report of something the principal may not see; the caller
    then answers exactly as for an unknown one (not found and not yours look the same)."""
    _log_refusal(
        request.method,
        request.url.path,
        Refusal("not_yours", f"{what} is not visible to this key", principal.key_id),
    )


_VERBS = {
    Action.ACT_AS_AGENT: "register or heartbeat agents",
    Action.REPORT: "report task results or progress",
    Action.SUBMIT: "submit tasks, broadcasts or DAG runs",
    Action.READ_TASK: "read tasks",
    Action.READ_FLEET: "read the admin API",
    Action.ADMINISTER: "administer the hub",
    Action.APPROVE: "approve or reject tasks",
    Action.READ_APPROVALS: "read approvals",
}


async def _answer(error: ReachError, scope: Scope, receive: Receive, send: Send) -> None:
    response = JSONResponse(
        error.to_problem(scope.get("path")),
        status_code=error.status,
        media_type=PROBLEM_JSON,
        headers=error.headers() or None,
    )
    await response(scope, receive, send)


def client_host(scope: Scope) -> str | None:
    """The client's address (uvicorn's, from ``X-Forwarded-For`` only when the peer is a
    trusted proxy: ``FORWARDED_ALLOW_IPS``, by default 127.0.0.1)."""
    client = scope.get("client")
    return str(client[0]) if client else None


def _authorization(scope: Scope) -> str | None:
    return _header(scope, b"authorization")


def _header(scope: Scope, wanted: bytes) -> str | None:
    for name, value in scope.get("headers") or ():
        if name == wanted:
            return str(value.decode("latin-1"))
    return None


def _log_refusal(method: str, path: str, refusal: Refusal) -> None:
    metrics.AUTH_REFUSALS_TOTAL.labels(refusal.reason).inc()
    log.warning("refused %s %s: %s (key %s)", method, path, refusal.reason, refusal.key_id or "-")
