"""``/v1/agents/channel``: agents the hub cannot dial hold a WebSocket here instead.

The protocol (frames in ``reach.core.interop.channel``): the agent's first frame is ``hello`` with
its declaration; the hub checks the credential the socket was opened with (the agent's API
key as ``Authorization: Bearer``) exactly as for an HTTP registration, registers the
instance at this replica (``reach.hub.interop.channel``) and answers ``welcome``. From then on the
hub pings (RTT and loss become the instance's probe samples), the agent heartbeats on the
channel, and deliveries arrive through ``POST /internal/channel/{iid}/{secret}/tasks/{m}``
from the workers, are forwarded as ``deliver`` frames and answered from the agent's
``result`` frame, with an HTTP agent's status and body.

Refused: a channel without a valid key (when one is required), or with another agent's
key (``error`` frame, then close 1008); a malformed, oversize or unexpected frame (close
1008); an ``ack`` or ``result`` for an attempt this channel does not hold (an ``error``
frame; the channel stays up, the answer is dropped: only the attempt out decides).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketState

from reach.core.interop.channel import (
    FROM_AGENT,
    GOING_AWAY,
    POLICY_VIOLATION,
    Frame,
    FrameError,
    encode,
    parse,
)
from reach.core.security.auth import OPEN, Action, Principal, bearer_of, may_act_for, permits
from reach.errors import ReachError
from reach.hub import metrics
from reach.hub.api.auth import check_declarable
from reach.hub.context import HubContext
from reach.hub.fleet import registry
from reach.hub.interop.channel import Channel, Channels, NotHere, Pinger, holder_url, record_ping
from reach.hub.interop.channel import register as register_channel
from reach.hub.security import apikeys
from reach.hub.security.apikeys import Refusal
from reach.wire.schemas import HeartbeatRequest, RegisterRequest

log = logging.getLogger("reach.hub.interop.channel")
security_log = logging.getLogger("reach.security")

HELLO_TIMEOUT_S = 10.0


def channel_router(ctx: HubContext, require_auth: bool) -> APIRouter:
    router = APIRouter(tags=["agents (agent-facing)"])
    channels = Channels()

    @router.websocket("/v1/agents/channel")
    async def channel(websocket: WebSocket) -> None:
        await websocket.accept()
        principal = await _principal(ctx, websocket, require_auth)
        if isinstance(principal, Refusal):
            _refused(principal.reason, principal.key_id)
            await _close(websocket, principal.reason, principal.detail)
            return
        try:
            raw = await asyncio.wait_for(websocket.receive_text(), HELLO_TIMEOUT_S)
            hello = parse(raw, frozenset({"hello"}))
        except FrameError as exc:
            await _close(websocket, "bad_frame", exc.reason)
            return
        except (TimeoutError, WebSocketDisconnect, KeyError, RuntimeError):
            await _close(websocket, "bad_frame", "expected a hello frame first")
            return
        try:
            declared = RegisterRequest.model_validate(hello.data["register"])
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "register"
            await _close(websocket, "invalid_registration", f"{where}: {first['msg']}")
            return
        if not may_act_for(principal, declared.agent_id):
            _refused("wrong_agent", principal.key_id)
            await _close(
                websocket, "forbidden", f"this key may not act for agent {declared.agent_id!r}"
            )
            return
        if declared.instance_id is None:
            await _close(websocket, "invalid_registration", "register.instance_id is required")
            return
        try:
            check_declarable(principal, declared)
        except ReachError as exc:
            _refused("undeclarable", principal.key_id)
            await _close(websocket, "forbidden", str(exc))
            return
        server = websocket.scope.get("server") or ("127.0.0.1", 0)
        link = Channel(declared.agent_id, declared.instance_id, websocket.send_text)
        endpoint = holder_url(str(server[0]), int(server[1]), link.instance_id, link.secret)
        try:
            answer = await run_in_threadpool(
                ctx.write,
                lambda s: register_channel(
                    s,
                    declared,
                    endpoint,
                    ctx.clock.now(),
                    ctx.policy,
                    ctx.registry_limits,
                    owner=principal.key_id,
                ),
            )
        except ReachError as exc:
            await _close(websocket, exc.slug, str(exc))
            return
        ctx.matcher.registered(declared.agent_id, bool(declared.capabilities))  # vectors, apart
        channels.open(link)
        metrics.CHANNEL_EVENTS_TOTAL.labels("opened").inc()
        log.info("channel open: %s/%s", link.agent_id, link.instance_id)
        await link.send(
            "welcome", ping_interval=ctx.settings.probe.interval, **answer.model_dump(mode="json")
        )
        pings = asyncio.create_task(_ping_loop(ctx, websocket, link))
        try:
            await _serve(ctx, websocket, link)
        finally:
            pings.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pings
            channels.drop(link)
            metrics.CHANNEL_EVENTS_TOTAL.labels("closed").inc()
            log.info("channel closed: %s/%s", link.agent_id, link.instance_id)
            now = ctx.clock.now()
            with contextlib.suppress(Exception):  # the store being down must not hide the close
                await run_in_threadpool(
                    ctx.write,
                    lambda s: record_ping(
                        s, link.instance_id, False, None, now, "channel closed", now, ctx.policy
                    ),
                )

    @router.post("/internal/channel/{instance_id}/{secret}/tasks/{method}", include_in_schema=False)
    async def deliver(instance_id: str, secret: str, method: str, request: Request) -> JSONResponse:
        """A worker's delivery to a channel instance held here (503: not here, retry)."""
        try:
            link = channels.holding(instance_id, secret)
        except NotHere:
            return _not_here(instance_id)
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("task_id"), str):
            return JSONResponse({"code": 400, "message": "delivery body needs task_id"}, 400)
        seq = body.get("attempt_seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            return JSONResponse({"code": 400, "message": "delivery body needs attempt_seq"}, 400)
        deadline = body.get("deadline")
        timeout = (
            max(0.1, float(deadline) - time.time())
            if isinstance(deadline, int | float) and not isinstance(deadline, bool)
            else 30.0
        )
        try:
            answer = await link.deliver(
                body["task_id"], seq, method, raw, request.headers.get("authorization"), timeout
            )
        except NotHere:
            return _not_here(instance_id)
        if answer is None:
            return JSONResponse(
                {"code": -1, "message": "the agent did not answer on its channel in time"}, 504
            )
        status, reply = answer
        return JSONResponse(reply, status)

    return router


async def _serve(ctx: HubContext, websocket: WebSocket, link: Channel) -> None:
    """Read frames until the socket closes or the agent breaks the protocol."""
    while True:
        try:
            message = await websocket.receive()
        except (WebSocketDisconnect, RuntimeError):
            return
        if message["type"] == "websocket.disconnect":
            return
        raw = message.get("text")
        if raw is None:
            raw = message.get("bytes") or b""
        try:
            frame = parse(raw, FROM_AGENT)
        except FrameError as exc:
            log.warning("channel of %s/%s: %s", link.agent_id, link.instance_id, exc.reason)
            await _close(websocket, "bad_frame", exc.reason)
            return
        await _handle(ctx, link, frame)


async def _handle(ctx: HubContext, link: Channel, frame: Frame) -> None:
    if frame.type in ("ack", "result"):
        key = frame.attempt
        held = (
            link.acknowledge(key)
            if frame.type == "ack"
            else link.answer(key, int(frame.data["status"]), frame.data["body"])
        )
        if not held:
            metrics.CHANNEL_REFUSED_FRAMES_TOTAL.labels("unknown_attempt").inc()
            await link.send(
                "error",
                code="unknown_attempt",
                message=f"this channel holds no attempt {key[1]} of task {key[0]!r}",
                task_id=key[0],
                attempt_seq=key[1],
            )
    elif frame.type == "pong":
        pinger: Pinger | None = getattr(link, "_pinger", None)
        got = pinger.pong(int(frame.data["id"])) if pinger is not None else None
        if got is not None:
            rtt_ms, at = got
            await _record(ctx, link, True, rtt_ms, at, None)
    elif frame.type == "heartbeat":
        try:
            hb = HeartbeatRequest.model_validate(
                {
                    **frame.data["heartbeat"],
                    "agent_id": link.agent_id,
                    "instance_id": link.instance_id,
                }
            )
        except ValidationError as exc:
            await link.send("error", code="invalid_heartbeat", message=str(exc.errors()[0]["msg"]))
            return
        try:
            await run_in_threadpool(
                ctx.write, lambda s: registry.heartbeat(s, hb, ctx.clock.now(), ctx.policy)
            )
            metrics.HEARTBEATS_TOTAL.inc()
        except ReachError as exc:
            await link.send("error", code=exc.slug, message=str(exc))


async def _ping_loop(ctx: HubContext, websocket: WebSocket, link: Channel) -> None:
    """Ping at the probe interval; an unanswered ping is a lost probe sample, and
    ``probe.fail_threshold`` of them in a row close the channel (its deliveries fail now,
    to be retried, instead of waiting out their deadline on a dead socket)."""
    probe = ctx.settings.probe
    pinger = Pinger(timeout=probe.timeout)
    link._pinger = pinger  # type: ignore[attr-defined]
    lost_in_a_row = 0
    while True:
        lost = pinger.lost()
        for at in lost:
            await _record(ctx, link, False, None, at, f"no pong within {probe.timeout:.1f}s")
        lost_in_a_row = lost_in_a_row + len(lost) if lost else lost_in_a_row
        if pinger.answered:
            lost_in_a_row, pinger.answered = 0, False
        if lost_in_a_row >= probe.fail_threshold:
            log.warning("channel of %s silent: closing it", link.instance_id)
            link.close()
            with contextlib.suppress(Exception):
                await websocket.close(GOING_AWAY, reason="no pong")
            return
        with contextlib.suppress(Exception):
            await link.send("ping", id=pinger.ping(), at=time.time())
        await asyncio.sleep(probe.interval)


async def _record(
    ctx: HubContext, link: Channel, ok: bool, rtt_ms: float | None, at: float, error: str | None
) -> None:
    try:
        await run_in_threadpool(
            ctx.write,
            lambda s: record_ping(
                s, link.instance_id, ok, rtt_ms, at, error, ctx.clock.now(), ctx.policy
            ),
        )
    except ReachError as exc:
        log.warning("could not record a channel ping of %s: %s", link.instance_id, exc)


async def _principal(
    ctx: HubContext, websocket: WebSocket, require_auth: bool
) -> Principal | Refusal:
    """The socket's principal, by the rules of ``reach.hub.api.auth.AuthMiddleware``."""
    header = websocket.headers.get("authorization")
    if header is None:
        if not require_auth:
            return OPEN
        return Refusal("missing", "an API key is required: send 'Authorization: Bearer <key>'")
    secret = bearer_of(header)
    if secret is None:
        return Refusal("malformed", "malformed Authorization header: expected 'Bearer <key>'")

    def check() -> Principal | Refusal:
        with ctx.reading() as session:
            return apikeys.check(session, secret, ctx.clock.now())

    try:
        principal = await run_in_threadpool(check)
    except ReachError as exc:
        return Refusal("unavailable", str(exc))
    if isinstance(principal, Principal) and not permits(principal, Action.ACT_AS_AGENT):
        return Refusal("forbidden", f"a {principal.scope.value} key may not act as an agent")
    return principal


def _refused(reason: str, key_id: str | None) -> None:
    metrics.AUTH_REFUSALS_TOTAL.labels(reason).inc()
    security_log.warning("refused WEBSOCKET /v1/agents/channel: %s (key %s)", reason, key_id or "-")


async def _close(websocket: WebSocket, code: str, message: str) -> None:
    """Say why in an ``error`` frame, then close with the policy-violation code."""
    metrics.CHANNEL_REFUSED_FRAMES_TOTAL.labels(code).inc()
    if websocket.client_state is WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await websocket.send_text(encode("error", code=code, message=message))
        with contextlib.suppress(Exception):
            await websocket.close(POLICY_VIOLATION, reason=message[:120])


def _not_here(instance_id: str) -> JSONResponse:
    body: dict[str, Any] = {
        "code": -1,
        "message": f"no open channel of instance {instance_id!r} on this replica",
    }
    return JSONResponse(body, 503)
