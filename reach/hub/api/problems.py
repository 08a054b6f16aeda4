"""Every error leaves the API as ``application/problem+json`` (RFC 9457) with a stable type.

Also the request-size guard: bodies over the limit are refused before they are parsed;
and the input guard: a NUL character in the path, the query or the body, and a ``NaN`` or
``Infinity`` in a JSON body, are refused with a 422 problem before any route sees them (a
NUL reached PostgreSQL as a 500; a NaN one as a 500 whose log quoted the payload).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reach.errors import (
    PROBLEM_TYPE_PREFIX,
    DagError,
    InvalidQuery,
    InvalidRegistration,
    InvalidTaskRequest,
    MalformedRequest,
    ReachError,
    RequestTooLarge,
)

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("reach.hub.api")

# Which error a request that fails validation is, by the resource its path names: a bad
# task is not a bad registration. Agents and the registry's admin views keep
# ``InvalidRegistration`` (``invalid-request``).
_INVALID_BY_RESOURCE: tuple[tuple[str, type[ReachError]], ...] = (
    ("/v1/tasks", InvalidTaskRequest),
    ("/v1/match", InvalidTaskRequest),
    ("/v1/broadcasts", InvalidTaskRequest),
    ("/api/v1/dead-letters", InvalidTaskRequest),
    ("/api/v1/dag-runs", DagError),
    ("/api/v1/tasks", InvalidQuery),
    ("/api/v1/alerts", InvalidQuery),
)


def invalid_request_type(path: str) -> type[ReachError]:
    """The error type of a request to ``path`` whose body or parameters fail validation."""
    for prefix, error in _INVALID_BY_RESOURCE:
        if path == prefix or path.startswith(prefix + "/"):
            return error
    return InvalidRegistration


def problem_response(error: ReachError, request: Request | None = None) -> JSONResponse:
    instance = request.url.path if request is not None else None
    return JSONResponse(
        error.to_problem(instance),
        status_code=error.status,
        media_type=PROBLEM_JSON,
        headers=error.headers() or None,
    )


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(ReachError)
    async def _reach_error(request: Request, exc: ReachError) -> JSONResponse:
        return problem_response(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_clean_error(e) for e in exc.errors()]
        if any(e["type"] in {"json_invalid", "json_type"} for e in errors) or (
            errors and errors[0]["loc"] == ["body"] and errors[0]["type"] == "missing"
        ):
            return problem_response(
                MalformedRequest("request body must be a JSON object", errors=errors), request
            )
        first = errors[0] if errors else {"loc": [], "msg": "invalid"}
        where = ".".join(str(p) for p in first["loc"] if p != "body") or "body"
        invalid = invalid_request_type(request.url.path)
        return problem_response(invalid(f"{where}: {first['msg']}", errors=errors), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = {404: "not-found", 405: "method-not-allowed", 413: "payload-too-large"}.get(
            exc.status_code, "http-error"
        )
        body = {
            "type": PROBLEM_TYPE_PREFIX + slug,
            "title": str(exc.detail),
            "status": exc.status_code,
            "detail": str(exc.detail),
            "instance": request.url.path,
        }
        return JSONResponse(body, status_code=exc.status_code, media_type=PROBLEM_JSON)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        body = {
            "type": PROBLEM_TYPE_PREFIX + "internal-error",
            "title": "Internal error",
            "status": 500,
            "detail": "the hub failed to handle this request; see its log",
            "instance": request.url.path,
        }
        return JSONResponse(body, status_code=500, media_type=PROBLEM_JSON)


def _clean_error(err: Any) -> dict[str, Any]:
    return {
        "loc": [str(p) for p in err.get("loc", ())],
        "msg": str(err.get("msg", "")),
        "type": str(err.get("type", "")),
    }


class BodyLimitMiddleware:
    """Refuse request bodies above ``max_bytes`` with a 413 problem, declared or streamed."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, raised: Mapping[tuple[str, str], int] | None = None
    ) -> None:
        self.app = app
        self.default_bytes = max_bytes
        self.raised = dict(raised or {})  # (method, path) -> its own limit (a blob upload)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.raised.get(
            (scope.get("method", ""), scope.get("path", "")), self.default_bytes
        )
        await self._limited(scope, receive, send, limit)

    async def _limited(self, scope: Scope, receive: Receive, send: Send, max_bytes: int) -> None:
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > max_bytes
            except ValueError:
                too_big = False
            if too_big:
                await self._refuse(scope, send, max_bytes)
                return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise _BodyTooLarge()
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._refuse(scope, send, max_bytes)

    async def _refuse(self, scope: Scope, send: Send, max_bytes: int) -> None:
        advice = "" if max_bytes != self.default_bytes else "; send a reference instead"
        error = RequestTooLarge(
            f"request body exceeds {max_bytes} bytes{advice}",
            limit=max_bytes,
        )
        response = JSONResponse(
            error.to_problem(scope.get("path")), status_code=413, media_type=PROBLEM_JSON
        )
        await response(scope, _empty_receive, send)


