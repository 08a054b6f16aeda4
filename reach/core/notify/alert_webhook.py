"""The alert webhook's body (``reach.hub.ops.alert_webhook`` sends it): one alert as
``GET /api/v1/alerts`` lists it, and an ``alert_id`` a receiver may dedupe on (delivery
is at least once)."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["EVENT", "alert_body", "alert_id"]

EVENT: Final = "alert"


def alert_id(alert: dict[str, Any]) -> str:
    """The alert's stable name: its source table and that row's id."""
    return f"{alert['source']}:{alert['source_id']}"


def alert_body(alert: dict[str, Any]) -> dict[str, Any]:
    """The JSON a receiver gets for one alert (`reach.hub.ops.alerts` item)."""
    return {
        "event": EVENT,
        "alert_id": alert_id(alert),
        "kind": alert["kind"],
        "at": alert["at"],
        "agent_id": alert["agent_id"],
        "instance_id": alert["instance_id"],
        "summary": alert["summary"],
        "details": alert["details"],
        "source": alert["source"],
        "source_id": alert["source_id"],
    }
