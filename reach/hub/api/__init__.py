"""The hub's HTTP API: agent-facing ``/v1``, admin ``/api/v1``, health and metrics."""

from reach.hub.api.app import create_app
from reach.hub.context import HubContext

__all__ = ["HubContext", "create_app"]
