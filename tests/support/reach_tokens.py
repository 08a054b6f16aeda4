"""Reach tokens made the way the hub makes them, for tests that post to an agent directly.

`mint` signs with the hub's own current key, read from the hub's store (the key the hub
publishes at ``/.well-known/jwks.json``), so an agent that verifies tokens accepts what a
test sends exactly as it accepts a delivery -- or refuses it for the one claim the test
changed (an old ``iat``, another audience, another task).

A hub process seals its signing key with the seal key of its home (``reach.hub.security.sealing``):
give its home with the store (`HubStore`) wherever a hub process may have made the key.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from reach.core.security.tokens import ALGORITHM, body_digest, claims_for
from reach.hub.security import signing
from reach.hub.security.sealing import SealKey
from reach.hub.storage import create_engine_for, session_factory


@dataclass(frozen=True)
class HubStore:
    """A hub's store and home (where its seal key lives)."""

    url: str
    home: Path | None = None


def hub_key(store: str | HubStore) -> tuple[str, Ed25519PrivateKey]:
    """The hub's signing key now (created if the hub has none yet): kid and private key."""
    where = store if isinstance(store, HubStore) else HubStore(store)
    seal = SealKey.load(None, where.home) if where.home is not None else None
    engine = create_engine_for(where.url)
    try:
        with session_factory(engine).begin() as session:
            row = signing.current_key(session, time.time(), seal)
            kid, pem = row.kid, signing.private_pem(row, seal)
    finally:
        engine.dispose()
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return kid, key


def sign(claims: dict[str, Any], kid: str, key: Ed25519PrivateKey) -> str:
    return jwt.encode(claims, key, algorithm=ALGORITHM, headers={"kid": kid})


def encoded(body: dict[str, Any]) -> bytes:
    """A delivery body's bytes, as the hub encodes them (and a test then posts them)."""
    return json.dumps(body, separators=(",", ":")).encode()


def mint(
    store_url: str | HubStore,
    *,
    audience: str,
    task_id: str,
    body: bytes,
    attempt_seq: int = 1,
    method: str = "work.do",
    subject: str = "anonymous",
    iat: float | None = None,
    ttl_s: float = 300,
    issuer: str = "agent-reach",
) -> str:
    """A token signed with the hub's key for a delivery of ``body`` (its exact bytes) to
    ``method``; ``iat`` in the past makes an expired one."""
    kid, key = hub_key(store_url)
    claims = claims_for(
        issuer, subject, audience, task_id, attempt_seq, time.time() if iat is None else iat,
        ttl_s, uuid.uuid4().hex, method=method, body_sha256=body_digest(body),
    )  # fmt: skip
    return sign(claims, kid, key)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
