"""The hub's signing keys on both stores: one first key however many workers race for it,
and rotation windows in which every token minted stays verifiable until it expires."""

from __future__ import annotations

import threading
import time

import jwt
from sqlalchemy import Engine, func, select

from reach.core.security.tokens import MAX_TTL_S
from reach.hub.security import signing
from reach.hub.security.signing import RETIRE_AFTER_S, Signer
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import SigningKeyRow

NOW = 1_800_000_000.0


def _jwks(engine: Engine, now: float) -> dict[str, dict[str, str]]:
    with session_factory(engine).begin() as session:
        return {k["kid"]: k for k in signing.jwks(session, now)["keys"]}


def _verify(token: str, keys: dict[str, dict[str, str]], audience: str) -> dict[str, object]:
    kid = jwt.get_unverified_header(token)["kid"]
    key = jwt.PyJWK(keys[kid]).key
    return dict(jwt.decode(token, key, algorithms=["EdDSA"], audience=audience, leeway=10))


def test_workers_racing_for_the_first_key_end_with_one(store_url: str) -> None:
    """Eight processes' worth of connections ask for the current key at once."""
    engines = [create_engine_for(store_url) for _ in range(8)]
    barrier = threading.Barrier(len(engines))
    kids: list[str] = []
    errors: list[BaseException] = []

    def first_use(engine: Engine) -> None:
        try:
            barrier.wait(10)
            with session_factory(engine).begin() as session:
                kids.append(signing.current_key(session, NOW).kid)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=first_use, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert errors == []
        assert len(kids) == 8 and len(set(kids)) == 1
        with session_factory(engines[0]).begin() as session:
            assert session.scalar(select(func.count()).select_from(SigningKeyRow)) == 1
    finally:
        for e in engines:
            e.dispose()


def test_a_first_key_created_a_moment_later_is_the_one(engine: Engine) -> None:
    """A worker read its clock (``NOW``) before another process, whose clock read a moment
    later, created the first key: the later key is the first key, not a reason for a
    second (two first keys: an agent that fetched between them refuses the other's
    tokens with 503 until it may fetch again)."""
    sessions = session_factory(engine)
    with sessions.begin() as session:
        first = signing.current_key(session, NOW + 0.25).kid
    with sessions.begin() as session:
        assert signing.current_key(session, NOW).kid == first
    with sessions.begin() as session:
        assert session.scalar(select(func.count()).select_from(SigningKeyRow)) == 1
    assert set(_jwks(engine, NOW)) == {first}


def test_workers_whose_clocks_differ_end_with_one_first_key(store_url: str) -> None:
    """Eight processes' worth of connections ask for the current key one after another,
    each with a clock a little behind the one before."""
    engines = [create_engine_for(store_url) for _ in range(8)]
    try:
        kids = []
        for i, engine in enumerate(engines):
            with session_factory(engine).begin() as session:
                kids.append(signing.current_key(session, NOW - i * 0.01).kid)
        assert len(kids) == 8 and len(set(kids)) == 1
        with session_factory(engines[0]).begin() as session:
            assert session.scalar(select(func.count()).select_from(SigningKeyRow)) == 1
    finally:
        for e in engines:
            e.dispose()


def test_the_jwk_is_the_public_half_named_by_its_thumbprint(engine: Engine) -> None:
    with session_factory(engine).begin() as session:
        row = signing.current_key(session, NOW)
        assert row.algorithm == "EdDSA"
        assert row.private_pem.startswith("-----BEGIN PRIVATE KEY-----")  # PKCS8
    (jwk,) = _jwks(engine, NOW).values()
    assert set(jwk) == {"kty", "crv", "x", "kid", "alg", "use"}
    assert (jwk["kty"], jwk["crv"], jwk["alg"], jwk["use"]) == ("OKP", "Ed25519", "EdDSA", "sig")
    assert jwk["kid"] == row.kid
    assert jwt.PyJWK(jwk).key is not None


