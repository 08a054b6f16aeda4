"""The agent-side dedup guard: a redelivered task gets the stored answer, not a second run.

At-least-once delivery means an agent can see the same ``task_id`` twice (a retry after a
lost answer, a redelivery after a worker crash). ``task_id`` is the dedup key — it stays
the same across attempts; ``attempt_seq`` is only the hub's fencing token.

The memory is bounded three ways (an agent runs for months): at most ``capacity``
answers, at most ``max_bytes`` of them in total (measured as their JSON), and none older
than ``ttl`` seconds — the hub's retries and redeliveries of one task are over within
minutes, so a day covers them with room to spare. Least recently used answers go first.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

log = logging.getLogger("reach.sdk.dedup")

DEFAULT_CAPACITY = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TTL_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Begin:
    """What to do with an arriving task: run it, answer from memory, or it is running now."""

    action: str  # "run" | "done" | "running"
    answer: Any = None
    running: threading.Event | None = None


def answer_size(answer: Any) -> int:
    """Bytes an answer weighs in the guard: its JSON, as the agent sends it."""
    return max(1, len(json.dumps(answer, default=str, separators=(",", ":")).encode()))


class IdempotencyGuard:
    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl: float = DEFAULT_TTL_S,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1 or max_bytes < 1 or ttl <= 0:
            raise ValueError("dedup capacity, max_bytes and ttl must be positive")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._done: TTLCache[str, Any] = TTLCache(
            maxsize=max_bytes, ttl=ttl, timer=timer, getsizeof=answer_size
        )
        self._running: dict[str, threading.Event] = {}

    def begin(self, task_id: str) -> Begin:
        with self._lock:
            if task_id in self._done:
                return Begin("done", self._done[task_id])  # a read refreshes its LRU place
            if task_id in self._running:
                return Begin("running", running=self._running[task_id])
            self._running[task_id] = threading.Event()
            return Begin("run")

    def finish(self, task_id: str, answer: Any, remember: bool) -> None:
        """End a run; remember the answer only if it is final (not a transient failure)."""
        with self._lock:
            event = self._running.pop(task_id, None)
            if remember:
                self._remember(task_id, answer)
        if event is not None:
            event.set()

    def _remember(self, task_id: str, answer: Any) -> None:
        self._done.pop(task_id, None)  # re-inserted as the most recent
        try:
            self._done[task_id] = answer  # evicts the least recent past max_bytes
        except ValueError:  # alone larger than max_bytes: a redelivery runs it again
            log.warning(
                "answer of task %s (%d bytes) exceeds the dedup guard's %d bytes: not kept",
                task_id,
                answer_size(answer),
                self.max_bytes,
            )
            return
        while len(self._done) > self.capacity:
            self._done.popitem()

    def answer_of(self, task_id: str) -> Any:
        with self._lock:
            return self._done.get(task_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._done)

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return int(self._done.currsize)
