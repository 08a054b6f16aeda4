"""One exception tree for the whole project, so callers catch by meaning.

    ReachError
    ├── ConfigError                 bad setting at start-up (names the key)
    ├── RegistryError
    │   ├── InvalidRegistration     body or capability declaration rejected
    │   ├── LoopbackAddress         a loopback endpoint the hub will not call
    │   ├── AddressRefused          an address outside the networks the hub calls
    │   ├── RegistrationConflict    same agent/instance declared differently
    │   ├── RegistryLimit           past a bound on what one agent or one key may register
    │   ├── UnknownInstance         heartbeat/deregister for an instance we never saw
    │   ├── InvalidAgentCard        an A2A agent card that is not one the hub can reach
    │   ├── AgentCardUnavailable    an A2A agent card that could not be fetched
    │   ├── InvalidMcpServer        an MCP server whose tools the hub cannot take
    │   └── McpServerUnavailable    an MCP server that did not answer initialize or tools/list
    ├── RoutingError
    │   ├── NoSuitableAgent         nothing matches (an intent: nothing at the threshold)
    │   ├── CircuitOpen             every matching instance's circuit breaker is open
    │   └── SemanticMatchingOff     an intent, but this hub has no embedding model
    ├── DeliveryError
    │   ├── AgentUnreachable
    │   ├── AgentTimeout
    │   ├── Backpressure
    │   ├── BusinessError
    │   └── DeadLettered            retries exhausted; the task waits in the dead-letter queue
    ├── TaskError
    │   ├── InvalidTaskRequest      a task, broadcast or report body is malformed
    │   ├── InvalidPayload          the payload fails the capability's params_schema
    │   ├── UnknownTask
    │   ├── CallbackRefused         a callback URL that is invalid or private (the rule named)
    │   ├── BadLastEventId          a stream resumed from an id it never sent
    │   ├── TaskConflict            a task_id reused for a different task
    │   │   └── IllegalTransition   the task's status does not allow this move
    │   ├── StaleReport             a report for an attempt or instance the task no longer waits on
    │   └── ResultTimeout           no terminal result within the caller's wait
    ├── HubUnavailable              the hub (or its database) could not be reached
    │   ├── HubOverloaded           memory admission: new submits wait (Retry-After)
    │   └── ProtocolError           the hub answered 2xx without the JSON it promises
    ├── DagError
    ├── SecurityError
    │   ├── Unauthenticated         no valid credential (missing, unknown, expired, revoked)
    │   ├── Forbidden               a valid credential outside its scope, agent or allow-list
    │   ├── InvalidReachToken       a delivery's token is forged, expired, replayed or not ours
    │   ├── InvalidSignature        a hub-signed webhook's signature does not verify
    │   └── TooManyAuthFailures     this address failed to authenticate too often (Retry-After)
    ├── UnknownKey                  no API key with this id (listing, revoking)
    ├── ApprovalError               a human decision on a parked task (issue 13)
    │   ├── UnknownApproval         no approval with this id
    │   ├── ApprovalDecided         already approved/rejected/cancelled (also: the race lost)
    │   ├── ApprovalExpired         its time ran out: the task failed, nobody may decide it
    │   ├── ApprovalRejected        a human rejected the task (the caller's side: who, why)
    │   ├── SelfApproval            the requester may not decide its own request
    │   ├── ReasonRequired          a rejection without a reason
    │   └── PayloadChanged          the task's payload no longer matches what was requested
    ├── LoopDetected                a reach would repeat an agent of its path, or exceed max_hops
    ├── UnknownSession              no session with this id
    ├── BlobError                   a payload blob (``PUT /v1/blobs``, a task's ``payload_ref``)
    │   ├── UnknownBlob             no blob with this id (or one of another caller's)
    │   ├── BlobTaken               the blob already belongs to another task
    │   └── InvalidBlobLink         a blob link whose signature is forged or whose time is up
    ├── SessionClosed               the reach's session is closed: refused or cancelled
    └── InvalidQuery                a listing's filter, time range or limit is not valid
        └── BadCursor               a page cursor that is garbage, tampered or of another list

Every class carries a stable problem ``slug``; the API turns it into the
``type`` of an ``application/problem+json`` answer and the SDK turns such an
answer back into the same class, so the error a caller catches does not
depend on which side noticed the problem.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

PROBLEM_TYPE_PREFIX = "urn:agent-reach:problem:"


class ReachError(Exception):
    """Base of every error Agent-Reach raises on purpose."""

    slug: ClassVar[str] = "reach-error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Agent-Reach error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    @classmethod
    def problem_type(cls) -> str:
        return PROBLEM_TYPE_PREFIX + cls.slug

    def to_problem(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": self.problem_type(),
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        body.update(self.extra)
        return body

    def headers(self) -> dict[str, str]:
        """HTTP headers the problem answer carries besides its body."""
        return {}


def _retry_after(seconds: object) -> dict[str, str]:
    """A ``Retry-After`` header in whole seconds (at least 1), or none for a non-number."""
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        return {"Retry-After": str(max(1, math.ceil(seconds)))}
    return {}


class ConfigError(ReachError):
    """A setting is missing or invalid; the message names the key."""

    slug = "config-error"
    title = "Invalid configuration"


class RegistryError(ReachError):
    """The registry refused a request."""

    slug = "registry-error"
    status = 400
    title = "Registry error"


class InvalidRegistration(RegistryError):
    """A registration, heartbeat or capability declaration is malformed."""

    slug = "invalid-request"
    status = 422
    title = "Invalid request"


class LoopbackAddress(RegistryError):
    """A loopback address without the agent's opt-in, or on a hub that calls none."""

    slug = "loopback-address"
    status = 422
    title = "Loopback address refused"


