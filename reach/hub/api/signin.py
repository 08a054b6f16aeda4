"""Dashboard sign-in: an API key in, a signed, expiring session cookie out; CSRF tokens.

The cookie (``reach_ui``, HttpOnly, SameSite=Strict, Path=/ui, Secure over https) holds
``<payload>.<mac>``, signed by itsdangerous (HMAC-SHA256): the payload names the key id, a
random session id, the expiry and the MAC key (``kid``, its fingerprint) that signed it.
Every request checks the MAC, the expiry, that the session was not signed out (`sign_out`
records its id in ``ui_sign_outs`` until it would have expired: a copy of the cookie is
worthless after the sign-out), and reads the key's row afresh, so revoking (or expiring)
the key signs its sessions out on the very next request.

The MAC key is a key of its own, derived from the hub's seal key (``reach.hub.security.sealing``):
not the token-signing key (a key that signs reach tokens signs nothing else) and not
anything the database holds, so a copy of the database cannot forge a session. Every API
process with the same seal key accepts the same cookies; a new seal key signs everyone
out.

An open hub (``require_auth`` off) gives the dashboard an anonymous session (no key id) so
that its forms still carry a CSRF token: a page on another site cannot read it.

Neither the cookie nor a CSRF token is ever logged: the sign-in is a POST (the key never
lands in a URL), and refusals log only the key id.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from itsdangerous import BadData, HMACAlgorithm, URLSafeSerializer
from sqlalchemy.orm import Session

from reach.core.security import auth
from reach.core.security.auth import Principal, Scope
from reach.hub.security.sealing import SealKey
from reach.hub.storage.models import ApiKeyRow, UiSignOutRow

COOKIE = "reach_ui"
COOKIE_PATH = "/ui"
SESSION_TTL_S = 8 * 3600.0
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
SIGN_IN_SCOPES = frozenset({Scope.ADMIN, Scope.VIEWER, Scope.APPROVER})
_MAC_PURPOSE = "dashboard session v1"
_MAX_COOKIE = 1024
_HMAC = HMACAlgorithm(hashlib.sha256)
# the key is the seal key's own for this purpose (`mac_key`): itsdangerous derives no other
_SIGNER = {"key_derivation": "none", "digest_method": hashlib.sha256}


@dataclass(frozen=True, slots=True)
class UiSession:
    """A verified session: whose (``key_id``; None on an open hub) and until when."""

    key_id: str | None
    sid: str
    expires_at: float
    kid: str
    mac_key: bytes

    def csrf_token(self) -> str:
        """The token every POST form of this session carries (bound to the session id)."""
        return _HMAC.get_signature(self.mac_key, self._csrf_input).hex()

    def csrf_ok(self, presented: str | None) -> bool:
        """Timing-safe: whether ``presented`` is this session's CSRF token."""
        try:
            mac = bytes.fromhex(presented or "")
        except ValueError:
            return False
        if not mac or mac.hex() != presented:  # the token as issued, to the letter
            return False
        return _HMAC.verify_signature(self.mac_key, self._csrf_input, mac)

    @property
    def _csrf_input(self) -> bytes:
        return b"csrf:" + self.sid.encode()


@dataclass(frozen=True, slots=True)
class MacKey:
    """The key sessions are signed with (``kid``: its fingerprint, in every cookie)."""

    kid: str
    secret: bytes


def mac_key(seal: SealKey) -> MacKey:
    """The session-signing key: the seal key's own for this purpose."""
    secret = seal.derive(_MAC_PURPOSE)
    return MacKey(hashlib.sha256(secret).hexdigest()[:16], secret)


def new_session(key: MacKey, key_id: str | None, now: float) -> tuple[UiSession, str]:
    """A fresh session for ``key_id`` (None: anonymous) and its cookie value."""
    ui = UiSession(key_id, secrets.token_urlsafe(16), now + SESSION_TTL_S, key.kid, key.secret)
    fields = {"k": key_id, "s": ui.sid, "e": ui.expires_at, "v": key.kid}
    return ui, _serializer(key).dumps(fields)


def open_session(db: Session, cookie: str, now: float, key: MacKey) -> UiSession | None:
    """The session a cookie value stands for, or None when it is malformed, forged,
    expired or signed out (the key's own state is `principal_of`'s business)."""
    if not cookie or len(cookie) > _MAX_COOKIE:
        return None
    try:
        fields: Any = _serializer(key).loads(cookie)  # BadData: malformed or forged
        key_id, sid, expires_at, kid = fields["k"], fields["s"], fields["e"], fields["v"]
    except (BadData, KeyError, TypeError):
        return None
    if not isinstance(kid, str) or not isinstance(sid, str):
        return None
    if key_id is not None and not isinstance(key_id, str):
        return None
    if not isinstance(expires_at, int | float):
        return None
    if kid != key.kid:
        return None  # signed by another key (a seal key since replaced)
    if expires_at <= now:
        return None
    if key_id is not None and db.get(UiSignOutRow, sid) is not None:
        return None  # signed out: the cookie is refused although its MAC is good
    return UiSession(key_id, sid, float(expires_at), kid, key.secret)


def sign_out(db: Session, ui: UiSession, now: float) -> None:
    """End a signed-in session for good: its cookie is refused from now on, whoever holds
    a copy. An anonymous session (no key) is only forgotten by the browser: it grants
    nothing, and recording it would let anyone grow the table."""
    if ui.key_id is None or db.get(UiSignOutRow, ui.sid) is not None:
        return
    db.add(UiSignOutRow(sid=ui.sid, key_id=ui.key_id, signed_out_at=now, expires_at=ui.expires_at))


def principal_of(db: Session, ui: UiSession, now: float) -> Principal | None:
    """The principal of a signed-in session, read afresh: None once the key is revoked,
    expired, deleted, or of a scope that may not sign in."""
    if ui.key_id is None:
        return None
    row = db.get(ApiKeyRow, ui.key_id)
    if row is None or auth.key_refusal(row.expires_at, row.revoked_at, now) is not None:
        return None
    scope = Scope(row.scope)
    if scope not in SIGN_IN_SCOPES:
        return None
    return Principal(scope=scope, key_id=row.key_id, agent_pattern=row.agent_pattern, name=row.name)


def _serializer(key: MacKey) -> URLSafeSerializer:
    return URLSafeSerializer(key.secret, signer_kwargs=_SIGNER)
