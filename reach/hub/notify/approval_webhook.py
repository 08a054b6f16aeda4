"""The approval webhook: each new approval request POSTed, hub-signed, to a receiver.

When ``approval.webhook_url`` is set, parking a task (``reach.hub.gates.approvals``) calls
`schedule` in its transaction; once that transaction commits, the hub publishes one
``reach.approval_webhook`` Celery task per approval (`attach`), and a worker `deliver`\\ s
it: at least once (late acks; a receiver that does not take it is asked again with
backoff, ``approval.webhook_max_retries`` times), never on the submit's path, so a slow
or hanging receiver costs the caller nothing. A request already decided or expired by
the time it would be sent is not sent: there is nothing left to ask.

The body and its signature are ``reach.core.notify.approval_webhook``' format, signed with the key
that
signs reach tokens (``reach.hub.security.signing``), so a receiver verifies it with the JWKS the
agents use (``reach.verify_webhook``).

The URL is a server-side request chosen by configuration: it must resolve to public
addresses only (loopback, private, link-local, reserved refused) unless
``approval.webhook_allow_private``; redirects are not followed, so an answer cannot
point the hub somewhere else. What is resolved at check time may change by the time of
the connection (DNS rebinding); the operator owns the URL, so this guards against
mistakes and casual misuse, not against the operator's own DNS.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from reach.core.ledger.statuses import ApprovalStatus
from reach.core.notify.approval_webhook import (
    PUBLIC_ONLY,
    SIGNATURE_HEADER,
    Answer,
    address_refusal,
    answer_of,
    b64url,
    canonical,
    detached,
    request_body,
    signing_input,
)
from reach.core.security.networks import NetworkRule
from reach.core.security.tokens import ALGORITHM
from reach.hub.security import signing
from reach.hub.security.sealing import SealKey
from reach.hub.settings import ApprovalSettings
from reach.hub.storage.models import ApprovalRow

log = logging.getLogger("reach.hub.notify.approval_webhook")

WEBHOOK_TASK = "reach.approval_webhook"
TIMEOUT_S = (2.0, 5.0)  # connect, read: a hanging receiver holds a worker this long at most
_PENDING = "reach.approval_webhooks"  # session.info key: approvals parked, not yet committed


@dataclass(frozen=True, slots=True)
class Sent:
    """What one attempt came to, and why (for the log)."""

    answer: Answer
    detail: str


# -- scheduling: after the approval commits ------------------------------------------------


def schedule(session: Session, approval_id: str) -> None:
    """Send ``approval_id``'s webhook once this transaction commits (none if it rolls back)."""
    session.info.setdefault(_PENDING, []).append(approval_id)


def attach(sessions: sessionmaker[Session], publish: Callable[[str], object]) -> None:
    """Publish each committed transaction's scheduled webhooks with ``publish``."""

    def after_commit(session: Session) -> None:
        for approval_id in session.info.pop(_PENDING, None) or ():
            try:
                publish(approval_id)
            except Exception as exc:  # never fail a commit that already happened
                log.warning("webhook of approval %s not published: %s", approval_id, exc)

    def forget(session: Session, previous_transaction: Any) -> None:
        session.info.pop(_PENDING, None)

    event.listen(sessions, "after_commit", after_commit)
    event.listen(sessions, "after_soft_rollback", forget)


# -- delivery: in a worker ----------------------------------------------------------------


def deliver(
    sessions: sessionmaker[Session],
    settings: ApprovalSettings,
    approval_id: str,
    now: float,
    resolve: Callable[[str, int], list[str]] | None = None,
    seal: SealKey | None = None,
) -> Sent:
    """POST one approval's request, signed (the signing key opened with ``seal``); the
    answer says whether to ask again."""
    url = settings.webhook_url
    if not url:
        return Sent(Answer.DROP, "approval.webhook_url is not set")
    with sessions.begin() as session:
        row = session.scalar(select(ApprovalRow).where(ApprovalRow.approval_id == approval_id))
        if row is None:
            return Sent(Answer.DROP, "no such approval")
        if row.status != ApprovalStatus.PENDING or row.expires_at <= now:
            return Sent(Answer.DROP, f"already {row.status}: nothing to ask")
        body = canonical(request_body(_record(row), settings.public_url))
        key = signing.current_key(session, now, seal)
        kid, pem = key.kid, signing.private_pem(key, seal)
    allow = settings.webhook_allow_private
    rule = NetworkRule(loopback=allow, private=allow)  # link-local: never
    try:
        refusal = url_refusal(url, resolve or _resolve, rule)
    except OSError as exc:  # resolution may work next time
        return Sent(Answer.RETRY, f"the webhook host does not resolve: {exc}")
    if refusal is not None:
        setting = "" if allow else " (approval.webhook_allow_private is off)"
        return Sent(Answer.DROP, f"refused{setting}: {refusal}")
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: sign(body, kid, pem),
        "User-Agent": "agent-reach-hub",
    }
    try:
        answer = requests.post(
            url, data=body, headers=headers, timeout=TIMEOUT_S, allow_redirects=False
        )
    except requests.RequestException as exc:
        return Sent(Answer.RETRY, f"no answer: {type(exc).__name__}")
    return Sent(answer_of(answer.status_code), f"HTTP {answer.status_code}")


def sign(body: bytes, kid: str, private_pem: str) -> str:
    """The ``Reach-Signature`` of ``body``: a detached JWS by the key ``kid``."""
    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise TypeError(f"signing key {kid} is not an Ed25519 key")
    protected = b64url(canonical({"alg": ALGORITHM, "kid": kid}))
    return detached(protected, key.sign(signing_input(protected, body)))


def url_refusal(
    url: str, resolve: Callable[[str, int], list[str]], rule: NetworkRule = PUBLIC_ONLY
) -> str | None:
    """Why the hub may not POST to ``url``, or None: every address it resolves to must
    be one ``rule`` allows (default: public only; a name resolving to one refused address
    is refused as a whole). A name that does not resolve raises ``OSError``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = resolve(parts.hostname, port)
    if not addresses:
        raise OSError(f"{parts.hostname} resolves to no address")
    for address in addresses:
        refusal = address_refusal(address, rule)
        if refusal is not None:
            return f"{parts.hostname}: {refusal}"
    return None


def _resolve(host: str, port: int) -> list[str]:
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, port)})


def _record(row: ApprovalRow) -> dict[str, Any]:
    return {
        "approval_id": row.approval_id,
        "task_id": row.task_id,
        "capability": row.capability,
        "agent_id": row.agent_id,
        "method": row.method,
        "caller": row.caller,
        "payload_hash": row.payload_hash,
        "requested_at": row.requested_at,
        "expires_at": row.expires_at,
    }
