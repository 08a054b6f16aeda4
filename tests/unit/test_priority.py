"""The priority decision: which queue, and when a background attempt yields to online work."""

from __future__ import annotations

import pytest

from reach.core.flow.priority import (
    BACKGROUND_QUEUE,
    ONLINE_QUEUE,
    WORKER_QUEUES,
    Load,
    PriorityPolicy,
    Reason,
    admit_background,
    background_limit,
    defer_delay,
    lane_tokens,
    queue_for,
)

POLICY = PriorityPolicy(background_share=0.5, defer_s=0.5, max_wait_s=60.0)


@pytest.mark.parametrize(
    ("priority", "queue"),
    [
        ("online", ONLINE_QUEUE),
        ("background", BACKGROUND_QUEUE),
        (None, ONLINE_QUEUE),  # rows from before priorities existed
        ("anything", ONLINE_QUEUE),
    ],
)
def test_queue_for(priority: str | None, queue: str) -> None:
    assert queue_for(priority) == queue


def test_workers_prefer_online_then_background_then_probes() -> None:
    assert WORKER_QUEUES == ("reach.probe", "reach", "reach.background")


@pytest.mark.parametrize(
    ("slots", "share", "limit"),
    [(2, 0.5, 1), (4, 0.5, 2), (3, 0.5, 1), (1, 0.5, 0), (10, 0.3, 3), (8, 1.0, 8), (5, 0.2, 1)],
)
def test_background_limit(slots: int, share: float, limit: int) -> None:
    assert background_limit(slots, share) == limit


@pytest.mark.parametrize(
    ("waiting", "busy", "slots", "deferred_s", "run", "reason"),
    [
        # nothing online waits: background takes every slot it finds
        (False, 7, 8, None, True, Reason.NO_ONLINE_WAITING),
        (False, 0, None, None, True, Reason.NO_ONLINE_WAITING),
        # online waits: background within its share runs
        (True, 0, 2, None, True, Reason.WITHIN_SHARE),
        (True, 3, 8, None, True, Reason.WITHIN_SHARE),
        # ... past it, it yields
        (True, 1, 2, None, False, Reason.OVER_SHARE),
        (True, 4, 8, 10.0, False, Reason.OVER_SHARE),
        (True, 0, 1, None, False, Reason.OVER_SHARE),  # one slot x 0.5: background yields it
        # ... unless it has yielded long enough: it cannot starve
        (True, 4, 8, 60.0, True, Reason.WAITED_TOO_LONG),
        (True, 9, 8, 61.0, True, Reason.WAITED_TOO_LONG),
        # no worker reported its slots: no share to keep
        (True, 5, None, None, True, Reason.SLOTS_UNKNOWN),
        (True, 5, 0, None, True, Reason.SLOTS_UNKNOWN),
    ],
)
def test_admit_background(
    waiting: bool, busy: int, slots: int | None, deferred_s: float | None, run: bool, reason: Reason
) -> None:
    decision = admit_background(Load(waiting, busy, slots, deferred_s), POLICY)
    assert (decision.run, decision.reason) == (run, reason)
    assert decision.delay_s == (0.0 if run else defer_delay(deferred_s, POLICY))


@pytest.mark.parametrize(
    ("deferred_s", "delay"),
    [
        (None, 0.5), (0.0, 0.5), (0.3, 0.5), (1.0, 1.0), (1.7, 1.7), (2.0, 2.0), (5.0, 5.0),
        (8.0, 8.0), (30.0, 8.0),
        (55.0, 5.0), (59.0, 1.0), (59.8, 0.5), (75.0, 0.5),  # not past max_wait_s (60)
    ],
)  # fmt: skip
def test_a_deferral_waits_as_long_as_it_waited_already(
    deferred_s: float | None, delay: float
) -> None:
    """Doubling, capped: a large backlog must not cycle through the workers every 0.5 s,
    and the cap never carries a deferral past the bound on its wait."""
    assert defer_delay(deferred_s, POLICY) == delay


def test_a_larger_share_lets_more_background_run() -> None:
    load = Load(online_waiting=True, background_busy=3, slots=4, deferred_s=None)
    assert not admit_background(load, PriorityPolicy(background_share=0.5)).run
    assert admit_background(load, PriorityPolicy(background_share=1.0)).run


@pytest.mark.parametrize(
    ("caller_tokens", "online", "background"),
    [
        (10, 8, 2),  # the default pool of 20: half of it for callers
        (250, 188, 62),
        (4, 3, 1),
        (2, 1, 1),  # at least one each
        (1, 1, 1),
    ],
)
def test_background_submits_get_a_quarter_of_the_callers_tokens(
    caller_tokens: int, online: int, background: int
) -> None:
    assert lane_tokens(caller_tokens) == (online, background)
