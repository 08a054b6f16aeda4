"""`reach.hub.security.sealing`: what a seal key seals opens only with it, for the same row."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from reach.errors import ConfigError
from reach.hub.security.sealing import KEY_FILE, SEALED_PREFIX, SealKey, is_sealed

KEY = SealKey(b"k" * 32)


def test_sealed_values_open_only_for_their_row_purpose_and_key() -> None:
    sealed = KEY.seal("-----BEGIN PRIVATE KEY-----", purpose="signing key", name="kid-1")
    assert sealed.startswith(SEALED_PREFIX) and "PRIVATE" not in sealed and is_sealed(sealed)
    assert KEY.open(sealed, purpose="signing key", name="kid-1") == "-----BEGIN PRIVATE KEY-----"
    assert KEY.seal("x", purpose="p", name="n") != KEY.seal("x", purpose="p", name="n")  # nonce
    for purpose, name, key in (
        ("signing key", "kid-2", KEY),  # moved to another row
        ("a2a credential", "kid-1", KEY),  # or another column
        ("signing key", "kid-1", SealKey(b"o" * 32)),  # another hub's key
    ):
        with pytest.raises(ConfigError, match="does not open"):
            key.open(sealed, purpose=purpose, name=name)
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(ConfigError):
        KEY.open(tampered, purpose="signing key", name="kid-1")


def test_a_value_from_before_sealing_opens_as_itself() -> None:
    assert KEY.open("plain", purpose="p", name="n") == "plain"
    assert not is_sealed("plain") and not is_sealed(None) and not is_sealed("")


def test_each_purpose_has_its_own_key() -> None:
    derived = {KEY.derive(p) for p in ("seal", "dashboard session v1", "fingerprint")}
    assert len(derived) == 3 and all(len(k) == 32 for k in derived)
    assert KEY.derive("seal") == SealKey(b"k" * 32).derive("seal")  # deterministic
    assert "k" * 8 not in repr(KEY)  # the secret is never shown


def test_the_key_file_is_made_once_private_and_reused(tmp_path: Path) -> None:
    first = SealKey.load(None, tmp_path)
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SealKey.load(None, tmp_path).fingerprint == first.fingerprint
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE]  # no spare left behind


def test_a_configured_key_wins_and_a_bad_one_is_named(tmp_path: Path) -> None:
    configured = SealKey.generate()
    assert (
        SealKey.load(configured, tmp_path).fingerprint != SealKey.load(None, tmp_path).fingerprint
    )
    with pytest.raises(ConfigError) as caught:
        SealKey.load("c2hvcnQ", tmp_path)
    assert caught.value.extra["key"] == "security.seal_key"
