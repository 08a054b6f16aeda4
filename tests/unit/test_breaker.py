"""Tables for the pure circuit breaker: policy, states, what counts, the sliding window."""

from __future__ import annotations

from typing import Any

import pytest

from reach.core.delivery.retry import Outcome
from reach.core.flow.breakers import (
    BreakerPolicy,
    BreakerPolicyError,
    BreakerState,
    FailureWindow,
    Transition,
    counts_as_success,
    recovery_share,
    reopens,
    retry_at,
    routable,
    state,
    trips,
)
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.flow.breakers import Breakers, Ticket
from reach.hub.settings import load_settings

SMALL = BreakerPolicy(window_s=10, failure_ratio=0.5, min_volume=4, trial_interval_s=30)


def test_defaults_follow_the_design() -> None:
    policy = BreakerPolicy()
    assert (policy.window_s, policy.failure_ratio, policy.min_volume) == (10, 0.5, 20)
    assert policy.trial_interval_s == 30 and policy.enabled
    assert DeliveryPolicy.from_settings(load_settings(environ={})).breaker == policy


def test_settings_reach_the_delivery_policy() -> None:
    environ = {
        "REACH_ROUTER__BREAKER_WINDOW": "5",
        "REACH_ROUTER__BREAKER_FAILURE_RATIO": "0.25",
        "REACH_ROUTER__BREAKER_MIN_VOLUME": "0",
        "REACH_ROUTER__BREAKER_TRIAL_INTERVAL": "2",
    }
    policy = DeliveryPolicy.from_settings(load_settings(environ=environ)).breaker
    assert policy == BreakerPolicy(window_s=5, failure_ratio=0.25, min_volume=0, trial_interval_s=2)
    assert not policy.enabled


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window_s": 0}, "window_s"),
        ({"window_s": 2.5}, "window_s"),
        ({"window_s": True}, "window_s"),
        ({"min_volume": -1}, "min_volume"),
        ({"min_volume": 1.5}, "min_volume"),
        ({"failure_ratio": 1.0}, "failure_ratio"),
        ({"failure_ratio": -0.1}, "failure_ratio"),
        ({"failure_ratio": "0.5"}, "failure_ratio"),
        ({"trial_interval_s": 0}, "trial_interval_s"),
        ({"trial_interval_s": float("inf")}, "trial_interval_s"),
        ({"trial_interval_s": False}, "trial_interval_s"),
        ({"recovery_windows": -1}, "recovery_windows"),
        ({"recovery_windows": 1.5}, "recovery_windows"),
    ],
)
def test_invalid_policy_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(BreakerPolicyError) as caught:
        BreakerPolicy(**kwargs)
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("open_until", "now", "expected"),
    [
        (None, 100.0, BreakerState.CLOSED),
        (130.0, 100.0, BreakerState.OPEN),
        (100.001, 100.0, BreakerState.OPEN),
        (100.0, 100.0, BreakerState.TRIAL_DUE),  # the instant it expires, the trial is due
        (70.0, 100.0, BreakerState.TRIAL_DUE),
    ],
)
def test_state_from_open_until(
    open_until: float | None, now: float, expected: BreakerState
) -> None:
    assert state(open_until, now) is expected


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Outcome.TRANSIENT, False),  # 5xx, 408, timeout, refused
        (Outcome.SUCCESS, True),
        (Outcome.BUSINESS_ERROR, True),  # the instance answered; the caller's problem
        (Outcome.ACCEPTED, True),
        (Outcome.BACKPRESSURE, None),  # a full queue is flow control, not a fault
    ],
)
def test_what_counts(outcome: Outcome, expected: bool | None) -> None:
    assert counts_as_success(outcome) is expected


def test_every_outcome_is_classified() -> None:
    assert {o for o in Outcome} == {
        Outcome.TRANSIENT,
        Outcome.SUCCESS,
        Outcome.BUSINESS_ERROR,
        Outcome.ACCEPTED,
        Outcome.BACKPRESSURE,
    }


def feed(policy: BreakerPolicy, events: list[tuple[float, str]]) -> list[tuple[int, int, int]]:
    """Record ``(time, "F"|"S")`` events; return (index, failures, total) of each opening."""
    window = FailureWindow(policy)
    opened = []
    for i, (at, kind) in enumerate(events):
        transition = window.record(kind == "S", at)
        if transition is not None:
            assert transition.to is BreakerState.OPEN
            opened.append((i, transition.failures, transition.total))
    return opened


def at(t: float, kinds: str) -> list[tuple[float, str]]:
    return [(t, k) for k in kinds]


