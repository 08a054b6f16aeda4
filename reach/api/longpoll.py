"""Long-polling reads: hold a request until the answer is final or the wait is over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

from starlette.concurrency import run_in_threadpool

from reach.completions import Waiters

LIVE_FALLBACK_S = 5.0


async def long_poll(
    read: Callable[[], dict[str, Any]],
    done: Callable[[dict[str, Any]], bool],
    wait: float,
    *,
    waiters: Waiters | None = None,
    keys: Iterable[str] = (),
    carried: bool = False,
) -> dict[str, Any]:
    """Re-read (in a thread: the store is synchronous) when woken or on a growing timer.

    With a live completion channel the timer is only a safety net (every 5 s: under a
    backlog, hundreds of waiting requests re-reading every second cost more than the
    work itself); without one it is the mechanism (up to 250 ms). The watch starts before
    the read, so a notice that lands between the read and the wait is not missed. With
    ``carried``, a final view that came with the notice is the answer (no read).
    """
    deadline = time.monotonic() + wait
    pause = 0.02
    keys = list(keys)
    while True:
        if waiters is None or not keys:
            view = await run_in_threadpool(read)
            if done(view) or time.monotonic() >= deadline:
                return view
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 0.25)
            continue
        with waiters.watch(keys) as watch:
            view = await run_in_threadpool(read)
            if done(view) or time.monotonic() >= deadline:
                return view
            cap = LIVE_FALLBACK_S if waiters.live else 0.25
            step = cap if waiters.live else pause
            timeout = min(step, max(0.0, deadline - time.monotonic()))
            try:
                await asyncio.wait_for(watch.woken.wait(), timeout)
            except TimeoutError:
                pass
            if carried and watch.view is not None and done(watch.view):
                return watch.view
            pause = min(pause * 1.5, cap)
