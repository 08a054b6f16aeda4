"""What the hub asks of the workers' message broker, without knowing it is Celery.

The hub writes every piece of work to its database first (a delivery attempt in the
outbox, a DAG run's nodes, a broadcast's targets, a callback row, an approval); a
`Dispatcher` then hands it to the workers. A refusal loses nothing: the outbox relay, the
DAG sweep or the callback net publishes it again from the store.

`reach.worker.publisher.Publisher` implements it on Celery. The hub never imports Celery,
kombu or ``reach.worker`` (an import-linter contract): `reach.hub.context.HubContext` is
given a `DispatcherFactory` by whoever composes the process (`reach.worker.context`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from reach.core.orchestration.dags import Plan
from reach.hub.ledger.tasks import Publish
from reach.hub.settings import Settings


class Dispatcher(Protocol):
    """Sends the hub's work to the workers. The methods that answer a bool report a
    refusal (the caller leaves the work to a net); the others raise the broker's error."""

    @property
    def run_lifetime_s(self) -> float:
        """How long a started DAG run's canvas keeps its state on the broker's side: a
        run that may take longer is refused (it would never reach its next level)."""
        ...

    def publish(self, item: Publish) -> bool:
        """Queue one delivery attempt on its priority's queue; False if refused."""
        ...

    def start_run(self, run_id: str, plan: Plan, from_level: int = 0) -> None:
        """Start a DAG run's canvas (from ``from_level`` when resuming a stalled one)."""
        ...

    def fan_out(self, task_ids: list[str]) -> None:
        """Queue a broadcast's first attempts, every target at once."""
        ...

    def send_callback(self, callback_id: int, countdown: float | None = None) -> None:
        """Queue one callback POST (``reach.hub.notify.callbacks``), after ``countdown``."""
        ...

    def publish_webhook(self, approval_id: str) -> bool:
        """Queue one approval's webhook (``reach.hub.notify.approval_webhook``); False if
        refused."""
        ...

    def backlog(self) -> int | None:
        """Messages waiting in the delivery queues; None if the broker cannot say."""
        ...


DispatcherFactory = Callable[[Settings], Dispatcher]
"""Builds a process's dispatcher from the settings, on first use (after fork)."""