@pytest.mark.parametrize(
    ("policy", "events", "expected"),
    [
        pytest.param(SMALL, at(0, "FFF"), [], id="below-volume-never-opens"),
        pytest.param(BreakerPolicy(), at(0, "F" * 19), [], id="default-19-failures-stay-closed"),
        pytest.param(BreakerPolicy(), at(0, "F" * 20), [(19, 20, 20)], id="default-20th-opens"),
        pytest.param(SMALL, at(0, "FFFF"), [(3, 4, 4)], id="opens-when-volume-is-reached"),
        pytest.param(SMALL, at(0, "FSFS"), [], id="exactly-half-does-not-open"),
        pytest.param(SMALL, at(0, "FSFSSF"), [], id="half-again-stays-closed"),
        pytest.param(SMALL, at(0, "FFFS"), [(3, 3, 4)], id="over-half-opens"),
        pytest.param(SMALL, at(0, "SFFF"), [(3, 3, 4)], id="over-half-opens-on-a-failure"),
        pytest.param(
            SMALL,
            at(0, "S" * 10 + "F" * 10),
            [],
            id="successes-dilute-failures-10-of-20",
        ),
        pytest.param(
            SMALL,
            at(0, "S" * 10 + "F" * 11),
            [(20, 11, 21)],
            id="11-of-21-opens",
        ),
        pytest.param(
            SMALL,
            [*at(0, "FFF"), (10.0, "F")],
            [],
            id="old-bucket-slides-out",
        ),
        pytest.param(
            SMALL,
            [*at(0.5, "FFF"), (9.99, "F")],
            [(3, 4, 4)],
            id="last-second-of-the-window-still-counts",
        ),
        pytest.param(
            SMALL,
            [*at(0, "SSSS"), *at(10, "FFF"), (10.5, "F")],
            [(7, 4, 4)],
            id="old-successes-slide-out-too",
        ),
        pytest.param(
            SMALL,
            at(0, "FFFF" + "FFF" + "F"),
            [(3, 4, 4), (7, 4, 4)],
            id="after-opening-the-window-starts-afresh",
        ),
        pytest.param(
            SMALL,
            at(0, "FFFF" + "SFFF"),
            [(3, 4, 4), (7, 3, 4)],
            id="success-after-reset-counts-from-zero",
        ),
        pytest.param(
            SMALL,
            at(0, "FFFF" + "SSFF"),
            [(3, 4, 4)],
            id="half-after-reset-stays-closed",
        ),
        pytest.param(BreakerPolicy(min_volume=0), at(0, "F" * 50), [], id="min-volume-0-disables"),
        pytest.param(
            BreakerPolicy(min_volume=4, failure_ratio=0.0),
            at(0, "SSSF"),
            [(3, 1, 4)],
            id="ratio-0-any-failure-at-volume",
        ),
        pytest.param(
            BreakerPolicy(min_volume=4, failure_ratio=0.0), at(0, "SSSS"), [], id="ratio-0-all-ok"
        ),
        pytest.param(
            BreakerPolicy(window_s=1, min_volume=2),
            [(0.0, "F"), (1.0, "F"), (2.0, "F"), (2.9, "F")],
            [(3, 2, 2)],
            id="one-second-window",
        ),
        pytest.param(
            SMALL,
            [(5.0, "F"), (5.5, "F"), (3.0, "F"), (5.9, "F")],
            [(3, 4, 4)],
            id="clock-stepping-back-counts-into-the-newest-bucket",
        ),
        pytest.param(
            SMALL,
            [(t, "F") for t in (0, 3, 6, 9)],
            [(3, 4, 4)],
            id="spread-over-the-window",
        ),
        pytest.param(
            SMALL,
            [(t, "F") for t in (0, 4, 8, 12, 16)],
            [],
            id="too-sparse-to-reach-volume",
        ),
    ],
)
def test_window(
    policy: BreakerPolicy, events: list[tuple[float, str]], expected: list[tuple[int, int, int]]
) -> None:
    assert feed(policy, events) == expected


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (5.9, (3, 6)),
        (9.99, (3, 6)),
        (10.0, (1, 3)),  # the bucket of second 0 slid out
        (14.99, (1, 3)),
        (15.0, (0, 0)),
    ],
)
def test_counts_slide_by_whole_seconds(now: float, expected: tuple[int, int]) -> None:
    window = FailureWindow(BreakerPolicy(min_volume=100))  # never trips: counting only
    for t, success in [(0.2, False), (0.7, False), (0.9, True)]:  # second 0: 2 of 3 failed
        window.record(success, t)
    for t, success in [(5.0, False), (5.5, True), (5.6, True)]:  # second 5: 1 of 3 failed
        window.record(success, t)
    assert window.counts(now) == expected


# -- the per-process book of windows (reach.hub.flow.breakers.Breakers, memory only) ----------


def ticket(opened_at: float = 0.0, trial: bool = False) -> Ticket:
    return Ticket("i-1", "a", opened_at, trial)


def test_windows_are_per_instance() -> None:
    breakers = Breakers()
    for _ in range(3):
        assert breakers.record(ticket(), False, 0.0, SMALL) is None
    assert breakers.record(Ticket("i-2", "a", 0.0, False), False, 0.0, SMALL) is None
    assert breakers.record(ticket(), False, 0.0, SMALL) == Transition(BreakerState.OPEN, 4, 4)


