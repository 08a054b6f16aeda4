"""The hub as an A2A server: every hub agent (and every capability) is an A2A agent.

``/a2a/{agent_id}/.well-known/agent-card.json`` describes a hub agent as an A2A agent
(its capabilities as skills, the hub's bearer scheme when auth is on); ``POST
/a2a/{agent_id}`` is its JSON-RPC endpoint. ``/a2a/capability/{type}`` does the same for
a capability, routed to whichever agent has it. The JSON-RPC side (parsing, the
``A2A-Version`` check, method names, v0.3 compatibility, the protocol's error codes,
SSE framing) is ``a2a-sdk``'s own dispatcher; `HubRequestHandler` answers its calls
with the hub's tasks:

* ``SendMessage``: the message becomes a task (skill: ``metadata.skill``, or the only
  one; payload from the parts, ``reach.core.interop.a2a.payload_of``) submitted like ``POST
  /v1/tasks`` — routing, retries, breaker, dead letters and idempotency behind it (the
  same caller resending a message ID reaches the same task). Blocking (the default)
  waits up to ``a2a.send_wait_s`` for its end; the A2A task's ID is the hub's task ID.
* ``SendStreamingMessage``: the task, then its status changes, progress and result as
  A2A events, read from the hub's own progress stream.
* ``GetTask``, ``CancelTask``: the hub task, read by whoever may read it, cancelled by its
  caller (or an admin) only: an agent it was routed to reads it, and may not end it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING, Any, cast

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    InternalError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from pydantic import ValidationError
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from reach.core.flow.priority import queue_for
from reach.core.interop import a2a as rules
from reach.core.ledger.statuses import TERMINAL, TaskStatus
from reach.core.security.auth import Principal, may_cancel_task
from reach.errors import ReachError, UnknownTask
from reach.hub.gates import approvals
from reach.hub.ledger import streams
from reach.hub.ledger.longpoll import long_poll
from reach.hub.ledger.tasks import (
    Publish,
    finish,
    load_for_update,
    record_event,
    task_view,
)
from reach.hub.storage.models import AgentCapabilityRow, AgentRow
from reach.wire.schemas import SubmitRequest

if TYPE_CHECKING:
    from reach.hub.api.routes.tasks import Intake
    from reach.hub.context import HubContext
    from reach.hub.ledger.streams import StreamHub
    from reach.hub.ledger.wakeups import Waiters

log = logging.getLogger("reach.hub.interop.a2a")

_NOT_YOURS = "not-yours"  # CancelTask by a principal that may read the task, not end it

TARGET = "reach_target"  # request.state / call context: {"agent_id": ...} or {"capability": ...}


class ContextBuilder(DefaultServerCallContextBuilder):
    """The call context a2a-sdk hands the handler: its own (headers: the version check)
    plus what the hub's route decided (the principal, the target, the request)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state["principal"] = request.state.principal
        context.state[TARGET] = request.state.reach_target
        context.state["request"] = request
        return context


