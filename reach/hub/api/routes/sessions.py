"""Session endpoints: open (optional: a session never opened is implicitly open), close
(cancels its pending and parked reaches, tells the in-flight ones), read.

Opening and closing need ``submit`` (whoever sends reaches manages their sessions);
reading needs ``read_task``. A caller manages the sessions it owns, an admin any; a
session that is not yours answers exactly as an unknown one (404), as tasks do. Closing
an unknown session records it closed, so reaches sent for it later are refused.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from reach.core.security.auth import Action, Principal
from reach.errors import TaskConflict
from reach.hub.api.auth import not_yours, require
from reach.hub.context import HubContext
from reach.hub.gates import sessions

Manages = Annotated[Principal, Depends(require(Action.SUBMIT))]
Reads = Annotated[Principal, Depends(require(Action.READ_TASK))]
SessionId = Annotated[str, Path(min_length=1, max_length=128)]

MAX_REASON = 1000


class OpenSession(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttl_s: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="seconds until it expires (default sessions.default_ttl_s; "
        "at most sessions.max_ttl_s)",
    )


class CloseSession(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(None, max_length=MAX_REASON, description="why, for the record")


def session_router(ctx: HubContext) -> APIRouter:
    router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

    def refusal(request: Request, principal: Principal) -> sessions.NotYours:
        return lambda what: not_yours(request, principal, what)

    @router.post("/{session_id}/open", responses={404: {}, 410: {}, 422: {}})
    def open_session(
        session_id: SessionId,
        request: Request,
        principal: Manages,
        body: OpenSession | None = None,
    ) -> JSONResponse:
        """Open the session with a TTL (or renew an open one's); closed is final (410)."""
        cfg = ctx.settings.sessions
        ttl = body.ttl_s if body else None

        def work(s: Session) -> tuple[dict[str, Any], bool]:
            return sessions.open_session(
                s,
                session_id,
                principal,
                ctx.clock.now(),
                ttl_s=ttl,
                default_ttl_s=cfg.default_ttl_s,
                max_ttl_s=cfg.max_ttl_s,
                not_yours=refusal(request, principal),
            )

        view, created = ctx.write(work, conflict=TaskConflict)
        return JSONResponse(view, status_code=201 if created else 200)

    @router.post("/{session_id}/close", responses={404: {}})
    def close_session(
        session_id: SessionId,
        request: Request,
        principal: Manages,
        body: CloseSession | None = None,
    ) -> dict[str, Any]:
        """Close the session: its pending and parked reaches are cancelled (listed in
        ``cancelled``), in-flight ones told; new reaches for it are refused."""
        reason = body.reason if body else None
        return ctx.write(
            lambda s: sessions.close(
                s,
                session_id,
                principal,
                ctx.clock.now(),
                reason=reason,
                not_yours=refusal(request, principal),
            ),
            conflict=TaskConflict,
        )

    @router.get("/{session_id}", responses={404: {}})
    def get_session(session_id: SessionId, request: Request, principal: Reads) -> dict[str, Any]:
        """State (open, closed, expired), TTL left, and its reaches counted by status."""
        with ctx.reading() as s:
            return sessions.get(
                s, session_id, principal, ctx.clock.now(), refusal(request, principal)
            )

    return router
