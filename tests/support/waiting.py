"""Waiting on a condition instead of sleeping a fixed time."""

from __future__ import annotations

import time
from typing import Any


def wait_until(predicate: Any, timeout: float, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}: {last!r}")
