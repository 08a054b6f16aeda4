"""User sessions from the SDK: open one (with a TTL), close it, read it, and ask from
inside a handler whether the task's session is still alive.

    reach.open_session("chat-42", ttl_s=3600)
    reach.send(agent_id="writer", method="draft", payload=..., session_id="chat-42")
    reach.close_session("chat-42", reason="user left")   # its queued reaches are cancelled

    @agent.route("draft")
    def draft(task_id, payload):
        for chunk in plan(payload):
            if not reach.session_alive():   # the user left: stop spending model calls
                return {"stopped": True}
            ...

Opening is optional: a ``session_id`` never opened is open until someone closes it.
`session_alive` knows a session closed from the agent's heartbeat answers
(``X-Reach-Closed-Sessions``) and, between heartbeats, asks the hub (at most once a
second per session). When the hub cannot be asked it answers True: work is never
stopped because the hub was briefly unreachable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from cachetools import LRUCache

from reach.errors import ReachError, UnknownSession
from reach.sdk import trace
from reach.sdk.caller import Call, ask

__all__ = [
    "close_call",
    "close_session",
    "get_call",
    "get_session",
    "known_liveness",
    "learned_liveness",
    "note_closed",
    "open_call",
    "open_session",
    "session_alive",
]

RECHECK_S = 1.0
"""How long `session_alive` trusts the hub's last answer about one session."""

_lock = threading.Lock()
_closed: LRUCache[str, float] = LRUCache(maxsize=10_000)  # session id -> when we heard
_checked: LRUCache[str, tuple[float, bool]] = LRUCache(maxsize=10_000)  # -> (monotonic, alive)


def _path(session_id: str, action: str = "") -> str:
    return f"/v1/sessions/{quote(session_id, safe='')}" + (f"/{action}" if action else "")


def open_session(
    session_id: str,
    ttl_s: float | None = None,
    *,
    hub: str | None = None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Open ``session_id`` (or renew an open one's TTL); ``ttl_s`` None: the hub's
    ``sessions.default_ttl_s``. A closed or expired session raises ``SessionClosed``:
    closing is final."""
    return ask(open_call(session_id, ttl_s), hub, api_key)


def open_call(session_id: str, ttl_s: float | None) -> Call:
    body = {} if ttl_s is None else {"ttl_s": ttl_s}
    return Call("POST", _path(session_id, "open"), body, ("state",))


def close_session(
    session_id: str,
    reason: str | None = None,
    *,
    hub: str | None = None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """Close ``session_id``: its queued and parked reaches are cancelled (their ids are in
    ``["cancelled"]``), in-flight ones are told (``["in_flight"]`` counts them), and new
    reaches for it raise ``SessionClosed``. Closing one never opened records it closed."""
    answer = ask(close_call(session_id, reason), hub, api_key)
    note_closed([session_id])
    return answer


def close_call(session_id: str, reason: str | None) -> Call:
    body = {} if reason is None else {"reason": reason}
    return Call("POST", _path(session_id, "close"), body, ("state", "cancelled"))


def get_session(
    session_id: str, *, hub: str | None = None, api_key: str | None = None
) -> dict[str, Any]:
    """The session's ``state`` (open, closed, expired), TTL left and its reaches counted;
    ``UnknownSession`` for one never opened or closed, or one this key may not see."""
    return ask(get_call(session_id), hub, api_key)


def get_call(session_id: str) -> Call:
    return Call("GET", _path(session_id), None, ("state", "alive"))


def session_alive(*, hub: str | None = None, api_key: str | None = None) -> bool:
    """Inside a handler: whether the current task's session is still open (True for a
    task bound to none, and outside a handler)."""
    session_id = trace.session_of_current()
    if session_id is None:
        return True
    now = time.monotonic()
    known = known_liveness(session_id, now)
    if known is not None:
        return known
    try:
        view: dict[str, Any] | ReachError = get_session(session_id, hub=hub, api_key=api_key)
    except ReachError as exc:
        view = exc
    return learned_liveness(session_id, now, view)


def known_liveness(session_id: str, now: float) -> bool | None:
    """What this process knows of the session without asking: False once it heard it
    closed, the hub's answer of the last `RECHECK_S`, else None (ask the hub)."""
    with _lock:
        if session_id in _closed:
            return False
        checked = _checked.get(session_id)
        if checked is not None and now - checked[0] < RECHECK_S:
            return checked[1]
    return None


def learned_liveness(session_id: str, now: float, view: dict[str, Any] | ReachError) -> bool:
    """Whether the session is alive, from the hub's view of it (asked at ``now``) or the
    error asking raised; remembered for the next `RECHECK_S`."""
    if isinstance(view, UnknownSession):
        alive = True  # never opened nor closed: implicitly open
    elif isinstance(view, ReachError):
        return True  # the hub is unreachable or refuses: do not stop work on a guess
    else:
        alive = bool(view.get("alive", True))
    with _lock:
        _checked[session_id] = (now, alive)
    if not alive:
        note_closed([session_id])
    return alive


def note_closed(session_ids: Iterable[str]) -> None:
    """Remember sessions the hub said are closed (a heartbeat answer, a close): final,
    so `session_alive` answers False for them without asking again."""
    with _lock:
        for session_id in session_ids:
            _closed[session_id] = time.time()
