"""Wire records of the agent-facing API, shared by the hub and the SDK.

Every model forbids unknown fields: a typo in a registration is an error the agent
sees at once, not a silently ignored setting.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from reach.core.blobs.links import BLOB_ID_PATTERN
from reach.core.fleet import params_schema
from reach.core.fleet.endpoints import parse_endpoint
from reach.core.fleet.names import MAX_NAME, NAME_PATTERN, is_path, name_refusal

AgentId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]
InstanceId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")]
Tag = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$")]
BlobId = Annotated[str, Field(pattern=BLOB_ID_PATTERN)]


def _a_name(what: str) -> BeforeValidator:
    """A clear error for a value that is a path, not a name (`reach.core.fleet.names`), before
    the pattern's own (which says only that it does not match)."""

    def check(value: Any) -> Any:
        if isinstance(value, str) and is_path(value):
            raise ValueError(name_refusal(value, what))
        return value

    return BeforeValidator(check)


CapabilityType = Annotated[
    str, _a_name("capability type"), Field(pattern=NAME_PATTERN, max_length=MAX_NAME)
]
Example = Annotated[str, Field(min_length=1, max_length=300)]
Intent = Annotated[str, Field(min_length=1, max_length=1000, pattern=r"\S")]
MetadataValue = str | int | float | bool


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_json_schema(schema: dict[str, Any], field: str) -> dict[str, Any]:
    # on first use: a hub process that never checks a declared schema (the worker, beat)
    # does without the library and the ~2.5 MB it holds
    from jsonschema import Draft202012Validator, SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        raise ValueError(f"{field} is not a valid JSON Schema at {where}: {exc.message}") from None
    refused = params_schema.refusal(schema)  # remote references, backtracking patterns
    if refused is not None:
        raise ValueError(f"{field} is refused: {refused}")
    return schema


class Capability(WireModel):
    """What an agent can do, declared at registration and checked before delivery."""

    type: CapabilityType
    description: str = Field("", max_length=2000)
    params_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    return_schema: dict[str, Any] | None = None
    estimated_latency: float | None = Field(None, ge=0, description="milliseconds")
    danger_level: Literal["low", "medium", "high"] = "low"
    require_approval: bool = False
    examples: list[Example] = Field(
        default_factory=list,
        max_length=32,
        description="phrases a caller might use for this capability (semantic matching)",
    )

    @field_validator("params_schema")
    @classmethod
    def _params_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        return check_json_schema(value, "params_schema")

    @field_validator("return_schema")
    @classmethod
    def _return_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else check_json_schema(value, "return_schema")


