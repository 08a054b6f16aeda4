"""An agent's check of the reach token on every delivery, before its handler runs.

The hub signs a token into each delivery (``reach.core.security.tokens``). `TokenVerifier` checks
it: the signature against the hub's published keys (EdDSA only: never ``none``, never an
HS* secret guessed from a public key), then the claims (``aud`` is this agent, not
expired, ``task_id`` and ``attempt_seq`` are the body's, ``method`` the one posted to,
``body_sha256`` the digest of the body's bytes as received), then that its ``jti`` was
never seen. A refusal is the answer the agent gives instead of running the handler:

* 401: the token is missing, forged, expired, replayed or not for this delivery; the hub
  records the task as failed with the reason (a new attempt would be refused the same).
* 503: the token may be good but cannot be checked yet (the hub's keys are out of reach,
  or a key it does not know was asked for moments ago): the hub retries the attempt.

The keys (``GET /.well-known/jwks.json``) are fetched on first use and cached; they are
fetched again when a token names an unknown ``kid`` (a rotation) -- at most once every
``refetch_interval`` seconds, so forged ``kid`` values cannot make the agent hammer its
hub -- and when the cached set is older than ``max_age``, so a key the hub publishes
ahead of a rotation is known before it signs.

Seen ``jti`` values are kept until their token expires (plus the leeway), in a bounded
cache: past ``max_seen`` live tokens the oldest is forgotten first; a replay of it would
still meet the agent's dedup guard, which answers a task it already ran from its cache.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from cachetools import TLRUCache

from reach.core.security.auth import bearer_of
from reach.core.security.tokens import ALGORITHM, DEFAULT_LEEWAY_S, body_digest, check_claims
from reach.errors import ReachError
from reach.sdk.hub_client import HubClient

log = logging.getLogger("reach.sdk.tokens")

JWKS_PATH = "/.well-known/jwks.json"

# PyJWT checks the signature and the algorithm; every claim is `check_claims`'s decision
_DECODE_OPTIONS: Any = {
    "verify_signature": True,
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "verify_sub": False,
    "verify_jti": False,
}


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a delivery's token was not accepted, as the agent answers it."""

    status: int  # 401 refused; 503 cannot be checked now (the hub retries)
    message: str

    def answer(self) -> tuple[int, dict[str, Any]]:
        return self.status, {"code": self.status, "message": self.message}


class TokenVerifier:
    """Checks the reach tokens of deliveries to ``agent_id`` (thread-safe).

    ``issuer`` None accepts whatever ``iss`` the hub signs (its signature is the proof);
    set it to the hub's ``security.issuer`` to pin it as well.
    """

    def __init__(
        self,
        hub: HubClient,
        agent_id: str,
        issuer: str | None = None,
        *,
        leeway: float = DEFAULT_LEEWAY_S,
        refetch_interval: float = 5.0,
        max_age: float = 60.0,
        max_seen: int = 200_000,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hub = hub
        self.agent_id = agent_id
        self.issuer = issuer
        self.leeway = leeway
        self.refetch_interval = refetch_interval
        self.max_age = max_age
        self._clock = clock
        self._timer = timer
        self._keys_lock = threading.Lock()
        self._keys: dict[str, Any] = {}
        self._fetched_at: float | None = None  # last successful fetch (timer)
        self._tried_at: float | None = None  # last fetch attempt (timer)
        self._seen_lock = threading.Lock()
        # jti -> the wall-clock time until which its token could still be accepted
        self._seen: TLRUCache[str, float] = TLRUCache(
            maxsize=max_seen, ttu=lambda _jti, until, _now: until, timer=clock
        )

    def check(
        self, authorization: str | None, body: Mapping[str, Any], *, method: str, raw: bytes
    ) -> Refusal | None:
        """None if the delivery's token is good (its jti is now spent), else the refusal.

        ``body`` is the delivery's parsed body, ``raw`` its bytes as received (the token
        binds their digest) and ``method`` the one it was posted to."""
        token = bearer_of(authorization)
        if token is None:
            return Refusal(401, "no reach token (expected 'Authorization: Bearer <token>')")
        header = _header_of(token)
        if header is None:
            return Refusal(401, "malformed reach token")
        if header.get("alg") != ALGORITHM:
            return Refusal(401, f"reach token not signed with {ALGORITHM}")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            return Refusal(401, "reach token names no signing key (kid)")
        key = self._key(kid)
        if isinstance(key, Refusal):
            return key
        try:
            claims = jwt.decode(token, key, algorithms=[ALGORITHM], options=_DECODE_OPTIONS)
        except jwt.InvalidSignatureError:
            return Refusal(401, "reach token signature does not verify")
        except jwt.PyJWTError:
            return Refusal(401, "malformed reach token")
        now = self._clock()
        reason = check_claims(
            claims,
            self.agent_id,
            body.get("task_id"),
            now,
            self.leeway,
            attempt_seq=body.get("attempt_seq"),
            method=method,
            body_sha256=body_digest(raw),
            issuer=self.issuer,
        )
        if reason is not None:
            return Refusal(401, reason)
        with self._seen_lock:
            jti = claims["jti"]
            if self._seen.get(jti) is not None:
                return Refusal(401, "reach token already used (replayed jti)")
            self._seen[jti] = float(claims["exp"]) + self.leeway
        return None

    # -- the hub's keys --------------------------------------------------------------------
    def _key(self, kid: str) -> Any:
        """The public key ``kid`` names, fetching the hub's keys if due; or a `Refusal`."""
        with self._keys_lock:
            now = self._timer()
            known = kid in self._keys
            due = self._fetched_at is None or now - self._fetched_at >= self.max_age
            if known and not due:
                return self._keys[kid]
            if self._tried_at is None or now - self._tried_at >= self.refetch_interval:
                self._tried_at = now
                fetched = self._fetch(now)
                if kid in self._keys:
                    return self._keys[kid]
                if fetched:
                    return Refusal(401, "reach token signed by a key the hub does not publish")
                return Refusal(503, "cannot check the reach token: the hub's keys are unavailable")
            if known:  # a refresh is due but was tried moments ago: the cached key stands
                return self._keys[kid]
            return Refusal(
                503,
                "reach token signed by a key this agent does not know; the hub's keys were "
                "fetched moments ago: retry",
            )

    def _fetch(self, now: float) -> bool:
        """Replace the cached keys with the hub's; False (cache kept) if it cannot say."""
        try:
            answer = self.hub.get(JWKS_PATH, keys=("keys",))
        except ReachError as exc:
            log.warning(
                "could not fetch the hub's signing keys from %s: %s", self.hub.base_url, exc
            )
            return False
        found = answer["keys"]
        if not isinstance(found, list):
            log.warning("the hub's JWKS at %s holds no list of keys", self.hub.base_url)
            return False
        keys: dict[str, Any] = {}
        for jwk in found:
            if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                continue  # not a key a reach token can be signed with
            try:
                keys[str(jwk["kid"])] = jwt.PyJWK(jwk, algorithm=ALGORITHM).key
            except (KeyError, jwt.PyJWTError) as exc:
                log.warning("ignoring a malformed key in the hub's JWKS: %s", exc)
        self._keys = keys
        self._fetched_at = now
        return True


def _header_of(token: str) -> dict[str, Any] | None:
    """The token's (unverified) header, to find its key; ``jwt.decode`` then checks the
    whole token. Parsed here because PyJWT's own header read costs as much again as the
    signature check, on every delivery."""
    segment = token.split(".", 1)[0]
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        header = json.loads(raw)
    except (binascii.Error, ValueError):
        return None
    return header if isinstance(header, dict) else None
