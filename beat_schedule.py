"""Celery beat schedule of the hub: the periodic scans, each on its own cadence.

Beat stays single-active; every task here is safe to run twice (idempotent sweeps).
"""

from __future__ import annotations

from typing import Any

from reach.settings import Settings


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    return {
        "reach.sweep-liveness": {
            "task": "reach.sweep_liveness",
            "schedule": settings.heartbeat.sweep_interval,
            "options": {"expires": settings.heartbeat.sweep_interval * 2},
        },
    }
