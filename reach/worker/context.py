"""The hub's context as its processes build it: `reach.hub.context.HubContext` with the
Celery dispatcher (`reach.worker.publisher.Publisher`).

The hub cannot name Celery (an import contract), so the composition happens here, above
both: the API (`reach api`), the worker (`reach.worker.app.runtime`), the bench and the
tests build this class, and the hub's code takes any `reach.hub.context.HubContext`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

from reach.hub import context
from reach.hub.clock import Clock
from reach.hub.dispatch import DispatcherFactory
from reach.hub.settings import Settings
from reach.worker.publisher import Publisher


@dataclass
class HubContext(context.HubContext):
    """`reach.hub.context.HubContext` whose dispatcher is, unless told otherwise, a
    `Publisher` on a Celery app of its own."""

    dispatcher_factory: DispatcherFactory = field(default=Publisher.from_settings, kw_only=True)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        clock: Clock | None = None,
        *,
        dispatcher_factory: DispatcherFactory = Publisher.from_settings,
    ) -> Self:
        return super().from_settings(settings, clock, dispatcher_factory=dispatcher_factory)
