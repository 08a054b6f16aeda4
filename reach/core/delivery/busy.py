"""When an exchange an instance refused as busy (HTTP 429) is sent again from the loop.

An agent answers 429 past its declared ``max_concurrency``. The hub keeps each worker
process's exchanges at an instance within that number, but the processes do not count
each other's (a prefork worker of N children may have N times the slots in flight there),
so behind a backlog for a few-slot agent the excess comes back 429. Deferred through the
store and the broker, each such answer cost a round trip through a worker slot, the
relay and the queues -- for a backlog, round after round, crowding out every other
delivery. Instead the exchange is sent again from the process's event loop after a short,
growing, jittered wait, while its budget lasts and up to `MAX_RESENDS` times; only then
is the 429 recorded as the instance's backpressure (a deferral, as before).
"""

from __future__ import annotations

import random

FIRST_S = 0.05  # the first wait; each next one doubles
CAP_S = 1.0  # no wait longer: a place at a busy agent frees within its task time
MAX_RESENDS = 30  # past these the 429 is recorded (a deferral): a caller sees it
SEND_MIN_S = 0.5  # budget an exchange needs after its wait to be worth sending


def resend_after(
    status: int | None, resends: int, budget_left_s: float, rng: random.Random
) -> float | None:
    """Seconds to wait before sending again an exchange answered ``status`` after
    ``resends`` resends, with ``budget_left_s`` of its budget left; None: keep the answer."""
    if status != 429 or resends >= MAX_RESENDS:
        return None
    nominal: float = min(CAP_S, FIRST_S * 2.0**resends)
    wait = nominal * rng.uniform(0.5, 1.5)  # processes waiting on one agent spread out
    if wait + SEND_MIN_S > budget_left_s:
        return None
    return wait
