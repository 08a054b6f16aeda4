"""The retry budget's arithmetic (reach.core.flow.retry_budget): ratio, floor, window, waits."""

from __future__ import annotations

import pytest

from reach.core.flow.retry_budget import (
    MIN_WAIT_S,
    RetryBudget,
    RetryBudgetError,
    allowance,
    allows,
    wait_s,
)

B = RetryBudget(ratio=0.2, min_per_s=3.0, window_s=20)  # floor: 60 retries per window


@pytest.mark.parametrize(
    ("retries", "requests", "expected"),
    [
        (0, 0, 60.0),  # the floor alone
        (0, 100, 80.0),  # 0.2 x 100 first requests + 60
        (50, 150, 80.0),  # retries are not first requests: 0.2 x 100 + 60
        (10, 5, 60.0),  # a lagging request count below the retries: no first request
        (0, 1000, 260.0),
    ],
)
def test_allowance(retries: int, requests: int, expected: float) -> None:
    assert allowance(retries, requests, B) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("retries", "requests", "budget", "ok"),
    [
        (59, 59, B, True),  # the 60th retry of the floor fits
        (60, 60, B, False),  # the 61st does not
        (79, 179, B, True),  # 0.2 x 100 + 60 = 80: the 80th fits
        (80, 180, B, False),
        (0, 0, RetryBudget(ratio=0.2, min_per_s=0.0, window_s=10), False),  # no floor, no traffic
        (1, 11, RetryBudget(ratio=0.2, min_per_s=0.0, window_s=10), True),  # 0.2 x 10 = 2
        (2, 12, RetryBudget(ratio=0.2, min_per_s=0.0, window_s=10), False),
        (10**6, 10**6, RetryBudget(ratio=0.0, min_per_s=0.0, window_s=10), True),  # disabled
        (0, 0, RetryBudget(ratio=0.0, min_per_s=0.1, window_s=10), True),  # floor 1 per window
        (1, 1, RetryBudget(ratio=0.0, min_per_s=0.1, window_s=10), False),
    ],
)
def test_allows(retries: int, requests: int, budget: RetryBudget, ok: bool) -> None:
    assert allows(retries, requests, budget) is ok


@pytest.mark.parametrize(
    ("retries", "requests", "waiting", "u", "low", "high"),
    [
        (10, 100, 0, 0.0, 0.0, 0.0),  # within budget: no wait
        (60, 60, 0, 0.0, MIN_WAIT_S, MIN_WAIT_S),  # one over: the minimum wait
        (120, 120, 0, 0.0, 10.0, 10.2),  # 61 of 120 must slide out of 20 s: ~10 s
        (600, 600, 0, 0.0, 18.0, 18.1),  # 541 of 600: most of the window
        (60, 60, 30, 0.999, 10.0, 10.5),  # 30 waiting, 3 freed a second: spread over 10 s
        (60, 60, 10**6, 0.999, 20.0, 20.5),  # the spread is capped at the window too
    ],
)
def test_wait(retries: int, requests: int, waiting: int, u: float, low: float, high: float) -> None:
    assert low <= wait_s(retries, requests, waiting, B, u) <= high


def test_a_wait_is_never_longer_than_the_window_plus_the_spread() -> None:
    no_floor = RetryBudget(ratio=0.2, min_per_s=0.0, window_s=10)
    assert wait_s(0, 0, 0, no_floor, 0.0) == 10.0  # nothing frees budget but new traffic
    assert wait_s(0, 0, 5, no_floor, 0.999) < 20.0


def test_wait_spreads_retries_that_wait_together() -> None:
    waits = [wait_s(60, 60, 30, B, u / 10) for u in range(10)]
    assert waits == sorted(waits) and waits[-1] - waits[0] > 5


def test_a_disabled_budget_never_waits() -> None:
    off = RetryBudget(ratio=0.0, min_per_s=0.0, window_s=10)
    assert not off.enabled
    assert wait_s(10**6, 0, 0, off, 0.5) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ratio": -0.1}, "ratio"),
        ({"ratio": float("nan")}, "ratio"),
        ({"ratio": True}, "ratio"),
        ({"min_per_s": -1}, "min_per_s"),
        ({"min_per_s": float("inf")}, "min_per_s"),
        ({"window_s": 0}, "window_s"),
        ({"window_s": 1.5}, "window_s"),
    ],
)
def test_bad_budget_is_refused_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(RetryBudgetError) as err:
        RetryBudget(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, 0), "retries"),
        ((0, -1), "requests"),
        ((True, 0), "retries"),
    ],
)
def test_bad_counts_are_refused(args: tuple[int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        allowance(*args, B)


def test_bad_draw_and_waiting_are_refused() -> None:
    with pytest.raises(ValueError, match="u"):
        wait_s(61, 61, 0, B, 1.0)
    with pytest.raises(ValueError, match="waiting"):
        wait_s(61, 61, -1, B, 0.0)
