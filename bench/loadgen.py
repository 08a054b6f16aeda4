"""Open-loop load: requests leave on a fixed schedule whether or not earlier ones returned.

A closed loop (send, wait, send) slows down exactly when the system does and hides the
queueing it causes (coordinated omission). Here each request is *due* at ``i / rate``
seconds; its latency is measured from that instant, so time spent waiting for a free
client thread counts against the system, as it would for a real caller.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from bench.stats import Sample

Job = Callable[[int], None]  # raises on failure; the argument is the request's sequence number


def run_open_loop(
    job: Job, rate: float, duration: float, *, max_threads: int = 256, start: float | None = None
) -> tuple[list[Sample], float]:
    """Run ``job`` ``rate`` times a second for ``duration`` seconds; returns (samples, wall)."""
    count = max(1, int(rate * duration))
    samples: list[Sample] = []
    lock = threading.Lock()
    t0 = time.perf_counter() if start is None else start

    def one(i: int, due: float) -> None:
        lag = time.perf_counter() - (t0 + due)  # the generator's own: no thread was free
        try:
            job(i)
            ok, error = True, ""
        except Exception as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"[:300]
        latency = time.perf_counter() - (t0 + due)
        with lock:
            samples.append(Sample(due, latency, ok, error, max(0.0, lag)))

    with ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="load") as pool:
        for i in range(count):
            due = i / rate
            pause = t0 + due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            pool.submit(one, i, due)
    wall = time.perf_counter() - t0
    samples.sort(key=lambda s: s.due)
    return samples, wall
