"""The alert webhook: each new alert POSTed, hub-signed, to the operator's receiver.

When ``alerts.webhook_url`` is set, a beat tick (``reach.alerts_push``, every
``alerts.push_interval_s``; not scheduled while the URL is unset) runs `push` in a
worker: it reads the alerts recorded since its marker
(`reach.hub.ops.alerts.alerts_after`: every kind `list_alerts` returns, dead letters
included) and POSTs each one, oldest first, skipping the kinds an admin muted.

Why a scan and not a hook where alerts are recorded: alerts are not one event but the
trace of several decisions, written in five places (the reachability sweep's instance
events, the breakers, the loop detector's and the 429's audit rows, the dead-letter
queue), some in a transaction of their own, some in the API, some in a worker. A scan of
the same records `list_alerts` reads covers every kind by construction, a kind added to
`list_alerts` is pushed with no new hook, and nothing on those paths waits for a
receiver. The marker is in the store (``alert_push``: one row, the highest id of each
source table already pushed), so a restart or a failover of beat resumes where it was.
On SQLite a table whose newest rows retention deleted reuses their ids: the marker of such
a table is moved back to the last row recorded before the previous scan
(`reach.hub.ops.alerts.rewound`).

Delivery is at least once and, in the normal case, once: the marker moves past an alert
in its own transaction right after the receiver took it (2xx); a crash between the POST
and that commit sends it again (the body's ``alert_id`` lets a receiver dedupe). A
receiver that does not answer, or answers 408, 429 or 5xx, is asked again for the same
alert with jittered exponential backoff (``alerts.backoff_base_s`` .. ``backoff_cap_s``),
holding back the ones after it so the order stays; after ``alerts.webhook_max_retries``
the alert is skipped (logged at error level) so one poisoned alert cannot stop the rest.
Any other answer (a 4xx, a redirect) drops that alert. One tick at a time: a tick claims
a lease on the marker row with a conditional update, so overlapping ticks (a slow
receiver) never send the same alert twice.

A webhook that starts (no marker yet) begins at the newest record: what happened before
it was configured is in the alerts list, not pushed. Alerts of a muted kind are passed
over and stay passed over when the kind is unmuted.

The body is ``reach.core.notify.alert_webhook``'s; it is signed and sent as every signed
outbound POST (``reach.hub.notify.outbound``), untyped like the approval webhook, so
``reach.verify_webhook`` verifies it. The URL rules are the approval webhook's: public
addresses only unless ``alerts.webhook_allow_private``; redirects are not followed.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from reach.core.notify.alert_webhook import alert_body, alert_id
from reach.core.notify.outbound import (
    Answer,
    Resolver,
    answer_of,
    canonical,
    next_delay,
    url_refusal,
)
from reach.core.security.networks import NetworkRule
from reach.hub.notify import outbound
from reach.hub.ops.alerts import Marks, alerts_after, current_marks, muted_kinds, rewound
from reach.hub.security import signing
from reach.hub.security.sealing import SealKey
from reach.hub.settings import AlertSettings
from reach.hub.storage.models import AlertPushRow

__all__ = ["PUSH_TASK", "TIMEOUT_S", "Pushed", "push"]

log = logging.getLogger("reach.hub.ops.alert_webhook")

PUSH_TASK = "reach.alerts_push"
TIMEOUT_S = (2.0, 5.0)  # connect, read: a hanging receiver holds the tick this long at most
LEASE_S = 120.0  # longer than one tick's sends can take: TIMEOUT_S per alert, in batches
_ROW = 1


@dataclass(frozen=True, slots=True)
class Pushed:
    """What one tick did: alerts delivered, skipped (muted, dropped, given up), and why
    it stopped."""

    delivered: int
    skipped: int
    detail: str


def push(
    db: sessionmaker[Session],
    settings: AlertSettings,
    now: Callable[[], float],
    *,
    resolve: Resolver | None = None,
    seal: SealKey | None = None,
    rng: random.Random | None = None,
) -> Pushed:
    """One tick: POST the alerts recorded since the marker (see the module docstring)."""
    url = settings.webhook_url
    if not url:
        return Pushed(0, 0, "alerts.webhook_url is not set")
    started = now()
    lease = started + LEASE_S
    with db.begin() as session:
        begun = session.get(AlertPushRow, _ROW) is not None
    if not begun:
        return _start(db, started)
    with db.begin() as session:
        claimed = session.execute(
            update(AlertPushRow)
            .where(
                AlertPushRow.id == _ROW,
                or_(AlertPushRow.lease_until.is_(None), AlertPushRow.lease_until <= started),
                or_(
                    AlertPushRow.next_attempt_at.is_(None),
                    AlertPushRow.next_attempt_at <= started,
                ),
            )
            .values(lease_until=lease)
        )
        if getattr(claimed, "rowcount", 0) != 1:
            return Pushed(0, 0, "another tick holds the marker, or a retry is not due")
        row = session.get(AlertPushRow, _ROW)
        assert row is not None
        marks = rewound(
            session, Marks(row.event_id, row.audit_id, row.dead_letter_id), row.updated_at
        )
        attempts = row.attempts
        items = alerts_after(session, marks, settings.batch)
        muted = muted_kinds(session)
        key = signing.current_key(session, started, seal) if items else None
        kid, pem = (key.kid, signing.private_pem(key, seal)) if key is not None else ("", "")
    delivered = skipped = 0
    next_at: float | None = None
    detail = f"{len(items)} new alerts"
    error: str | None = None
    try:
        for item in items:
            if now() - started > LEASE_S / 2:  # the rest next tick, well inside the lease
                detail = f"{delivered} sent; the rest next tick"
                break
            if item["kind"] in muted:
                marks, skipped = marks.past(item), skipped + 1
                continue
            answer, why = _post(url, settings, item, kid, pem, resolve)
            if answer is Answer.DELIVERED:
                marks, attempts, delivered, error = marks.past(item), 0, delivered + 1, None
                if not _save(db, marks, attempts, None, None, lease, keep=True):
                    return Pushed(delivered, skipped, "the lease was lost: another tick took over")
                continue
            if answer is Answer.DROP:
                log.warning("alert %s not sent: %s", alert_id(item), why)
                marks, attempts, skipped = marks.past(item), 0, skipped + 1
                continue
            attempts += 1
            error = why
            if attempts > settings.webhook_max_retries:
                log.error("alert %s given up after %d attempts: %s", alert_id(item), attempts, why)
                marks, attempts, skipped = marks.past(item), 0, skipped + 1
                continue
            delay = next_delay(
                attempts, settings.backoff_base_s, settings.backoff_cap_s, rng or random.Random()
            )
            next_at = now() + delay
            log.info("alert %s: %s; again in %.1fs", alert_id(item), why, delay)
            detail = f"alert {alert_id(item)}: {why}; retry {attempts} in {delay:.1f}s"
            break
    finally:
        _save(db, marks, attempts, next_at, error, lease, keep=False)
    return Pushed(delivered, skipped, detail)


def _start(db: sessionmaker[Session], now: float) -> Pushed:
    """The first tick: the marker at the newest records (nothing older is pushed)."""
    try:
        with db.begin() as session:
            marks = current_marks(session)
            session.add(
                AlertPushRow(
                    id=_ROW,
                    event_id=marks.event_id,
                    audit_id=marks.audit_id,
                    dead_letter_id=marks.dead_letter_id,
                    attempts=0,
                    updated_at=now,
                )
            )
    except IntegrityError:  # another tick started it at the same moment
        return Pushed(0, 0, "the marker was started by another tick")
    return Pushed(0, 0, "the marker starts at the newest records")


def _save(
    db: sessionmaker[Session],
    marks: Marks,
    attempts: int,
    next_at: float | None,
    error: str | None,
    lease: float,
    *,
    keep: bool,
) -> bool:
    """Write the marker if this tick still holds the lease (``keep``: go on holding it)."""
    with db.begin() as session:
        done = session.execute(
            update(AlertPushRow)
            .where(AlertPushRow.id == _ROW, AlertPushRow.lease_until == lease)
            .values(
                event_id=marks.event_id,
                audit_id=marks.audit_id,
                dead_letter_id=marks.dead_letter_id,
                attempts=attempts,
                next_attempt_at=next_at,
                last_error=error,
                lease_until=lease if keep else None,
                updated_at=lease - LEASE_S,
            )
        )
        return getattr(done, "rowcount", 0) == 1


def _post(
    url: str,
    settings: AlertSettings,
    item: dict[str, Any],
    kid: str,
    pem: str,
    resolve: Resolver | None,
) -> tuple[Answer, str]:
    allow = settings.webhook_allow_private
    rule = NetworkRule(loopback=allow, private=allow)  # link-local: never
    try:
        refusal = url_refusal(url, resolve or outbound.resolve, rule)
    except OSError as exc:  # resolution may work next time
        return Answer.RETRY, f"the webhook host does not resolve: {exc}"
    if refusal is not None:
        setting = "" if allow else " (alerts.webhook_allow_private is off)"
        return Answer.DROP, f"refused{setting}: {refusal}"
    body = canonical(alert_body(item))
    headers = outbound.signed_headers(body, kid, pem)
    status, error = outbound.post(url, body, headers, TIMEOUT_S)
    if status is None:
        return Answer.RETRY, f"no answer: {error}"
    return answer_of(status), f"HTTP {status}"
