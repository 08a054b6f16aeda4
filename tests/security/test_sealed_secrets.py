"""Secrets at rest and separate keys for separate purposes (issue 37, item 19), against a
real ``reach api`` process.

Before: the dashboard's session cookies were MACed with a key derived from the token-signing
key's private PEM, which the database holds in plaintext: anyone who could read the
database (a backup, a replica) could forge a signed-in session for any admin key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import stat
import time
from pathlib import Path

import pytest
import requests
from sqlalchemy import select
from sqlalchemy.orm import Session

from reach.errors import ConfigError
from reach.hub.api.signin import COOKIE
from reach.hub.interop.a2a import exchange
from reach.hub.security import signing
from reach.hub.security.sealing import KEY_FILE, SealKey
from reach.hub.storage.models import InstanceRow, SigningKeyRow
from tests.security.edge_hub import EdgeHub, csrf_of, edge_hub
from tests.support.a2a_echo import A2aEchoProcess
from tests.support.ports import free_port
from tests.support.stacks import wait_http_ok

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged_cookie(row: SigningKeyRow, key_id: str) -> str:
    """A session cookie made the way the hub made them before: its MAC keyed by the
    token-signing key's PEM, read from the database."""
    mac_key = hmac.new(
        row.private_pem.encode(), b"agent-reach dashboard session v1", hashlib.sha256
    ).digest()
    body = {"k": key_id, "s": "forged-session", "e": time.time() + 3600, "v": row.kid}
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    mac = hmac.new(mac_key, payload.encode(), hashlib.sha256).digest()
    return f"{payload}.{_b64(mac)}"


def sign_in(hub: EdgeHub) -> str:
    browser = hub.client(1)
    form = browser.get(f"{hub.url}/ui/login", timeout=10)
    fields = {"api_key": hub.admin.secret, "next": "/ui", "csrf_token": csrf_of(form.text)}
    answer = browser.post(f"{hub.url}/ui/login", data=fields, allow_redirects=False, timeout=10)
    assert answer.status_code == 303
    return str(answer.cookies[COOKIE])


def page_for(hub: EdgeHub, cookie: str) -> int:
    headers = {"Cookie": f"{COOKIE}={cookie}"}
    return requests.get(
        f"{hub.url}/ui", headers=headers, allow_redirects=False, timeout=10
    ).status_code


def test_the_database_alone_cannot_forge_a_session_or_sign_a_token(
    store_url: str, tmp_path: Path
) -> None:
    with edge_hub(store_url, tmp_path) as hub:
        assert requests.get(f"{hub.url}/.well-known/jwks.json", timeout=10).json()["keys"]
        with Session(hub.engine) as db:
            row = db.scalars(select(SigningKeyRow)).first()
            assert row is not None
            db.expunge(row)
        assert page_for(hub, forged_cookie(row, hub.admin.key_id)) == 303  # to the sign-in

        # the token-signing key is sealed: the database holds no private key
        assert row.private_pem.startswith("sealed:v1:") and "PRIVATE KEY" not in row.private_pem
        seal = SealKey.load(None, tmp_path)  # the hub's home holds the key that opens it
        opened = signing.private_key(row, seal)
        assert signing.public_jwk(opened)["kid"] == row.kid
        with pytest.raises(ConfigError):  # another hub's seal key opens nothing
            signing.private_key(row, SealKey(b"x" * 32))

        # the session key is the seal key's own: sessions outlive the token-signing keys
        cookie = sign_in(hub)
        assert page_for(hub, cookie) == 200
        with Session(hub.engine) as db, db.begin():
            db.query(SigningKeyRow).delete()
        assert page_for(hub, cookie) == 200
        key_file = tmp_path / KEY_FILE  # the seal key: in the hub's home, not the database
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    # another seal key: every session it did not sign is refused
    with edge_hub(store_url, tmp_path, REACH_SECURITY__SEAL_KEY=SealKey.generate()) as hub:
        assert page_for(hub, cookie) == 303


def test_an_a2a_credential_is_stored_sealed(store_url: str, tmp_path: Path) -> None:
    secret = "a2a-bearer-secret-" + "z" * 24
    (tmp_path / "hub").mkdir()
    agent = A2aEchoProcess(free_port(), tmp_path / "echo.jsonl", streaming=False, bearer=secret)
    try:
        wait_http_ok(agent.url + "/.well-known/agent-card.json")
        with edge_hub(store_url, tmp_path / "hub") as hub:
            added = requests.post(
                f"{hub.url}/api/v1/agents/a2a",
                json={"card_url": agent.url, "credential": secret, "allow_loopback": True},
                headers={"Authorization": f"Bearer {hub.admin.secret}"},
                timeout=30,
            )
            assert added.status_code == 201, added.text
            instance_id = added.json()["instance_id"]
            with Session(hub.engine) as db:
                row = db.get(InstanceRow, instance_id)
                assert row is not None and row.a2a_credential is not None
                assert secret not in row.a2a_credential
                seal = SealKey.load(None, tmp_path / "hub")
                peer = exchange.peer_of(db, instance_id, seal)  # what a delivery presents
                assert peer is not None and peer.credential == secret
                with pytest.raises(ConfigError):  # the database alone opens nothing
                    exchange.peer_of(db, instance_id, None)
    finally:
        agent.stop()
