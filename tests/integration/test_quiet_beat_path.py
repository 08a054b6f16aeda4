"""`reach.hub.api.beatpath`: a quiet heartbeat is answered before FastAPI, from the
intake's memory; every other request reaches the full stack with its body unchanged (so
refusals, writes and bad bodies keep the route's answers, checked in the heartbeat, auth
and registry API tests). Driven at the ASGI level with a real intake and context."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from sqlalchemy import Engine
from starlette.types import Message, Receive, Scope, Send

from reach.core.security.auth import OPEN, Principal
from reach.core.security.auth import Scope as KeyScope
from reach.hub.api import create_app
from reach.hub.api.app import Surface
from reach.hub.api.auth import AuthMiddleware
from reach.hub.api.beatpath import MAX_BODY, PATH, QuietBeatPath
from reach.hub.api.heartbeats import HeartbeatIntake
from reach.hub.clock import ManualClock
from reach.hub.settings import load_settings
from reach.worker.context import HubContext

AGENT, INSTANCE = "beater", "beater-1"
QUIET = {"agent_id": AGENT, "instance_id": INSTANCE, "in_flight": 0}
AGENT_KEY = Principal(scope=KeyScope.AGENT, key_id="k1", agent_pattern=AGENT)
OTHER_AGENTS_KEY = Principal(scope=KeyScope.AGENT, key_id="k2", agent_pattern="someone-else")
CALLER_KEY = Principal(scope=KeyScope.CALLER, key_id="k3")


@pytest.fixture
def ctx(store_url: str, engine: Engine, tmp_path: Any) -> HubContext:
    env = {"REACH_DATABASE_URL": store_url, "REACH_HOME": str(tmp_path)}
    return HubContext(
        settings=load_settings(environ=env), engine=engine, clock=ManualClock(start=1.8e9)
    )


@pytest.fixture
def intake(ctx: HubContext) -> HeartbeatIntake:
    beats = HeartbeatIntake(ctx, flush_s=3600.0)  # nothing flushed while a test runs
    beats.registered(INSTANCE, AGENT, "online", 10.0)  # this process knows it, online
    return beats


class Inner:
    """The full stack's stand-in: records what reaches it, answers 299."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        self.bodies.append(b"".join(chunks))
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _call(
    app: Any,
    chunks: list[bytes],
    *,
    principal: Principal | None = OPEN,
    method: str = "POST",
    path: str = PATH,
    ctype: bytes = b"application/json",
    query: bytes = b"",
) -> tuple[int, bytes]:
    """One request through ``app``: its status and body."""
    messages: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query,
        "headers": [(b"content-type", ctype)],
        "state": {} if principal is None else {"principal": principal},
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def call(app: Any, chunks: list[bytes], **options: Any) -> tuple[int, bytes]:
    return asyncio.run(_call(app, chunks, **options))


def body(**changes: Any) -> bytes:
    return json.dumps({**QUIET, **changes}).encode()


def test_a_quiet_beat_is_answered_from_memory(intake: HeartbeatIntake) -> None:
    inner = Inner()
    path = QuietBeatPath(inner, intake)
    for principal in (OPEN, AGENT_KEY):
        status, answer = call(path, [body()], principal=principal)
        assert status == 200
        assert json.loads(answer) == {"status": "online", "next_heartbeat_in": 10.0}
    # a body in several messages, and the charset parameter, are the same beat
    raw = body(current_load=0.5)
    status, _ = call(path, [raw[:7], raw[7:]], ctype=b"application/json; charset=utf-8")
    assert status == 200
    assert inner.bodies == []  # the full stack never saw them


@pytest.mark.parametrize(
    ("why", "chunks", "options"),
    [
        ("in flight: written at once", [body(in_flight=2)], {}),
        ("failing: written at once", [body(consecutive_failure_count=50)], {}),
        ("an instance this process does not know", [body(instance_id="beater-9")], {}),
        ("another agent's instance", [body(agent_id="intruder")], {}),
        ("a key for other agents: the route audits it", [body()], {"principal": OTHER_AGENTS_KEY}),
        ("a key that may not act as an agent", [body()], {"principal": CALLER_KEY}),
        ("no principal", [body()], {"principal": None}),
        ("not JSON", [b"{not json"], {}),
        ("NaN", [b'{"agent_id":"beater","instance_id":"beater-1","current_load":NaN}'], {}),
        ("a NUL", [body(agent_id="beat\x00er")], {}),
        ("a field the model refuses", [body(in_flight=-1)], {}),
        ("an unknown field", [body(colour="red")], {}),
        ("a form, not JSON", [b"agent_id=beater"], {"ctype": b"application/x-www-form-urlencoded"}),
        ("too large", [body(), b" " * MAX_BODY], {}),
        ("another method", [body()], {"method": "PUT"}),
        ("another path", [body()], {"path": PATH + "/"}),
        ("a query string", [body()], {"query": b"x=%00"}),
    ],
)
def test_anything_else_reaches_the_full_stack_unchanged(
    intake: HeartbeatIntake, why: str, chunks: list[bytes], options: dict[str, Any]
) -> None:
    inner = Inner()
    status, _ = call(QuietBeatPath(inner, intake), chunks, **options)
    assert status == 299, why
    assert inner.bodies == [b"".join(chunks)], why


def test_it_sits_inside_authentication_on_the_agent_facing_surfaces(ctx: HubContext) -> None:
    for surface, present in ((Surface.ALL, True), (Surface.PUBLIC, True), (Surface.ADMIN, False)):
        # outermost first
        layers: list[object] = [m.cls for m in create_app(ctx, surface).user_middleware]
        assert (QuietBeatPath in layers) is present, surface
        if present:
            assert layers.index(AuthMiddleware) < layers.index(QuietBeatPath), surface
