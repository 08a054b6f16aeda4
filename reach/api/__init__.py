"""The hub's HTTP API: agent-facing ``/v1``, admin ``/api/v1``, health and metrics."""

from reach.api.app import create_app
from reach.context import HubContext

__all__ = ["HubContext", "create_app"]
