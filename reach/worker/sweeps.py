"""Periodic sweeps live through a database outage: a tick that cannot reach the store is
skipped with one line in the log, and beat runs the sweep again on its next tick.

Raising into Celery instead would log a traceback per sweep per tick (dozens a second
during an outage) and mark a failure for what is only a missed tick.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from reach.errors import HubUnavailable

log = logging.getLogger("reach.worker.sweeps")

P = ParamSpec("P")
T = TypeVar("T")


def skip_when_unavailable(sweep: Callable[P, T]) -> Callable[P, T | None]:
    """Run ``sweep``; if the hub's database is unavailable, log it and return None."""

    @functools.wraps(sweep)
    def tick(*args: P.args, **kwargs: P.kwargs) -> T | None:
        try:
            return sweep(*args, **kwargs)
        except HubUnavailable as exc:
            log.warning("%s skipped this tick: %s", sweep.__name__, exc.detail)
            return None

    return tick
