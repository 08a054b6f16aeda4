"""The hub as an MCP server: its capabilities as MCP tools, a task's end as a tool result.

Pure decisions on plain JSON (the hub's edge, ``reach.hub.interop.mcp``, turns them into
the ``mcp`` SDK's types), so they are table-tested without sockets and ``reach.core``
stays free of the SDK.

**Tools.** One tool per capability type among the agents in scope, whichever agents
declare it: a call is routed by capability (routing picks the agent and instance), so
two agents declaring ``doc.summarise`` are one tool, not two. The first declaration in
agent-id order gives the description and the input schema. A capability type that is
a valid MCP tool name (``[A-Za-z0-9._-]{1,128}``) is the tool's name; one with ``:`` or
``/`` (which hub names allow and tool names do not) becomes its name with those replaced
by ``_``, plus ``-`` and the first 8 hex digits of the SHA-256 of the type, so names stay
distinct; in the rare clash left, a type that is its own name keeps it (else the first in
sorted order) and the other is left out. The tool's ``_meta`` names the capability type
and its agents.

**Results.** A task's terminal view becomes a `ToolResult`:

=====================================  ========  ===========================================
task                                   isError   content / structuredContent
=====================================  ========  ===========================================
success                                no        the result (text: JSON; object: as is,
                                                 anything else under ``result``)
awaiting_approval                      no        "awaiting approval", approval and task ids
failed (the agent said no)             yes       ``business-error``, its code and message
failed: approval rejected / expired    yes       ``approval-rejected`` / ``approval-expired``
dead (retries spent)                   yes       ``dead-lettered`` and the last failure
cancelled                              yes       ``session-closed`` or ``task-cancelled``
not over when the wait is              yes       ``result-timeout``, the task id to read later
refused at submit                      yes       the refusal's problem type and detail
=====================================  ========  ===========================================

Every error's ``structuredContent`` carries the problem ``type`` (the same
``urn:agent-reach:problem:...`` the HTTP API answers with), ``status`` and ``task_id``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from reach.core.security.auth import is_loopback_host
from reach.errors import (
    PROBLEM_TYPE_PREFIX,
    ApprovalExpired,
    ApprovalRejected,
    BusinessError,
    DeadLettered,
    ReachError,
    ResultTimeout,
    SessionClosed,
)

__all__ = [
    "CANCELLED",
    "SESSION_META",
    "TIMEOUT_META",
    "TOOL_NAME",
    "CallOptions",
    "Scope",
    "Tool",
    "ToolResult",
    "awaiting_approval",
    "call_options",
    "input_schema_of",
    "outcome_of",
    "progress_step",
    "rebinding_refusal",
    "refusal",
    "submission",
    "tool_name",
    "tools_of",
]

TOOL_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
TIMEOUT_META: Final = "reach/timeout_ms"  # a call's task timeout, in the request's _meta
SESSION_META: Final = "reach/session_id"  # the user session the call's task belongs to
MAX_SESSION_ID: Final = 128
DEFAULT_TIMEOUT_MS: Final = 30_000  # a task's default (reach.wire.schemas.SubmitRequest)
MAX_TIMEOUT_MS: Final = 3_600_000
CANCELLED: Final = PROBLEM_TYPE_PREFIX + "task-cancelled"
_HASH_DIGITS = 8


@dataclass(frozen=True, slots=True)
class Scope:
    """Which agents an MCP endpoint serves: all, or those of one agent id, carrying every
    tag given, and (``capability``) one capability only."""

    agent_id: str | None = None
    tags: tuple[str, ...] = ()
    capability: str | None = None

    def describe(self) -> str:
        parts = [f"agent {self.agent_id}"] if self.agent_id else []
        parts += [f"tag {t}" for t in self.tags]
        parts += [f"capability {self.capability}"] if self.capability else []
        return ", ".join(parts) or "the whole hub"


@dataclass(frozen=True, slots=True)
class Tool:
    """One MCP tool: a capability of the agents in scope."""

    name: str
    capability: str
    description: str
    input_schema: dict[str, Any]
    agents: tuple[str, ...]
    approval: bool = False

    def meta(self) -> dict[str, Any]:
        return {"reach/capability": self.capability, "reach/agents": list(self.agents)}


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tools/call answer: text for the model, the same as JSON, and whether it failed."""

    text: str
    structured: dict[str, Any]
    is_error: bool = False
    task_id: str | None = None  # the result's _meta names it: GET /v1/tasks/{id} reads it

    def meta(self) -> dict[str, Any]:
        return {"reach/task_id": self.task_id} if self.task_id else {}


