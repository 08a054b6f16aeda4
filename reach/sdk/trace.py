"""Trace context: every reach carries (root_id, parent_task_id, hops, path).

Inside a handler the SDK sets the current task's context (in the thread or the coroutine
that runs it: ``reach.sdk.running``), so a ``reach.send`` made there continues the same
trace one hop further — the thread the hub follows to answer "which agents handled
this, in what order" and, later, to refuse dependency loops.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_current: ContextVar[dict[str, Any] | None] = ContextVar("reach_trace", default=None)
# Apart from the trace dict: that one is copied into requests and may be logged; a key never.
_api_key: ContextVar[str | None] = ContextVar("reach_api_key", default=None)
_session: ContextVar[str | None] = ContextVar("reach_session", default=None)
_blob: ContextVar[dict[str, Any] | None] = ContextVar("reach_blob", default=None)


def current() -> dict[str, Any] | None:
    """The trace of the task being handled in this thread or coroutine, if any."""
    return _current.get()


def hub_of_current() -> str | None:
    """Inside a handler, the hub its agent talks to (the default for nested reaches)."""
    ctx = _current.get()
    return None if ctx is None else ctx.get("hub")


def api_key_of_current() -> str | None:
    """Inside a handler, its agent's API key: a nested reach authenticates as that agent
    (the delivery's reach token is never forwarded)."""
    return _api_key.get()


def traceparent_of_current() -> str | None:
    """Inside a handler, the W3C ``traceparent`` its nested reaches carry (None: none)."""
    ctx = _current.get()
    return None if ctx is None else ctx.get("traceparent")


def session_of_current() -> str | None:
    """Inside a handler, the session its task is bound to (None: none, or not handling)."""
    return _session.get()


def blob_of_current() -> dict[str, Any] | None:
    """Inside a handler, its delivery's ``payload_ref`` (the blob's facts and link)."""
    return _blob.get()


@contextmanager
def handling(
    task_id: str,
    trace: dict[str, Any] | None,
    agent_id: str,
    hub: str | None = None,
    api_key: str | None = None,
    session_id: str | None = None,
    traceparent: str | None = None,
    blob: dict[str, Any] | None = None,
) -> Iterator[None]:
    """Mark the current context (a thread's, or an asyncio task's) as handling ``task_id``
    of ``agent_id`` (whose hub and API key are the defaults of reaches sent from there;
    ``session_id``: the user session the task is bound to, which `reach.session_alive`
    checks and nested reaches inherit; ``traceparent``: the W3C trace context nested reaches
    carry, the handler's span or, when this process does not trace, the delivery's;
    ``blob``: the delivery's ``payload_ref``)."""
    base = dict(trace or {})
    ctx = {
        "root_id": base.get("root_id") or task_id,
        "task_id": task_id,
        "hops": int(base.get("hops") or 0),
        "path": [*list(base.get("path") or []), agent_id],
        "hub": hub,
        "traceparent": traceparent,
    }
    token = _current.set(ctx)
    key_token = _api_key.set(api_key)
    session_token = _session.set(session_id)
    blob_token = _blob.set(blob)
    try:
        yield
    finally:
        _blob.reset(blob_token)
        _session.reset(session_token)
        _api_key.reset(key_token)
        _current.reset(token)


def child_of(parent: dict[str, Any] | None) -> dict[str, Any] | None:
    """The trace a new reach sent from inside a handler carries (None at the edge)."""
    if parent is None:
        return None
    return {
        "root_id": parent["root_id"],
        "parent_task_id": parent["task_id"],
        "hops": parent["hops"] + 1,
        "path": list(parent["path"]),
    }
