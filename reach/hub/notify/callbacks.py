"""Callbacks: a task's result (and, if asked, its progress) POSTed, hub-signed, to the
caller's ``callback_url``.

The life of one callback row (table ``callbacks``):

* submit (`register`, in the submission's transaction): a ``result`` row, ``waiting``,
  with the URL, the caller's ``callback_context`` and whether progress was asked for;
* the transaction that makes the task terminal (`on_event`, called by
  ``reach.hub.delivery`` as it records the terminal event) arms it: ``due`` now. A crash
  after that commit cannot lose it: the row is durable with the terminal state, and the
  beat's net (`due_ids`) re-publishes what no worker took;
* each progress report of a task that asked for progress adds a ``progress`` row, due;
* after commit, each due row is published as a ``reach.callback`` Celery task
  (`attach`); a worker `prepare`\\ s it -- claims it for ``timeout`` (so a second copy of
  the message does not POST in parallel) and signs it -- and its exchanger's loop POSTs
  it (a slow receiver holds no worker slot); the answer is recorded (`answered`):
  ``delivered``; a retry after jittered backoff; or, past ``callbacks.max_retries`` (or an
  answer that retrying cannot change: a 4xx, a redirect), ``dead`` with ``last_error``,
  logged and counted (``agentreach_callbacks_total{outcome="dead"}``).

A dead-lettered task an operator replays keeps its callback as it was: one already
delivered is not sent again (the first terminal result was the one announced).

The URL was checked at submit (`check_url`, ``reach.core.notify.callbacks.url_refusal``) and is
checked again before each POST (DNS may have changed); the POST is every signed outbound
POST's (``reach.hub.notify.outbound``): redirects are not followed.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from prometheus_client import Counter
from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session, sessionmaker

from reach.core.ledger.statuses import TERMINAL
from reach.core.notify import callbacks as rules
from reach.core.notify.outbound import Answer, Resolver, answer_of, canonical, next_delay
from reach.errors import CallbackRefused
from reach.hub.notify import outbound
from reach.hub.security import signing
from reach.hub.security.sealing import SealKey
from reach.hub.settings import CallbackSettings
from reach.hub.storage.models import CallbackRow, TaskRow

log = logging.getLogger("reach.hub.notify.callbacks")

CALLBACK_TASK = "reach.callback"
CALLBACK_SWEEP_TASK = "reach.callbacks_sweep"
ID_HEADER = "Reach-Callback-Id"
_PENDING = "reach.callbacks"  # session.info key: rows made due, published after commit
NET_GRACE_S = 10.0  # the net leaves a row this long to the retry already scheduled for it

CALLBACKS_TOTAL = Counter(
    "agentreach_callbacks_total", "Callback POSTs by outcome.", ["outcome"]
)  # delivered | retry | dead


class Status:
    WAITING, DUE, DELIVERED, DEAD = "waiting", "due", "delivered", "dead"


# -- at submit ---------------------------------------------------------------------------


def check_url(url: str, settings: CallbackSettings, resolver: Resolver = outbound.resolve) -> None:
    """Refuse (`CallbackRefused`, naming the rule) a URL the hub will not POST to."""
    try:
        refusal = rules.url_refusal(url, settings.allow_private, resolver)
    except OSError as exc:
        refusal = f"the host does not resolve ({type(exc).__name__})"
    if refusal is not None:
        raise CallbackRefused(f"callback_url refused: {refusal}", rule=refusal)


def register(
    session: Session, task_id: str, url: str, context: Any, progress: bool, now: float
) -> None:
    """The callback's intent, in the submission's transaction: waits for the task's end."""
    session.add(
        CallbackRow(
            task_id=task_id,
            kind="result",
            url=url,
            context=context,
            progress=progress,
            status=Status.WAITING,
            attempts=0,
            created_at=now,
        )
    )


# -- as the task moves (called by reach.hub.delivery, only for tasks with a callback) ------


