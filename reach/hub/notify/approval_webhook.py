"""The approval webhook: each new approval request POSTed, hub-signed, to a receiver.

When ``approval.webhook_url`` is set, parking a task (``reach.hub.gates.approvals``) calls
`schedule` in its transaction; once that transaction commits, the hub publishes one
``reach.approval_webhook`` Celery task per approval (`attach`), and a worker `deliver`\\ s
it: at least once (late acks; a receiver that does not take it is asked again with
backoff, ``approval.webhook_max_retries`` times), never on the submit's path, so a slow
or hanging receiver costs the caller nothing. A request already decided or expired by
the time it would be sent is not sent: there is nothing left to ask.

The body is ``reach.core.notify.approval_webhook``'s; it goes out as every signed outbound
POST does (``reach.hub.notify.outbound``), signed with the key that signs reach tokens
(``reach.hub.security.signing``), so a receiver verifies it with the JWKS the agents use
(``reach.verify_webhook``).

The URL is a server-side request chosen by configuration: it must resolve to public
addresses only (loopback, private, link-local, reserved refused) unless
``approval.webhook_allow_private``; redirects are not followed. The operator owns the URL,
so the screen guards against mistakes and casual misuse, not against the operator's own
DNS.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event, select
from sqlalchemy.orm import Session, sessionmaker

from reach.core.ledger.statuses import ApprovalStatus
from reach.core.notify.approval_webhook import request_body
from reach.core.notify.outbound import Answer, Resolver, answer_of, canonical, url_refusal
from reach.core.security.networks import NetworkRule
from reach.hub.notify import outbound
from reach.hub.notify.outbound import sign
from reach.hub.security import signing
from reach.hub.security.sealing import SealKey
from reach.hub.settings import ApprovalSettings
from reach.hub.storage.models import ApprovalRow

__all__ = ["TIMEOUT_S", "WEBHOOK_TASK", "Sent", "attach", "deliver", "schedule", "sign"]

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


def attach(db: sessionmaker[Session], publish: Callable[[str], object]) -> None:
    """Publish each committed transaction's scheduled webhooks with ``publish``."""

    def after_commit(session: Session) -> None:
        for approval_id in session.info.pop(_PENDING, None) or ():
            try:
                publish(approval_id)
            except Exception as exc:  # never fail a commit that already happened
                log.warning("webhook of approval %s not published: %s", approval_id, exc)

    def forget(session: Session, previous_transaction: Any) -> None:
        session.info.pop(_PENDING, None)

    event.listen(db, "after_commit", after_commit)
    event.listen(db, "after_soft_rollback", forget)


# -- delivery: in a worker ----------------------------------------------------------------


def deliver(
    db: sessionmaker[Session],
    settings: ApprovalSettings,
    approval_id: str,
    now: float,
    resolve: Resolver | None = None,
    seal: SealKey | None = None,
) -> Sent:
    """POST one approval's request, signed (the signing key opened with ``seal``); the
    answer says whether to ask again."""
    url = settings.webhook_url
    if not url:
        return Sent(Answer.DROP, "approval.webhook_url is not set")
    with db.begin() as session:
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
        refusal = url_refusal(url, resolve or outbound.resolve, rule)
    except OSError as exc:  # resolution may work next time
        return Sent(Answer.RETRY, f"the webhook host does not resolve: {exc}")
    if refusal is not None:
        setting = "" if allow else " (approval.webhook_allow_private is off)"
        return Sent(Answer.DROP, f"refused{setting}: {refusal}")
    headers = outbound.signed_headers(body, kid, pem)
    status, error = outbound.post(url, body, headers, TIMEOUT_S)
    if status is None:
        return Sent(Answer.RETRY, f"no answer: {error}")
    return Sent(answer_of(status), f"HTTP {status}")


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
