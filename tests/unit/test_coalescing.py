"""Which heartbeats may wait for the batched write (`reach.core.fleet.coalescing`)."""

from __future__ import annotations

import pytest

from reach.core.fleet.coalescing import Known, Quiet, may_defer

NOW = 1_000.0
ONLINE = Known("a", "online", False, 10.0, NOW - 1)


def known(status: str = "online", *, alerted: bool = False, seen_at: float = NOW - 1) -> Known:
    return Known("a", status, alerted, 10.0, seen_at)


@pytest.mark.parametrize(
    ("view", "beat", "deferred"),
    [
        # an idle, online instance without alerts, seen lately: the beat only confirms it
        (ONLINE, Quiet("a", 0, 0), True),
        (ONLINE, Quiet("a", 0, 2), True),  # failures below the routing threshold (3)
        (known(seen_at=NOW - 10), Quiet("a", 0, 0), True),  # seen exactly max_age ago
        # written at once
        (None, Quiet("a", 0, 0), False),  # never seen here: the database says if it exists
        (ONLINE, Quiet("b", 0, 0), False),  # another agent's instance: its 404
        (known(seen_at=NOW - 10.5), Quiet("a", 0, 0), False),  # the view is too old
        (known(seen_at=NOW + 1), Quiet("a", 0, 0), False),  # a view from the future
        (known(status="suspect"), Quiet("a", 0, 0), False),  # comes back: transition
        (known(status="offline"), Quiet("a", 0, 0), False),
        (known(status="degraded"), Quiet("a", 0, 0), False),
        (known(status="unreachable"), Quiet("a", 0, 0), False),
        (known(alerted=True), Quiet("a", 0, 0), False),  # an alert may clear
        (ONLINE, Quiet("a", 1, 0), False),  # busy: capacity, rise streak, closed sessions
        (ONLINE, Quiet("a", 0, 3), False),  # leaves the routing pool: FAILING
    ],
)
def test_may_defer(view: Known | None, beat: Quiet, deferred: bool) -> None:
    assert may_defer(view, beat, NOW, max_age=10.0, failure_threshold=3) is deferred
