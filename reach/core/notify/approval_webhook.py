"""The approval webhook's body, without I/O.

Each new approval request is POSTed to ``approval.webhook_url``, signed by the hub like
every outbound POST (``reach.core.notify.outbound``: canonical JSON, a detached JWS in the
``Reach-Signature`` header, untyped). The receiver verifies the exact bytes it received
against the hub's JWKS (``reach.verify_webhook``) and never parses a body whose signature
fails.

The hub (``reach.hub.notify.approval_webhook``) sends; this module says what the body is.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["EVENT", "request_body"]

EVENT: Final = "approval_requested"


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