class AddressRefused(RegistryError):
    """An address that resolves where the hub never calls (or does not resolve at all)."""

    slug = "address-refused"
    status = 422
    title = "Address refused"


class RegistrationConflict(RegistryError):
    """The agent or instance is already registered with different data."""

    slug = "registration-conflict"
    status = 409
    title = "Registration conflict"


class RegistryLimit(RegistryError):
    """A registration past a bound on what one agent or one key may hold (``registry.*``)."""

    slug = "registry-limit"
    status = 409
    title = "Registry limit reached"


class UnknownInstance(RegistryError):
    """The instance named is not registered (or was deregistered)."""

    slug = "unknown-instance"
    status = 404
    title = "Unknown instance"


class InvalidAgentCard(RegistryError):
    """An A2A agent card is malformed, or declares nothing the hub can reach it by."""

    slug = "invalid-agent-card"
    status = 422
    title = "Invalid agent card"


class AgentCardUnavailable(RegistryError):
    """An A2A agent card could not be fetched (refused, timed out, not JSON, not 200)."""

    slug = "agent-card-unavailable"
    status = 502
    title = "Agent card unavailable"


class InvalidMcpServer(RegistryError):
    """An MCP server lists no tool the hub can declare as a capability."""

    slug = "invalid-mcp-server"
    status = 422
    title = "Invalid MCP server"


class McpServerUnavailable(RegistryError):
    """An MCP server did not answer ``initialize`` or ``tools/list`` (refused, timed out)."""

    slug = "mcp-server-unavailable"
    status = 502
    title = "MCP server unavailable"


class UnknownAgent(RegistryError):
    """No agent with this ID is registered."""

    slug = "unknown-agent"
    status = 404
    title = "Unknown agent"


class RoutingError(ReachError):
    """No route could be chosen for a task."""

    slug = "routing-error"
    status = 422
    title = "Routing error"


class NoSuitableAgent(RoutingError):
    """No registered, routable instance matches the filter."""

    slug = "no-suitable-agent"
    status = 404
    title = "No suitable agent"


class SemanticMatchingOff(RoutingError):
    """An intent was given, but this hub has no embedding model (``reason`` says why)."""

    slug = "semantic-matching-off"
    status = 501
    title = "Semantic matching is off"


class CircuitOpen(RoutingError):
    """Every matching instance's circuit breaker is open; fail fast instead of queueing."""

    slug = "circuit-open"
    status = 503
    title = "Circuit open"

    def headers(self) -> dict[str, str]:
        return _retry_after(self.extra.get("retry_after"))


class DeliveryError(ReachError):
    """A task could not be delivered or completed."""

    slug = "delivery-error"
    status = 502
    title = "Delivery error"


class AgentUnreachable(DeliveryError):
    """The agent refused the connection or could not be reached."""

    slug = "agent-unreachable"
    title = "Agent unreachable"


class AgentTimeout(DeliveryError):
    """The agent did not answer in time."""

    slug = "agent-timeout"
    status = 504
    title = "Agent timeout"


class Backpressure(DeliveryError):
    """The target is full (extra: depth, limit, retry_after_ms); never a failure nor retried."""

    slug = "backpressure"
    status = 429
    title = "Backpressure"

    def headers(self) -> dict[str, str]:
        ms = self.extra.get("retry_after_ms")
        return _retry_after(ms / 1000 if isinstance(ms, int | float) else None)


class BusinessError(DeliveryError):
    """The agent answered with a non-zero business code; never retried blindly."""

    slug = "business-error"
    status = 422
    title = "Business error"

    def __init__(self, code: int, message: str = "", **extra: Any) -> None:
        super().__init__(message or f"business error {code}", code=code, **extra)
        self.code = code
        self.message = message


