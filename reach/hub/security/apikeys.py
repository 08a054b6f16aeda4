"""API keys: create, list, revoke, and authenticate a presented secret into a `Principal`.

Only a key's id and the SHA-256 of its secret are stored; the secret is returned once, by
`create_key`. Every request reads the key's row afresh (no cache), so a revocation or an
expiry acts on the very next request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.core.security import auth
from reach.core.security.auth import Principal, Scope
from reach.errors import Unauthenticated, UnknownKey
from reach.hub.storage.models import ApiKeyRow

INVALID_KEY = "invalid API key"  # unknown id and wrong secret alike: no oracle for ids
MAX_NAME = 128
MAX_PATTERN = 128
# what an unknown id's secret is compared against, so it costs what a known one does
_NO_DIGEST = auth.digest("rk_000000000000_no-such-key-no-such-key")


@dataclass(frozen=True, slots=True)
class CreatedKey:
    """A new key, with its secret: the only time the secret exists outside the caller."""

    key_id: str
    secret: str
    scope: Scope
    agent_pattern: str | None
    name: str
    expires_at: float | None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a presented secret does not authenticate: ``reason`` and ``key_id`` are for the
    hub's log and metrics; ``detail`` is all the caller is told."""

    reason: str  # malformed | unknown_key | wrong_secret | expired | revoked
    detail: str
    key_id: str | None = None

    def error(self) -> Unauthenticated:
        return Unauthenticated(self.detail)


def create_key(
    session: Session,
    *,
    scope: Scope,
    agent_pattern: str | None,
    name: str,
    expires_in_s: float | None,
    now: float,
    allowed_capabilities: list[str] | None = None,
    allowed_tags: list[str] | None = None,
) -> CreatedKey:
    """Store a new key and return it with its secret (shown once, never stored).

    Raises ``ValueError`` for a combination that could never be used: an agent key needs
    the agent ID (or glob) it speaks for, and only an agent key has one.
    """
    scope = Scope(scope)
    pattern = (agent_pattern or "").strip() or None
    if scope is Scope.AGENT and pattern is None:
        raise ValueError("an agent key needs --agent-id (an agent ID or a glob such as 'a-*')")
    if scope is not Scope.AGENT and pattern is not None:
        raise ValueError(f"only an agent key names agents; a {scope.value} key takes no agent ID")
    if pattern is not None and len(pattern) > MAX_PATTERN:
        raise ValueError(f"agent ID pattern longer than {MAX_PATTERN} characters")
    if len(name) > MAX_NAME:
        raise ValueError(f"key name longer than {MAX_NAME} characters")
    if expires_in_s is not None and not expires_in_s > 0:
        raise ValueError("expires_in must be positive")
    key_id = auth.new_key_id()
    secret = auth.new_secret(key_id)
    expires_at = now + expires_in_s if expires_in_s is not None else None
    session.add(
        ApiKeyRow(
            key_id=key_id,
            name=name,
            scope=scope.value,
            agent_pattern=pattern,
            secret_hash=auth.digest(secret),
            created_at=now,
            expires_at=expires_at,
            revoked_at=None,
            allowed_capabilities=allowed_capabilities,
            allowed_tags=allowed_tags,
        )
    )
    session.flush()
    return CreatedKey(key_id, secret, scope, pattern, name, expires_at)


def list_keys(session: Session, now: float) -> list[dict[str, Any]]:
    """Every key's view, oldest first (never its hash)."""
    rows = session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.key_id))
    return [view(row, now) for row in rows]


def revoke_key(session: Session, key_id: str, now: float) -> dict[str, Any]:
    """Revoke at once; revoking a revoked key keeps the first revocation time."""
    row = session.get(ApiKeyRow, key_id, with_for_update=True)
    if row is None:
        raise UnknownKey(f"API key {key_id!r} does not exist", key_id=key_id)
    if row.revoked_at is None:
        row.revoked_at = now
    return view(row, now)


def view(row: ApiKeyRow, now: float) -> dict[str, Any]:
    refusal = auth.key_refusal(row.expires_at, row.revoked_at, now)
    return {
        "key_id": row.key_id,
        "name": row.name,
        "scope": row.scope,
        "agent_pattern": row.agent_pattern,
        "created_at": row.created_at,
        "expires_at": row.expires_at,
        "revoked_at": row.revoked_at,
        "state": refusal or "active",
        "allowed_capabilities": row.allowed_capabilities,
        "allowed_tags": row.allowed_tags,
    }


def authenticate(session: Session, secret: str, now: float) -> Principal:
    """The principal a presented secret stands for; `Unauthenticated` when it is
    malformed, unknown, wrong, expired or revoked."""
    checked = check(session, secret, now)
    if isinstance(checked, Refusal):
        raise checked.error()
    return checked


def check(session: Session, secret: str, now: float) -> Principal | Refusal:
    """`authenticate`, answering why not instead of raising (the API logs and counts it).

    The secret is checked before the key's state, so only its holder learns that a key
    expired or was revoked; anyone else is told the same "invalid API key".
    """
    key_id = auth.parse_secret(secret)
    if key_id is None:
        return Refusal("malformed", "malformed API key: expected rk_<key id>_<secret>")
    row = session.get(ApiKeyRow, key_id)
    if row is None:
        auth.secret_matches(secret, _NO_DIGEST)
        return Refusal("unknown_key", INVALID_KEY, key_id)
    if not auth.secret_matches(secret, row.secret_hash):
        return Refusal("wrong_secret", INVALID_KEY, key_id)
    refusal = auth.key_refusal(row.expires_at, row.revoked_at, now)
    if refusal is not None:
        return Refusal(refusal, f"API key {key_id} is {refusal}", key_id)
    return Principal(
        scope=Scope(row.scope),
        key_id=row.key_id,
        agent_pattern=row.agent_pattern,
        name=row.name,
        allowed_capabilities=_patterns(row.allowed_capabilities),
        allowed_tags=_patterns(row.allowed_tags),
    )


def _patterns(stored: list[str] | None) -> tuple[str, ...] | None:
    return None if stored is None else tuple(stored)


def set_allowed(
    session: Session,
    key_id: str,
    *,
    capabilities: list[str] | None,
    tags: list[str] | None,
    now: float,
) -> dict[str, Any]:
    """An admin sets (or widens) what an agent key's agents may declare: fnmatch patterns
    of capabilities and tags; None leaves that list as it is, ``[]`` allows nothing, and
    ``["*"]`` anything. Refused for a key of another scope (``ValueError``)."""
    row = session.get(ApiKeyRow, key_id, with_for_update=True)
    if row is None:
        raise UnknownKey(f"API key {key_id!r} does not exist", key_id=key_id)
    if row.scope != Scope.AGENT.value:
        raise ValueError(f"only an agent key declares agents; {key_id} is a {row.scope} key")
    for patterns in (capabilities, tags):
        if patterns is not None and any(not p or len(p) > MAX_PATTERN for p in patterns):
            raise ValueError(f"a pattern must be 1 to {MAX_PATTERN} characters")
    if capabilities is not None:
        row.allowed_capabilities = sorted(set(capabilities))
    if tags is not None:
        row.allowed_tags = sorted(set(tags))
    session.flush()
    return view(row, now)
