"""The hub's HTTP API: agent-facing ``/v1``, admin ``/api/v1``, health and metrics."""

from reach.api.app import HubContext, create_app

__all__ = ["HubContext", "create_app"]
