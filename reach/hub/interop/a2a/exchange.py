"""A2A instances in the store: their peers, their answers as envelopes, and the follow
of a task one is still working on.

Delivery (``reach.hub.delivery``) claims, routes, fences and records as for every agent;
for an instance whose protocol is ``a2a`` its ``A2ATransport`` sends a JSON-RPC
``SendMessage`` (``SendStreamingMessage`` when the card says the agent streams) to the
`Peer` read here. The answer comes back as the envelope an SDK agent would have sent
(`envelope_of`, from ``reach.core.interop.a2a.Verdict``), so retries, the breaker, dead letters
and idempotency apply unchanged. Each status update of a stream is recorded as the
task's progress while the attempt holds its lease (`record_progress`, so it shows in
``/v1/tasks/{id}/stream``).

An A2A task still working when the attempt ends (a blocking send that returned early, a
stream that ran out of time or broke) is accepted, as a 202 would be, and `follow` asks
its agent with ``GetTask`` every ``a2a.poll_interval_s``: status messages become
progress, the end becomes the task's end, input-required / auth-required makes it
``waiting``, and ``a2a.poll_failures`` failed polls in a row fail the attempt
(transient: retried, then dead-lettered). The watchdog still fails a task silent past
its timeout.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from reach.core.delivery.answers import AgentAnswer, described_body
from reach.core.delivery.retry import RetryPolicy
from reach.core.interop import a2a as rules
from reach.core.ledger import lifecycle
from reach.core.ledger.lifecycle import TaskEvent
from reach.core.ledger.statuses import TaskStatus
from reach.errors import ConfigError
from reach.hub.interop.a2a import PROTOCOL
from reach.hub.ledger.tasks import fail_transient, finish, load_for_update, record_event
from reach.hub.security.sealing import SealKey, is_sealed
from reach.hub.storage.models import InstanceRow, TaskEventRow, TaskRow

log = logging.getLogger("reach.hub.interop.a2a")

FOLLOWED = (TaskStatus.EXECUTING.value, TaskStatus.WAITING.value)
FOLLOW_BATCH = 100


@dataclass(frozen=True, slots=True)
class Peer:
    """Where and how to call one A2A instance (from its stored card)."""

    rpc_url: str
    streaming: bool
    scheme: rules.Scheme
    credential: str | None

    def headers(self) -> dict[str, str]:
        return {"A2A-Version": rules.A2A_VERSION, **self.scheme.headers(self.credential)}


CREDENTIAL = "a2a credential"  # what a sealed credential is bound to, with its instance


def open_credential(row: InstanceRow, seal: SealKey | None) -> str | None:
    """The instance's A2A credential, unsealed (``reach.hub.security.sealing``); one stored before
    sealing reads as it is."""
    stored = row.a2a_credential
    if stored is None:
        return None
    if seal is None:
        if is_sealed(stored):
            raise ConfigError(
                f"the A2A credential of {row.instance_id} is sealed and this process has no "
                "seal key",
                key="security.seal_key",
            )
        return stored
    return seal.open(stored, purpose=CREDENTIAL, name=row.instance_id)


def peer_of(session: Session, instance_id: str, seal: SealKey | None = None) -> Peer | None:
    row = session.get(InstanceRow, instance_id)
    if row is None or row.protocol != PROTOCOL or not row.a2a:
        return None
    scheme = row.a2a.get("scheme") or {}
    rpc_url = str(row.a2a["rpc_url"])
    # the credential goes only where it was given (reach.hub.interop.a2a.cards binds it)
    bound = row.a2a.get("credential_origin") or rules.origin_of(rpc_url)
    return Peer(
        rpc_url=rpc_url,
        streaming=bool(row.a2a.get("streaming")),
        scheme=rules.Scheme(
            str(scheme.get("kind", "none")),
            str(scheme.get("name", "")),
            str(scheme.get("header", "")),
        ),
        credential=open_credential(row, seal) if rules.origin_of(rpc_url) == bound else None,
    )


def envelope_of(answer: AgentAnswer, verdict: rules.Verdict) -> AgentAnswer:
    """The answer ``reach.core.delivery.retry.classify`` judges: the verdict's envelope, or the
    HTTP answer itself where A2A added nothing (no answer, 5xx, 429, 401 ...)."""
    if verdict.kind == "http":
        return answer
    if verdict.kind == "cut":  # a task is out there, still working: follow it
        return AgentAnswer(202, None)
    if verdict.kind == "transient":
        if verdict.status is None:
            return AgentAnswer(None, None, answer.error or verdict.message or "no A2A answer")
        return AgentAnswer(verdict.status, {"message": verdict.message})
    return AgentAnswer(verdict.status, verdict.body)


def record_progress(
    db: sessionmaker[Session],
    task_id: str,
    lease_token: str,
    progress: rules.Progress,
    now: float,
) -> None:
    """A status update of the stream, as the task's progress, while the attempt still
    holds its lease (a fenced-out copy records nothing)."""
    with db.begin() as session:
        task = load_for_update(session, task_id)
        if task is None or task.status != TaskStatus.DISPATCHING or task.lease_token != lease_token:
            return
        record_event(session, task, "progress", now, _progress_detail(progress))


def _progress_detail(progress: rules.Progress) -> dict[str, Any]:
    detail: dict[str, Any] = {"message": progress.message}
    if progress.state:  # an A2A stream's task state (an MCP progress notification has none)
        detail["a2a_state"] = progress.state
    if progress.progress is not None:
        detail["progress"] = progress.progress
    if progress.data is not None:
        detail["data"] = progress.data
    return detail


def accepted(session: Session, task: TaskRow, verdict: rules.Verdict | None, now: float) -> None:
    """After an attempt's 202: remember the A2A task to follow, and make the task
    ``waiting`` when the agent asked for input or authorisation."""
    if verdict is None:
        if task.remote_task_id is not None:
            task.remote_task_id = None  # an earlier attempt's, at an A2A instance
        return
    task.remote_task_id = verdict.remote_task_id
    if verdict.kind == "waiting":
        task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.WAIT)
        record_event(session, task, "waiting", now, _waiting_detail(verdict))


def _waiting_detail(verdict: rules.Verdict) -> dict[str, Any]:
    state = (verdict.state or "").removeprefix("TASK_STATE_").lower()
    return {"a2a_state": verdict.state, "reason": state, "message": verdict.message}


# -- the follow (beat: reach.a2a_follow) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Followed:
    task_id: str
    attempt_seq: int
    remote_task_id: str
    instance_id: str


def due_follows(
    session: Session, limit: int = FOLLOW_BATCH, seal: SealKey | None = None
) -> list[tuple[Followed, Peer]]:
    rows = session.execute(
        select(TaskRow.task_id, TaskRow.attempt_seq, TaskRow.remote_task_id, TaskRow.instance_id)
        .where(TaskRow.status.in_(FOLLOWED), TaskRow.remote_task_id.is_not(None))
        .order_by(TaskRow.updated_at)
        .limit(limit)
    ).all()
    out: list[tuple[Followed, Peer]] = []
    for task_id, seq, remote, instance_id in rows:
        peer = peer_of(session, instance_id, seal) if instance_id else None
        if peer is not None and remote is not None and instance_id is not None:
            out.append((Followed(task_id, seq, remote, instance_id), peer))
    return out


Post = Callable[[str, dict[str, Any], float, float, dict[str, str]], AgentAnswer]
"""One JSON POST (url, body, connect timeout, timeout, headers) and its answer."""


def follow(
    db: sessionmaker[Session],
    post: Post,
    *,
    now: Callable[[], float],
    retry: RetryPolicy,
    connect_timeout: float,
    rng: random.Random,
    poll_timeout: float,
    poll_failures: int,
    seal: SealKey | None = None,
) -> list[Any]:
    """Poll every followed A2A task once; the retries to publish (failed follows)."""
    with db.begin() as session:
        due = due_follows(session, seal=seal)
    publish: list[Any] = []
    for item, peer in due:
        answer = post(
            peer.rpc_url,
            rules.rpc(rules.METHOD_GET, {"id": item.remote_task_id}, f"{item.task_id}#get"),
            connect_timeout,
            poll_timeout,
            peer.headers(),
        )
        verdict = rules.judge_response(answer.status, answer.body)
        with db.begin() as session:
            again = _apply(session, item, answer, verdict, now(), retry, rng, poll_failures)
        if again is not None:
            publish.append(again)
    return publish


def _apply(
    session: Session,
    item: Followed,
    answer: AgentAnswer,
    verdict: rules.Verdict,
    now: float,
    retry: RetryPolicy,
    rng: random.Random,
    poll_failures: int,
) -> Any:
    task = load_for_update(session, item.task_id)
    if (
        task is None
        or task.status not in FOLLOWED
        or task.attempt_seq != item.attempt_seq
        or task.remote_task_id != item.remote_task_id
    ):
        return None  # ended or moved on meanwhile
    detail = {"instance_id": item.instance_id, "attempt_seq": item.attempt_seq, "followed": True}
    if verdict.kind == "success":
        finish(session, task, TaskStatus.SUCCESS, now, result=verdict.body["data"], detail=detail)
        return None
    if verdict.kind == "business" and verdict.state is not None:  # the task's own end
        body = verdict.body or {}
        error = {"kind": "business", "code": body.get("code"), "message": body.get("message")}
        finish(session, task, TaskStatus.FAILED, now, error=error, detail=detail)
        return None
    if verdict.kind in ("working", "waiting"):
        if verdict.kind == "waiting" and task.status == TaskStatus.EXECUTING:
            task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.WAIT)
            record_event(session, task, "waiting", now, _waiting_detail(verdict))
        elif verdict.kind == "working" and task.status == TaskStatus.WAITING:
            task.status = lifecycle.transition(TaskStatus(task.status), TaskEvent.RESUME)
            record_event(session, task, "resumed", now, {"a2a_state": verdict.state})
        elif (
            verdict.kind == "working"
            and verdict.message
            and verdict.message != _last_progress(session, task)
        ):
            progress = rules.Progress(verdict.message, None, verdict.state or "")
            record_event(session, task, "progress", now, _progress_detail(progress))
        if task.status == TaskStatus.WAITING and task.deadline is not None and now > task.deadline:
            error = {
                "kind": "business",
                "code": rules.BUSINESS_CODE,
                "message": f"the A2A agent still waits ({verdict.state}): {verdict.message}",
            }
            finish(session, task, TaskStatus.FAILED, now, error=error, detail=detail)
        task.updated_at = now
        return None
    # the agent did not answer the poll, or answered it with an error (a JSON-RPC error:
    # e.g. TaskNotFound from an agent restarted without its tasks): count it
    error = {
        "kind": answer.error_kind,
        "http_status": answer.status,
        "message": (answer.error or verdict.message or described_body(answer.status, answer.body))[
            :2000
        ],
        "instance_id": item.instance_id,
    }
    failed = session.scalar(
        select(func.count())
        .select_from(TaskEventRow)
        .where(
            TaskEventRow.task_id == task.task_id,
            TaskEventRow.attempt_seq == task.attempt_seq,
            TaskEventRow.kind == "follow_failed",
        )
    )  # before this one is added: the session flushes before a query
    record_event(session, task, "follow_failed", now, {"error": error})
    task.updated_at = now
    if (failed or 0) + 1 < poll_failures:
        return None
    task.remote_task_id = None
    return fail_transient(session, task, None, now, retry, rng, reason="follow_failed", error=error)


def _last_progress(session: Session, task: TaskRow) -> str | None:
    detail = session.scalar(
        select(TaskEventRow.detail)
        .where(
            TaskEventRow.task_id == task.task_id,
            TaskEventRow.attempt_seq == task.attempt_seq,
            TaskEventRow.kind == "progress",
        )
        .order_by(TaskEventRow.id.desc())
        .limit(1)
    )
    return str(detail.get("message")) if isinstance(detail, dict) else None