class DeadLettered(DeliveryError):
    """Delivery exhausted its retries; an operator can replay it from the dead-letter queue."""

    slug = "dead-lettered"
    status = 502
    title = "Dead-lettered"


class TaskError(ReachError):
    """A task request was refused."""

    slug = "task-error"
    status = 400
    title = "Task error"


class InvalidTaskRequest(TaskError):
    """A task, broadcast, result or progress request fails validation (the field is named)."""

    slug = "invalid-task-request"
    status = 422
    title = "Invalid task request"


class InvalidPayload(TaskError):
    """The payload does not satisfy the capability's params_schema."""

    slug = "invalid-payload"
    status = 422
    title = "Invalid payload"


class UnknownTask(TaskError):
    """No task with this ID exists."""

    slug = "unknown-task"
    status = 404
    title = "Unknown task"


class CallbackRefused(TaskError):
    """A ``callback_url`` the hub will not POST to (invalid, or private): ``rule`` says why."""

    slug = "callback-refused"
    status = 422
    title = "Callback URL refused"


class BadLastEventId(TaskError):
    """A stream's ``Last-Event-ID`` is garbage, negative, or newer than anything it sent."""

    slug = "bad-last-event-id"
    status = 400
    title = "Bad Last-Event-ID"


class TaskConflict(TaskError):
    """The task_id is already used by a task with different content."""

    slug = "task-conflict"
    status = 409
    title = "Task conflict"


class IllegalTransition(TaskConflict):
    """The task's current status does not allow this move in its lifecycle."""

    slug = "illegal-transition"
    status = 409
    title = "Illegal task transition"


class StaleReport(TaskError):
    """A result or progress report names an attempt or instance the task is not waiting on."""

    slug = "stale-report"
    status = 409
    title = "Stale or foreign report"


class ResultTimeout(TaskError):
    """The task reached no terminal state within the wait; it may still complete."""

    slug = "result-timeout"
    status = 408
    title = "Result timeout"


class HubUnavailable(ReachError):
    """The hub, or the hub's database, could not be reached (refused, timeout, 5xx)."""

    slug = "hub-unavailable"
    status = 503
    title = "Hub unavailable"

    def headers(self) -> dict[str, str]:
        """Say when to try again (``retry_after`` s, else 1): a database outage is usually
        short, and a caller resubmitting the same task_id gets the same task."""
        return _retry_after(self.extra.get("retry_after", 1))


class HubOverloaded(HubUnavailable):
    """The hub refuses new work for a moment (memory admission); ``Retry-After`` says when."""

    slug = "overloaded"
    status = 503
    title = "Hub overloaded"

    def headers(self) -> dict[str, str]:
        return _retry_after(self.extra.get("retry_after"))


class ProtocolError(HubUnavailable):
    """The hub answered with a success status but not the JSON object the API promises."""

    slug = "protocol-error"
    status = 502
    title = "Protocol error"


class DagError(ReachError):
    """A DAG definition or run is invalid."""

    slug = "dag-error"
    status = 422
    title = "DAG error"


class SecurityError(ReachError):
    """Authentication or authorisation failed."""

    slug = "security-error"
    status = 403
    title = "Forbidden"


class Unauthenticated(SecurityError):
    """No valid credential: missing, malformed, unknown, expired or revoked."""

    slug = "unauthenticated"
    status = 401
    title = "Unauthenticated"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="agent-reach"'}


class Forbidden(SecurityError):
    """A valid credential asked for something outside its scope, agent or allow-list."""

    slug = "forbidden"
    status = 403
    title = "Forbidden"


class InvalidReachToken(SecurityError):
    """A delivery's reach token is forged, expired, replayed or meant for someone else."""

    slug = "invalid-reach-token"
    status = 401
    title = "Invalid reach token"


class InvalidSignature(SecurityError):
    """A hub-signed webhook's signature is missing, malformed, forged or by an unknown key."""

    slug = "invalid-signature"
    status = 401
    title = "Invalid signature"


class TooManyAuthFailures(SecurityError):
    """This address failed to authenticate too often: no key it sends is checked for a while."""

    slug = "too-many-auth-failures"
    status = 429
    title = "Too many failed authentications"

    def headers(self) -> dict[str, str]:
        return _retry_after(self.extra.get("retry_after"))


class UnknownKey(ReachError):
    """No API key with this id exists (an operator listing or revoking keys)."""

    slug = "unknown-key"
    status = 404
    title = "Unknown API key"


class ApprovalError(ReachError):
    """A decision on an approval was refused, or the task it gated did not run."""

    slug = "approval-error"
    status = 409
    title = "Approval error"


