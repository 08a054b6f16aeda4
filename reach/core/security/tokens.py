"""Reach tokens: what the hub signs into every delivery, and what an agent checks of one.

A reach token is a JWT the hub signs (EdDSA, Ed25519) for one attempt of one task::

    header  {"alg": "EdDSA", "typ": "JWT", "kid": <the signing key's id>}
    claims  iss  the hub (``security.issuer``)
            sub  who asked: the task's caller identity (``key:<id>``, ``agent:<id>``,
                 ``anonymous`` on an open hub)
            aud  the target agent ID: the token is worth nothing to any other agent
            task_id, attempt_seq   the delivery it rides on
            method                 the method it is posted to (``/tasks/<method>``)
            body_sha256            hex sha256 of the exact bytes of the delivery's body (its
                                   payload, task_id, attempt_seq, deadline, trace ...)
            iat, exp               issued at, expires at (at most 15 minutes later)
            jti                    unique: an agent accepts a token once

The last two bind the token to the request: a token captured on the way (from a log, a
proxy, another instance of the same agent, whose seen-``jti`` cache is its own) cannot
carry another payload or reach another method. The body's bytes are hashed as they
travel, never a re-serialisation of them, so an agent checks exactly what it got.

Tokens are never forwarded: a reach from inside a handler authenticates with the agent's
own credential and the hub mints a new token for that hop (``sub`` = the agent).

Pure: `claims_for` builds the claims, `public_jwk` a signing key's published half,
`check_claims` is the agent's decision on decoded claims (the signature is checked
before it, by ``reach.sdk.tokens``). The clock, the ttl and the jti are arguments, so
the rules are table-tested.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ALGORITHM = "EdDSA"
"""The only algorithm a reach token is signed or accepted with (never ``none``, never HS*)."""

MAX_TTL_S = 900
"""A reach token lives at most 15 minutes (design: short-lived, bound to caller and target)."""

DEFAULT_LEEWAY_S = 30.0
"""Clock skew an agent tolerates between its clock and the hub's."""

REQUIRED = (
    "iss", "sub", "aud", "task_id", "attempt_seq", "method", "body_sha256", "iat", "exp", "jti",
)  # fmt: skip


def body_digest(raw: bytes) -> str:
    """The ``body_sha256`` of a delivery body: hex sha256 of its exact bytes."""
    return hashlib.sha256(raw).hexdigest()


def public_jwk(key: Ed25519PrivateKey) -> dict[str, str]:
    """The public half of ``key`` as a JWK (what a hub publishes at
    ``/.well-known/jwks.json``), its ``kid`` the RFC 7638 thumbprint."""
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    x = _b64url(raw)
    # RFC 7638: the required members only, sorted, no whitespace
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
    kid = _b64url(hashlib.sha256(canonical.encode()).digest())
    return {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": ALGORITHM, "use": "sig"}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims_for(
    issuer: str,
    subject: str,
    audience: str,
    task_id: str,
    attempt_seq: int,
    now: float,
    ttl_s: float,
    jti: str,
    *,
    method: str,
    body_sha256: str,
) -> dict[str, Any]:
    """The claims of the token for one attempt, bound to the method it is posted to and
    the digest of its body (`body_digest`); its lifetime is capped at `MAX_TTL_S`."""
    if ttl_s <= 0:
        raise ValueError(f"ttl_s: must be > 0, got {ttl_s!r}")
    iat = int(now)
    return {
        "iss": issuer,
        "sub": subject,
        "aud": audience,
        "task_id": task_id,
        "attempt_seq": attempt_seq,
        "method": method,
        "body_sha256": body_sha256,
        "iat": iat,
        "exp": iat + max(1, int(min(ttl_s, MAX_TTL_S))),
        "jti": jti,
    }


def check_claims(
    claims: Mapping[str, Any],
    expected_audience: str,
    task_id: object,
    now: float,
    leeway: float = DEFAULT_LEEWAY_S,
    *,
    attempt_seq: object,
    method: str,
    body_sha256: str,
    issuer: str | None = None,
) -> str | None:
    """Why an agent refuses a token with these (signature-checked) claims, or None.

    ``task_id`` and ``attempt_seq`` are the delivery body's (a body without an integer
    ``attempt_seq`` is refused: the attempt is part of what a token is good for);
    ``method`` is the one the delivery was posted to and ``body_sha256`` the
    `body_digest` of the body's bytes as received; ``issuer`` None accepts any issuer
    (the signature already proves the token is the hub's). Reasons never quote the token.
    """
    missing = [name for name in REQUIRED if name not in claims]
    if missing:
        return f"token lacks claims: {', '.join(missing)}"
    for name in ("iss", "sub", "task_id", "method", "body_sha256", "jti"):
        if not isinstance(claims[name], str) or not claims[name]:
            return f"token claim {name} is not a non-empty string"
    for name in ("iat", "exp"):
        if not _is_number(claims[name]):
            return f"token claim {name} is not a finite number"
    if not _is_int(claims["attempt_seq"]):
        return "token claim attempt_seq is not an integer"
    if issuer is not None and claims["iss"] != issuer:
        return "token issued by another issuer"
    if not _audience_matches(claims["aud"], expected_audience):
        return f"token is meant for another agent, not {expected_audience!r}"
    iat, exp = float(claims["iat"]), float(claims["exp"])
    if exp <= iat:
        return "token expires before it was issued"
    if exp - iat > MAX_TTL_S:
        return f"token lifetime exceeds {MAX_TTL_S} s"
    if iat > now + leeway:
        return "token issued in the future"
    if exp + leeway <= now:
        return "token expired"
    if claims["task_id"] != task_id:
        return "token is for another task"
    if not _is_int(attempt_seq):
        return "delivery body names no attempt_seq (an integer): the token cannot be matched"
    if claims["attempt_seq"] != attempt_seq:
        return "token is for another attempt"
    if claims["method"] != method:
        return "token is for another method"
    if not hmac.compare_digest(str(claims["body_sha256"]).encode(), body_sha256.encode()):
        return "token was signed for another body: the delivery's payload or fields differ"
    return None


def _audience_matches(aud: object, expected: str) -> bool:
    # a single audience; a list is allowed by RFC 7519 but the hub mints only strings, and
    # a token naming several agents would let any of them present it to the others
    return isinstance(aud, str) and aud == expected


def _is_number(value: object) -> bool:
    # NaN and infinity compare False with everything: they would pass every time check
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
