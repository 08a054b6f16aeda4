"""The agent-side dedup guard: a redelivered task gets the stored answer, not a second run.

At-least-once delivery means an agent can see the same ``task_id`` twice (a retry after a
lost answer, a redelivery after a worker crash). ``task_id`` is the dedup key — it stays
the same across attempts; ``attempt_seq`` is only the hub's fencing token.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Begin:
    """What to do with an arriving task: run it, answer from memory, or it is running now."""

    action: str  # "run" | "done" | "running"
    answer: Any = None
    running: threading.Event | None = None


class IdempotencyGuard:
    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._done: OrderedDict[str, Any] = OrderedDict()
        self._running: dict[str, threading.Event] = {}

    def begin(self, task_id: str) -> Begin:
        with self._lock:
            if task_id in self._done:
                self._done.move_to_end(task_id)
                return Begin("done", self._done[task_id])
            if task_id in self._running:
                return Begin("running", running=self._running[task_id])
            self._running[task_id] = threading.Event()
            return Begin("run")

    def finish(self, task_id: str, answer: Any, remember: bool) -> None:
        """End a run; remember the answer only if it is final (not a transient failure)."""
        with self._lock:
            event = self._running.pop(task_id, None)
            if remember:
                self._done[task_id] = answer
                self._done.move_to_end(task_id)
                while len(self._done) > self.capacity:
                    self._done.popitem(last=False)
        if event is not None:
            event.set()

    def answer_of(self, task_id: str) -> Any:
        with self._lock:
            return self._done.get(task_id)