def test_a_graceful_rotation_publishes_first_and_signs_later(engine: Engine) -> None:
    sessions = session_factory(engine)
    with sessions.begin() as session:
        old = signing.current_key(session, NOW).kid
    with sessions.begin() as session:
        new = signing.rotate(session, NOW + 10, grace_s=300)
    assert (new["state"], new["not_before"]) == ("next", NOW + 310)
    assert new["retiring"] == [{"kid": old, "retire_after": NOW + 310 + RETIRE_AFTER_S}]
    assert set(_jwks(engine, NOW + 11)) == {old, new["kid"]}  # published at once
    with sessions.begin() as session:
        assert signing.current_key(session, NOW + 309).kid == old  # not signing yet
        assert signing.current_key(session, NOW + 310).kid == new["kid"]
        states = {k["kid"]: k["state"] for k in signing.list_keys(session, NOW + 400)}
    assert states == {old: "previous", new["kid"]: "signing"}
    # the old key stays published until its last token has expired, then goes
    last_old_token_expires = NOW + 309 + MAX_TTL_S
    assert old in _jwks(engine, last_old_token_expires)
    assert set(_jwks(engine, NOW + 310 + RETIRE_AFTER_S)) == {new["kid"]}
    with sessions.begin() as session:  # the next rotation deletes the retired key
        signing.rotate(session, NOW + 310 + RETIRE_AFTER_S + 1, grace_s=0)
        kept = {k["kid"] for k in signing.list_keys(session, NOW + 310 + RETIRE_AFTER_S + 1)}
    assert old not in kept and new["kid"] in kept


def test_an_immediate_rotation_signs_at_once_and_old_tokens_still_verify(
    engine: Engine,
) -> None:
    sessions = session_factory(engine)
    now = time.time()
    before = Signer(sessions, issuer="hub-x", ttl_s=300)
    old_token = before.mint(
        subject="key:k1",
        audience="billing",
        task_id="t",
        attempt_seq=1,
        method="m",
        body=b"{}",
        now=now,
    )
    with sessions.begin() as session:
        new = signing.rotate(session, now + 1, grace_s=300, immediate=True)
    assert new["state"] == "signing"
    after = Signer(sessions, issuer="hub-x", ttl_s=300)
    new_token = after.mint(
        subject="agent:a",
        audience="billing",
        task_id="t",
        attempt_seq=2,
        method="m",
        body=b"{}",
        now=now + 2,
    )
    assert jwt.get_unverified_header(new_token)["kid"] == new["kid"]
    keys = _jwks(engine, now + 2)
    assert _verify(old_token, keys, "billing")["sub"] == "key:k1"
    assert _verify(new_token, keys, "billing")["sub"] == "agent:a"


def test_an_immediate_rotation_withdraws_a_key_published_ahead(engine: Engine) -> None:
    sessions = session_factory(engine)
    with sessions.begin() as session:
        old = signing.current_key(session, NOW).kid
        ahead = signing.rotate(session, NOW + 10, grace_s=300)
        now = signing.rotate(session, NOW + 20, grace_s=300, immediate=True)
    assert now["state"] == "signing" and now["not_before"] == NOW + 20
    assert [r["kid"] for r in now["retiring"]] == [old]
    assert set(_jwks(engine, NOW + 21)) == {old, now["kid"]}
    with sessions.begin() as session:  # and it never comes to sign later
        assert signing.current_key(session, NOW + 400).kid == now["kid"]
    assert ahead["kid"] not in _jwks(engine, NOW + 400)


def test_rotating_an_empty_store_signs_at_once(engine: Engine) -> None:
    """Nothing to roll over from: a grace period would leave the hub with no key to sign."""
    with session_factory(engine).begin() as session:
        new = signing.rotate(session, NOW, grace_s=300)
        assert new["state"] == "signing" and new["not_before"] == NOW
        assert signing.current_key(session, NOW).kid == new["kid"]
        assert session.scalar(select(func.count()).select_from(SigningKeyRow)) == 1


def test_a_signer_caches_the_key_briefly(engine: Engine) -> None:
    sessions = session_factory(engine)
    clock = [0.0]
    signer = Signer(sessions, issuer="i", ttl_s=300, cache_s=5, timer=lambda: clock[0])
    now = time.time()

    def kid(at: float) -> str:
        token = signer.mint(
            subject="s", audience="a", task_id="t", attempt_seq=1, method="m", body=b"", now=at
        )
        return str(jwt.get_unverified_header(token)["kid"])

    first = kid(now)
    with sessions.begin() as session:
        new = signing.rotate(session, now + 1, grace_s=0, immediate=True)
    clock[0] = 4.9
    assert kid(now + 2) == first  # within the cache: the old key (still published) signs
    clock[0] = 5.1
    assert kid(now + 2) == new["kid"]


def test_a_token_never_outlives_fifteen_minutes(engine: Engine) -> None:
    signer = Signer(session_factory(engine), issuer="i", ttl_s=86_400)
    token = signer.mint(
        subject="s", audience="a", task_id="t", attempt_seq=1, method="m", body=b"", now=time.time()
    )
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == MAX_TTL_S