@dataclass(frozen=True, slots=True)
class CallOptions:
    """What a tools/call's ``_meta`` asks of the hub: the task's timeout (also how long
    the call waits for its end), whether progress notifications are wanted, and the user
    session the task belongs to (closing it cancels the task: ``reach sessions close``)."""

    timeout_ms: int = DEFAULT_TIMEOUT_MS
    progress: bool = False
    session_id: str | None = None


def tool_name(capability: str) -> str:
    """The tool name of a capability type (see the module docstring)."""
    if TOOL_NAME.fullmatch(capability):
        return capability
    digest = hashlib.sha256(capability.encode()).hexdigest()[:_HASH_DIGITS]
    base = re.sub(r"[^A-Za-z0-9._-]", "_", capability)[: 128 - _HASH_DIGITS - 1]
    return f"{base}-{digest}"


def input_schema_of(params_schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """The tool's inputSchema: the capability's ``params_schema``, whose root MCP wants
    to be ``type: object`` (a payload always is one): added when the schema names no type,
    and a schema of another type is kept under ``allOf`` (no object satisfies it: the
    hub's validation says so at the call)."""
    schema = dict(params_schema or {})
    kind = schema.get("type")
    if kind == "object":
        return schema
    if kind is None:
        return {"type": "object", **schema}
    return {"type": "object", "allOf": [schema]}


def tools_of(
    declarations: Iterable[tuple[str, Mapping[str, Any]]],
    needs_approval: Iterable[str] = (),
) -> list[Tool]:
    """The tools of ``(agent_id, capability declaration)`` pairs, sorted by name; one per
    capability type (``needs_approval``: the types a call of which waits for a human)."""
    gated = set(needs_approval)
    by_type: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for agent_id, decl in sorted(declarations, key=lambda d: (str(d[1].get("type")), d[0])):
        by_type.setdefault(str(decl.get("type")), []).append((agent_id, decl))
    tools: dict[str, Tool] = {}
    # a type that is its own tool name first: it keeps its name in a clash with a mapped one
    for capability, decls in sorted(by_type.items(), key=lambda i: (tool_name(i[0]) != i[0], i)):
        name = tool_name(capability)
        if name in tools:
            continue  # a clash (see the module docstring): the one named first keeps it
        first = decls[0][1]
        agents = tuple(dict.fromkeys(agent for agent, _ in decls))
        description = str(first.get("description") or "").strip() or (
            f"The capability {capability} of {', '.join(agents)}, reached through Agent-Reach."
        )
        approval = capability in gated
        if approval:
            description += (
                " Needs a human approval: a call returns at once with the approval's id "
                "and the task's, and the task runs once someone approves it."
            )
        tools[name] = Tool(
            name, capability, description, input_schema_of(first.get("params_schema")), agents,
            approval,
        )  # fmt: skip
    return [tools[n] for n in sorted(tools)]


def call_options(params: Mapping[str, Any] | None) -> CallOptions:
    """The options of a tools/call from its raw params' ``_meta``: ``reach/timeout_ms``
    (1 ms to 1 h), ``reach/session_id`` (a string of 1 to 128 characters), whether a
    ``progressToken`` was sent; a bad value is a ValueError naming its key."""
    meta = (params or {}).get("_meta")
    if not isinstance(meta, Mapping):
        return CallOptions()
    token = meta.get("progressToken")
    progress = isinstance(token, str | int) and not isinstance(token, bool)
    raw = meta.get(TIMEOUT_META, DEFAULT_TIMEOUT_MS)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_TIMEOUT_MS:
        raise ValueError(
            f"_meta.{TIMEOUT_META} must be an integer from 1 to {MAX_TIMEOUT_MS}, not {raw!r}"
        )
    session = meta.get(SESSION_META)
    if session is not None and (
        not isinstance(session, str) or not 1 <= len(session) <= MAX_SESSION_ID
    ):
        raise ValueError(
            f"_meta.{SESSION_META} must be a string of 1 to {MAX_SESSION_ID} characters"
        )
    return CallOptions(raw, progress, session)


def submission(
    scope: Scope, tool: Tool, arguments: Mapping[str, Any] | None, options: CallOptions
) -> dict[str, Any]:
    """The ``POST /v1/tasks`` body of a call: routed by capability, within the scope."""
    body: dict[str, Any] = {
        "capability": tool.capability,
        "method": tool.capability,
        "payload": dict(arguments or {}),
        "timeout_ms": options.timeout_ms,
    }
    if options.session_id is not None:
        body["session_id"] = options.session_id
    if scope.agent_id:
        body["agent_id"] = scope.agent_id
    if scope.tags:
        body["tags"] = list(scope.tags)
    return body


def progress_step(
    progress: object, message: object, last: float
) -> tuple[float, float, str | None] | None:
    """A progress report of the task as an MCP progress notification ``(progress, total,
    message)``, or None: MCP wants progress to increase, so only a report whose fraction
    (0 to 1) passes the last one sent is one (a retry that starts over shows again once
    it gets further than the attempt before)."""
    if isinstance(progress, bool) or not isinstance(progress, int | float):
        return None
    fraction = min(1.0, max(0.0, float(progress)))
    if fraction <= last:
        return None
    return fraction, 1.0, (str(message) if message else None)


def rebinding_refusal(host: str | None, origin: str | None) -> str | None:
    """Why a request to an open hub on loopback is refused (None: it is not): its ``Host``
    or ``Origin`` names something other than a loopback address. A web page's script whose
    site name was made to resolve to 127.0.0.1 (DNS rebinding) sends its own name there,
    and must not reach the tools of a hub that takes requests without a key."""
    try:
        name = urlsplit(f"//{host}").hostname if host else None
    except ValueError:  # a bracket left open
        name = None
    if not name or not is_loopback_host(name):
        return f"Host {host!r} is not a loopback name (an open hub's MCP endpoint)"
    if origin is not None:
        try:
            parts = urlsplit(origin)
            loopback = parts.scheme in ("http", "https") and is_loopback_host(parts.hostname or "")
        except ValueError:
            loopback = False
        if not loopback:
            return f"Origin {origin!r} is not a loopback origin (an open hub's MCP endpoint)"
    return None


def _error(
    problem: type[ReachError] | str, detail: str, task_id: str | None, **extra: Any
) -> ToolResult:
    kind = problem if isinstance(problem, str) else problem.problem_type()
    status = extra.pop("status", None)
    if status is None and not isinstance(problem, str):
        status = problem.status
    slug = kind.removeprefix(PROBLEM_TYPE_PREFIX)
    structured = {"type": kind, "status": status, "detail": detail, "task_id": task_id, **extra}
    return ToolResult(f"{slug}: {detail}", structured, is_error=True, task_id=task_id)


def refusal(exc: ReachError) -> ToolResult:
    """A submit the hub refused (bad arguments, no agent, backpressure...) as a tool error
    with its problem type: the model can read why and correct the call."""
    extra = {k: v for k, v in exc.extra.items() if k not in ("type", "status", "detail")}
    return _error(type(exc), exc.detail, extra.pop("task_id", None), **extra)


def awaiting_approval(task_id: str, approval_id: str | None) -> ToolResult:
    """A call of a gated capability: the task is parked for a human; nobody holds the call."""
    text = (
        f"awaiting approval: task {task_id} waits for a human decision (approval "
        f"{approval_id}); it runs once approved. Its result: GET /v1/tasks/{task_id}."
    )
    structured = {"status": "awaiting_approval", "task_id": task_id, "approval_id": approval_id}
    return ToolResult(text, structured, task_id=task_id)


def _text_of(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, sort_keys=True)


def outcome_of(view: Mapping[str, Any], waited_s: float) -> ToolResult:
    """A task's view as the tool's result (the table of the module docstring);
    ``waited_s``: how long the call waited, named when it is not over yet."""
    task_id = str(view["task_id"])
    status = view["status"]
    error: Mapping[str, Any] = view.get("error") or {}
    message = str(error.get("message") or "")
    if status == "success":
        result = view.get("result")
        structured = dict(result) if isinstance(result, Mapping) else {"result": result}
        return ToolResult(_text_of(result), structured, task_id=task_id)
    if status == "failed" and error.get("kind") == "approval_rejected":
        detail = message or f"task {task_id} was rejected by {error.get('decided_by')}"
        return _error(
            ApprovalRejected, detail, task_id,
            approval_id=error.get("approval_id"), reason=error.get("reason"),
        )  # fmt: skip
    if status == "failed" and error.get("kind") == "approval_expired":
        detail = message or f"task {task_id}: nobody approved it in time"
        return _error(ApprovalExpired, detail, task_id, approval_id=error.get("approval_id"))
    if status == "failed":
        code = error.get("code")
        detail = message or f"task {task_id} failed"
        return _error(BusinessError, detail, task_id, code=code if code is not None else 1)
    if status == "dead":
        detail = (
            f"task {task_id} was dead-lettered after its retries: "
            f"{error.get('kind')}: {message}".rstrip(": ")
        )
        return _error(DeadLettered, detail, task_id, cause=error.get("kind"))
    if status == "cancelled":
        if error.get("kind") == "session_closed":
            detail = message or f"task {task_id}: its session was closed"
            return _error(SessionClosed, detail, task_id, session_id=error.get("session_id"))
        return _error(CANCELLED, message or f"task {task_id} was cancelled", task_id, status=409)
    detail = (
        f"task {task_id} is still {status} after {waited_s:g} s; "
        f"its result: GET /v1/tasks/{task_id}"
    )
    return _error(ResultTimeout, detail, task_id, task_status=status)
