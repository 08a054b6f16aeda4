"""The caller's API on asyncio, for agents and flows that run on an event loop (LangGraph,
pydantic-ai, the OpenAI Agents SDK, CrewAI flows)::

    import reach.aio

    sub = await reach.aio.send(agent_id="doc-analyzer-01", method="task.process", payload={...})
    result = await reach.aio.wait_for_result(sub.task_id, timeout=60)
    async for event in reach.aio.stream(sub.task_id, timeout=120): ...

Each function is the coroutine twin of ``reach.<name>``: the same arguments and defaults,
the same records (`reach.Submission`, `reach.TaskResult`, `reach.BroadcastResult`,
`reach.Match`, `reach.StreamEvent`, session dicts) and the same typed errors, because both
build their requests and read the answers with the same functions (``reach.sdk.caller``,
``reach.sdk.sessions``, ``reach.sdk.stream``); only the sending differs. The hub and key
default as there too: inside a handler, its agent's (context variables, which asyncio
tasks inherit), else ``$REACH_HUB_URL`` and ``$REACH_API_KEY``; a reach sent from a
handler carries its trace and session.

Requests go over aiohttp, one connection pool per event loop (``reach.sdk.aio_client``),
opened on first use and closed when the loop ends (``asyncio.run`` closes it on the way
out); ``await reach.aio.aclose()`` closes the running loop's pool sooner.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from reach.errors import ReachError
from reach.sdk import blobs, trace
from reach.sdk.aio_client import FETCH_FAILURES, AsyncHubClient, aclose, fetch, stream_path
from reach.sdk.caller import (
    BroadcastResult,
    Call,
    Match,
    Submission,
    TaskResult,
    broadcast_call,
    broadcast_of,
    broadcast_poll_call,
    find_call,
    get_task_call,
    matches_of,
    poll_call,
    progress_call,
    result_call,
    result_timeout,
    send_call,
    settled,
    submission_of,
)
from reach.sdk.hub_client import refused
from reach.sdk.sessions import (
    close_call,
    get_call,
    known_liveness,
    learned_liveness,
    note_closed,
    open_call,
)
from reach.sdk.stream import StreamEvent

__all__ = [
    "aclose",
    "broadcast",
    "close_session",
    "find",
    "get_session",
    "get_task",
    "open_session",
    "payload_blob",
    "report_progress",
    "report_result",
    "send",
    "session_alive",
    "stream",
    "wait_for_result",
]


async def _ask(call: Call, hub: str | None, api_key: str | None) -> dict[str, Any]:
    client = AsyncHubClient(hub, read_timeout=call.read_timeout, api_key=api_key)
    if call.verb == "GET":
        return await client.get(call.path, call.data, keys=call.keys)
    return await client.post(call.path, call.data or {}, keys=call.keys, headers=dict(call.headers))


async def send(
    *,
    method: str | None = None,
    payload: dict[str, Any] | None = None,
    payload_ref: str | None = None,
    agent_id: str | None = None,
    tags: Sequence[str] = (),
    capability: str | None = None,
    intent: str | None = None,
    rules: dict[str, str | int | float | bool] | None = None,
    task_id: str | None = None,
    timeout_ms: int = 30_000,
    session_id: str | None = None,
    priority: str = "online",
    hub: str | None = None,
    api_key: str | None = None,
    callback_url: str | None = None,
    callback_context: Any = None,
    callback_progress: bool = False,
) -> Submission:
    """Submit one task, as `reach.send` (idempotent on ``task_id``; its errors)."""
    call = send_call(
        method=method,
        payload=payload,
        payload_ref=payload_ref,
        agent_id=agent_id,
        tags=tags,
        capability=capability,
        intent=intent,
        rules=rules,
        task_id=task_id,
        timeout_ms=timeout_ms,
        session_id=session_id,
        priority=priority,
        callback_url=callback_url,
        callback_context=callback_context,
        callback_progress=callback_progress,
    )
    return submission_of(await _ask(call, hub, api_key))


async def find(
    intent: str,
    *,
    agent_id: str | None = None,
    tags: Sequence[str] = (),
    capability: str | None = None,
    method: str | None = None,
    limit: int = 5,
    hub: str | None = None,
    api_key: str | None = None,
) -> list[Match]:
    """The capabilities ``intent`` matches, best first, as `reach.find`."""
    call = find_call(
        intent, agent_id=agent_id, tags=tags, capability=capability, method=method, limit=limit
    )
    return matches_of(await _ask(call, hub, api_key))


async def get_task(
    task_id: str, *, wait: float = 0.0, hub: str | None = None, api_key: str | None = None
) -> dict[str, Any]:
    """The task's view (long-polls up to ``wait`` s for a change), as `reach.get_task`."""
    return await _ask(get_task_call(task_id, wait), hub, api_key)


