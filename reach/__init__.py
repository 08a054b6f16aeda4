"""Agent-Reach: the reach layer between AI agents.

The public surface is what ``__all__`` lists; everything else is internal.
"""

from reach.agent import ACCEPTED, Agent
from reach.client import (
    Submission,
    TaskResult,
    get_task,
    report_progress,
    report_result,
    send,
    wait_for_result,
)
from reach.errors import (
    AgentTimeout,
    AgentUnreachable,
    Backpressure,
    BusinessError,
    ConfigError,
    DagError,
    DeadLettered,
    DeliveryError,
    HubUnavailable,
    InvalidRegistration,
    LoopbackAddress,
    LoopDetected,
    NoSuitableAgent,
    ReachError,
    RegistrationConflict,
    RegistryError,
    ResultTimeout,
    RoutingError,
    SecurityError,
    SessionClosed,
    TaskConflict,
    TaskError,
    UnknownAgent,
    UnknownInstance,
    UnknownTask,
)
from reach.schemas import Capability

__version__ = "0.1.0"

__all__ = [
    "ACCEPTED",
    "Agent",
    "AgentTimeout",
    "AgentUnreachable",
    "Backpressure",
    "BusinessError",
    "Capability",
    "ConfigError",
    "DagError",
    "DeadLettered",
    "DeliveryError",
    "HubUnavailable",
    "InvalidRegistration",
    "LoopDetected",
    "LoopbackAddress",
    "NoSuitableAgent",
    "ReachError",
    "RegistrationConflict",
    "RegistryError",
    "ResultTimeout",
    "RoutingError",
    "SecurityError",
    "SessionClosed",
    "Submission",
    "TaskConflict",
    "TaskError",
    "TaskResult",
    "UnknownAgent",
    "UnknownInstance",
    "UnknownTask",
    "__version__",
    "get_task",
    "report_progress",
    "report_result",
    "send",
    "wait_for_result",
]
