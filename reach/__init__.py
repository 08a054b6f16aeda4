"""Agent-Reach: the reach layer between AI agents.

The public surface is what ``__all__`` lists; everything else is internal.
"""

from typing import TYPE_CHECKING, Any

from reach.errors import (
    AddressRefused,
    AgentTimeout,
    AgentUnreachable,
    ApprovalExpired,
    ApprovalRejected,
    Backpressure,
    BlobTaken,
    BusinessError,
    CallbackRefused,
    CircuitOpen,
    ConfigError,
    DagError,
    DeadLettered,
    DeliveryError,
    Forbidden,
    HubOverloaded,
    HubUnavailable,
    IllegalTransition,
    InvalidBlobLink,
    InvalidPayload,
    InvalidReachToken,
    InvalidRegistration,
    InvalidSignature,
    InvalidTaskRequest,
    LoopbackAddress,
    LoopDetected,
    NoSuitableAgent,
    ProtocolError,
    ReachError,
    RegistrationConflict,
    RegistryError,
    RegistryLimit,
    ResultTimeout,
    RoutingError,
    SecurityError,
    SemanticMatchingOff,
    SessionClosed,
    StaleReport,
    TaskConflict,
    TaskError,
    TooManyAuthFailures,
    Unauthenticated,
    UnknownAgent,
    UnknownBlob,
    UnknownInstance,
    UnknownSession,
    UnknownTask,
)

# The SDK's members load on first use (PEP 562): a process that imports only
# ``reach.errors`` or a CLI command that never builds an agent does not pay for pydantic
# models, JSON Schema, JWT and HTTP clients at start-up.
_LAZY = {
    "Capability": "reach.wire.schemas",
    "ACCEPTED": "reach.sdk.running",
    "Agent": "reach.sdk.agent",
    "verify_callback": "reach.sdk.callbacks",
    "BroadcastResult": "reach.sdk.caller",
    "Match": "reach.sdk.caller",
    "Submission": "reach.sdk.caller",
    "TaskResult": "reach.sdk.caller",
    "broadcast": "reach.sdk.caller",
    "find": "reach.sdk.caller",
    "get_task": "reach.sdk.caller",
    "report_progress": "reach.sdk.caller",
    "report_result": "reach.sdk.caller",
    "send": "reach.sdk.caller",
    "wait_for_result": "reach.sdk.caller",
    "close_session": "reach.sdk.sessions",
    "get_session": "reach.sdk.sessions",
    "open_session": "reach.sdk.sessions",
    "session_alive": "reach.sdk.sessions",
    "StreamEvent": "reach.sdk.stream",
    "stream": "reach.sdk.stream",
    "TLSConfig": "reach.sdk.tls",
    "payload_blob": "reach.sdk.blobs",
    "payload_blob_ref": "reach.sdk.blobs",
    "put_blob": "reach.sdk.blobs",
    "verify_webhook": "reach.sdk.webhooks",
}

# Submodules that are part of the surface, loaded the same way: ``reach.aio`` brings
# aiohttp, which a synchronous caller never needs.
_LAZY_MODULES = frozenset({"aio"})

if TYPE_CHECKING:
    from reach import aio
    from reach.sdk.agent import Agent
    from reach.sdk.blobs import payload_blob, payload_blob_ref, put_blob
    from reach.sdk.callbacks import verify_callback
    from reach.sdk.caller import (
        BroadcastResult,
        Match,
        Submission,
        TaskResult,
        broadcast,
        find,
        get_task,
        report_progress,
        report_result,
        send,
        wait_for_result,
    )
    from reach.sdk.running import ACCEPTED
    from reach.sdk.sessions import close_session, get_session, open_session, session_alive
    from reach.sdk.stream import StreamEvent, stream
    from reach.sdk.tls import TLSConfig
    from reach.sdk.webhooks import verify_webhook
    from reach.wire.schemas import Capability


def __getattr__(name: str) -> Any:
    from importlib import import_module

    if name in _LAZY_MODULES:
        return import_module(f"reach.{name}")  # importing binds it here as an attribute
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reach' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _LAZY_MODULES)


__version__ = "0.1.0"

__all__ = [
    "ACCEPTED",
    "AddressRefused",
    "Agent",
    "AgentTimeout",
    "AgentUnreachable",
    "ApprovalExpired",
    "ApprovalRejected",
    "Backpressure",
    "BlobTaken",
    "BroadcastResult",
    "BusinessError",
    "CallbackRefused",
    "Capability",
    "CircuitOpen",
    "ConfigError",
    "DagError",
    "DeadLettered",
    "DeliveryError",
    "Forbidden",
    "HubOverloaded",
    "HubUnavailable",
    "IllegalTransition",
    "InvalidBlobLink",
    "InvalidPayload",
    "InvalidReachToken",
    "InvalidRegistration",
    "InvalidSignature",
    "InvalidTaskRequest",
    "LoopDetected",
    "LoopbackAddress",
    "Match",
    "NoSuitableAgent",
    "ProtocolError",
    "ReachError",
    "RegistrationConflict",
    "RegistryError",
    "RegistryLimit",
    "ResultTimeout",
    "RoutingError",
    "SecurityError",
    "SemanticMatchingOff",
    "SessionClosed",
    "StaleReport",
    "StreamEvent",
    "Submission",
    "TLSConfig",
    "TaskConflict",
    "TaskError",
    "TaskResult",
    "TooManyAuthFailures",
    "Unauthenticated",
    "UnknownAgent",
    "UnknownBlob",
    "UnknownInstance",
    "UnknownSession",
    "UnknownTask",
    "__version__",
    "aio",
    "broadcast",
    "close_session",
    "find",
    "get_session",
    "get_task",
    "open_session",
    "payload_blob",
    "payload_blob_ref",
    "put_blob",
    "report_progress",
    "report_result",
    "send",
    "session_alive",
    "stream",
    "verify_callback",
    "verify_webhook",
    "wait_for_result",
]
