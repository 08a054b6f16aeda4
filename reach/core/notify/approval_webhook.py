"""The approval webhook's wire format and rules, without I/O.

Each new approval request is POSTed to ``approval.webhook_url`` as canonical JSON, signed
by the hub: a *detached* compact JWS (RFC 7515, appendix F) in the ``Reach-Signature``
header, ``<protected>..<signature>``, where the protected header is ``{"alg": "EdDSA",
"kid": ...}`` and the signing input is ``<protected>.<base64url(body)>``. The receiver
verifies the exact bytes it received against the hub's JWKS (``reach.verify_webhook``)
and never parses a body whose signature fails; any JOSE library verifies it too, once the
base64url body is put back between the dots.

The hub (``reach.hub.notify.approval_webhook``) sends; these functions say what the body is,
which addresses it may be sent to (a webhook URL is a server-side request: loopback,
private, link-local and reserved addresses are refused unless the operator allows them)
and what a receiver's answer means.
"""

from __future__ import annotations

import base64
import binascii
import json
from enum import StrEnum
from typing import Any, Final

from reach.core.security.networks import NetworkRule

__all__ = [
    "SIGNATURE_HEADER",
    "Answer",
    "address_refusal",
    "answer_of",
    "b64url",
    "b64url_decode",
    "canonical",
    "detached",
    "request_body",
    "signing_input",
    "split_detached",
]

SIGNATURE_HEADER: Final = "Reach-Signature"
PUBLIC_ONLY: Final = NetworkRule()
EVENT: Final = "approval_requested"


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


def request_body(approval: dict[str, Any], public_url: str | None) -> dict[str, Any]:
    """The JSON a receiver gets for one approval (the fields of its stored record).

    ``links`` point back at the hub only when ``public_url`` says where approvers reach
    it: the hub cannot know its own public address, and a wrong link is worse than none."""
    body = {
        "event": EVENT,
        "approval_id": approval["approval_id"],
        "task_id": approval["task_id"],
        "capability": approval["capability"],
        "agent_id": approval["agent_id"],
        "method": approval["method"],
        "caller": approval["caller"],
        "payload_hash": approval["payload_hash"],
        "requested_at": approval["requested_at"],
        "expires_at": approval["expires_at"],
        "links": {},
    }
    if public_url:
        base = public_url.rstrip("/")
        approval_id = approval["approval_id"]
        body["links"] = {
            "approve_api": f"{base}/api/v1/approvals/{approval_id}/approve",
            "reject_api": f"{base}/api/v1/approvals/{approval_id}/reject",
            "dashboard": f"{base}/ui/approvals/{approval_id}",
        }
    return body


def canonical(body: dict[str, Any]) -> bytes:
    """The bytes sent and signed: sorted keys, no whitespace, UTF-8."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(text: str) -> bytes:
    """Strict base64url (no padding, URL alphabet only); ValueError when it is not."""
    if any(c in text for c in "+/= \n\r\t"):
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("not base64url") from exc


def signing_input(protected: str, body: bytes) -> bytes:
    """What the signature covers (RFC 7515 §5.1): the protected header and the body."""
    return f"{protected}.{b64url(body)}".encode("ascii")


def detached(protected: str, signature: bytes) -> str:
    """The header value: a compact JWS with its payload left out."""
    return f"{protected}..{b64url(signature)}"


def split_detached(value: str) -> tuple[str, dict[str, Any], bytes]:
    """``(protected, header, signature)`` of a detached JWS; ValueError on any other form."""
    parts = value.strip().split(".")
    if len(parts) != 3 or parts[1] != "" or not parts[0] or not parts[2]:
        raise ValueError("not a detached compact JWS (<protected>..<signature>)")
    try:
        header = json.loads(b64url_decode(parts[0]))
    except ValueError as exc:
        raise ValueError("its protected header is not base64url JSON") from exc
    if not isinstance(header, dict):
        raise ValueError("its protected header is not a JSON object")
    return parts[0], header, b64url_decode(parts[2])


def address_refusal(address: str, rule: NetworkRule = PUBLIC_ONLY) -> str | None:
    """Why the hub may not POST to ``address`` (an IP), or None: ``rule`` (default:
    public addresses only) as `reach.core.security.networks` judges every call the hub makes."""
    why = rule.refusal(address)
    return None if why is None else f"{address} is {why}"
