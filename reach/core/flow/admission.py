"""Admission at submit, as pure decisions: no I/O, no clock reads.

Three reasons a hub refuses a new task before writing anything of it (issue 14):

* **Backpressure** (429): the target agent already holds ``limit`` tasks that are pending
  or in flight (``pending``, ``dispatching``, ``executing``). A task parked for a human
  decision (``awaiting_approval``) is not counted: it holds no worker slot and no agent
  capacity until it is approved. The limit is the admin's override, else what the agent
  declared at registration, else ``router.max_queue`` (`effective_limit`). A task routed by
  tags or capability is refused only when *every* eligible agent is full (`verdict`).
* **Payload cap** (413): a payload whose compact JSON exceeds ``router.max_payload_bytes``;
  large data travels by reference (a URL or an object key), not through the hub.
* **Memory admission** (503): the API process is above ``server.memory_admission_ratio``
  of its memory limit (`overloaded`).

A refusal says when to come back (`retry_after_ms`): the tasks that must drain before
there is room, at the agent's recent completion rate, bounded so a caller neither spins
nor is sent away for minutes on a guess.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "MAX_RETRY_MS",
    "MEMORY_RETRY_AFTER_S",
    "MIN_RETRY_MS",
    "RATE_WINDOW_S",
    "UNKNOWN_RATE_RETRY_MS",
    "Queue",
    "effective_limit",
    "overloaded",
    "payload_refusal",
    "retry_after_ms",
    "verdict",
]

MIN_RETRY_MS = 100
"""Never ask a caller to come back sooner: one slot frees in less, but polling faster is a storm."""
MAX_RETRY_MS = 60_000
"""Never send a caller away longer on an estimate: rates change; it may ask again."""
UNKNOWN_RATE_RETRY_MS = 1_000
"""No completion seen in the window (a new or stalled agent): ask again in a second."""
RATE_WINDOW_S = 30.0
"""The completions counted for an agent's drain rate."""
MEMORY_RETRY_AFTER_S = 2
"""An overloaded API process frees memory in seconds (requests end, the GC runs)."""


@dataclass(frozen=True, slots=True)
class Queue:
    """One agent's queue as the submit transaction counted it.

    ``completed`` (tasks that finished within ``RATE_WINDOW_S``) is read only when the
    queue is full, to say how long to wait."""

    agent_id: str
    depth: int
    limit: int
    completed: int = 0

    @property
    def full(self) -> bool:
        return self.depth >= self.limit


def effective_limit(override: int | None, declared: int | None, default: int) -> int:
    """The admin's override wins, then the agent's declaration, then ``router.max_queue``."""
    if override is not None:
        return override
    if declared is not None:
        return declared
    return default


def retry_after_ms(queue: Queue, window_s: float = RATE_WINDOW_S) -> int:
    """When a slot should be free: the tasks beyond the limit plus one, at the agent's
    completion rate over the window; bounded to [MIN_RETRY_MS, MAX_RETRY_MS]."""
    if queue.completed <= 0 or window_s <= 0:
        return UNKNOWN_RATE_RETRY_MS
    must_drain = max(1, queue.depth - queue.limit + 1)
    per_s = queue.completed / window_s
    estimate = math.ceil(must_drain / per_s * 1000)
    return max(MIN_RETRY_MS, min(MAX_RETRY_MS, estimate))


def verdict(queues: Sequence[Queue]) -> Queue | None:
    """None: admit (some eligible agent has room, or nothing is known to count).

    Otherwise the queue to name in the refusal: of the full ones, the one that frees a
    slot first (the shortest `retry_after_ms`, then the agent ID for a stable answer)."""
    if not queues or any(not q.full for q in queues):
        return None
    return min(queues, key=lambda q: (retry_after_ms(q), q.agent_id))


def payload_refusal(size: int, cap: int) -> str | None:
    """The 413's detail for a payload of ``size`` bytes against ``cap``; None: it fits."""
    if size <= cap:
        return None
    return (
        f"the payload is {size} bytes, over the hub's limit of {cap} "
        "(router.max_payload_bytes); send a reference to the data (a URL or an object "
        "key the agent can fetch) instead of the bytes"
    )


def overloaded(rss_bytes: int | None, limit_bytes: int | None, ratio: float) -> bool:
    """Whether the process is past ``ratio`` of its memory limit (unknown: never)."""
    if rss_bytes is None or limit_bytes is None or limit_bytes <= 0:
        return False
    return rss_bytes > ratio * limit_bytes
