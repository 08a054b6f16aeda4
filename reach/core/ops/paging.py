"""Listing pages: opaque cursors, limits, filters and time bounds, checked in one place.

Pure. A list endpoint (tasks, DAG runs, alerts) answers newest first, one page at a time,
by *keyset*: the cursor names the last row a page showed, ``(at, rank, id)``, and the next
page starts strictly after it. Rows written meanwhile neither shift a page nor repeat
one (an offset would do both). ``rank`` orders rows of several sources that share an
instant (alerts merge instance events and audit rows); single-source lists leave it 0.

A cursor is ``base64url(json)`` + ``.`` + a check: a cursor that is cut, edited, made up
or taken from another listing is refused (`BadCursor`, 400) instead of silently paging
from somewhere else. It is not a secret: who may read a row is decided by the query, so a
cursor crafted by hand can only start a page where its owner could have anyway.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from reach.core.ledger.statuses import DagRunStatus, TaskStatus
from reach.errors import BadCursor, InvalidQuery

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "DagRunFilter",
    "Page",
    "Position",
    "TaskFilter",
    "check_limit",
    "check_range",
    "decode_cursor",
    "decode_key_cursor",
    "encode_cursor",
    "encode_key_cursor",
    "parse_choices",
    "parse_instant",
    "parse_statuses",
]

S = TypeVar("S", TaskStatus, DagRunStatus)

DEFAULT_LIMIT: Final = 50
MAX_LIMIT: Final = 500
_VERSION: Final = 1
_MAX_CURSOR: Final = 512  # a real cursor is ~80 characters; anything far longer is not one
_MAX_TEXT: Final = 256  # a filter value (agent id, caller, session) longer than any stored
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """Where a page ended: the last row's time, its source's rank and its id."""

    at: float
    rank: int = 0
    id: int = 0


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a listing: its items (newest first) and the cursor of the next page
    (None on the last page)."""

    items: list[dict[str, Any]]
    next_cursor: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items, "next_cursor": self.next_cursor}


def _check(kind: str, body: str) -> str:
    return hashlib.sha256(f"reach-cursor:{kind}:{body}".encode()).hexdigest()[:12]


def encode_cursor(kind: str, position: Position) -> str:
    """The opaque cursor of the page after ``position`` in the listing ``kind``."""
    raw = json.dumps([_VERSION, kind, position.at, position.rank, position.id])
    body = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    return f"{body}.{_check(kind, body)}"


def decode_cursor(kind: str, cursor: str) -> Position:
    """The position ``cursor`` names in the listing ``kind``; `BadCursor` if it is not one
    this listing issued (garbage, cut, edited, or another listing's)."""
    refused = BadCursor("cursor is not valid for this listing: start again without it")
    if not isinstance(cursor, str) or not cursor or len(cursor) > _MAX_CURSOR:
        raise refused
    body, dot, check = cursor.partition(".")
    if not dot or not hmac.compare_digest(check.encode(), _check(kind, body).encode()):
        raise refused
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        decoded = json.loads(raw)
    except (binascii.Error, ValueError):
        raise refused from None
    if not (isinstance(decoded, list) and len(decoded) == 5):
        raise refused
    version, named, at, rank, row_id = decoded
    if version != _VERSION or named != kind:
        raise refused
    if not _is_number(at) or not math.isfinite(at) or not _is_int(rank) or not _is_int(row_id):
        raise refused
    return Position(float(at), rank, row_id)


def encode_key_cursor(kind: str, key: str) -> str:
    """The cursor of the page after the row whose key is ``key``, in a listing ordered by a
    unique text key (the fleet, by agent ID) instead of time: same form and check."""
    raw = json.dumps([_VERSION, kind, key])
    body = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    return f"{body}.{_check(kind, body)}"


def decode_key_cursor(kind: str, cursor: str) -> str:
    """The key ``cursor`` names in the listing ``kind``; `BadCursor` if it is not one this
    listing issued."""
    refused = BadCursor("cursor is not valid for this listing: start again without it")
    if not isinstance(cursor, str) or not cursor or len(cursor) > _MAX_CURSOR:
        raise refused
    body, dot, check = cursor.partition(".")
    if not dot or not hmac.compare_digest(check.encode(), _check(kind, body).encode()):
        raise refused
    try:
        decoded = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError):
        raise refused from None
    if not (isinstance(decoded, list) and len(decoded) == 3):
        raise refused
    version, named, key = decoded
    if version != _VERSION or named != kind or not isinstance(key, str) or not key:
        raise refused
    return key


