"""Callbacks' pure rules: the SSRF screen, the retry backoff, the bodies, and that a
callback's signature and an approval webhook's cannot stand in for each other."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from reach.core.notify.callbacks import progress_body, result_body, url_refusal
from reach.core.notify.outbound import b64url, canonical, next_delay
from reach.errors import InvalidSignature
from reach.hub.notify import approval_webhook, callbacks
from reach.sdk.callbacks import verify_callback
from reach.sdk.webhooks import verify_webhook

PUBLIC = "93.184.216.34"


def resolver(*addresses: str):  # type: ignore[no-untyped-def]
    def resolve(host: str, port: int) -> Sequence[str]:
        return addresses

    return resolve


@pytest.mark.parametrize(
    ("url", "addresses", "allow_private", "rule"),
    [
        ("https://hooks.example.com/cb", (PUBLIC,), False, None),
        ("http://hooks.example.com:8080/cb?x=1", (PUBLIC,), False, None),
        ("http://hooks.example.com/cb", ("127.0.0.1",), False, "loopback"),
        ("http://hooks.example.com/cb", (PUBLIC, "10.0.0.8"), False, "private"),  # any one
        ("http://hooks.example.com/cb", ("169.254.169.254",), False, "link-local"),
        ("http://hooks.example.com/cb", ("::ffff:127.0.0.1",), False, "loopback"),
        ("http://hooks.example.com/cb", ("fe80::1",), False, "link-local"),
        ("http://hooks.example.com/cb", ("0.0.0.0",), False, "unspecified"),
        ("http://hooks.example.com/cb", ("127.0.0.1",), True, None),  # allowed
        ("ftp://hooks.example.com/cb", (PUBLIC,), True, "http(s)"),  # shape: always
        ("http:///cb", (PUBLIC,), True, "http(s)"),
        ("http://u:p@hooks.example.com/cb", (PUBLIC,), True, "credentials"),
        ("http://hooks.example.com/cb#frag", (PUBLIC,), True, "fragment"),
        ("http://hooks.example.com:99999/cb", (PUBLIC,), True, "not a URL"),
        ("http://hooks.example.com/" + "x" * 600, (PUBLIC,), True, "longer"),
    ],
)
def test_url_refusal(
    url: str, addresses: tuple[str, ...], allow_private: bool, rule: str | None
) -> None:
    refusal = url_refusal(url, allow_private, resolver(*addresses))
    if rule is None:
        assert refusal is None
    else:
        assert refusal is not None and rule in refusal


def test_a_name_that_resolves_to_nothing_raises() -> None:
    with pytest.raises(OSError):
        url_refusal("http://nowhere.example/cb", False, resolver())


@pytest.mark.parametrize("attempts", [1, 2, 3, 5, 8, 20])
def test_backoff_grows_and_stays_under_its_cap(attempts: int) -> None:
    rng = random.Random(7)
    delays = [next_delay(attempts, 0.5, 30.0, rng) for _ in range(50)]
    nominal = min(30.0, 0.5 * 2 ** (attempts - 1))
    assert all(0 < d <= 30.0 * 1.2 + 1e-9 for d in delays)
    assert min(delays) >= nominal * 0.8 - 1e-9


def test_bodies_carry_the_id_and_the_context() -> None:
    task = {"task_id": "t1", "status": "success", "result": {"x": 1}, "error": None}
    body = result_body(5, {**task, "finished_at": 9.0}, {"turns": [1, 2]})
    assert body["callback_id"] == 5 and body["context"] == {"turns": [1, 2]}
    assert body["event"] == "task_result" and body["result"] == {"x": 1}
    progress = progress_body(6, "t1", None, {"progress": 0.5}, "c")
    assert progress["event"] == "task_progress" and progress["progress"] == {"progress": 0.5}


def _key() -> tuple[str, dict[str, str]]:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return pem, {"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": b64url(raw), "use": "sig"}


def test_a_callback_and_a_webhook_cannot_stand_in_for_each_other() -> None:
    pem, jwk = _key()
    jwks = {"keys": [jwk]}
    body = canonical({"event": "task_result", "callback_id": 1})
    as_callback = callbacks.sign(body, "k1", pem)
    as_webhook = approval_webhook.sign(body, "k1", pem)
    assert verify_callback(body, as_callback, jwks)["callback_id"] == 1
    assert verify_webhook(body, as_webhook, jwks)["callback_id"] == 1
    with pytest.raises(InvalidSignature, match="purpose"):
        verify_webhook(body, as_callback, jwks)
    with pytest.raises(InvalidSignature, match="purpose"):
        verify_callback(body, as_webhook, jwks)
    with pytest.raises(InvalidSignature):
        verify_callback(body + b" ", as_callback, jwks)
    with pytest.raises(InvalidSignature):
        verify_callback(body, "garbage", jwks)
