"""A quiet heartbeat answered before FastAPI: the fleet's most frequent call, made lean.

Every idle instance beats every few seconds, and a quiet beat (`reach.core.fleet.coalescing`)
only confirms what this process already knows: `HeartbeatIntake.buffered` answers it from
memory. Through the whole stack that answer paid for routing, dependency solving, request
parsing and four middlewares each turn; here it costs one JSON validation.

`QuietBeatPath` sits just inside `AuthMiddleware` (the principal is known, the body not yet
read) and takes only the case it can answer exactly as the route would: ``POST
/v1/agents/heartbeat`` without a query string, with a JSON body of at most `MAX_BODY`
bytes that the input guard would pass and `HeartbeatRequest` validates, from a principal
that may act for the agent, for a beat the intake buffers. Anything else (a refusal to
audit, a beat to write, a bad body, an unknown instance) goes on to the full stack with
the bytes already read handed over unchanged, so every error keeps its one problem+json
answer.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reach.core.security.auth import Action, Principal, may_act_for, permits
from reach.hub.api.heartbeats import HeartbeatIntake
from reach.hub.api.problems import body_refusal, content_type, replay
from reach.wire.schemas import HeartbeatRequest

PATH = "/v1/agents/heartbeat"
# a heartbeat's body is a few hundred bytes; a larger one is not the common case
MAX_BODY = 4096


class QuietBeatPath:
    """Answer quiet heartbeats from the intake's memory; hand every other request on."""

    def __init__(self, app: ASGIApp, intake: HeartbeatIntake) -> None:
        self.app = app
        self.intake = intake

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("path") != PATH
            or scope.get("method") != "POST"
            or scope.get("query_string")  # none is expected: the input guard judges one
        ):
            await self.app(scope, receive, send)
            return
        principal = scope.get("state", {}).get("principal")
        if (
            not isinstance(principal, Principal)
            or not permits(principal, Action.ACT_AS_AGENT)
            or content_type(scope).split(";")[0].strip() != "application/json"
        ):
            await self.app(scope, receive, send)
            return
        read: list[Message] = []
        body = await _read(receive, read)
        hb = _beat(body, principal) if body is not None else None
        taken = self.intake.buffered(hb) if hb is not None else None
        if taken is None:
            await self.app(scope, replay(read, receive), send)
            return
        beat, headers = taken
        response = JSONResponse(
            {"status": beat.status, "next_heartbeat_in": beat.heartbeat_interval},
            headers=headers,
        )
        await response(scope, receive, send)


async def _read(receive: Receive, read: list[Message]) -> bytes | None:
    """The whole body, or None once it is not a plain one of at most `MAX_BODY` bytes
    (every message received is kept in ``read``, to hand on)."""
    size = 0
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request":
            return None
        size += len(message.get("body", b""))
        if size > MAX_BODY:
            return None
        if not message.get("more_body", False):
            return b"".join(m.get("body", b"") for m in read)


def _beat(body: bytes, principal: Principal) -> HeartbeatRequest | None:
    """The heartbeat ``body`` holds, if the full stack would take it from ``principal``."""
    if body_refusal(body, "application/json") is not None:
        return None
    try:
        hb = HeartbeatRequest.model_validate_json(body)
    except ValidationError:
        return None
    return hb if may_act_for(principal, hb.agent_id) else None
