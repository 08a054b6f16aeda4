"""Long-polling reads: hold a request until the answer is final or the wait is over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.concurrency import run_in_threadpool

from reach.hub.ledger.wakeups import Waiters

LIVE_FALLBACK_S = 5.0


async def long_poll(
    read: Callable[[], dict[str, Any]],
    done: Callable[[dict[str, Any]], bool],
    wait: float,
    *,
    waiters: Waiters | None = None,
    keys: Iterable[str] = (),
    carried: bool = False,
    wake_after: Callable[[dict[str, Any]], int] | None = None,
    reread_within: float | None = None,
    run: Callable[[Callable[[], dict[str, Any]]], Awaitable[dict[str, Any]]] = run_in_threadpool,
) -> dict[str, Any]:
    """Re-read (in a thread: the store is synchronous) when woken or on a timer.

    With a live completion channel the timer is only a safety net (every 5 s: under a
    backlog, hundreds of waiting requests re-reading every second cost more than the
    work itself); without one it is the mechanism (growing up to 250 ms). The watch
    starts before the first read, so a notice that lands between a read and the wait is
    not missed. With ``carried``, a final view that came with the notice is the answer
    (no read). ``wake_after(view)`` is how many more keys must be announced before a
    read can change the answer (a broadcast needs its missing answers); notices are
    counted from before each read, so one landing during a read is never lost.
    ``reread_within`` bounds the wait before a forced read (the broadcast's deadline).
    ``run`` takes each read to a thread (a submit's reads go through the callers' lane,
    `reach.hub.api.lanes`).
    """
    deadline = time.monotonic() + wait
    if waiters is None or not (keys := list(keys)):
        pause = 0.02
        while True:
            view = await run(read)
            if done(view) or time.monotonic() >= deadline:
                return view
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 1.5, 0.25)
    forced = None if reread_within is None else time.monotonic() + max(0.0, reread_within)
    with waiters.watch(keys) as watch:
        pause = 0.02
        while True:
            base = len(watch.seen)
            view = await run(read)
            if done(view) or time.monotonic() >= deadline:
                return view
            needed = max(1, wake_after(view)) if wake_after else 1
            while True:  # wait for enough notices, the forced read, or the timer
                step = LIVE_FALLBACK_S if waiters.live else pause
                until = min(deadline, time.monotonic() + step)
                if forced is not None and forced > time.monotonic():
                    until = min(until, forced + 0.05)
                try:
                    await asyncio.wait_for(watch.woken.wait(), max(0.0, until - time.monotonic()))
                except TimeoutError:
                    break
                watch.woken.clear()
                if carried and watch.view is not None and done(watch.view):
                    return watch.view
                if len(watch.seen) - base >= needed:
                    break
            pause = min(pause * 1.5, 0.25)
