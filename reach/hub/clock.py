"""Time as an explicit dependency, so liveness decisions can be tested with a controlled clock.

The hub never trusts an agent's clock: every timestamp it stores comes from a ``Clock``.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    """The wall clock of the hub process."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to (tests, simulations)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def set(self, value: float) -> None:
        with self._lock:
            self._now = value
