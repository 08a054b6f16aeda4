"""Agent-Reach: the reach layer between AI agents.

The public surface is what ``__all__`` lists; everything else is internal.
"""

from reach.agent import Agent
from reach.errors import (
    AgentTimeout,
    AgentUnreachable,
    Backpressure,
    BusinessError,
    ConfigError,
    DagError,
    DeliveryError,
    HubUnavailable,
    InvalidRegistration,
    LoopbackAddress,
    LoopDetected,
    NoSuitableAgent,
    ReachError,
    RegistrationConflict,
    RegistryError,
    RoutingError,
    SecurityError,
    SessionClosed,
    UnknownAgent,
    UnknownInstance,
)
from reach.schemas import Capability

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentTimeout",
    "AgentUnreachable",
    "Backpressure",
    "BusinessError",
    "Capability",
    "ConfigError",
    "DagError",
    "DeliveryError",
    "HubUnavailable",
    "InvalidRegistration",
    "LoopDetected",
    "LoopbackAddress",
    "NoSuitableAgent",
    "ReachError",
    "RegistrationConflict",
    "RegistryError",
    "RoutingError",
    "SecurityError",
    "SessionClosed",
    "UnknownAgent",
    "UnknownInstance",
    "__version__",
]
