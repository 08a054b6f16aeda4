"""Entry point for ``celery -A reach.worker.app``: the one place that builds globals.

Workers, beat and Flower import this module; domain code never does. Tasks reach the
hub's database through ``runtime()``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from celery import signals

from reach.hub.settings import load_settings
from reach.worker import exchanges, logs
from reach.worker.context import HubContext
from reach.worker.factory import create_celery
from reach.worker.slots import SlotReporter, slots_of

settings = load_settings()
app = create_celery(settings)
logs.install(app, settings, "worker")  # JSON lines when logging.format says so


@lru_cache(maxsize=1)
def runtime() -> HubContext:
    """The worker's database context, built on first use (after fork, per child)."""
    return HubContext.from_settings(settings)


_reporters: list[SlotReporter] = []


@signals.worker_ready.connect  # type: ignore[untyped-decorator]
def _report_slots(sender: Any = None, **_: Any) -> None:
    """The worker's places count toward the hub's (background's share: reach.hub.flow.priority):
    each of its processes keeps up to ``exchanges.max_in_flight`` exchanges in flight."""
    places = slots_of(sender) * settings.exchanges.max_in_flight
    reporter = SlotReporter(settings.storage.resolved_database_url, str(sender.hostname), places)
    reporter.start()
    _reporters.append(reporter)


@signals.worker_shutdown.connect  # type: ignore[untyped-decorator]
def _withdraw_slots(**_: Any) -> None:
    while _reporters:
        _reporters.pop().stop()


@signals.worker_process_shutdown.connect  # type: ignore[untyped-decorator]
def _drain_child(**_: Any) -> None:
    """A prefork child stopping: its exchanges get ``exchanges.drain_s`` to end, the rest
    are given back for delivery at once (``reach.worker.exchanges.drain``)."""
    exchanges.drain()


@signals.worker_shutdown.connect  # type: ignore[untyped-decorator]
def _drain_main(**_: Any) -> None:
    """The solo and threads pools deliver in the main process: drain it too."""
    exchanges.drain()
