"""The hub's signing keys: the Ed25519 keys that sign reach tokens, and their rotation.

Keys live in ``signing_keys``: the private key as PKCS8 PEM sealed with the hub's seal key
(``reach.hub.security.sealing``: a copy of the database alone cannot sign tokens; rows from before
sealing are read as they are), the public key as a JWK
(``kty=OKP``, ``crv=Ed25519``, ``alg=EdDSA``, ``use=sig``; ``kid`` is its RFC 7638
thumbprint). A key signs from ``not_before`` until a newer key does, and is published in
the JWKS (``GET /.well-known/jwks.json``) until ``retire_after``.

Rotation never strands a token: ``rotate`` publishes the new key at once but lets it sign
only after ``grace_s`` (agents refresh their cached JWKS meanwhile); the previous key stays
published until the new one signs plus a token's longest life, so every token it signed
verifies until it expires. ``immediate`` (a compromised key) signs with the new key at
once: agents fetch it on the first unknown ``kid``.

The first key is created on first use (`current_key`), under a lock so that two workers
starting together end with one key: PostgreSQL's transaction-scoped advisory lock;
SQLite's write lock, which every write transaction takes at ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import jwt
from cachetools import TTLCache
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session, sessionmaker

from reach.core.security.tokens import (
    ALGORITHM,
    DEFAULT_LEEWAY_S,
    MAX_TTL_S,
    body_digest,
    claims_for,
    public_jwk,
)
from reach.errors import ConfigError
from reach.hub.security.sealing import SealKey, is_sealed
from reach.hub.storage.engine import advisory_xact_lock
from reach.hub.storage.models import SigningKeyRow

RETIRE_AFTER_S = MAX_TTL_S + DEFAULT_LEEWAY_S
"""How long a replaced key stays published after its successor signs: a token's longest
life plus the clock skew agents allow, so the last token it signed still verifies."""

_TICK = 0.001  # a rotated key signs at least this long after the key it replaces
_LOCK_KEY = 0x7265616368_6B6579  # pg_advisory_xact_lock id of key creation and rotation
SEAL_PURPOSE = "signing key"  # what a sealed private key is bound to, with its kid


def current_key(session: Session, now: float, seal: SealKey | None = None) -> SigningKeyRow:
    """The key that signs at ``now``; the first one is created here if there is none.

    A first key another process created while we waited for the lock may sign only from
    a moment after our ``now`` (its clock was read later, or runs ahead): that key is the
    one, not a reason for a second. Two first keys would each sign some tokens, and an
    agent that fetched the keys between the two refuses the other's tokens until it may
    fetch again."""
    row = _signing(session, now)
    if row is not None:
        return row
    _lock(session)
    # another worker may have created it while we waited
    row = _signing(session, now) or _first_published(session, now)
    if row is None:
        row = _new_key(now, not_before=now, seal=seal)
        session.add(row)
        session.flush()
    return row


def signing_key(session: Session, now: float) -> SigningKeyRow | None:
    """The key that signs at ``now``, or None before the first one (a read: it creates
    nothing, so a read session will do)."""
    return _signing(session, now)


def rotate(
    session: Session,
    now: float,
    grace_s: float,
    immediate: bool = False,
    seal: SealKey | None = None,
) -> dict[str, Any]:
    """Publish a new key now; it signs from ``now + grace_s`` (``immediate``: from now).

    Every key published before it is retired `RETIRE_AFTER_S` after the new one starts
    signing; keys retired already are deleted (their tokens have all expired). With no
    key yet, the new one signs at once: there is nothing to roll over from. ``immediate``
    also withdraws keys published ahead of an earlier rotation (they never signed, and may
    be as exposed as the key being replaced). Returns the new key's view.
    """
    if grace_s < 0:
        raise ValueError(f"grace_s: must be >= 0, got {grace_s!r}")
    _lock(session)
    session.execute(
        delete(SigningKeyRow).where(
            SigningKeyRow.retire_after.is_not(None), SigningKeyRow.retire_after <= now
        )
    )
    if immediate:  # keys published ahead never signed anything: withdrawn with the rest
        session.execute(delete(SigningKeyRow).where(SigningKeyRow.not_before > now))
    previous = list(session.scalars(select(SigningKeyRow)).all())
    signs_from = now if immediate or _signing(session, now) is None else now + grace_s
    # strictly after every key before it: the newest rotation is the one that signs
    latest = max((row.not_before for row in previous), default=signs_from - 1)
    signs_from = max(signs_from, latest + _TICK)
    retire = signs_from + RETIRE_AFTER_S
    for row in previous:
        if row.retire_after is None or row.retire_after > retire:
            row.retire_after = retire
    new = _new_key(now, not_before=signs_from, seal=seal)
    session.add(new)
    session.flush()
    signing = _signing(session, now)
    return {
        **_view(new, signing.kid if signing else None, now),
        "retiring": [{"kid": r.kid, "retire_after": r.retire_after} for r in previous],
    }


def jwks(
    session: Session, now: float, *, ensure: bool = False, seal: SealKey | None = None
) -> dict[str, list[dict[str, Any]]]:
    """The JWK Set agents verify with: every key published at ``now``, newest first.

    ``ensure`` (a write transaction): create the first key if there is none yet (sealed
    with ``seal``), so an agent that asks before the first delivery is not told the hub
    has no keys."""
    if ensure:
        current_key(session, now, seal)
    return {"keys": [dict(row.public_jwk) for row in _published(session, now)]}


def list_keys(session: Session, now: float) -> list[dict[str, Any]]:
    """Every stored key's view (never the private key): kid, window and state."""
    rows = session.scalars(
        select(SigningKeyRow).order_by(SigningKeyRow.not_before.desc(), SigningKeyRow.kid)
    ).all()
    signing = _signing(session, now)
    return [_view(row, signing.kid if signing else None, now) for row in rows]


