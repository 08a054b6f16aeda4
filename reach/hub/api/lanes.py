"""The callers' lanes: a flood of submits waits for worker threads of its own.

Sync work leaves the event loop through anyio's worker threads, and every request shares
one limiter of 40 tokens, first come first served. 2,000 submits arriving at once then
queue every agent's result report and heartbeat behind them: the agents go unheard (their
heartbeats time out) and tasks they finished are dead-lettered for want of a report. A
submit's thread work (its transaction, its publish, its long-poll reads) takes a token of
a callers' lane instead; the shared limiter stays free for everything else.

Online and background submits have a lane each (``reach.core.flow.priority.lane_tokens``
splits the tokens): a background flood to one agent waits on that agent's queue lock
holding its tokens, and an online submit must not wait for them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from reach.core.flow.priority import BACKGROUND, lane_tokens

T = TypeVar("T")


def caller_tokens(pool_size: int) -> int:
    """Half the process's connection pool: a submit waiting on an agent's queue lock holds
    a connection, and reports and heartbeats need the other half."""
    return max(1, pool_size // 2)


class CallerLane:
    """Runs callers' sync work on a limiter of its own."""

    def __init__(self, tokens: int) -> None:
        if tokens < 1:
            raise ValueError(f"a lane needs at least one token, not {tokens}")
        self.tokens = tokens
        self._limiter: anyio.CapacityLimiter | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:  # made inside the event loop that serves the app
            self._limiter = anyio.CapacityLimiter(self.tokens)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=self._limiter)


class CallerLanes:
    """The online and the background lane of one app's callers."""

    def __init__(self, tokens: int) -> None:
        online, background = lane_tokens(tokens)
        self.online = CallerLane(online)
        self.background = CallerLane(background)

    def of(self, priority: str | None) -> CallerLane:
        return self.background if priority == BACKGROUND else self.online