class RegisterRequest(WireModel):
    agent_id: AgentId
    instance_id: InstanceId | None = None
    addr: str = Field(min_length=1, max_length=512)
    public_endpoint: str | None = Field(None, max_length=512)
    tags: list[Tag] = Field(default_factory=list, max_length=64)
    capabilities: list[Capability] = Field(default_factory=list, max_length=256)
    metadata: dict[Annotated[str, Field(max_length=64)], MetadataValue] = Field(
        default_factory=dict, max_length=64
    )
    max_concurrency: int = Field(8, ge=1, le=100_000)
    # the agent's bound on pending + in-flight tasks (429 past it); None: router.max_queue.
    # An admin's override wins (PUT /api/v1/agents/{id}/max-queue).
    max_queue: int | None = Field(None, ge=1, le=10_000_000, strict=True)
    heartbeat_interval: float = Field(10.0, ge=0.05, le=3600)
    allow_loopback: bool = False
    version: str = Field("", max_length=64)

    @field_validator("addr", "public_endpoint")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_endpoint(value)
        return value

    @field_validator("tags")
    @classmethod
    def _unique_tags(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("tags must be unique")
        return sorted(value)

    @model_validator(mode="after")
    def _unique_capabilities(self) -> RegisterRequest:
        seen: set[str] = set()
        for cap in self.capabilities:
            if cap.type in seen:
                raise ValueError(f"capability type {cap.type!r} is declared twice")
            seen.add(cap.type)
        return self


class RegisterResponse(WireModel):
    agent_id: str
    instance_id: str
    status: str
    endpoint: str
    heartbeat_interval: float
    created: bool


DB_INT_MAX = 2**31 - 1
"""The largest value an ``Integer`` column holds on PostgreSQL: ids and counts the hub
stores or looks up are bounded by it, so out-of-range input is a 422, not a 500."""
Count = Annotated[int, Field(ge=0, le=DB_INT_MAX)]

MAX_WAIT_S = 60.0
"""The longest long-poll (``wait``) the API holds a request for; a caller that waits
longer asks again."""
BusinessCode = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class HeartbeatRequest(WireModel):
    agent_id: AgentId
    instance_id: InstanceId
    current_load: float = Field(0.0, ge=0)
    in_flight: Count = 0
    max_concurrency: int | None = Field(None, ge=1, le=100_000)
    last_task_duration_ms: float | None = Field(None, ge=0)
    consecutive_failure_count: Count = 0
    sent_at: float | None = Field(None, description="agent clock; recorded, never trusted")


class HeartbeatResponse(WireModel):
    status: str
    next_heartbeat_in: float


class DeregisterRequest(WireModel):
    agent_id: AgentId
    instance_id: InstanceId


TaskId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$")]
Method = Annotated[str, _a_name("method"), Field(pattern=NAME_PATTERN, max_length=MAX_NAME)]


class TraceContext(WireModel):
    """Carried by every reach so a chain of agents stays one story (and loops show)."""

    root_id: Annotated[str, Field(max_length=128)]
    parent_task_id: Annotated[str, Field(max_length=128)] | None = None
    hops: int = Field(0, ge=0, le=1000)
    path: list[Annotated[str, Field(max_length=128)]] = Field(default_factory=list, max_length=1000)


Priority = Literal["online", "background"]
"""Online deliveries are consumed first; background ones yield while online work waits."""


class SubmitRequest(WireModel):
    """``POST /v1/tasks``: one message to one agent, chosen by ID, tags or capability, or
    by ``intent`` (words: the hub matches them to a declared capability by meaning, among
    the agents the other fields allow; ``method`` is then the matched capability)."""

    task_id: TaskId | None = None
    agent_id: AgentId | None = None
    tags: list[Tag] = Field(default_factory=list, max_length=64)
    capability: CapabilityType | None = None
    intent: Intent | None = Field(
        None, description="what the caller needs, in words (semantic capability matching)"
    )
    method: Method | None = Field(None, description="required unless an intent is given")
    payload: dict[str, Any] = Field(default_factory=dict)
    payload_ref: BlobId | None = Field(
        None,
        description="a blob the caller uploaded (PUT /v1/blobs) that carries a large payload; "
        "the agent reads it by a short-lived link, and it is deleted with the task",
    )
    rules: dict[Annotated[str, Field(max_length=64)], MetadataValue] = Field(
        default_factory=dict, max_length=32, description="agent metadata that must match"
    )
    timeout_ms: int = Field(30_000, ge=1, le=3_600_000, strict=True)  # `true` is no timeout
    session_id: Annotated[str, Field(max_length=128)] | None = None
    trace: TraceContext | None = None
    priority: Priority = "online"
    callback_url: Annotated[str, Field(min_length=1, max_length=512)] | None = Field(
        None, description="the hub POSTs the result here, signed (reach.verify_callback)"
    )
    callback_context: Any = Field(None, description="echoed back in the callback's body")
    callback_progress: bool = Field(False, description="also POST each progress report")

    @model_validator(mode="after")
    def _callback_fields(self) -> SubmitRequest:
        asked = self.callback_context is not None or self.callback_progress
        if self.callback_url is None and asked:
            raise ValueError("callback_context and callback_progress need a callback_url")
        if self.callback_context is not None and len(json.dumps(self.callback_context)) > 16_384:
            raise ValueError("callback_context is larger than 16 KiB of JSON")
        return self

    @model_validator(mode="after")
    def _has_target(self) -> SubmitRequest:
        if not (self.agent_id or self.tags or self.capability or self.intent):
            raise ValueError(
                "name a target: agent_id, tags, capability or intent (never a blind broadcast)"
            )
        if self.method is None and self.intent is None:
            raise ValueError("method is required (or give an intent: the match names it)")
        return self


class MatchCandidate(WireModel):
    """One capability that matches an intent: ``score`` is the cosine similarity."""

    agent_id: str
    capability: str
    score: float


class MatchResponse(WireModel):
    """``GET /v1/match``: the candidates at or above the threshold, best first."""

    intent: str
    threshold: float
    candidates: list[MatchCandidate]


AttemptSeq = Annotated[int, Field(ge=1, le=DB_INT_MAX)]


class ResultReport(WireModel):
    """``POST /v1/tasks/{id}/result``: the agent's late answer after a 202.

    It names the attempt it answers (``attempt_seq`` of the delivery) and the instance
    that took it: the hub refuses a report for any other attempt or instance (409
    ``stale-report``), so a stale copy or a stranger cannot decide the task.
    """

    code: BusinessCode = 0
    data: Any = None
    message: str = Field("", max_length=10_000)
    attempt_seq: AttemptSeq
    instance_id: InstanceId
    transient: bool = Field(
        False,
        description="the accepted work failed in a way a retry may mend (as a 5xx would): "
        "the hub retries the task with backoff, or dead-letters it; needs a non-zero code",
    )

    @model_validator(mode="after")
    def _transient_is_a_failure(self) -> ResultReport:
        if self.transient and self.code == 0:
            raise ValueError("a transient report is a failure: give it a non-zero code")
        return self


class ProgressReport(WireModel):
    """``POST /v1/tasks/{id}/progress``: named like a result (see `ResultReport`).

    Any progress report tells the hub the accepted work goes on: its watchdog waits
    ``timeout_ms`` + grace again from now. A ``keepalive`` says only that (no event is
    recorded), for agents whose handlers run longer than any timeout."""

    progress: float | None = Field(None, ge=0, le=1)
    message: str = Field("", max_length=10_000)
    data: Any = None
    attempt_seq: AttemptSeq
    instance_id: InstanceId
    keepalive: bool = False

    @model_validator(mode="after")
    def _keepalive_is_empty(self) -> ProgressReport:
        if self.keepalive and (self.progress is not None or self.message or self.data is not None):
            raise ValueError("a keepalive carries no progress, message or data")
        return self


class BroadcastRequest(WireModel):
    """``POST /v1/broadcasts``: one request to every routable instance matching the filter."""

    tags: list[Tag] = Field(default_factory=list, max_length=64)
    capability: CapabilityType | None = None
    rules: dict[Annotated[str, Field(max_length=64)], MetadataValue] = Field(
        default_factory=dict, max_length=32
    )
    method: Method
    payload: dict[str, Any] = Field(default_factory=dict)
    min_results: int | None = Field(
        None, ge=1, le=DB_INT_MAX, strict=True, description="complete early with this many"
    )
    timeout_ms: int = Field(30_000, ge=1, le=3_600_000, strict=True)
    max_retry: int = Field(
        0, ge=0, le=10, strict=True, description="per target; a broadcast never waits long"
    )

    @model_validator(mode="after")
    def _has_filter(self) -> BroadcastRequest:
        if not (self.tags or self.capability):
            raise ValueError("a broadcast needs tags or a capability (never a blind broadcast)")
        return self
