"""One signed outbound POST, for callbacks and the approval webhook alike.

The format and the rules are ``reach.core.notify.outbound``'s; this module does the I/O:
it resolves the URL's host (`resolve`) for the SSRF screen, signs the body with the key
that signs reach tokens (`sign`, PyJWT's JWS with its payload then left out: RFC 7515,
appendix F) and POSTs it without following redirects (`post`), so an answer cannot point
the hub somewhere else. What is resolved at check time may change by the time of the
connection (DNS rebinding): the screen guards against mistakes and casual misuse.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from jwt import api_jws

from reach.core.notify.outbound import SIGNATURE_HEADER, USER_AGENT, detach, protected_header
from reach.core.security.tokens import ALGORITHM

__all__ = ["post", "resolve", "sign", "signed_headers"]


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (``OSError`` when it does not)."""
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port)})


def sign(body: bytes, kid: str, private_pem: str, typ: str | None = None) -> str:
    """The ``Reach-Signature`` of ``body``: a detached JWS by the key ``kid``, typed
    ``typ`` (None: untyped, the approval webhook's)."""
    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise TypeError(f"signing key {kid} is not an Ed25519 key")
    headers = protected_header(kid, typ)
    return detach(api_jws.encode(body, key, algorithm=ALGORITHM, headers=headers))


def signed_headers(
    body: bytes,
    kid: str,
    private_pem: str,
    typ: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The headers of one POST of ``body``: its type, its signature, the hub's name and
    ``extra``."""
    return {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(body, kid, private_pem, typ),
        **(extra or {}),
        "User-Agent": USER_AGENT,
    }


def post(
    url: str, body: bytes, headers: dict[str, str], timeout: tuple[float, float]
) -> tuple[int | None, str | None]:
    """POST ``body`` (redirects not followed): ``(status, None)``, or ``(None, why)`` (the
    kind of failure, never the address) when no answer came."""
    import requests  # on first use: most hub processes never post one (~3 MB each)

    try:
        answer = requests.post(
            url, data=body, headers=headers, timeout=timeout, allow_redirects=False
        )
    except requests.RequestException as exc:
        return None, type(exc).__name__
    return answer.status_code, None
