"""The reach token's claims and the agent's decision on them
(reach.core.security.tokens), as tables."""

from __future__ import annotations

import math
from typing import Any

import pytest

from reach.core.security.tokens import MAX_TTL_S, REQUIRED, body_digest, check_claims, claims_for

NOW = 1_700_000_000.0


RAW = b'{"task_id":"t-1","attempt_seq":2,"payload":{"amount":5}}'
DIGEST = body_digest(RAW)
BOUND = {"method": "pay", "body_sha256": DIGEST}
DELIVERY: dict[str, Any] = {"attempt_seq": 2, "method": "pay", "body_sha256": DIGEST}


def good(**changes: Any) -> dict[str, Any]:
    claims = claims_for("agent-reach", "key:abc", "billing", "t-1", 2, NOW, 300, "j-1", **BOUND)
    claims.update(changes)
    return claims


def test_body_digest_is_hex_sha256_of_the_bytes() -> None:
    assert body_digest(b"abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


def test_claims_of_one_attempt() -> None:
    made = claims_for(
        "hub-x", "agent:planner", "billing", "t-9", 3, NOW + 0.7, 300, "jti-1", **BOUND
    )
    assert made == {
        "iss": "hub-x",
        "sub": "agent:planner",
        "aud": "billing",
        "task_id": "t-9",
        "attempt_seq": 3,
        "method": "pay",
        "body_sha256": DIGEST,
        "iat": int(NOW),
        "exp": int(NOW) + 300,
        "jti": "jti-1",
    }


@pytest.mark.parametrize(
    ("ttl_s", "lifetime"),
    [
        (300, 300),
        (900, 900),
        (901, MAX_TTL_S),  # never more than 15 minutes, whatever is asked
        (86_400, MAX_TTL_S),
        (5.9, 5),
        (0.2, 1),  # at least a second: exp must come after iat
    ],
)
def test_lifetime_is_capped(ttl_s: float, lifetime: int) -> None:
    claims = claims_for("i", "s", "a", "t", 1, NOW, ttl_s, "j", **BOUND)
    assert claims["exp"] - claims["iat"] == lifetime


@pytest.mark.parametrize("ttl_s", [0, -1])
def test_lifetime_must_be_positive(ttl_s: float) -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        claims_for("i", "s", "a", "t", 1, NOW, ttl_s, "j", **BOUND)


CASES: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    # name, claim changes, check arguments, refusal (None: accepted)
    ("good", {}, {}, None),
    ("another method", {}, {"method": "refund"}, "another method"),
    ("another body", {}, {"body_sha256": body_digest(RAW + b" ")}, "signed for another body"),
    ("body without attempt_seq", {}, {"attempt_seq": None}, "names no attempt_seq"),
    ("attempt_seq a string in the body", {}, {"attempt_seq": "2"}, "names no attempt_seq"),
    ("method claim not a string", {"method": 1}, {}, "method is not a non-empty string"),
    ("good, issuer pinned", {}, {"issuer": "agent-reach"}, None),
    ("another audience", {"aud": "payments"}, {}, "another agent"),
    ("audience as a list", {"aud": ["billing", "payments"]}, {}, "another agent"),
    ("audience empty", {"aud": ""}, {}, "another agent"),
    ("another task", {"task_id": "t-2"}, {}, "another task"),
    ("another attempt", {}, {"attempt_seq": 3}, "another attempt"),
    ("attempt as a string", {"attempt_seq": "2"}, {}, "attempt_seq is not an integer"),
    ("attempt as a bool", {"attempt_seq": True}, {}, "attempt_seq is not an integer"),
    ("another issuer", {"iss": "evil"}, {"issuer": "agent-reach"}, "another issuer"),
    ("expired", {"iat": NOW - 400, "exp": NOW - 100}, {}, "expired"),
    ("expired within leeway", {"iat": NOW - 320, "exp": NOW - 20}, {}, None),
    ("expired just past leeway", {"iat": NOW - 330, "exp": NOW - 30}, {}, "expired"),
    ("issued in the future", {"iat": NOW + 60, "exp": NOW + 360}, {}, "future"),
    ("issued a little ahead", {"iat": NOW + 10, "exp": NOW + 310}, {}, None),
    ("lives too long", {"exp": NOW + MAX_TTL_S + 1}, {}, "lifetime exceeds"),
    ("expires before issue", {"exp": NOW - 1}, {}, "before it was issued"),
    ("exp as a string", {"exp": str(NOW + 300)}, {}, "exp is not a finite number"),
    ("exp NaN", {"exp": math.nan}, {}, "exp is not a finite number"),
    ("exp infinite", {"exp": math.inf}, {}, "exp is not a finite number"),
    ("iat a bool", {"iat": True}, {}, "iat is not a finite number"),
    ("sub empty", {"sub": ""}, {}, "sub is not a non-empty string"),
    ("jti not a string", {"jti": 7}, {}, "jti is not a non-empty string"),
    ("task_id not a string", {"task_id": 1}, {}, "task_id is not a non-empty string"),
]


@pytest.mark.parametrize(
    ("changes", "kwargs", "refusal"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_check_claims(changes: dict[str, Any], kwargs: dict[str, Any], refusal: str | None) -> None:
    reason = check_claims(good(**changes), "billing", "t-1", NOW, 30.0, **{**DELIVERY, **kwargs})
    if refusal is None:
        assert reason is None
    else:
        assert reason is not None and refusal in reason


@pytest.mark.parametrize("name", REQUIRED)
def test_every_claim_is_required(name: str) -> None:
    claims = good()
    del claims[name]
    assert check_claims(claims, "billing", "t-1", NOW, **DELIVERY) == f"token lacks claims: {name}"


def test_body_without_task_id_is_refused() -> None:
    assert check_claims(good(), "billing", None, NOW, **DELIVERY) == "token is for another task"


def test_reasons_never_quote_the_claims() -> None:
    secretish = "s3cr3t-looking-value"
    for changes in ({"aud": secretish}, {"iss": secretish}, {"task_id": secretish}):
        reason = check_claims(
            good(**changes), "billing", "t-1", NOW, issuer="agent-reach", **DELIVERY
        )
        assert reason is not None and secretish not in reason
