"""The load generator is open-loop: requests leave on schedule even when the system is
slow, and the time they wait for a free client counts in their latency."""

from __future__ import annotations

import threading
import time

from bench.loadgen import run_open_loop


def test_requests_are_due_on_a_fixed_schedule_and_all_run() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            seen.append(i)

    samples, wall = run_open_loop(job, rate=200, duration=0.25)
    assert sorted(seen) == list(range(50))
    assert [s.due for s in samples] == [i / 200 for i in range(50)]
    assert all(s.ok for s in samples)
    assert wall >= 0.245


def test_a_slow_system_shows_up_as_latency_not_as_a_slower_schedule() -> None:
    """Closed-loop clients would report ~20 ms for every request here (coordinated
    omission); one client thread and a 20 ms job at 100/s must instead show queueing."""

    def job(i: int) -> None:
        time.sleep(0.02)

    samples, _ = run_open_loop(job, rate=100, duration=0.3, max_threads=1)
    latencies = [s.latency_s for s in samples]
    assert len(samples) == 30
    assert latencies[-1] > latencies[0] + 0.2  # the 30th waited for the 29 before it


def test_failures_are_samples_with_their_error() -> None:
    def job(i: int) -> None:
        if i % 2:
            raise RuntimeError(f"no {i}")

    samples, _ = run_open_loop(job, rate=100, duration=0.1)
    failed = [s for s in samples if not s.ok]
    assert len(failed) == 5
    assert all("RuntimeError: no" in s.error for s in failed)
