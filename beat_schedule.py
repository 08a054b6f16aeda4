"""The hub's Celery beat schedule, where the repository's layout keeps it.

The wheel installs only ``reach``: the schedule itself is `reach.worker.schedule`, which
the hub's Celery app reads; this module re-exports it for whoever looks for it here.
"""

from reach.worker.schedule import PROBE_QUEUE, beat_schedule

__all__ = ["PROBE_QUEUE", "beat_schedule"]
