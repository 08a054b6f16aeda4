"""Memory admission: an API process near its memory limit takes no new submits.

Past ``server.memory_admission_ratio`` of the process's limit, ``POST /v1/tasks``,
``POST /v1/broadcasts`` and ``POST /api/v1/dag-runs`` answer 503 ``overloaded`` with
``Retry-After`` before their body is read, while reads, results and heartbeats (which
let work drain) go on: the process sheds the load that grows its memory instead of
being killed by the kernel with every request in it.

The limit is ``server.memory_limit_bytes`` if set, else the cgroup's (v2 ``memory.max``,
v1 ``memory.limit_in_bytes``), read once at start; with neither (no cgroup limit, not
Linux) there is no admission. The resident set comes from ``/proc/self/statm``, sampled
at most every ``SAMPLE_INTERVAL_S`` so a submit costs a clock read, not a file read.
The decision is `reach.core.flow.admission.overloaded`; the refusal at the HTTP edge is
`reach.hub.api.admission.MemoryAdmissionMiddleware`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from reach.core.flow.admission import overloaded

log = logging.getLogger("reach.hub.flow.memory")

SAMPLE_INTERVAL_S = 0.5

_CGROUP = Path("/sys/fs/cgroup")
_UNLIMITED = 1 << 60  # cgroup v1 says "no limit" with a huge page-rounded number


def rss_bytes() -> int | None:
    """This process's resident set size, or None where ``/proc`` is not there."""
    try:
        fields = Path("/proc/self/statm").read_text().split()
        return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def cgroup_limit(root: Path = _CGROUP, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """The memory limit of this process's cgroup (the tightest on its path), or None."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[int] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: the unified hierarchy
            found += _limits(root, path, "memory.max")
        elif "memory" in controllers.split(","):
            found += _limits(root / "memory", path, "memory.limit_in_bytes")
    return min(found) if found else None


def _limits(base: Path, path: str, name: str) -> list[int]:
    """Every limit set on ``path`` and its ancestors (a container may see only ``/``)."""
    parts = [p for p in path.strip("/").split("/") if p]
    values = []
    for depth in range(len(parts), -1, -1):
        value = _read_limit(base.joinpath(*parts[:depth], name))
        if value is not None:
            values.append(value)
    return values


def _read_limit(file: Path) -> int | None:
    try:
        raw = file.read_text().strip()
    except OSError:
        return None
    if not raw.isdigit():  # "max": none
        return None
    value = int(raw)
    return value if 0 < value < _UNLIMITED else None


class MemoryGauge:
    """Whether the process is over its admission threshold, sampled at most every
    ``interval_s`` (thread-safe: one sampler at a time, the others read the last)."""

    def __init__(
        self,
        limit_bytes: int | None,
        ratio: float,
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        read_rss: Callable[[], int | None] = rss_bytes,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit_bytes = limit_bytes
        self.ratio = ratio
        self._interval = interval_s
        self._read_rss = read_rss
        self._clock = clock
        self._lock = threading.Lock()
        self._next_at = float("-inf")
        self.rss: int | None = None
        self._over = False

    @classmethod
    def configured(cls, limit_bytes: int | None, ratio: float) -> MemoryGauge:
        limit = limit_bytes if limit_bytes is not None else cgroup_limit()
        if limit is not None:
            log.info("memory admission above %.0f%% of %d bytes", ratio * 100, limit)
        return cls(limit, ratio)

    def over(self) -> bool:
        if self.limit_bytes is None:
            return False
        now = self._clock()
        if now >= self._next_at and self._lock.acquire(blocking=False):
            try:
                self.rss = self._read_rss()
                over = overloaded(self.rss, self.limit_bytes, self.ratio)
                if over != self._over:
                    log.warning(
                        "memory admission %s: rss %s of limit %d bytes",
                        "refusing new submits" if over else "accepting submits again",
                        self.rss,
                        self.limit_bytes,
                    )
                self._over = over
                self._next_at = now + self._interval
            finally:
                self._lock.release()
        return self._over
