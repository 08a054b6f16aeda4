"""Entry point for ``celery -A reach.worker.app``: the one place that builds globals.

Workers, beat and Flower import this module; domain code never does. Tasks reach the
hub's database through ``runtime()``.
"""

from __future__ import annotations

from functools import lru_cache

from reach.hub.context import HubContext
from reach.hub.settings import load_settings
from reach.worker.factory import create_celery

settings = load_settings()
app = create_celery(settings)


@lru_cache(maxsize=1)
def runtime() -> HubContext:
    """The worker's database context, built on first use (after fork, per child)."""
    return HubContext.from_settings(settings)
