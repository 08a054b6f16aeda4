"""Checking that an approval webhook really comes from the hub, before acting on it.

The hub signs each webhook body with its current Ed25519 key: a detached compact JWS in
the ``Reach-Signature`` header (format: ``reach.core.notify.outbound``). A receiver passes the
raw body bytes it received (not a re-serialised copy) and the header to
`verify_webhook`, with the hub's JWKS or the hub's URL to fetch it from, and gets the
parsed body back; anything else raises `InvalidSignature`, and the body must then be
ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import jwt
import requests
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from jwt import api_jws

from reach.core.notify.outbound import attach, split_detached
from reach.core.security.tokens import ALGORITHM
from reach.errors import HubUnavailable, InvalidSignature

__all__ = ["JWKS_PATH", "verify_webhook"]

JWKS_PATH = "/.well-known/jwks.json"
_FETCH_TIMEOUT_S = 5.0


def verify_webhook(
    body: bytes,
    signature: str,
    jwks: Mapping[str, Any] | None = None,
    *,
    hub: str | None = None,
) -> dict[str, Any]:
    """The webhook's JSON body once its ``Reach-Signature`` verifies; `InvalidSignature`
    if it does not (forged, altered, another hub's key, not EdDSA).

    ``jwks`` is the hub's key set (``GET /.well-known/jwks.json``); given ``hub`` instead
    (its base URL), the set is fetched from there (`HubUnavailable` if it cannot be).
    Cache the set and refetch it on an unknown ``kid``: keys rotate. A signature typed
    for another purpose (a callback's, ``reach.verify_callback``) is refused."""
    return verify_signed(body, signature, jwks, hub=hub, typ=None)


def verify_signed(
    body: bytes,
    signature: str,
    jwks: Mapping[str, Any] | None,
    *,
    hub: str | None,
    typ: str | None,
) -> dict[str, Any]:
    """`verify_webhook` for a signature whose protected ``typ`` must be ``typ`` (None:
    absent): one purpose's signed body is never accepted as another's."""
    if jwks is None:
        if hub is None:
            raise ValueError("verify_webhook needs jwks or hub")
        jwks = _fetch_jwks(hub)
    if not isinstance(body, bytes | bytearray):
        raise TypeError("body: the raw bytes received, not a parsed or re-encoded copy")
    try:
        _protected, header, _sig = split_detached(signature or "")
    except ValueError as exc:
        raise InvalidSignature(f"Reach-Signature: {exc}") from exc
    if header.get("alg") != ALGORITHM:
        raise InvalidSignature(
            f"Reach-Signature: alg must be {ALGORITHM}, got {header.get('alg')!r}"
        )
    if header.get("crit"):  # RFC 7515 §4.1.11: none are understood, so none are accepted
        raise InvalidSignature("Reach-Signature: critical header parameters are not understood")
    if header.get("typ") != typ:
        raise InvalidSignature(
            f"Reach-Signature: signed for another purpose (typ {header.get('typ')!r})"
        )
    key = _key_of(jwks, header.get("kid"))
    try:  # the payload put back between the dots: the compact JWS that was signed
        api_jws.decode(attach(signature, bytes(body)), key, algorithms=[ALGORITHM])
    except jwt.InvalidSignatureError as exc:
        raise InvalidSignature("Reach-Signature does not match the body") from exc
    except jwt.PyJWTError as exc:
        raise InvalidSignature(f"Reach-Signature: {exc}") from exc
    try:
        parsed = json.loads(body)
    except ValueError as exc:  # signed by the hub yet not JSON: nothing we send
        raise InvalidSignature("the signed body is not JSON") from exc
    if not isinstance(parsed, dict):
        raise InvalidSignature("the signed body is not a JSON object")
    return parsed


def _key_of(jwks: Mapping[str, Any], kid: object) -> Ed25519PublicKey:
    if not isinstance(kid, str) or not kid:
        raise InvalidSignature("Reach-Signature names no kid")
    for jwk in jwks.get("keys") or ():
        if isinstance(jwk, Mapping) and jwk.get("kid") == kid:
            if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
                raise InvalidSignature(f"key {kid} is not an Ed25519 key")
            public = {"kty": "OKP", "crv": "Ed25519", "x": str(jwk.get("x", ""))}
            try:  # its public part only
                key = jwt.PyJWK(public, ALGORITHM).key
            except (jwt.PyJWTError, ValueError) as exc:
                raise InvalidSignature(f"key {kid} is malformed") from exc
            if not isinstance(key, Ed25519PublicKey):
                raise InvalidSignature(f"key {kid} is not an Ed25519 key")
            return key
    raise InvalidSignature(f"key {kid} is not in the hub's key set")


def _fetch_jwks(hub: str) -> dict[str, Any]:
    url = hub.rstrip("/") + JWKS_PATH
    try:
        answer = requests.get(url, timeout=_FETCH_TIMEOUT_S)
        answer.raise_for_status()
        data = answer.json()
    except (requests.RequestException, ValueError) as exc:
        raise HubUnavailable(f"the hub's keys could not be fetched from {url}: {exc}") from exc
    if not isinstance(data, dict):
        raise HubUnavailable(f"{url} did not answer a JWK Set")
    return data