def on_event(session: Session, task_id: str, kind: str, now: float, detail: dict[str, Any]) -> None:
    """Arm the result callback on the terminal event; add a progress callback on a
    progress event (if the caller asked). In the event's own transaction."""
    if kind in ("terminal_success", "terminal_failure"):
        ids = session.scalars(
            update(CallbackRow)
            .where(
                CallbackRow.task_id == task_id,
                CallbackRow.kind == "result",
                CallbackRow.status == Status.WAITING,
            )
            .values(status=Status.DUE, next_attempt_at=now)
            .returning(CallbackRow.id)
        ).all()
        _schedule(session, ids)
    elif kind == "progress":
        parent = session.scalar(
            select(CallbackRow).where(
                CallbackRow.task_id == task_id,
                CallbackRow.kind == "result",
                CallbackRow.progress.is_(True),
            )
        )
        if parent is None:
            return
        row = CallbackRow(
            task_id=task_id,
            kind="progress",
            url=parent.url,
            context=parent.context,
            body=detail,
            progress=True,
            status=Status.DUE,
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
        session.add(row)
        session.flush()
        _schedule(session, [row.id])


def _schedule(session: Session, ids: Any) -> None:
    if ids:
        session.info.setdefault(_PENDING, []).extend(int(i) for i in ids)


def attach(db: sessionmaker[Session], publish: Callable[[int], object]) -> None:
    """Publish each committed transaction's due callbacks with ``publish``."""
    from sqlalchemy import event

    def after_commit(session: Session) -> None:
        for callback_id in session.info.pop(_PENDING, None) or ():
            try:
                publish(callback_id)
            except Exception as exc:  # the beat's net publishes it later
                log.warning("callback %s not published: %s", callback_id, exc)

    def forget(session: Session, previous_transaction: Any) -> None:
        session.info.pop(_PENDING, None)

    event.listen(db, "after_commit", after_commit)
    event.listen(db, "after_soft_rollback", forget)


def due_ids(session: Session, now: float, limit: int = 500) -> list[int]:
    """The net: due rows whose time passed a while ago (their publish was lost)."""
    return list(
        session.scalars(
            select(CallbackRow.id)
            .where(
                CallbackRow.status == Status.DUE,
                CallbackRow.next_attempt_at <= now - NET_GRACE_S,
            )
            .order_by(CallbackRow.next_attempt_at)
            .limit(limit)
        )
    )


# -- delivery: in a worker ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sent:
    """What one attempt came to: ``retry_in`` seconds before the next, when there is one."""

    outcome: str  # delivered | retry | dead | skipped
    detail: str
    retry_in: float | None = None


@dataclass(frozen=True, slots=True)
class Post:
    """A claimed callback, signed and ready to POST (off the worker's slot)."""

    callback_id: int
    url: str
    body: bytes
    headers: dict[str, str]
    attempts: int
    connect_timeout: float
    timeout: float


def prepare(
    db: sessionmaker[Session],
    settings: CallbackSettings,
    callback_id: int,
    now: float,
    rng: random.Random,
    seal: SealKey | None = None,
) -> Post | Sent:
    """Claim the callback for its lease and sign its body (with the hub's signing key,
    opened with ``seal``): the `Post` to send, or what the attempt came to without one
    (not due, the task gone, the URL refused)."""
    lease = settings.timeout_s * 2 + 5
    with db.begin() as session:
        claimed = cast(
            CursorResult[Any],
            session.execute(
                update(CallbackRow)
                .where(
                    CallbackRow.id == callback_id,
                    CallbackRow.status == Status.DUE,
                    CallbackRow.next_attempt_at <= now,
                )
                .values(next_attempt_at=now + lease)
            ),
        ).rowcount
        if not claimed:
            return Sent("skipped", "not due (delivered, dead, or held by another attempt)")
        row = session.get(CallbackRow, callback_id)
        assert row is not None
        url, attempts = row.url, row.attempts
        if row.kind == "result":
            task = session.scalar(select(TaskRow).where(TaskRow.task_id == row.task_id))
            if task is None or task.status not in TERMINAL:
                body_dict = None
            else:
                body_dict = rules.result_body(callback_id, _task(task), row.context)
        else:
            body_dict = rules.progress_body(
                callback_id, row.task_id, row.event_id, row.body or {}, row.context
            )
        key = signing.current_key(session, now, seal)
        kid, pem = key.kid, signing.private_pem(key, seal)
    if body_dict is None:
        gone = "the task is gone or not terminal"
        return _record(db, callback_id, "dead", gone, attempts, now, settings, rng)
    body = canonical(body_dict)
    try:
        refusal = rules.url_refusal(url, settings.allow_private, outbound.resolve)
    except OSError as exc:  # resolution may work next time
        detail = f"the host does not resolve: {type(exc).__name__}"
        return _record(db, callback_id, "retry", detail, attempts, now, settings, rng)
    if refusal is not None:
        detail = f"refused: {refusal}"
        return _record(db, callback_id, "dead", detail, attempts, now, settings, rng)
    headers = outbound.signed_headers(
        body, kid, pem, rules.CALLBACK_TYP, extra={ID_HEADER: str(callback_id)}
    )
    connect = min(2.0, settings.timeout_s)
    return Post(callback_id, url, body, headers, attempts, connect, settings.timeout_s)


def answered(
    db: sessionmaker[Session],
    settings: CallbackSettings,
    post: Post,
    status: int | None,
    error: str | None,
    now: float,
    rng: random.Random,
) -> Sent:
    """Record what the receiver answered (``status``; None: no answer, ``error`` why)."""
    if status is None:
        answer, detail = Answer.RETRY, f"no answer: {error or 'none'}"
    else:
        answer, detail = answer_of(status), f"HTTP {status}"
    outcome = {Answer.DELIVERED: "delivered", Answer.DROP: "dead"}.get(answer, "retry")
    return _record(db, post.callback_id, outcome, detail, post.attempts, now, settings, rng)


def deliver(
    db: sessionmaker[Session],
    settings: CallbackSettings,
    callback_id: int,
    now: float,
    rng: random.Random,
    clock: Callable[[], float] | None = None,
    seal: SealKey | None = None,
) -> Sent:
    """Claim, POST and record one callback, blocking (tools and tests; a worker POSTs
    from its exchanger's loop instead: ``reach.tasks.callbacks``)."""
    post = prepare(db, settings, callback_id, now, rng, seal)
    if isinstance(post, Sent):
        return post
    timeout = (post.connect_timeout, post.timeout)
    status, error = outbound.post(post.url, post.body, post.headers, timeout)
    return answered(db, settings, post, status, error, clock() if clock else now, rng)


def _record(
    db: sessionmaker[Session],
    callback_id: int,
    outcome: str,
    detail: str,
    attempts: int,
    now: float,
    settings: CallbackSettings,
    rng: random.Random,
) -> Sent:
    attempts += 1
    retry_in = None
    values: dict[str, Any] = {"attempts": attempts, "last_error": None}
    if outcome == "delivered":
        values.update(status=Status.DELIVERED, delivered_at=now, next_attempt_at=None)
    elif outcome == "retry" and attempts <= settings.max_retries:
        retry_in = next_delay(attempts, settings.backoff_base_s, settings.backoff_cap_s, rng)
        values.update(next_attempt_at=now + retry_in, last_error=detail)
    else:
        outcome = "dead"
        values.update(status=Status.DEAD, next_attempt_at=None, last_error=detail[:2000])
    with db.begin() as session:
        session.execute(update(CallbackRow).where(CallbackRow.id == callback_id).values(**values))
    CALLBACKS_TOTAL.labels(outcome).inc()
    if outcome == "dead":
        log.error(
            "ALERT callback %s dead-lettered after %d attempts: %s", callback_id, attempts, detail
        )
    return Sent(outcome, detail, retry_in)


def sign(body: bytes, kid: str, private_pem: str) -> str:
    """A detached JWS like the approval webhook's, typed as a callback."""
    return outbound.sign(body, kid, private_pem, rules.CALLBACK_TYP)


def _task(task: TaskRow) -> dict[str, Any]:
    return {
        "task_id": task.task_id,
        "status": task.status,
        "result": task.result,
        "error": task.error,
        "finished_at": task.finished_at,
    }


def view(row: CallbackRow) -> dict[str, Any]:
    """A callback's record (the task's receipt lists them; never the URL's query)."""
    return {
        "callback_id": row.id,
        "kind": row.kind,
        "status": row.status,
        "attempts": row.attempts,
        "last_error": row.last_error,
        "delivered_at": row.delivered_at,
        "context": row.context,
    }