def test_outcomes_from_before_the_last_opening_are_forgotten() -> None:
    """Failures counted before the breaker last opened (anywhere) cannot trip it again."""
    breakers = Breakers()
    for _ in range(3):
        breakers.record(ticket(opened_at=0.0), False, 0.0, SMALL)
    # another process opened it at t=1 and it has closed since; this process learns of it
    assert breakers.record(ticket(opened_at=1.0), False, 5.0, SMALL) is None
    for _ in range(2):
        assert breakers.record(ticket(opened_at=1.0), False, 5.0, SMALL) is None
    # an attempt routed before that opening reports late: old evidence, not counted
    assert breakers.record(ticket(opened_at=0.0), False, 5.0, SMALL) is None
    assert breakers.record(ticket(opened_at=1.0), False, 5.0, SMALL) is not None


def test_forget_resets_the_window() -> None:
    breakers = Breakers()
    for _ in range(3):
        breakers.record(ticket(), False, 0.0, SMALL)
    breakers.forget("i-1")
    assert breakers.record(ticket(), False, 0.0, SMALL) is None


# -- hub-wide windows: the rule over summed counts (issue 14) -------------------------------


@pytest.mark.parametrize(
    ("failures", "total", "policy", "opens"),
    [
        (3, 3, SMALL, False),  # below min_volume: never, whatever the ratio
        (4, 4, SMALL, True),
        (3, 4, SMALL, True),  # 75 %
        (2, 4, SMALL, False),  # exactly the ratio: not strictly above
        (3, 6, SMALL, False),
        (4, 7, SMALL, True),  # 57 %
        (0, 0, SMALL, False),
        (20, 20, BreakerPolicy(min_volume=0), False),  # disabled
        (20, 39, BreakerPolicy(), True),  # the defaults: 20 answers, > 50 %
        (19, 19, BreakerPolicy(), False),
    ],
)
def test_trips_on_summed_counts(
    failures: int, total: int, policy: BreakerPolicy, opens: bool
) -> None:
    got = trips(failures, total, policy)
    assert (got == Transition(BreakerState.OPEN, failures, total)) if opens else got is None


@pytest.mark.parametrize(("failures", "total"), [(-1, 3), (1, -1), (4, 3), (True, 3)])
def test_trips_refuses_impossible_counts(failures: int, total: int) -> None:
    with pytest.raises(ValueError):
        trips(failures, total, SMALL)


def test_the_window_and_the_summed_rule_agree() -> None:
    """FailureWindow is the same rule applied to its own buckets."""
    for pattern in ([False] * 4, [True, False, False, False], [True, True, False, False]):
        window = FailureWindow(SMALL)
        verdicts = [window.record(ok, 0.0) for ok in pattern]
        failures = pattern.count(False)
        assert verdicts[-1] == trips(failures, len(pattern), SMALL)


@pytest.mark.parametrize(
    ("verdict_routable", "failing_only", "breaker", "expected"),
    [
        (True, False, BreakerState.CLOSED, True),
        (False, True, BreakerState.CLOSED, False),  # failing, no trial: out
        (True, False, BreakerState.OPEN, False),
        (False, True, BreakerState.OPEN, False),
        (True, False, BreakerState.TRIAL_DUE, True),
        (False, True, BreakerState.TRIAL_DUE, True),  # a due trial overrides "failing"
        (False, False, BreakerState.TRIAL_DUE, False),  # offline / unreachable: no trial
    ],
)
def test_routable(
    verdict_routable: bool, failing_only: bool, breaker: BreakerState, expected: bool
) -> None:
    assert routable(verdict_routable, failing_only, breaker) is expected


@pytest.mark.parametrize(
    ("open_until", "expected"),
    [
        ([], None),  # no live instance: not the breakers' doing
        ([None], None),  # a closed breaker: something else holds it out
        ([120.0, None], None),
        ([120.0], 120.0),  # wait for the next trial
        ([150.0, 120.0], 120.0),  # the earliest of them
        ([100.0], 101.0),  # due, claimed by another delivery: look again shortly
        ([90.0, 130.0], 101.0),
    ],
)
def test_retry_at(open_until: list[float | None], expected: float | None) -> None:
    assert retry_at(open_until, 100.0, 1.0) == expected


@pytest.mark.parametrize(
    ("closed_at", "now", "windows", "share"),
    [
        (None, 100.0, 3, 1.0),  # never opened, or long closed
        (100.0, 100.0, 3, 0.25),  # the first window after the trial: a quarter
        (100.0, 109.9, 3, 0.25),
        (100.0, 110.0, 3, 0.5),
        (100.0, 125.0, 3, 0.75),
        (100.0, 130.0, 3, 1.0),  # three windows passed: its whole share
        (100.0, 95.0, 3, 0.25),  # another process's clock behind: the first step
        (100.0, 100.0, 0, 1.0),  # recovery_windows 0: whole share at once
        (100.0, 100.0, 1, 0.5),
    ],
)
def test_recovery_share(closed_at: float | None, now: float, windows: int, share: float) -> None:
    policy = BreakerPolicy(window_s=10, recovery_windows=windows)
    assert recovery_share(closed_at, now, policy) == pytest.approx(share)
    assert reopens(closed_at, now, policy) is (share < 1.0)