class _BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive``; FastAPI lets HTTP exceptions through its body parsing."""

    def __init__(self) -> None:
        super().__init__(413, "request body exceeds the configured limit")


async def _empty_receive() -> Message:
    return {"type": "http.disconnect"}


class InputGuardMiddleware:
    """Refuse what no route can store (issue 37, item 17), with the 422 problem of the
    resource the path names (`invalid_request_type`), never quoting the input:

    * a NUL character in the decoded path or anywhere in the query string (PostgreSQL
      text cannot hold one);
    * in a body: a NUL in a JSON string (``\\u0000``) or a form field (``%00``), and the
      JSON constants ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON: Python's parser
      takes them, PostgreSQL and every agent refuse them).

    Bodies are read whole (the body limit, outside this, bounds them) only for methods
    that carry one; the JSON is parsed again only when its bytes hold ``\\u0000``,
    ``NaN`` or ``Infinity`` somewhere, so an ordinary request costs a byte scan."""

    def __init__(self, app: ASGIApp, raw: frozenset[tuple[str, str]] = frozenset()) -> None:
        self.app = app
        self.raw = raw  # (method, path) whose body is bytes, not JSON (a blob upload)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path") or ""
        if "\x00" in path:
            await self._refuse(scope, send, "path: contains a NUL character")
            return
        query: bytes = scope.get("query_string") or b""
        if b"%00" in query or b"\x00" in query:
            await self._refuse(scope, send, "query: a parameter contains a NUL character")
            return
        if scope.get("method") not in _WITH_BODY or (scope.get("method"), path) in self.raw:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        wrong = body_refusal(body, content_type(scope))
        if wrong is not None:
            await self._refuse(scope, send, wrong)
            return
        replayed: Message = {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, replay([replayed], receive), send)

    async def _refuse(self, scope: Scope, send: Send, detail: str) -> None:
        path = scope.get("path") or ""
        invalid = invalid_request_type(path.replace("\x00", ""))
        error = invalid(detail)
        response = JSONResponse(
            error.to_problem(path.replace("\x00", "")), status_code=422, media_type=PROBLEM_JSON
        )
        await response(scope, _empty_receive, send)


_WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def body_refusal(body: bytes, content_type: str) -> str | None:
    """Why a request body cannot be taken (a NUL, a non-JSON number), or None."""
    if not body:
        return None
    if "application/x-www-form-urlencoded" in content_type:
        if b"%00" in body or b"\x00" in body:
            return "body: a form field contains a NUL character"
        return None
    if b"\\u0000" not in body and b"NaN" not in body and b"Infinity" not in body:
        return None  # the common case: nothing to parse twice
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except _NotJson as exc:
        return f"body: {exc.args[0]} is not a JSON number (send null or a string)"
    except ValueError:
        return None  # not JSON at all: the route's own parsing says so
    where = _nul_in(value, "body")
    if where is not None:
        return f"{where}: contains a NUL character"
    return None


class _NotJson(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJson(name)


def _nul_in(value: Any, where: str) -> str | None:
    """The place of the first string (or key) holding a NUL, or None."""
    todo: list[tuple[Any, str]] = [(value, where)]
    while todo:
        item, at = todo.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return at
        elif isinstance(item, dict):
            for key, sub in item.items():
                if "\x00" in key:
                    return f"{at} (a key)"
                todo.append((sub, f"{at}.{key}"))
        elif isinstance(item, list):
            todo.extend((sub, f"{at}[{i}]") for i, sub in enumerate(item))
    return None


def content_type(scope: Scope) -> str:
    for name, value in scope.get("headers") or []:
        if name == b"content-type":
            return str(value.decode("latin-1").lower())
    return ""


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that hands out ``messages`` first, then the real one's."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
