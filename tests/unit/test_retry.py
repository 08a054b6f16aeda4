"""Tables for the pure retry module: backoff schedule, jitter bounds, budget, classification."""

from __future__ import annotations

import random
from typing import Any

import pytest

from reach.core.delivery.retry import (
    Outcome,
    RetryPolicy,
    RetryPolicyError,
    backoff_delay,
    business_message,
    classify,
    delay_bounds,
    nominal_delay,
    should_retry,
)

DEFAULT = RetryPolicy()


def test_defaults_follow_the_design() -> None:
    assert (DEFAULT.max_retry, DEFAULT.base, DEFAULT.cap, DEFAULT.jitter) == (5, 1.0, 30.0, 0.2)


# --- nominal schedule ------------------------------------------------------------------------


def test_nominal_sequence() -> None:
    assert [nominal_delay(n, DEFAULT) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (RetryPolicy(base=0.5, cap=10), [0.5, 1, 2, 4, 8, 10, 10]),
        (RetryPolicy(base=2, cap=5), [2, 4, 5, 5, 5, 5, 5]),
        (RetryPolicy(base=3, cap=3), [3, 3, 3, 3, 3, 3, 3]),
        (RetryPolicy(base=0.1, cap=1000), [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4]),
    ],
)
def test_nominal_custom_base_and_cap(policy: RetryPolicy, expected: list[float]) -> None:
    assert [nominal_delay(n, policy) for n in range(1, 8)] == pytest.approx(expected)


@pytest.mark.parametrize("retry_number", [64, 1025, 10_000, 10**12])
def test_nominal_far_past_the_cap_does_not_overflow(retry_number: int) -> None:
    assert nominal_delay(retry_number, DEFAULT) == 30.0
    low, high = delay_bounds(retry_number, DEFAULT)
    assert backoff_delay(retry_number, DEFAULT, random.Random(0)) <= high == 30.0
    assert low == pytest.approx(24.0)


@pytest.mark.parametrize("retry_number", [0, -1, True, 1.0])
def test_retry_number_is_one_based(retry_number: Any) -> None:
    with pytest.raises(ValueError, match="retry_number"):
        nominal_delay(retry_number, DEFAULT)
    with pytest.raises(ValueError, match="retry_number"):
        backoff_delay(retry_number, DEFAULT, random.Random(0))
    with pytest.raises(ValueError, match="retry_number"):
        delay_bounds(retry_number, DEFAULT)


# --- jitter bounds ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_number", "bounds"),
    [
        (1, (0.8, 1.2)),
        (2, (1.6, 2.4)),
        (3, (3.2, 4.8)),
        (4, (6.4, 9.6)),
        (5, (12.8, 19.2)),
        (6, (24.0, 30.0)),  # nominal 30 (capped); the upper jitter is clamped to the cap
        (7, (24.0, 30.0)),
    ],
)
def test_delay_bounds(retry_number: int, bounds: tuple[float, float]) -> None:
    assert delay_bounds(retry_number, DEFAULT) == pytest.approx(bounds)


def test_delay_bounds_partly_clamped() -> None:
    # nominal 16, jitter range 12.8..19.2, cap 18 cuts the top
    policy = RetryPolicy(base=1, cap=18)
    assert delay_bounds(5, policy) == pytest.approx((12.8, 18.0))


def test_delay_bounds_without_jitter() -> None:
    policy = RetryPolicy(jitter=0)
    for n in range(1, 8):
        assert delay_bounds(n, policy) == (nominal_delay(n, policy),) * 2
        assert backoff_delay(n, policy, random.Random(n)) == nominal_delay(n, policy)


@pytest.mark.parametrize(
    "policy",
    [
        DEFAULT,
        RetryPolicy(base=0.25, cap=7, jitter=0.5),
        RetryPolicy(base=2, cap=2, jitter=0.9),
        RetryPolicy(max_retry=0, base=1e-3, cap=1e-2, jitter=0.1),
    ],
)
@pytest.mark.parametrize("retry_number", [1, 2, 3, 4, 5, 6, 7, 8])
def test_samples_stay_within_bounds(policy: RetryPolicy, retry_number: int) -> None:
    rng = random.Random(retry_number)
    low, high = delay_bounds(retry_number, policy)
    samples = [backoff_delay(retry_number, policy, rng) for _ in range(1000)]
    assert all(low <= s <= high for s in samples)
    assert all(0 <= s <= policy.cap for s in samples)
    # the jitter is real: samples spread over the range rather than sitting on one value
    assert len(set(samples)) > 1
    assert max(samples) - min(samples) > 0.5 * (high - low)


