"""Blob links: a short-lived URL that lets one agent read one blob, with no API key.

The hub serves a blob of its directory store at ``/v1/blobs/{blob_id}?exp=..&sig=..``:
``sig`` is an HMAC-SHA256 of the blob id and the expiry under a key only the hub holds
(derived from its seal key), so a link cannot be made for another blob or stretched in
time. An agent needs nothing but the link, as with an S3 presigned URL; a link leaked
from a log is worth at most ``blobs.link_ttl_s``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re

__all__ = ["BLOB_ID_PATTERN", "expiry", "is_blob_id", "new_blob_id", "query", "refusal", "sign"]

BLOB_ID_PATTERN = r"^b-[0-9a-f]{32}$"
_BLOB_ID = re.compile(BLOB_ID_PATTERN)


def new_blob_id(random_hex: str) -> str:
    """A blob id from 32 hex digits of randomness (the caller draws them)."""
    blob_id = f"b-{random_hex}"
    if not is_blob_id(blob_id):
        raise ValueError("a blob id needs 32 lowercase hex digits")
    return blob_id


def is_blob_id(value: str) -> bool:
    return bool(_BLOB_ID.fullmatch(value))


def expiry(now: float, ttl_s: float) -> int:
    """A link's expiry: whole epoch seconds, never earlier than ``now + ttl_s``."""
    return math.ceil(now + ttl_s)


def sign(key: bytes, blob_id: str, expires_at: int) -> str:
    """The link's signature: base64url (unpadded) HMAC-SHA256 of id and expiry."""
    mac = hmac.new(key, f"{blob_id}\n{expires_at}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def query(key: bytes, blob_id: str, expires_at: int) -> str:
    """The query string of a link to ``blob_id`` valid until ``expires_at``."""
    return f"exp={expires_at}&sig={sign(key, blob_id, expires_at)}"


def refusal(key: bytes, blob_id: str, exp: str | None, sig: str | None, now: float) -> str | None:
    """Why a link may not be served at ``now`` (None: it may). The signature is checked
    first, in constant time, so an expired link and a forged one are told apart only for
    a link the hub did sign."""
    if not exp or not sig:
        return "the link has no exp or no sig"
    if not exp.isascii() or not exp.isdigit() or len(exp) > 12:
        return "the link's exp is not epoch seconds"
    expected = sign(key, blob_id, int(exp))
    if not hmac.compare_digest(expected.encode(), sig.encode("utf-8", "replace")):
        return "the link's signature does not verify"
    if int(exp) < now:
        return "the link has expired"
    return None