class UnknownApproval(ApprovalError):
    """No approval with this id (or none this principal may see)."""

    slug = "unknown-approval"
    status = 404
    title = "Unknown approval"


class ApprovalDecided(ApprovalError):
    """The approval was already decided; of two concurrent decisions exactly one wins."""

    slug = "approval-decided"
    status = 409
    title = "Approval already decided"


class ApprovalExpired(ApprovalError):
    """Nobody decided in time (the SDK raises it too, for ``approval_expired``)."""

    slug = "approval-expired"
    status = 410
    title = "Approval expired"


class ApprovalRejected(ApprovalError):
    """A human rejected the task: ``decided_by`` and ``reason`` say who and why."""

    slug = "approval-rejected"
    status = 403
    title = "Approval rejected"


class SelfApproval(ApprovalError):
    """``approval.forbid_self_approval``: the identity that submitted may not decide."""

    slug = "self-approval"
    status = 403
    title = "Self-approval forbidden"


class ReasonRequired(ApprovalError):
    """A rejection must say why: the caller is told the reason."""

    slug = "reason-required"
    status = 422
    title = "Reason required"


class PayloadChanged(ApprovalError):
    """The task's stored payload no longer hashes to what was put up for approval."""

    slug = "payload-changed"
    status = 409
    title = "Payload changed since the request"


class LoopDetected(ReachError):
    """A reach closes an agent cycle (A -> B -> A) or exceeds ``router.max_hops``: ``cycle``."""

    slug = "loop-detected"
    status = 508
    title = "Dependency loop detected"


class SessionClosed(ReachError):
    """The reach's session is closed or expired: refused or cancelled (extra: session_id)."""

    slug = "session-closed"
    status = 410
    title = "Session closed"


class UnknownSession(ReachError):
    """No session with this id (or one the key may not see)."""

    slug = "unknown-session"
    status = 404
    title = "Unknown session"


class BlobError(ReachError):
    """A payload blob cannot be stored, read or referenced as asked."""

    slug = "blob-error"
    status = 400
    title = "Blob error"


class UnknownBlob(BlobError):
    """No blob with this id (one of another caller's looks the same)."""

    slug = "unknown-blob"
    status = 404
    title = "Unknown blob"


class BlobTaken(BlobError):
    """The blob is already the payload of another task (a blob goes with one task)."""

    slug = "blob-taken"
    status = 409
    title = "Blob taken"


class InvalidBlobLink(BlobError):
    """A blob link whose signature does not verify, or whose time is up."""

    slug = "invalid-blob-link"
    status = 403
    title = "Invalid blob link"


class RequestTooLarge(ReachError):
    """The request body exceeds the configured limit."""

    slug = "payload-too-large"
    status = 413
    title = "Payload too large"


class HeadersTooLarge(ReachError):
    """The request line and headers exceed the server's size or count limit."""

    slug = "headers-too-large"
    status = 431
    title = "Request header fields too large"


class MalformedRequest(ReachError):
    """The request body is not valid JSON or not of the expected shape."""

    slug = "malformed-request"
    status = 400
    title = "Malformed request"


class InvalidQuery(ReachError):
    """A listing's filter, time range or limit is not valid (the parameter named)."""

    slug = "invalid-query"
    status = 422
    title = "Invalid query"


class BadCursor(InvalidQuery):
    """A page cursor that is garbage, was tampered with, or belongs to another listing."""

    slug = "bad-cursor"
    status = 400
    title = "Bad cursor"


def _all_subclasses(cls: type[ReachError]) -> list[type[ReachError]]:
    found: list[type[ReachError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_all_subclasses(sub))
    return found


def error_for_problem(problem: dict[str, Any], fallback_status: int) -> ReachError:
    """Rebuild the typed error from a problem document (the SDK side of the edge)."""
    ptype = str(problem.get("type", ""))
    detail = str(problem.get("detail") or problem.get("title") or f"HTTP {fallback_status}")
    extra = {k: v for k, v in problem.items() if k not in {"type", "title", "status", "detail"}}
    candidates: list[type[ReachError]] = [ReachError, *_all_subclasses(ReachError)]
    for cls in candidates:
        if cls.problem_type() == ptype:
            if cls is BusinessError:
                raw = extra.pop("code", 1)
                try:
                    code = int(raw)
                except (TypeError, ValueError):
                    code, extra["raw_code"] = 1, raw
                return BusinessError(code, detail, **extra)
            return cls(detail, **extra)
    if fallback_status >= 500:
        return HubUnavailable(detail, status=fallback_status)
    return ReachError(detail, status=fallback_status, **extra)