def skills_of(session: Any, target: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The target's skills (id, description, tags), or None when it does not exist."""
    if "agent_id" in target:
        agent = session.get(AgentRow, target["agent_id"])
        if agent is None:
            return None
        return [
            {"id": c["type"], "description": c.get("description") or c["type"], "tags": agent.tags}
            for c in agent.capabilities
        ]
    capability = target["capability"]
    found = session.scalar(
        select(AgentCapabilityRow.agent_id).where(AgentCapabilityRow.capability == capability)
    )
    if found is None:
        return None
    return [{"id": capability, "description": capability, "tags": []}]


def card_for(
    name: str, description: str, rpc_url: str, skills: list[dict[str, Any]], auth: bool
) -> dict[str, Any]:
    """The A2A card of a hub agent or capability (checked against a2a-sdk's AgentCard)."""
    card: dict[str, Any] = {
        "name": name,
        "description": description,
        "version": "1.0",
        "supportedInterfaces": [
            {
                "url": rpc_url,
                "protocolBinding": rules.JSONRPC_BINDING,
                "protocolVersion": rules.A2A_VERSION,
            }
        ],
        "provider": {"organization": "Agent-Reach", "url": rpc_url},
        "capabilities": {"streaming": True, "pushNotifications": False},
        "defaultInputModes": ["application/json", "text/plain"],
        "defaultOutputModes": ["application/json", "text/plain"],
        "skills": [
            {
                "id": s["id"],
                "name": s["id"],
                "description": s["description"],
                "tags": s["tags"] or [s["id"]],
            }
            for s in skills
        ],
    }
    if auth:
        card["securitySchemes"] = {
            "reach": {
                "httpAuthSecurityScheme": {
                    "scheme": "bearer",
                    "description": "an Agent-Reach API key of scope caller (rk_...)",
                }
            }
        }
        card["securityRequirements"] = [{"schemes": {"reach": {}}}]
    return cast(dict[str, Any], MessageToDict(ParseDict(card, AgentCard())))


ReadTask = Callable[[Any, str, Request, Principal], dict[str, Any]]
"""The API's read of one task for a principal (its visibility rules applied)."""


class HubRequestHandler(RequestHandler):
    """a2a-sdk's request handler interface, answered with the hub's tasks."""

    def __init__(
        self,
        ctx: HubContext,
        intake: Intake,
        waiters: Waiters | None,
        stream_hub: StreamHub,
        read: ReadTask,
    ) -> None:
        """``intake`` and ``read`` are the API's own submit and read of a task (with its
        screening and ownership rules): the A2A edge answers exactly as ``/v1/tasks``."""
        self.ctx = ctx
        self.intake = intake
        self.waiters = waiters
        self.stream_hub = stream_hub
        self.read = read

    # -- sending --------------------------------------------------------------------------

    async def _submit(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> dict[str, Any]:
        principal: Principal = context.state["principal"]
        target: dict[str, Any] = context.state[TARGET]
        message = MessageToDict(params.message)
        if params.message.task_id:
            raise UnsupportedOperationError(
                message="continuing an A2A task is not supported: send a new message"
            )
        if not params.message.message_id:
            raise InvalidParamsError(message="message.messageId is required")
        skills = [s["id"] for s in await run_in_threadpool(self._skills, target)]
        try:
            skill = rules.skill_of(message.get("metadata"), skills)
        except ValueError as exc:
            raise InvalidParamsError(message=str(exc), data={"skills": skills}) from None
        try:
            body = SubmitRequest(
                task_id=rules.hub_task_id(principal.identity, params.message.message_id),
                method=skill,
                payload=rules.payload_of(message.get("parts") or ()),
                **target,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise InvalidParamsError(message=f"{where}: {first['msg']}") from None
        try:
            view, created = await self.intake.accept(body, principal)
        except ReachError as exc:
            raise _a2a_error(exc) from None
        if created and view["status"] != TaskStatus.AWAITING_APPROVAL:
            attempt = Publish(view["task_id"], 1, 0.0, queue_for(view.get("priority")))
            await run_in_threadpool(self.ctx.publish_premarked, attempt)
        context.state["context_id"] = params.message.context_id or view["task_id"]
        return view

    def _skills(self, target: dict[str, Any]) -> list[dict[str, Any]]:
        with self.ctx.reading() as session:
            return skills_of(session, target) or []

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        view = await self._submit(params, context)
        wait = self.ctx.settings.a2a.send_wait_s
        if not params.configuration.return_immediately and view["status"] not in TERMINAL:
            task_id = view["task_id"]
            view = await long_poll(
                lambda: self._read(task_id, context),
                lambda v: v["status"] in TERMINAL,
                wait,
                waiters=self.waiters,
                keys=[task_id],
                carried=True,
            )
        return task_of(view, context.state["context_id"])

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        view = await self._submit(params, context)
        async for event in self._events(view, context.state["context_id"]):
            yield event

    async def _events(self, view: dict[str, Any], context_id: str) -> AsyncGenerator[Event]:
        """The task first, then the hub's progress stream of it as A2A events: from its
        first event (read after the task was written, so nothing can slip between)."""
        task_id = view["task_id"]
        yield task_of(view, context_id)
        if view["status"] in TERMINAL:
            return
        async for event in streams.task_stream(self.stream_hub, task_id, view, 0, 0):
            for a2a_event in events_of(event.kind, event.data, task_id, context_id):
                yield a2a_event

    # -- tasks ----------------------------------------------------------------------------

    def _read(self, task_id: str, context: ServerCallContext) -> dict[str, Any]:
        try:
            return self.read(
                self.ctx, task_id, context.state["request"], context.state["principal"]
            )
        except UnknownTask:
            raise TaskNotFoundError(message=f"task {task_id!r} not found") from None

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        view = await run_in_threadpool(self._read, params.id, context)
        return task_of(view, params.id)

    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        view = await run_in_threadpool(self._read, params.id, context)  # visible to the caller
        principal: Principal = context.state["principal"]

        def cancel(session: Any) -> dict[str, Any] | str | None:
            task = load_for_update(session, params.id)
            if task is not None and not may_cancel_task(principal, task.caller):
                return _NOT_YOURS  # an agent it was routed to reads it; it may not end it
            if task is None or task.status in TERMINAL:
                return None
            now = self.ctx.clock.now()
            if task.status == TaskStatus.AWAITING_APPROVAL:
                approvals.cancel(session, task.task_id, now, principal.identity)
            detail = {"by": "a2a", "method": "CancelTask"}
            record_event(session, task, "cancel_requested", now, detail, actor=principal.identity)
            error = {"kind": "cancelled", "message": "cancelled by its A2A caller"}
            finish(
                session,
                task,
                TaskStatus.CANCELLED,
                now,
                error=error,
                detail=detail,
                actor=principal.identity,
            )
            return task_view(task)

        done = await run_in_threadpool(self.ctx.write, cancel)
        if done == _NOT_YOURS:
            log.warning(
                "CancelTask of %s refused: %s is not its caller", params.id, principal.identity
            )
            raise TaskNotCancelableError(
                message=f"task {params.id!r} may be cancelled only by its caller or an admin"
            )
        if not isinstance(done, dict):
            raise TaskNotCancelableError(
                message=f"task {params.id!r} is {view['status']}: it cannot be cancelled"
            )
        return task_of(done, params.id)

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        view = await run_in_threadpool(self._read, params.id, context)
        async for event in self._events(view, params.id):
            yield event

    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        raise UnsupportedOperationError(message="ListTasks: use GET /api/v1/tasks of the hub")

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise UnsupportedOperationError(message="no extended card: the public one is all")


def _a2a_error(exc: ReachError) -> Exception:
    """A hub refusal as the protocol's error: the request's fault (4xx) is invalid params,
    the hub's state (429, 5xx) an internal error; both name the problem type."""
    message = f"{exc.slug}: {exc.detail}"
    data = {"type": exc.problem_type(), "status": exc.status}
    if 400 <= exc.status < 500 and exc.status != 429:
        return InvalidParamsError(message=message, data=data)
    return InternalError(message=message, data=data)


def _status(state: rules.State, text: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {"state": state.value}
    if text:
        status["message"] = {
            "messageId": f"status-{abs(hash(text))}",
            "role": "ROLE_AGENT",
            "parts": [{"text": text}],
        }
    return status


def task_of(view: dict[str, Any], context_id: str) -> Task:
    """A hub task as an A2A task: its state, its result as an artifact, its error as the
    status message."""
    state = rules.HUB_STATE.get(view["status"], rules.State.WORKING)
    error = view.get("error") or {}
    task: dict[str, Any] = {
        "id": view["task_id"],
        "contextId": context_id,
        "status": _status(state, str(error.get("message") or "") if error else ""),
        "metadata": {"reach": {"status": view["status"], "agent_id": view.get("agent_id")}},
    }
    if view["status"] == TaskStatus.SUCCESS:
        task["artifacts"] = [
            {
                "artifactId": "result",
                "name": "result",
                "parts": rules.artifact_parts(view["result"]),
            }
        ]
    return cast(Task, ParseDict(task, Task()))


def events_of(kind: str, data: dict[str, Any], task_id: str, context_id: str) -> list[Event]:
    """One event of the hub's progress stream as A2A stream events."""
    if kind == "status":
        state = rules.HUB_STATE.get(str(data.get("status")), rules.State.WORKING)
        update = {"taskId": task_id, "contextId": context_id, "status": _status(state)}
        return [ParseDict(update, TaskStatusUpdateEvent())]
    if kind == "progress":
        parts: list[dict[str, Any]] = []
        if data.get("message"):
            parts.append({"text": str(data["message"])})
        extra = {k: data[k] for k in ("progress", "data") if data.get(k) is not None}
        if extra:
            parts.append({"data": extra})
        status = {
            "state": rules.State.WORKING.value,
            "message": {
                "messageId": f"{task_id}-progress-{data.get('at')}",
                "role": "ROLE_AGENT",
                "parts": parts or [{"text": ""}],
            },
        }
        update = {"taskId": task_id, "contextId": context_id, "status": status}
        return [ParseDict(update, TaskStatusUpdateEvent())]
    if kind == "result":
        view = data
        out: list[Event] = []
        if view.get("status") == TaskStatus.SUCCESS:
            artifact = {
                "taskId": task_id,
                "contextId": context_id,
                "artifact": {
                    "artifactId": "result",
                    "name": "result",
                    "parts": rules.artifact_parts(view.get("result")),
                },
                "lastChunk": True,
            }
            out.append(ParseDict(artifact, TaskArtifactUpdateEvent()))
        state = rules.HUB_STATE.get(str(view.get("status")), rules.State.FAILED)
        error = view.get("error") or {}
        final = {
            "taskId": task_id,
            "contextId": context_id,
            "status": _status(state, str(error.get("message") or "") if error else ""),
        }
        out.append(ParseDict(final, TaskStatusUpdateEvent()))
        return out
    return []
