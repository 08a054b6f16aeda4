"""The approval webhook's format and rules: the body, the detached JWS the hub signs it
with and `reach.verify_webhook`'s check of it, the SSRF screen and the answer table."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import reach
from reach.core.notify.approval_webhook import request_body
from reach.core.notify.outbound import (
    Answer,
    address_refusal,
    answer_of,
    b64url,
    canonical,
    split_detached,
    url_refusal,
)
from reach.hub.notify.outbound import sign
from reach.hub.security.signing import public_jwk

APPROVAL = {
    "approval_id": "ap-1",
    "task_id": "t-1",
    "capability": "orders.cancel",
    "agent_id": "sales-agent-01",
    "method": "orders.cancel",
    "caller": "key:abc",
    "payload_hash": "0" * 64,
    "requested_at": 100.0,
    "expires_at": 3700.0,
}


def keypair() -> tuple[str, str, dict[str, Any]]:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    jwk = public_jwk(key)
    return jwk["kid"], pem, {"keys": [jwk]}


def signed() -> tuple[bytes, str, dict[str, Any]]:
    kid, pem, jwks = keypair()
    body = canonical(request_body(APPROVAL, "https://hub.example/"))
    return body, sign(body, kid, pem), jwks


def test_body_links_back_to_the_hub_only_when_its_public_url_is_known() -> None:
    body = request_body(APPROVAL, "https://hub.example/")
    assert {k: body[k] for k in APPROVAL} == APPROVAL
    assert body["links"] == {
        "approve_api": "https://hub.example/api/v1/approvals/ap-1/approve",
        "reject_api": "https://hub.example/api/v1/approvals/ap-1/reject",
        "dashboard": "https://hub.example/ui/approvals/ap-1",
    }
    assert request_body(APPROVAL, None)["links"] == {}


def test_signature_is_a_detached_jws_naming_the_key() -> None:
    _body, signature, jwks = signed()
    _protected, header, sig = split_detached(signature)
    assert signature.split(".")[1] == ""  # the payload is left out: the body is sent as is
    assert header == {"alg": "EdDSA", "kid": jwks["keys"][0]["kid"]}
    assert len(sig) == 64


def test_verify_webhook_returns_the_body_it_verified() -> None:
    body, signature, jwks = signed()
    assert reach.verify_webhook(body, signature, jwks) == json.loads(body)


def test_a_standard_jose_library_verifies_it_with_the_payload_put_back() -> None:
    import jwt

    body, signature, jwks = signed()
    protected, _, sig = signature.split(".")
    compact = f"{protected}.{b64url(body)}.{sig}"
    key = jwt.PyJWK(jwks["keys"][0]).key
    assert jwt.api_jws.PyJWS().decode(compact, key, algorithms=["EdDSA"]) == body


def _forged_alg_none(body: bytes, signature: str) -> str:
    header = b64url(
        json.dumps({"alg": "none", "kid": split_detached(signature)[1]["kid"]}).encode()
    )
    return f"{header}..{signature.split('.')[2]}"


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda b, s, j: (b.replace(b"orders.cancel", b"orders.refund"), s, j), "does not match"),
        (lambda b, s, j: (b, s[:-4] + ("AAAA" if s[-4:] != "AAAA" else "BBBB"), j), ""),
        (lambda b, s, j: (b, s, {"keys": keypair()[2]["keys"]}), "not in the hub's key set"),
        (lambda b, s, j: (b, s, {"keys": []}), "not in the hub's key set"),
        (lambda b, s, j: (b, "", j), "detached"),
        (lambda b, s, j: (b, "a.b.c", j), "detached"),
        (lambda b, s, j: (b, s.replace("..", f".{b64url(b)}."), j), "detached"),
        (lambda b, s, j: (b, _forged_alg_none(b, s), j), "alg must be EdDSA"),
    ],
    ids=[
        "altered-body",
        "altered-signature",
        "another-hubs-key",
        "empty-key-set",
        "no-signature",
        "not-detached",
        "payload-attached",
        "alg-none",
    ],
)
def test_anything_but_the_hubs_signature_of_these_bytes_is_refused(
    tamper: Any, message: str
) -> None:
    body, signature, jwks = tamper(*signed())
    with pytest.raises(reach.InvalidSignature) as refused:
        reach.verify_webhook(body, signature, jwks)
    assert message in str(refused.value)


def test_a_forged_signature_by_an_unpublished_key_with_a_published_kid_fails() -> None:
    body, _signature, jwks = signed()
    _, other_pem, _ = keypair()
    kid = jwks["keys"][0]["kid"]
    with pytest.raises(reach.InvalidSignature, match="does not match"):
        reach.verify_webhook(body, sign(body, kid, other_pem), jwks)


def test_verify_webhook_wants_the_raw_bytes() -> None:
    body, signature, jwks = signed()
    with pytest.raises(TypeError):
        reach.verify_webhook(json.loads(body), signature, jwks)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="jwks or hub"):
        reach.verify_webhook(body, signature)


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("93.184.216.34", None),
        ("2606:2800:220:1:248:1893:25c8:1946", None),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),  # cloud metadata
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
    ],
)
def test_address_refusal(address: str, refused: str | None) -> None:
    reason = address_refusal(address)
    assert (reason is None) == (refused is None)
    if refused:
        assert refused in str(reason)


def test_a_name_is_refused_when_any_of_its_addresses_is_private() -> None:
    def resolve(host: str, port: int) -> list[str]:
        return {"pub.example": ["93.184.216.34"], "mixed.example": ["93.184.216.34", "10.0.0.1"]}[
            host
        ]

    assert url_refusal("https://pub.example/hook", resolve) is None
    assert "private" in str(url_refusal("https://mixed.example/hook", resolve))
    assert "not an http(s) URL" in str(url_refusal("file:///etc/passwd", resolve))
    with pytest.raises(OSError):
        url_refusal("https://nothing.example/", lambda h, p: [])


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (None, Answer.RETRY),
        (200, Answer.DELIVERED),
        (204, Answer.DELIVERED),
        (408, Answer.RETRY),
        (429, Answer.RETRY),
        (500, Answer.RETRY),
        (503, Answer.RETRY),
        (301, Answer.DROP),
        (400, Answer.DROP),
        (404, Answer.DROP),
    ],
)
def test_answer_of(status: int | None, answer: Answer) -> None:
    assert answer_of(status) is answer
