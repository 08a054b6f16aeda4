"""The caller's SDK: send a task, wait for its result, report results and progress.

    sub = reach.send(agent_id="doc-analyzer-01", method="task.process", payload={"doc_id": "abc"})
    result = reach.wait_for_result(sub.task_id, timeout=60)

Errors are typed: ``NoSuitableAgent``, ``InvalidPayload`` and ``CircuitOpen`` (every
matching instance is failing; ``.extra["retry_after"]`` says when to try again) at submit,
``BusinessError`` (the agent said no), ``DeadLettered`` (retries exhausted;
``AgentUnreachable`` or ``AgentTimeout`` say why in ``.cause``), ``ApprovalRejected`` (a
human said no; ``.extra`` has ``decided_by`` and ``reason``), ``ApprovalExpired`` (nobody
decided in time) and ``ResultTimeout`` (whose ``.extra["status"]`` says
``awaiting_approval`` while a human has yet to decide, ``waiting`` while an A2A agent
asks for input) from ``wait_for_result``;
``Unauthenticated`` (no valid key) and ``Forbidden`` (a key outside its scope) from any
call; ``SemanticMatchingOff`` from a send with ``intent`` or `find` on a hub without its
model. ``get_task`` shows a parked task's status as is: ``awaiting_approval``.

Every function takes ``api_key``; by default, inside a handler, that agent's own key, else
``$REACH_API_KEY`` (see ``reach.sdk.hub_client.default_api_key``).

``reach.aio`` is the asyncio twin of these functions and shares all but the sending: each
function here builds a `Call` (what to ask the hub: path, body, the keys its answer must
hold, how long to wait for it) and reads the answer with a pure function (`submission_of`,
`settled`, `broadcast_of` ...); only `ask`, which sends a call on ``requests``, differs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reach.core.fleet.names import name_refusal
from reach.core.ledger.statuses import TERMINAL, TaskStatus
from reach.core.telemetry import traceparent
from reach.errors import (
    ApprovalExpired,
    ApprovalRejected,
    BusinessError,
    DeadLettered,
    InvalidTaskRequest,
    ReachError,
    ResultTimeout,
    SessionClosed,
)
from reach.sdk import telemetry, trace
from reach.sdk.hub_client import HubClient

SEMANTIC_READ_TIMEOUT = 60.0
LONG_POLL_S = 30.0  # the longest one GET waits at the hub; a longer wait asks again
_SUBMITTED = ("task_id", "status")
_MATCHED = ("candidates",)
_VIEW = ("task_id", "status", "attempt_seq")
_BROADCAST = ("broadcast_id", "complete", "reason", "succeeded", "results")


@dataclass(frozen=True, slots=True)
class Call:
    """One request to the hub, decided without I/O: `ask` sends it, and ``reach.aio`` on
    its asyncio client. ``data`` is the query of a GET or the JSON body of a POST; the
    answer must be a JSON object holding ``keys``."""

    verb: str
    path: str
    data: dict[str, Any] | None = None
    keys: tuple[str, ...] = ()
    read_timeout: float = 10.0
    headers: tuple[tuple[str, str], ...] = ()  # beyond the key's: a submit's traceparent


def ask(call: Call, hub: str | None, api_key: str | None) -> dict[str, Any]:
    """Send ``call`` on this process's pooled session for the hub (see ``hub_client``)."""
    client = HubClient(hub, read_timeout=call.read_timeout, shared=True, api_key=api_key)
    if call.verb == "GET":
        return client.get(call.path, params=call.data, keys=call.keys)
    return client.post(call.path, call.data or {}, keys=call.keys, headers=dict(call.headers))


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    """What the hub is sent: a field left None takes the hub's default."""
    return {k: v for k, v in fields.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Submission:
    """An accepted task; ``agent_id`` and ``method`` say where an ``intent`` was matched
    (the agent and capability the hub chose), or what was named."""

    task_id: str
    status: str
    agent_id: str | None = None
    method: str | None = None


@dataclass(frozen=True, slots=True)
class Match:
    """A capability an intent matches (`find`): ``score`` is the cosine similarity."""

    agent_id: str
    capability: str
    score: float


@dataclass(frozen=True, slots=True)
class TaskResult:
    task_id: str
    data: Any
    agent_id: str | None
    instance_id: str | None
    attempt_seq: int
    task: dict[str, Any]


def send(
    *,
    method: str | None = None,
    payload: dict[str, Any] | None = None,
    payload_ref: str | None = None,
    agent_id: str | None = None,
    tags: Sequence[str] = (),
    capability: str | None = None,
    intent: str | None = None,
    rules: dict[str, str | int | float | bool] | None = None,
    task_id: str | None = None,
    timeout_ms: int = 30_000,
    session_id: str | None = None,
    priority: str = "online",
    hub: str | None = None,
    api_key: str | None = None,
    callback_url: str | None = None,
    callback_context: Any = None,
    callback_progress: bool = False,
) -> Submission:
    """Submit one task; idempotent on ``task_id`` (resubmitting returns the same task).

    ``intent`` describes what is needed in words ("refund a damaged order"): the hub
    matches it to a declared capability by meaning among the agents the other arguments
    allow (``method`` may then be left out: it is the matched capability, returned in
    ``.method`` with the agent in ``.agent_id``). Nothing close enough raises
    ``NoSuitableAgent`` (its ``.extra["candidates"]`` has the closest and their scores);
    a hub without semantic matching raises ``SemanticMatchingOff``.

    With ``callback_url`` the hub POSTs the result there once the task ends (and each
    progress report, with ``callback_progress``), signed: verify it with
    `reach.verify_callback`; ``callback_context`` comes back in that body. A private or
    loopback URL raises ``CallbackRefused`` unless the hub allows them.

    ``priority`` is ``"online"`` (a user waits: consumed first) or ``"background"``
    (yields while online work waits). A full target raises ``Backpressure`` (its
    ``.extra`` has ``depth``, ``limit`` and ``retry_after_ms``): not a failure, and never
    retried here -- the caller decides whether to wait that long. A reach that would
    repeat an agent of its own path raises ``LoopDetected``; one bound to a closed
    ``session_id`` raises ``SessionClosed``.

    ``payload_ref`` names a blob this caller uploaded (`reach.put_blob`) that carries a
    payload too large to send inline: the agent reads it with `reach.payload_blob`, and
    it is deleted with the task. Another caller's blob, or an unknown one, raises
    ``UnknownBlob``; a blob another task took, ``BlobTaken``."""
    call = send_call(
        method=method,
        payload=payload,
        payload_ref=payload_ref,
        agent_id=agent_id,
        tags=tags,
        capability=capability,
        intent=intent,
        rules=rules,
        task_id=task_id,
        timeout_ms=timeout_ms,
        session_id=session_id,
        priority=priority,
        callback_url=callback_url,
        callback_context=callback_context,
        callback_progress=callback_progress,
    )
    return submission_of(ask(call, hub, api_key))


def send_call(
    *,
    method: str | None,
    payload: dict[str, Any] | None,
    payload_ref: str | None,
    agent_id: str | None,
    tags: Sequence[str],
    capability: str | None,
    intent: str | None,
    rules: dict[str, str | int | float | bool] | None,
    task_id: str | None,
    timeout_ms: int,
    session_id: str | None,
    priority: str,
    callback_url: str | None,
    callback_context: Any,
    callback_progress: bool,
) -> Call:
    """The submit of `send`. Inside a handler it carries the handler's trace one hop on
    and its session; its ``traceparent`` header continues the current OpenTelemetry span
    (or the handler's): build it in the context (thread or asyncio task) that sends it."""
    _check_method(method)
    body: dict[str, Any] = {
        "method": method,
        "payload": payload or {},
        "payload_ref": payload_ref,
        "agent_id": agent_id,
        "tags": list(tags),
        "capability": capability,
        "intent": intent,
        "rules": rules or {},
        "task_id": task_id,
        "timeout_ms": timeout_ms,
        "session_id": session_id or trace.session_of_current(),  # a handler's reach inherits
        "trace": trace.child_of(trace.current()),
        "priority": None if priority == "online" else priority,
        "callback_url": callback_url,
        "callback_context": callback_context,
        "callback_progress": callback_progress or None,
    }
    # the first intent a hub process matches may wait for its model to load (seconds)
    read_timeout = SEMANTIC_READ_TIMEOUT if intent is not None else 10.0
    # W3C trace context: the caller's current span, or inside a handler the handler's
    tp = telemetry.outgoing(trace.traceparent_of_current())
    headers = ((traceparent.HEADER, tp),) if tp else ()
    return Call("POST", "/v1/tasks", _present(body), _SUBMITTED, read_timeout, headers)


def _check_method(method: str | None) -> None:
    """A method is a name, not a path (`reach.core.fleet.names`): refused here, before it is
    sent, as the hub would refuse it."""
    if isinstance(method, str) and (why := name_refusal(method)) is not None:
        raise InvalidTaskRequest(why, field="method")


def submission_of(answer: dict[str, Any]) -> Submission:
    return Submission(
        answer["task_id"], answer["status"], answer.get("agent_id"), answer.get("method")
    )


def find(
    intent: str,
    *,
    agent_id: str | None = None,
    tags: Sequence[str] = (),
    capability: str | None = None,
    method: str | None = None,
    limit: int = 5,
    hub: str | None = None,
    api_key: str | None = None,
) -> list[Match]:
    """The capabilities ``intent`` matches, best first (``GET /v1/match``): what a send
    with this intent would choose from, without sending. Nothing at the hub's threshold
    raises ``NoSuitableAgent`` (``.extra["candidates"]``: the closest, with scores); a
    hub without semantic matching raises ``SemanticMatchingOff``."""
    call = find_call(
        intent, agent_id=agent_id, tags=tags, capability=capability, method=method, limit=limit
    )
    return matches_of(ask(call, hub, api_key))


def find_call(
    intent: str,
    *,
    agent_id: str | None,
    tags: Sequence[str],
    capability: str | None,
    method: str | None,
    limit: int,
) -> Call:
    params: dict[str, Any] = {
        "intent": intent,
        "agent_id": agent_id,
        "tag": list(tags) or None,
        "capability": capability,
        "method": method,
        "limit": limit,
    }
    return Call("GET", "/v1/match", _present(params), _MATCHED, SEMANTIC_READ_TIMEOUT)


def matches_of(answer: dict[str, Any]) -> list[Match]:
    return [Match(c["agent_id"], c["capability"], float(c["score"])) for c in answer["candidates"]]


def get_task(
    task_id: str, *, wait: float = 0.0, hub: str | None = None, api_key: str | None = None
) -> dict[str, Any]:
    """The task's view (long-polls up to ``wait`` s for a change); a task the key may not
    read raises ``UnknownTask``, like one that does not exist."""
    return ask(get_task_call(task_id, wait), hub, api_key)


def get_task_call(task_id: str, wait: float) -> Call:
    params = {"wait": wait} if wait else None
    return Call("GET", f"/v1/tasks/{task_id}", params, _VIEW, read_timeout=wait + 10)


def wait_for_result(
    task_id: str, timeout: float = 60.0, *, hub: str | None = None, api_key: str | None = None
) -> TaskResult:
    """Block until the task is terminal; return its data or raise the typed error."""
    deadline = time.monotonic() + timeout
    while True:
        view = ask(poll_call(task_id, deadline - time.monotonic()), hub, api_key)
        result = settled(view)
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise result_timeout(view, task_id, timeout)


def poll_call(task_id: str, left: float) -> Call:
    """One long-poll of `wait_for_result`, ``left`` seconds before its deadline."""
    wait = round(max(0.0, min(left, LONG_POLL_S)), 3)
    return Call("GET", f"/v1/tasks/{task_id}", {"wait": wait}, _VIEW, read_timeout=40.0)


def settled(view: dict[str, Any]) -> TaskResult | None:
    """A terminal task's result (or its typed error, raised); None while it runs."""
    return outcome(view) if view["status"] in TERMINAL else None


def result_timeout(view: dict[str, Any], task_id: str, timeout: float) -> ResultTimeout:
    """A parked task did not time out on its own: it waits for a human, and says so."""
    status = view["status"]
    if status == TaskStatus.AWAITING_APPROVAL:
        return ResultTimeout(
            f"task {task_id} is still awaiting approval after {timeout:g}s "
            "(a human must approve or reject it: `reach approvals list`)",
            task_id=task_id,
            status=status,
        )
    if status == TaskStatus.WAITING:
        return ResultTimeout(
            f"task {task_id} is still waiting after {timeout:g}s: its A2A agent asked for "
            "input or authorisation (the task's `waiting` event says what)",
            task_id=task_id,
            status=status,
        )
    return ResultTimeout(
        f"task {task_id} is still {status} after {timeout:g}s", task_id=task_id, status=status
    )


def outcome(view: dict[str, Any]) -> TaskResult:
    """A terminal task's result, or the typed error it ended with (raised)."""
    status = view["status"]
    error = view.get("error") or {}
    if status == "success":
        return TaskResult(
            view["task_id"],
            view.get("result"),
            view.get("agent_id"),
            view.get("instance_id"),
            view["attempt_seq"],
            view,
        )
    if status == "failed" and error.get("kind") == "approval_rejected":
        by, reason = error.get("decided_by"), error.get("reason")
        raise ApprovalRejected(
            str(error.get("message") or f"task {view['task_id']} was rejected by {by}: {reason}"),
            task_id=view["task_id"],
            approval_id=error.get("approval_id"),
            decided_by=by,
            decided_name=error.get("decided_name"),
            reason=reason,
        )
    if status == "failed" and error.get("kind") == "approval_expired":
        raise ApprovalExpired(
            str(error.get("message") or f"task {view['task_id']}: nobody approved it in time"),
            task_id=view["task_id"],
            approval_id=error.get("approval_id"),
            expires_at=error.get("expires_at"),
        )
    if status == "failed":
        raise BusinessError(
            int(error.get("code") or 1), str(error.get("message") or ""), task_id=view["task_id"]
        )
    if status == "dead":
        raise DeadLettered(
            f"task {view['task_id']} was dead-lettered: {error.get('reason') or ''} "
            f"({error.get('kind')}: {error.get('message')})",
            task_id=view["task_id"],
            cause=error.get("kind"),
        )
    if status == "cancelled" and error.get("kind") == "session_closed":
        raise SessionClosed(
            str(error.get("message") or f"task {view['task_id']}: its session was closed"),
            task_id=view["task_id"],
            session_id=error.get("session_id"),
            reason=error.get("reason"),
        )
    raise ReachError(f"task {view['task_id']} ended as {status}", task_id=view["task_id"])


def report_result(
    task_id: str,
    data: Any = None,
    *,
    code: int = 0,
    message: str = "",
    attempt_seq: int | None = None,
    instance_id: str | None = None,
    transient: bool = False,
    hub: str | None = None,
    api_key: str | None = None,
) -> bool:
    """Report the result of a task answered with 202; True if this report decided it.

    The hub takes a report only for the attempt it waits on, from the instance that
    attempt went to: ``attempt_seq`` is the delivery's, ``instance_id`` the agent's own
    (``Agent.report_result`` fills both in). A report without them is refused (422); one
    for an attempt or instance the task no longer waits on raises ``StaleReport``.
    ``transient``: the accepted work failed in a way a retry may mend (a non-zero
    ``code``): the hub retries the task with backoff, as for a 5xx answer.
    """
    call = result_call(
        task_id, data, code=code, message=message, attempt_seq=attempt_seq,
        instance_id=instance_id, transient=transient,
    )  # fmt: skip
    return bool(ask(call, hub, api_key)["decided"])


def result_call(
    task_id: str,
    data: Any,
    *,
    code: int,
    message: str,
    attempt_seq: int | None,
    instance_id: str | None,
    transient: bool = False,
) -> Call:
    body = {
        "code": code,
        "data": data,
        "message": message,
        "attempt_seq": attempt_seq,
        "instance_id": instance_id,
        "transient": transient or None,
    }
    return Call("POST", f"/v1/tasks/{task_id}/result", _present(body), ("decided",))


def report_progress(
    task_id: str,
    progress: float | None = None,
    message: str = "",
    data: Any = None,
    *,
    attempt_seq: int | None = None,
    instance_id: str | None = None,
    hub: str | None = None,
    api_key: str | None = None,
) -> None:
    """Report progress of an accepted task; named like a result (see `report_result`)."""
    call = progress_call(
        task_id, progress, message, data, attempt_seq=attempt_seq, instance_id=instance_id
    )
    ask(call, hub, api_key)


def progress_call(
    task_id: str,
    progress: float | None,
    message: str,
    data: Any,
    *,
    attempt_seq: int | None,
    instance_id: str | None,
    keepalive: bool = False,
) -> Call:
    """A progress report; a ``keepalive`` says only that the work goes on (no event)."""
    body = {
        "progress": progress,
        "message": message or None,
        "data": data,
        "attempt_seq": attempt_seq,
        "instance_id": instance_id,
        "keepalive": keepalive or None,
    }
    return Call("POST", f"/v1/tasks/{task_id}/progress", _present(body))


@dataclass(frozen=True, slots=True)
class BroadcastResult:
    broadcast_id: str
    complete: bool
    reason: str
    succeeded: int
    results: list[dict[str, Any]]

    @property
    def data(self) -> list[Any]:
        """The data of every target that succeeded so far."""
        return [r["data"] for r in self.results if r["status"] == "success"]


def broadcast(
    *,
    method: str,
    payload: dict[str, Any] | None = None,
    capability: str | None = None,
    tags: Sequence[str] = (),
    rules: dict[str, str | int | float | bool] | None = None,
    min_results: int | None = None,
    timeout: float = 30.0,
    hub: str | None = None,
    api_key: str | None = None,
) -> BroadcastResult:
    """Send to every routable instance matching ``capability``/``tags`` and gather results.

    Returns as soon as ``min_results`` targets succeeded (all, by default), every target
    finished, or ``timeout`` passed; each target's status is in ``results``.
    """
    call = broadcast_call(
        method=method,
        payload=payload,
        capability=capability,
        tags=tags,
        rules=rules,
        min_results=min_results,
        timeout=timeout,
    )
    view = ask(call, hub, api_key)
    deadline = time.monotonic() + timeout
    while not view["complete"] and time.monotonic() < deadline:
        left = deadline - time.monotonic()
        view = ask(broadcast_poll_call(view["broadcast_id"], left, timeout), hub, api_key)
    return broadcast_of(view)


def broadcast_call(
    *,
    method: str,
    payload: dict[str, Any] | None,
    capability: str | None,
    tags: Sequence[str],
    rules: dict[str, str | int | float | bool] | None,
    min_results: int | None,
    timeout: float,
) -> Call:
    _check_method(method)
    body = {
        "method": method,
        "payload": payload or {},
        "capability": capability,
        "tags": list(tags),
        "rules": rules or {},
        "min_results": min_results,
        "timeout_ms": max(1, int(timeout * 1000)),
    }
    return Call("POST", "/v1/broadcasts", _present(body), _BROADCAST, read_timeout=timeout + 15)


def broadcast_poll_call(broadcast_id: str, left: float, timeout: float) -> Call:
    """One long-poll of `broadcast`, ``left`` seconds before its ``timeout`` ends."""
    wait = round(max(0.0, min(left, LONG_POLL_S)), 3)
    path = f"/v1/broadcasts/{broadcast_id}"
    return Call("GET", path, {"wait": wait}, _BROADCAST, read_timeout=timeout + 15)


def broadcast_of(view: dict[str, Any]) -> BroadcastResult:
    return BroadcastResult(
        view["broadcast_id"], view["complete"], view["reason"], view["succeeded"], view["results"]
    )