async def wait_for_result(
    task_id: str, timeout: float = 60.0, *, hub: str | None = None, api_key: str | None = None
) -> TaskResult:
    """Until the task is terminal: its result, or the typed error (`reach.wait_for_result`).
    Each long-poll holds one connection, not a thread: thousands may wait on one loop."""
    deadline = time.monotonic() + timeout
    while True:
        view = await _ask(poll_call(task_id, deadline - time.monotonic()), hub, api_key)
        result = settled(view)
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise result_timeout(view, task_id, timeout)


async def report_result(
    task_id: str,
    data: Any = None,
    *,
    code: int = 0,
    message: str = "",
    attempt_seq: int | None = None,
    instance_id: str | None = None,
    transient: bool = False,
    hub: str | None = None,
    api_key: str | None = None,
) -> bool:
    """Report the result of a task answered with 202, as `reach.report_result`."""
    call = result_call(
        task_id, data, code=code, message=message, attempt_seq=attempt_seq,
        instance_id=instance_id, transient=transient,
    )  # fmt: skip
    return bool((await _ask(call, hub, api_key))["decided"])


async def report_progress(
    task_id: str,
    progress: float | None = None,
    message: str = "",
    data: Any = None,
    *,
    attempt_seq: int | None = None,
    instance_id: str | None = None,
    hub: str | None = None,
    api_key: str | None = None,
) -> None:
    """Report progress of an accepted task, as `reach.report_progress`."""
    call = progress_call(
        task_id, progress, message, data, attempt_seq=attempt_seq, instance_id=instance_id
    )
    await _ask(call, hub, api_key)


async def broadcast(
    *,
    method: str,
    payload: dict[str, Any] | None = None,
    capability: str | None = None,
    tags: Sequence[str] = (),
    rules: dict[str, str | int | float | bool] | None = None,
    min_results: int | None = None,
    timeout: float = 30.0,
    hub: str | None = None,
    api_key: str | None = None,
) -> BroadcastResult:
    """Send to every routable instance that matches and gather results, as
    `reach.broadcast`."""
    call = broadcast_call(
        method=method,
        payload=payload,
        capability=capability,
        tags=tags,
        rules=rules,
        min_results=min_results,
        timeout=timeout,
    )
    view = await _ask(call, hub, api_key)
    deadline = time.monotonic() + timeout
    while not view["complete"] and time.monotonic() < deadline:
        left = deadline - time.monotonic()
        view = await _ask(broadcast_poll_call(view["broadcast_id"], left, timeout), hub, api_key)
    return broadcast_of(view)


def stream(
    task_id: str,
    *,
    hub: str | None = None,
    api_key: str | None = None,
    timeout: float | None = None,
    last_event_id: int | None = None,
) -> AsyncIterator[StreamEvent]:
    """The task's events until its result (``async for``), as `reach.stream`: a dropped
    connection is reopened with ``Last-Event-ID``, so each event comes once and in order.
    Leaving the loop early leaves the connection to the generator's close: wrap it in
    ``contextlib.aclosing`` to close it at once."""
    return stream_path(
        f"/v1/tasks/{task_id}/stream",
        hub=hub,
        api_key=api_key,
        timeout=timeout,
        last_event_id=last_event_id,
    )


async def open_session(
    session_id: str,
    ttl_s: float | None = None,
    *,
    hub: str | None = None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Open ``session_id`` (or renew an open one's TTL), as `reach.open_session`."""
    return await _ask(open_call(session_id, ttl_s), hub, api_key)


async def close_session(
    session_id: str,
    reason: str | None = None,
    *,
    hub: str | None = None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Close ``session_id`` (its queued reaches are cancelled), as `reach.close_session`."""
    answer = await _ask(close_call(session_id, reason), hub, api_key)
    note_closed([session_id])
    return answer


async def get_session(
    session_id: str, *, hub: str | None = None, api_key: str | None = None
) -> dict[str, Any]:
    """The session's state, TTL left and reaches, as `reach.get_session`."""
    return await _ask(get_call(session_id), hub, api_key)


async def session_alive(*, hub: str | None = None, api_key: str | None = None) -> bool:
    """Inside a handler: whether its task's session is still open, as
    `reach.session_alive` (and from the same memory of closed sessions)."""
    session_id = trace.session_of_current()
    if session_id is None:
        return True
    now = time.monotonic()
    known = known_liveness(session_id, now)
    if known is not None:
        return known
    try:
        view: dict[str, Any] | ReachError = await get_session(session_id, hub=hub, api_key=api_key)
    except ReachError as exc:
        view = exc
    return learned_liveness(session_id, now, view)


async def payload_blob(*, timeout: float = blobs.UPLOAD_TIMEOUT_S) -> bytes:
    """Inside a handler: the bytes of the blob its task carries, checked against its size
    and SHA-256 (`reach.payload_blob`, on this loop's connection pool)."""
    ref, url = blobs.link()
    try:
        status, body = await fetch(url, timeout)
    except FETCH_FAILURES as exc:
        raise blobs.unreachable(url, exc) from None  # its text holds the link's signature
    if status >= 400:
        raise refused(status, body, None)
    return blobs.checked(ref, body)