class Signer:
    """Mints reach tokens in one worker process.

    The signing key is read from the store at most once every ``cache_s`` seconds (and
    its PEM parsed then, not per token): a rotation reaches every worker within that
    time, and the key it replaces stays published far longer than that.
    """

    def __init__(
        self,
        db: sessionmaker[Session],
        *,
        issuer: str,
        ttl_s: float,
        cache_s: float = 5.0,
        timer: Callable[[], float] = time.monotonic,
        seal: SealKey | None = None,
    ) -> None:
        self._sessions = db
        self._seal = seal
        self.issuer = issuer
        self.ttl_s = min(ttl_s, MAX_TTL_S)
        self._cache: TTLCache[str, tuple[str, Ed25519PrivateKey]] = TTLCache(
            maxsize=1, ttl=cache_s, timer=timer
        )
        self._lock = threading.Lock()

    def mint(
        self,
        *,
        subject: str,
        audience: str,
        task_id: str,
        attempt_seq: int,
        method: str,
        body: bytes,
        now: float,
    ) -> str:
        """The token of one attempt: ``sub`` the caller, ``aud`` the target agent, bound to
        the ``method`` it is posted to and the exact ``body`` bytes it is posted with."""
        kid, key = self._key(now)
        claims = claims_for(
            self.issuer, subject, audience, task_id, attempt_seq, now, self.ttl_s,
            uuid.uuid4().hex, method=method, body_sha256=body_digest(body),
        )  # fmt: skip
        return jwt.encode(claims, key, algorithm=ALGORITHM, headers={"kid": kid})

    def _key(self, now: float) -> tuple[str, Ed25519PrivateKey]:
        with self._lock:
            cached = self._cache.get("current")
            if cached is not None:
                return cached
            with self._sessions.begin() as session:
                row = current_key(session, now, self._seal)
                kid, key = row.kid, private_key(row, self._seal)
            self._cache["current"] = (kid, key)
            return kid, key


# -- keys ----------------------------------------------------------------------------------


def private_pem(row: SigningKeyRow, seal: SealKey | None) -> str:
    """``row``'s private key as PEM, unsealed with ``seal``. A sealed key and no seal key
    is a configuration error (this process was not given the hub's seal key)."""
    if seal is None:
        if is_sealed(row.private_pem):
            raise ConfigError(
                f"signing key {row.kid} is sealed and this process has no seal key",
                key="security.seal_key",
            )
        return row.private_pem
    return seal.open(row.private_pem, purpose=SEAL_PURPOSE, name=row.kid)


def private_key(row: SigningKeyRow, seal: SealKey | None) -> Ed25519PrivateKey:
    """``row``'s private key, unsealed and parsed."""
    key = serialization.load_pem_private_key(private_pem(row, seal).encode(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise TypeError(f"signing key {row.kid} is not an Ed25519 key")
    return key


def _new_key(now: float, *, not_before: float, seal: SealKey | None) -> SigningKeyRow:
    key = Ed25519PrivateKey.generate()
    jwk = public_jwk(key)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    if seal is not None:
        pem = seal.seal(pem, purpose=SEAL_PURPOSE, name=jwk["kid"])
    return SigningKeyRow(
        kid=jwk["kid"],
        algorithm=ALGORITHM,
        private_pem=pem,
        public_jwk=jwk,
        created_at=now,
        not_before=not_before,
        retire_after=None,
    )


def _not_retired(now: float) -> Any:
    return or_(SigningKeyRow.retire_after.is_(None), SigningKeyRow.retire_after > now)


def _signing(session: Session, now: float) -> SigningKeyRow | None:
    return session.scalar(
        select(SigningKeyRow)
        .where(SigningKeyRow.not_before <= now, _not_retired(now))
        .order_by(SigningKeyRow.not_before.desc(), SigningKeyRow.kid.desc())
        .limit(1)
    )


def _first_published(session: Session, now: float) -> SigningKeyRow | None:
    """The published key that signs first (when none signs at ``now`` yet)."""
    return session.scalar(
        select(SigningKeyRow)
        .where(_not_retired(now))
        .order_by(SigningKeyRow.not_before, SigningKeyRow.kid)
        .limit(1)
    )


def _published(session: Session, now: float) -> list[SigningKeyRow]:
    return list(
        session.scalars(
            select(SigningKeyRow)
            .where(_not_retired(now))
            .order_by(SigningKeyRow.not_before.desc(), SigningKeyRow.kid)
        ).all()
    )


def _state(row: SigningKeyRow, signing_kid: str | None, now: float) -> str:
    if row.retire_after is not None and row.retire_after <= now:
        return "retired"
    if row.kid == signing_kid:
        return "signing"
    if row.not_before > now:
        return "next"
    return "previous"


def _view(row: SigningKeyRow, signing_kid: str | None, now: float) -> dict[str, Any]:
    return {
        "kid": row.kid,
        "algorithm": row.algorithm,
        "created_at": row.created_at,
        "not_before": row.not_before,
        "retire_after": row.retire_after,
        "state": _state(row, signing_kid, now),
    }


def _lock(session: Session) -> None:
    """Serialise key creation and rotation until this transaction ends."""
    advisory_xact_lock(session, _LOCK_KEY)
    # SQLite: a write transaction holds the database lock from BEGIN IMMEDIATE
