"""Long-polling reads: hold a request until the answer is final or the wait is over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool


async def long_poll(
    read: Callable[[], dict[str, Any]], done: Callable[[dict[str, Any]], bool], wait: float
) -> dict[str, Any]:
    """Re-read (in a thread: the store is synchronous) with a growing pause, up to 250 ms."""
    deadline = time.monotonic() + wait
    pause = 0.02
    while True:
        view = await run_in_threadpool(read)
        if done(view) or time.monotonic() >= deadline:
            return view
        await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 1.5, 0.25)