def check_limit(limit: int | None) -> int:
    """The page size: ``limit``, or `DEFAULT_LIMIT` when unset; 1..`MAX_LIMIT`."""
    if limit is None:
        return DEFAULT_LIMIT
    if not _is_int(limit) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidQuery(f"limit: must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def parse_instant(value: str | float | None, now: float, *, name: str = "since") -> float | None:
    """A time bound as epoch seconds: a number (epoch seconds), an ISO 8601 time (UTC when
    it names no zone) or a duration ago (``90s``, ``15m``, ``2h``, ``7d``, ``1w``)."""
    if value is None:
        return None
    if _is_number(value):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        seconds = _parse_text(text, now, name)
    else:
        raise InvalidQuery(f"{name}: expected a time, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidQuery(f"{name}: must be a finite time after 1970, got {value!r}")
    return seconds


def _parse_text(text: str, now: float, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    relative = _RELATIVE.fullmatch(text.lower())
    if relative:
        return now - float(relative.group(1)) * _UNIT_S[relative.group(2)]
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidQuery(
            f"{name}: expected epoch seconds, an ISO 8601 time or a duration ago "
            f"such as 15m, 2h or 7d; got {text[:64]!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def check_range(since: float | None, until: float | None) -> None:
    """``since`` must come before ``until`` when both are given."""
    if since is not None and until is not None and since >= until:
        raise InvalidQuery(f"since ({since:g}) must be before until ({until:g})")


def parse_statuses(values: Iterable[str] | str | None, enum: type[S]) -> frozenset[S]:
    """The statuses named (empty: any), each one of ``enum``'s; an unknown one is refused
    with the known ones listed. ``"failed,dead"`` and two repeats mean the same."""
    known = [s.value for s in enum]
    return frozenset(enum(v) for v in parse_choices(values, known, name="status"))


def parse_choices(
    values: Iterable[str] | str | None, known: Iterable[str], *, name: str
) -> frozenset[str]:
    """The values named (empty: any; commas split like repeats), each one of ``known``."""
    if values is None:
        return frozenset()
    if isinstance(values, str):
        values = [values]
    allowed = frozenset(known)
    found: set[str] = set()
    for value in values:
        for part in str(value).split(","):
            choice = part.strip().lower()
            if not choice:
                continue
            if choice not in allowed:
                listed = ", ".join(sorted(allowed))
                raise InvalidQuery(f"{name}: unknown {name} {choice[:64]!r}; known: {listed}")
            found.add(choice)
    return frozenset(found)


def check_text(value: str | None, name: str) -> str | None:
    """A text filter as stored text can hold it: trimmed, bounded, no NUL (PostgreSQL
    refuses NUL in text, so it would fail as a 500 rather than match nothing)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidQuery(f"{name}: expected a string, got {value!r}")
    value = value.strip()
    if len(value) > _MAX_TEXT:
        raise InvalidQuery(f"{name}: longer than {_MAX_TEXT} characters")
    if "\x00" in value:
        raise InvalidQuery(f"{name}: contains a NUL character")
    return value or None  # a blank form field means "any"


def _bound(value: float | None, name: str) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or not math.isfinite(value):
        raise InvalidQuery(f"{name}: must be a finite number of epoch seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks to list; every field unset means any. ``statuses`` may hold several
    (any of them); ``capability`` is the task's method; ``caller`` the recorded identity
    (``key:<id>``, ``agent:<id>``, ``anonymous``); since/until bound ``created_at``
    (since inclusive, until exclusive). Values are checked when built (`InvalidQuery`)."""

    statuses: frozenset[TaskStatus] = field(default_factory=frozenset)
    agent_id: str | None = None
    capability: str | None = None
    caller: str | None = None
    session_id: str | None = None
    since: float | None = None
    until: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "statuses", parse_statuses(self.statuses, TaskStatus))
        for name in ("agent_id", "capability", "caller", "session_id"):
            object.__setattr__(self, name, check_text(getattr(self, name), name))
        object.__setattr__(self, "since", _bound(self.since, "since"))
        object.__setattr__(self, "until", _bound(self.until, "until"))
        check_range(self.since, self.until)

    @classmethod
    def parse(
        cls,
        now: float,
        *,
        status: Iterable[str] | str | None = None,
        agent_id: str | None = None,
        capability: str | None = None,
        caller: str | None = None,
        session_id: str | None = None,
        since: str | float | None = None,
        until: str | float | None = None,
    ) -> TaskFilter:
        """Built from request parameters: times may be ISO 8601 or durations ago."""
        return cls(
            statuses=parse_statuses(status, TaskStatus),
            agent_id=agent_id,
            capability=capability,
            caller=caller,
            session_id=session_id,
            since=parse_instant(since, now, name="since"),
            until=parse_instant(until, now, name="until"),
        )


@dataclass(frozen=True, slots=True)
class DagRunFilter:
    """Which DAG runs to list: statuses (any of them), the DAG's ``name``, and a
    ``created_at`` range (since inclusive, until exclusive); unset means any."""

    statuses: frozenset[DagRunStatus] = field(default_factory=frozenset)
    name: str | None = None
    since: float | None = None
    until: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "statuses", parse_statuses(self.statuses, DagRunStatus))
        object.__setattr__(self, "name", check_text(self.name, "name"))
        object.__setattr__(self, "since", _bound(self.since, "since"))
        object.__setattr__(self, "until", _bound(self.until, "until"))
        check_range(self.since, self.until)

    @classmethod
    def parse(
        cls,
        now: float,
        *,
        status: Iterable[str] | str | None = None,
        name: str | None = None,
        since: str | float | None = None,
        until: str | float | None = None,
    ) -> DagRunFilter:
        return cls(
            statuses=parse_statuses(status, DagRunStatus),
            name=name,
            since=parse_instant(since, now, name="since"),
            until=parse_instant(until, now, name="until"),
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
