"""Celery beat schedule of the hub: the periodic scans, each on its own cadence.

The repository's top-level ``beat_schedule.py`` re-exports it (a fixed layout); the wheel
installs only ``reach``, so the hub's Celery app reads it from here.

Beat stays single-active; every task here is safe to run twice (idempotent sweeps).
Each entry expires after its own period, so a backlog never turns into a burst.
"""

from __future__ import annotations

from typing import Any

from reach.hub.settings import Settings

PROBE_QUEUE = "reach.probe"


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    sweep = settings.heartbeat.sweep_interval
    # The probe sweep runs at the fastest cadence; each instance's own next_probe_at
    # (5 s healthy, 1 s when its score is low, 30 s when unreachable) decides who is due.
    probe_tick = min(settings.probe.fast_interval, settings.probe.interval)
    entries: dict[str, dict[str, Any]] = {
        "reach.reachability-sweep": {
            "task": "reach.reachability_sweep",
            "schedule": sweep,
            "options": {"expires": sweep},
        },
        "reach.outbox-relay": {
            "task": "reach.outbox_relay",
            "schedule": 1.0,
            "options": {"expires": 1.0},
        },
        "reach.probe-sweep": {
            "task": "reach.probe_sweep",
            "schedule": probe_tick,
            "options": {"expires": probe_tick, "queue": PROBE_QUEUE},
        },
        # finished records past retention.days, long-offline instances (in short batches)
        "reach.retention-sweep": {
            "task": "reach.retention_sweep",
            "schedule": settings.retention.sweep_interval_s,
            "options": {"expires": settings.retention.sweep_interval_s},
        },
        # DAG runs whose chord died (messages lost with a worker or a broker): resumed or
        # failed with a stated reason, never left running
        "reach.dag-sweep": {
            "task": "reach.dag_sweep",
            "schedule": settings.dags.sweep_interval,
            "options": {"expires": settings.dags.sweep_interval},
        },
        # approvals nobody decided within approval.timeout_s: their tasks fail (expired)
        "reach.approvals-expire": {
            "task": "reach.approvals_expire",
            "schedule": settings.approval.sweep_interval_s,
            "options": {"expires": settings.approval.sweep_interval_s},
        },
        # every A2A agent's card read again: its heartbeat, and any change of its skills
        "reach.a2a-cards": {
            "task": "reach.a2a_cards",
            "schedule": settings.a2a.card_refresh_s,
            "options": {"expires": settings.a2a.card_refresh_s, "queue": PROBE_QUEUE},
        },
        # every MCP server's tool list read again: its heartbeat, and any change of its tools
        "reach.mcp-tools": {
            "task": "reach.mcp_tools",
            "schedule": settings.mcp_agents.refresh_s,
            "options": {"expires": settings.mcp_agents.refresh_s, "queue": PROBE_QUEUE},
        },
        # A2A tasks still working after their attempt: GetTask until they end
        "reach.a2a-follow": {
            "task": "reach.a2a_follow",
            "schedule": settings.a2a.poll_interval_s,
            "options": {"expires": settings.a2a.poll_interval_s},
        },
        # callbacks due but not taken (a lost publish): re-published
        "reach.callbacks-sweep": {
            "task": "reach.callbacks_sweep",
            "schedule": settings.callbacks.sweep_interval_s,
            "options": {"expires": settings.callbacks.sweep_interval_s},
        },
    }
    if settings.alerts.webhook_url:  # new alerts POSTed to it (no tick while it is unset)
        entries["reach.alerts-push"] = {
            "task": "reach.alerts_push",
            "schedule": settings.alerts.push_interval_s,
            "options": {"expires": settings.alerts.push_interval_s},
        }
    return entries