class _Extreme(random.Random):
    """A random source that always returns one end of the range (or a hair beyond it)."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self._value = value

    def uniform(self, a: float, b: float) -> float:
        return self._value


@pytest.mark.parametrize("factor", [0.0, 0.8, 0.79999999, 1.2, 1.20000001, 5.0])
def test_backoff_is_clamped_even_if_the_source_misbehaves(factor: float) -> None:
    for n in range(1, 8):
        low, high = delay_bounds(n, DEFAULT)
        assert low <= backoff_delay(n, DEFAULT, _Extreme(factor)) <= high


def test_backoff_is_reproducible_with_the_same_seed() -> None:
    rng1, rng2 = random.Random(99), random.Random(99)
    run1 = [backoff_delay(n, DEFAULT, rng1) for n in range(1, 8)]
    run2 = [backoff_delay(n, DEFAULT, rng2) for n in range(1, 8)]
    assert run1 == run2


# --- policy validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_retry": -1}, "max_retry"),
        ({"max_retry": 1.5}, "max_retry"),
        ({"max_retry": True}, "max_retry"),
        ({"base": 0}, "base"),
        ({"base": -1}, "base"),
        ({"base": float("nan")}, "base"),
        ({"base": float("inf"), "cap": float("inf")}, "base"),
        ({"base": "1"}, "base"),
        ({"cap": 0.5}, "cap"),  # below base 1.0
        ({"cap": float("inf")}, "cap"),
        ({"jitter": -0.1}, "jitter"),
        ({"jitter": 1.0}, "jitter"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": float("nan")}, "jitter"),
    ],
)
def test_policy_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(RetryPolicyError) as info:
        RetryPolicy(**kwargs)
    assert isinstance(info.value, ValueError)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}:")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_retry": 0},
        {"base": 0.001, "cap": 0.001},
        {"jitter": 0},
        {"jitter": 0.99},
        {"base": 5, "cap": 5},
    ],
)
def test_policy_accepts_edge_values(kwargs: dict[str, Any]) -> None:
    RetryPolicy(**kwargs)


# --- retry budget ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_retry", "retries_so_far", "expected"),
    [
        (5, 0, True),
        (5, 1, True),
        (5, 4, True),  # the fifth retry is still allowed
        (5, 5, False),  # five retries made: stop
        (5, 6, False),
        (0, 0, False),  # no retries at all
        (1, 0, True),
        (1, 1, False),
    ],
)
def test_should_retry(max_retry: int, retries_so_far: int, expected: bool) -> None:
    assert should_retry(retries_so_far, RetryPolicy(max_retry=max_retry)) is expected


def test_default_policy_allows_exactly_five_retries() -> None:
    retries = 0
    while should_retry(retries, DEFAULT):
        retries += 1
    assert retries == 5


def test_should_retry_refuses_a_negative_count() -> None:
    with pytest.raises(ValueError, match="retries_so_far"):
        should_retry(-1, DEFAULT)


# --- classification --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status_code", "body", "expected"),
    [
        # no HTTP answer: refused, timeout, connection reset
        (None, None, Outcome.TRANSIENT),
        # 200 with an envelope
        (200, {"code": 0, "data": {"x": 1}}, Outcome.SUCCESS),
        (200, {"code": 0}, Outcome.SUCCESS),
        (200, {"code": 7, "message": "unsupported"}, Outcome.BUSINESS_ERROR),
        (200, {"code": -1}, Outcome.BUSINESS_ERROR),
        # 200 without a valid envelope: protocol error, not retried
        (200, {"code": True}, Outcome.BUSINESS_ERROR),  # bool is not an int code
        (200, {"code": False}, Outcome.BUSINESS_ERROR),
        (200, {"code": 0.0}, Outcome.BUSINESS_ERROR),
        (200, {"code": "0"}, Outcome.BUSINESS_ERROR),
        (200, {"data": 1}, Outcome.BUSINESS_ERROR),
        (200, [{"code": 0}], Outcome.BUSINESS_ERROR),
        (200, "ok", Outcome.BUSINESS_ERROR),
        (200, None, Outcome.BUSINESS_ERROR),
        # other 2xx are read like 200
        (201, {"code": 0}, Outcome.SUCCESS),
        (204, None, Outcome.BUSINESS_ERROR),
        # accepted: the result comes later through report_result
        (202, None, Outcome.ACCEPTED),
        (202, {"code": 0}, Outcome.ACCEPTED),
        # backpressure is neither success nor failure
        (429, {"code": 429, "message": "agent at max_concurrency"}, Outcome.BACKPRESSURE),
        (429, None, Outcome.BACKPRESSURE),
        # transient
        (408, None, Outcome.TRANSIENT),
        (500, {"code": -1, "message": "boom"}, Outcome.TRANSIENT),
        (502, None, Outcome.TRANSIENT),
        (503, None, Outcome.TRANSIENT),
        (504, None, Outcome.TRANSIENT),
        # a request the agent refuses will be refused again
        (400, {"code": 400}, Outcome.BUSINESS_ERROR),
        (401, None, Outcome.BUSINESS_ERROR),
        (403, None, Outcome.BUSINESS_ERROR),
        (404, {"code": 404, "message": "no handler"}, Outcome.BUSINESS_ERROR),
        (413, None, Outcome.BUSINESS_ERROR),
        (422, None, Outcome.BUSINESS_ERROR),
        # odd statuses the agent should never send
        (301, None, Outcome.BUSINESS_ERROR),
        (100, None, Outcome.BUSINESS_ERROR),
    ],
)
def test_classify(status_code: int | None, body: object, expected: Outcome) -> None:
    assert classify(status_code, body) is expected


def test_outcome_values_are_stable() -> None:
    assert {o.value for o in Outcome} == {
        "success",
        "accepted",
        "business_error",
        "backpressure",
        "transient",
    }


@pytest.mark.parametrize(
    ("status", "message", "told"),
    [
        (401, "token expired", "agent refused the hub's reach token: token expired"),
        (200, "unsupported", "unsupported"),
        (404, "no handler", "no handler"),
    ],
)
def test_business_message_names_a_refused_token(status: int, message: str, told: str) -> None:
    assert classify(status, {"code": status, "message": message}) is Outcome.BUSINESS_ERROR
    assert business_message(status, message) == told
