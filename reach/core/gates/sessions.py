"""Session liveness, decided: a session's state from its row and the clock, the TTL a
request may ask for, which of its reaches closing cancels, who may see it, and the
heartbeat header that tells an agent its in-flight work lost its session.

Pure: ``reach.hub.gates.sessions`` reads and writes the rows and asks these functions.

A session belongs to a key: the one that opened it, or the one whose reach first named
it (a send with a new ``session_id`` opens it implicitly, with no TTL, owned by the
sender). Only its owner (or an admin) may open, close or bind reaches to it; an agent
handling one of its reaches may bind its own onward reaches to it (a handler's reach
inherits its session). So another caller can neither close a session whose reaches are
not its own nor slip reaches into it. Closing is final (an expired TTL is final too), and
a closed session's pending and parked reaches are cancelled while in-flight ones are told.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Final
from urllib.parse import quote, unquote

from reach.core.ledger.lifecycle import TaskEvent, sources_of
from reach.core.ledger.statuses import TaskStatus
from reach.core.security.auth import Principal, Scope, may_read_task
from reach.errors import InvalidTaskRequest

__all__ = [
    "CANCELLED_ON_CLOSE",
    "CLOSED_SESSIONS_HEADER",
    "IN_FLIGHT",
    "SessionState",
    "expiry",
    "format_closed",
    "may_bind",
    "may_manage",
    "may_read",
    "parse_closed",
    "resolve_ttl",
    "state_of",
]

CLOSED_SESSIONS_HEADER: Final = "X-Reach-Closed-Sessions"
"""On a heartbeat answer: the closed sessions among that instance's in-flight tasks."""

OPEN: Final = "open"
CLOSED: Final = "closed"


class SessionState(StrEnum):
    """What a session is now; ``expired`` is an open row whose TTL ran out (as final as
    ``closed``: nothing reopens it)."""

    OPEN = "open"
    CLOSED = "closed"
    EXPIRED = "expired"

    @property
    def alive(self) -> bool:
        return self is SessionState.OPEN


CANCELLED_ON_CLOSE: Final = frozenset({TaskStatus.PENDING, TaskStatus.AWAITING_APPROVAL})
"""Closing cancels what no agent has started: queued attempts and parked reaches."""

IN_FLIGHT: Final = frozenset({TaskStatus.DISPATCHING, TaskStatus.EXECUTING})
"""Closing does not kill these (the agent is working): it tells them."""

# Every status closing touches must be one the lifecycle lets a task be cancelled in.
assert CANCELLED_ON_CLOSE | IN_FLIGHT <= sources_of(TaskEvent.CANCEL)


def state_of(status: str | None, expires_at: float | None, now: float) -> SessionState:
    """The state of a session whose row says ``status`` (None: no row, implicitly open)."""
    if status is None:
        return SessionState.OPEN
    if status == CLOSED:
        return SessionState.CLOSED
    if expires_at is not None and now >= expires_at:
        return SessionState.EXPIRED
    return SessionState.OPEN


def resolve_ttl(ttl_s: float | None, default_ttl_s: float | None, max_ttl_s: float) -> float | None:
    """The TTL an open asks for (``sessions.default_ttl_s`` when it names none; None: no
    expiry); a TTL that is not a positive finite number, or above ``sessions.max_ttl_s``,
    is refused with the field named."""
    ttl = default_ttl_s if ttl_s is None else ttl_s
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not ttl > 0 or ttl == float("inf"):
        raise InvalidTaskRequest(
            f"ttl_s must be a positive number of seconds, not {ttl!r}", field="ttl_s"
        )
    if ttl > max_ttl_s:
        raise InvalidTaskRequest(
            f"ttl_s {ttl:g} exceeds sessions.max_ttl_s ({max_ttl_s:g})",
            field="ttl_s",
            max_ttl_s=max_ttl_s,
        )
    return float(ttl)


def expiry(now: float, ttl_s: float | None) -> float | None:
    return None if ttl_s is None else now + ttl_s


def may_manage(principal: Principal, owner: str | None) -> bool:
    """Open or close the session ``owner`` holds: its owner, or an admin."""
    if principal.scope is Scope.ADMIN:
        return True
    return (
        owner is not None
        and principal.scope is not Scope.VIEWER
        and may_read_task(principal, owner, None)
    )


def may_bind(principal: Principal, owner: str | None, handling: Iterable[str] = ()) -> bool:
    """Bind a new reach to the session ``owner`` holds: whoever may manage it, or an agent
    key that speaks for an agent now handling one of its reaches (``handling``: the agents
    of its in-flight reaches), whose handler's onward reaches inherit the session."""
    if may_manage(principal, owner):
        return True
    return principal.scope is Scope.AGENT and any(principal.matches_agent(a) for a in handling)


def may_read(principal: Principal, owner: str | None, agents: Iterable[str] = ()) -> bool:
    """Read the session: its owner, an admin or viewer, or an agent key that speaks for an
    agent one of its reaches was routed to (``agents``: so a handler can ask whether its
    task's session is alive)."""
    if principal.scope in (Scope.ADMIN, Scope.VIEWER):
        return True
    if owner is not None and may_read_task(principal, owner, None):
        return True
    return principal.scope is Scope.AGENT and any(principal.matches_agent(a) for a in agents)


def format_closed(session_ids: Iterable[str]) -> str:
    """The header value: each id percent-encoded (an id may hold commas or non-ASCII),
    comma-separated, sorted so equal sets give equal headers."""
    return ",".join(sorted(quote(s, safe="") for s in set(session_ids)))


def parse_closed(value: str | None) -> frozenset[str]:
    """The session ids a header value names (`format_closed` reversed; blanks dropped)."""
    if not value:
        return frozenset()
    return frozenset(unquote(part.strip()) for part in value.split(",") if part.strip())
