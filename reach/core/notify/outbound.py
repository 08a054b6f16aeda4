"""The hub's signed outbound POSTs (callbacks and the approval webhook): their wire format
and rules, without I/O.

Each body is canonical JSON, signed by the hub: a *detached* compact JWS (RFC 7515,
appendix F) in the ``Reach-Signature`` header, ``<protected>..<signature>``, where the
protected header is ``{"alg": "EdDSA", "kid": ...}`` (plus ``"typ"`` where the purpose is
typed: a callback's) and the signing input is ``<protected>.<base64url(body)>``. The
receiver verifies the exact bytes it received against the hub's JWKS and never parses a
body whose signature fails; any JOSE library verifies it too, once the base64url body is
put back between the dots (`attach`).

The URL is a server-side request: every address it resolves to must be one the
`NetworkRule` allows (`url_refusal`); an answer means `answer_of`; a retry waits
`next_delay`.
"""

from __future__ import annotations

import binascii
import json
import random
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any, Final
from urllib.parse import urlsplit

import jwt
from jwt.utils import base64url_decode, base64url_encode

from reach.core.delivery.retry import RetryPolicy, backoff_delay
from reach.core.security.networks import NetworkRule

__all__ = [
    "MAX_URL_LENGTH",
    "PUBLIC_ONLY",
    "SIGNATURE_HEADER",
    "USER_AGENT",
    "Answer",
    "Resolver",
    "address_refusal",
    "answer_of",
    "attach",
    "b64url",
    "canonical",
    "detach",
    "next_delay",
    "protected_header",
    "split_detached",
    "url_refusal",
]

SIGNATURE_HEADER: Final = "Reach-Signature"
USER_AGENT: Final = "agent-reach-hub"
PUBLIC_ONLY: Final = NetworkRule()
MAX_URL_LENGTH: Final = 512  # the tasks.callback_url column

Resolver = Callable[[str, int], Sequence[str]]


class Answer(StrEnum):
    """What one POST to the receiver came to."""

    DELIVERED = "delivered"  # 2xx: the receiver has it
    RETRY = "retry"  # no answer, 408, 429 or 5xx: asked again later, with backoff
    DROP = "drop"  # any other answer (a 4xx, a redirect): asking again changes nothing


def answer_of(status_code: int | None) -> Answer:
    if status_code is None or status_code in (408, 429) or status_code >= 500:
        return Answer.RETRY
    if 200 <= status_code < 300:
        return Answer.DELIVERED
    return Answer.DROP


def next_delay(attempts: int, base: float, cap: float, rng: random.Random) -> float:
    """The wait before retry ``attempts`` (1 = the first retry): jittered exponential."""
    policy = RetryPolicy(max_retry=max(attempts, 1), base=base, cap=max(cap, base))
    return backoff_delay(attempts, policy, rng)


# -- the signature ------------------------------------------------------------------------


def canonical(body: dict[str, Any]) -> bytes:
    """The bytes sent and signed: sorted keys, no whitespace, UTF-8."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def b64url(data: bytes) -> str:
    return base64url_encode(data).decode("ascii")


def protected_header(kid: str, typ: str | None = None) -> dict[str, Any]:
    """The JWS header fields besides ``alg``: the key, and the purpose where it is typed."""
    return {"kid": kid, "typ": typ}  # a None typ is left out of the header


def detach(compact: str) -> str:
    """The ``Reach-Signature`` value of a compact JWS: its payload left out."""
    protected, _payload, signature = compact.split(".")
    return f"{protected}..{signature}"


def attach(detached: str, body: bytes) -> str:
    """The compact JWS a detached one stands for, with ``body`` put back."""
    protected, _empty, signature = detached.strip().split(".")
    return f"{protected}.{b64url(body)}.{signature}"


def split_detached(value: str) -> tuple[str, dict[str, Any], bytes]:
    """``(protected, header, signature)`` of a detached JWS; ValueError on any other form."""
    parts = value.strip().split(".")
    if len(parts) != 3 or parts[1] != "" or not parts[0] or not parts[2]:
        raise ValueError("not a detached compact JWS (<protected>..<signature>)")
    try:
        header = jwt.get_unverified_header(value.strip())
        signature = base64url_decode(parts[2])
    except (jwt.PyJWTError, binascii.Error, ValueError) as exc:
        raise ValueError("its protected header is not base64url JSON") from exc
    return parts[0], header, signature


# -- where it may go -----------------------------------------------------------------------


def address_refusal(address: str, rule: NetworkRule = PUBLIC_ONLY) -> str | None:
    """Why the hub may not POST to ``address`` (an IP), or None: ``rule`` (default:
    public addresses only) as `reach.core.security.networks` judges every call the hub makes."""
    why = rule.refusal(address)
    return None if why is None else f"{address} is {why}"


def url_refusal(
    url: str,
    resolve: Resolver,
    rule: NetworkRule = PUBLIC_ONLY,
    *,
    caller_chosen: bool = False,
    setting: str = "",
) -> str | None:
    """Why the hub may not POST to ``url``, or None: every address ``resolve`` gives must
    be one ``rule`` allows (a name resolving to one refused address is refused as a
    whole). A name that does not resolve raises ``OSError``.

    A ``caller_chosen`` URL (a callback's) is held to more: a bounded length, no
    credentials, no fragment; and its refusal names the kind of address, never the
    address (whoever chose the name learns nothing of where it points). An operator's
    URL (the webhook's) is named in full. ``setting`` is added to an address's refusal:
    the setting that would allow it."""
    if caller_chosen and len(url) > MAX_URL_LENGTH:
        return f"the URL is longer than {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (
            "not an http(s) URL with a host" if caller_chosen else f"{url!r} is not an http(s) URL"
        )
    if caller_chosen and (parts.username is not None or parts.password is not None):
        return "credentials in the URL (they would be sent and logged in the clear)"
    if caller_chosen and parts.fragment:
        return "a URL fragment (never sent to a server)"
    addresses = resolve(parts.hostname, port or (443 if parts.scheme == "https" else 80))
    if not addresses:
        raise OSError(f"{parts.hostname} resolves to no address")
    for address in addresses:
        why = rule.refusal(address) if caller_chosen else address_refusal(address, rule)
        if why is not None:
            return f"{parts.hostname}: {why}{setting}"
    return None
