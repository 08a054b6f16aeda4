"""The hub's seal key: secrets at rest are sealed with a key the database does not hold.

The key is 32 random bytes from ``security.seal_key`` (``REACH_SECURITY__SEAL_KEY``,
base64url; give every hub process on every machine the same one) or, when that is unset,
from ``<storage.home>/seal.key`` (created on first use, mode 0600; processes sharing the
home share it). A copy of the database alone (a backup, a replica, a leaked dump) then
holds sealed values it cannot open.

Each purpose gets a key of its own, derived with HKDF-SHA256 (`derive`): sealing secrets
(`seal` and `open`: AES-256-GCM, the purpose and the row's name as associated data, so a
sealed value moved to another row or column does not open) and signing the dashboard's
session cookies (``reach.hub.api.signin``) never share a key, and neither uses the
token-signing key. A stored value that is not sealed (written before sealing existed)
opens as itself.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from reach.errors import ConfigError

SEALED_PREFIX = "sealed:v1:"
KEY_FILE = "seal.key"
_KEY_BYTES = 32
_NONCE_BYTES = 12
_LABEL = b"agent-reach seal v1: "


class SealKey:
    """The hub's seal key (see the module docstring); never logged, never stored in the
    database."""

    __slots__ = ("_secret",)

    def __init__(self, secret: bytes) -> None:
        if len(secret) != _KEY_BYTES:
            raise ConfigError(
                f"the seal key must be {_KEY_BYTES} bytes (base64url), got {len(secret)}",
                key="security.seal_key",
            )
        self._secret = secret

    def __repr__(self) -> str:
        return f"SealKey({self.fingerprint})"

    @classmethod
    def load(cls, configured: str | None, home: Path) -> SealKey:
        """``configured`` (base64url) if set, else ``home``'s key file, made if missing."""
        if configured:
            try:
                secret = base64.urlsafe_b64decode(configured + "=" * (-len(configured) % 4))
            except ValueError as exc:
                raise ConfigError(
                    "security.seal_key is not base64url", key="security.seal_key"
                ) from exc
            return cls(secret)
        return cls(_key_file(home / KEY_FILE))

    @staticmethod
    def generate() -> str:
        """A new key, as ``security.seal_key`` takes it."""
        return base64.urlsafe_b64encode(secrets.token_bytes(_KEY_BYTES)).decode().rstrip("=")

    @property
    def fingerprint(self) -> str:
        """A short public name of the key (which key sealed what; not a secret)."""
        return hashlib.sha256(self.derive("fingerprint")).hexdigest()[:16]

    def derive(self, purpose: str) -> bytes:
        """A 32-byte key for ``purpose`` alone."""
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LABEL + purpose.encode())
        return hkdf.derive(self._secret)

    def seal(self, plaintext: str, *, purpose: str, name: str) -> str:
        """``plaintext`` sealed for the row ``name`` of ``purpose``."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = AESGCM(self.derive("seal")).encrypt(nonce, plaintext.encode(), _aad(purpose, name))
        return SEALED_PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, stored: str, *, purpose: str, name: str) -> str:
        """What `seal` sealed; a value that is not sealed opens as itself. A value sealed
        by another key, for another row, or tampered with raises ``ConfigError``."""
        if not is_sealed(stored):
            return stored
        raw = base64.urlsafe_b64decode(stored[len(SEALED_PREFIX) :])
        nonce, sealed = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
        try:
            plain = AESGCM(self.derive("seal")).decrypt(nonce, sealed, _aad(purpose, name))
        except InvalidTag as exc:
            raise ConfigError(
                f"a sealed {purpose} ({name}) does not open with this hub's seal key "
                f"({self.fingerprint}): is security.seal_key (or <home>/seal.key) the one "
                "every hub process uses?",
                key="security.seal_key",
            ) from exc
        return plain.decode()


def is_sealed(stored: str | None) -> bool:
    return bool(stored) and str(stored).startswith(SEALED_PREFIX)


def _aad(purpose: str, name: str) -> bytes:
    return f"{purpose}\x00{name}".encode()


def _key_file(path: Path) -> bytes:
    """The key in ``path``, made (mode 0600) if there is none: written beside it, then
    linked into place, so two processes starting together end with the same key."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        spare = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(SealKey.generate() + "\n")
            try:
                os.link(spare, path)
            except FileExistsError:
                pass  # another process made it first: theirs is the key
        finally:
            spare.unlink(missing_ok=True)
    text = path.read_text().strip()
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError as exc:
        raise ConfigError(f"{path} does not hold a seal key", key="security.seal_key") from exc
