"""Retry decisions for delivery, as pure functions: backoff schedule and answer classification.

Delivery calls `classify` on each agent answer and, for a TRANSIENT outcome, asks
`should_retry` and `backoff_delay` what to do next. Nothing here sleeps, reads a clock or
draws from the global random source: the random source is passed in, so a schedule can be
replayed.

Backoff is exponential with jitter. Retry ``n`` (1-based: the first retry after the first
attempt is 1) waits a nominal ``min(cap, base * 2**(n-1))`` -- 1, 2, 4, 8, 16, 30, 30 ... s
with the defaults -- scaled by a factor drawn uniformly from ``[1 - jitter, 1 + jitter]``
and clamped to ``[0, cap]``, so ``cap`` is a hard ceiling (`delay_bounds` gives the exact
range).

How an agent answer is classified (DESIGN.md, "Delivery contract"):

=============================================  ================  ======================
answer                                         outcome           retried?
=============================================  ================  ======================
no HTTP answer (refused, timeout, reset)       TRANSIENT         yes, with backoff
2xx except 202, JSON object with int code 0    SUCCESS           --
2xx except 202, JSON object with int code != 0 BUSINESS_ERROR    no, caller told at once
2xx except 202 without such an envelope        BUSINESS_ERROR    no (protocol error)
202                                            ACCEPTED          -- (result comes later)
429                                            BACKPRESSURE      later, not a failure
408, 5xx                                       TRANSIENT         yes, with backoff
401 (the agent refused the hub's reach token)  BUSINESS_ERROR    no, caller told why
any other status (4xx, 1xx, 3xx)               BUSINESS_ERROR    no
=============================================  ================  ======================

A bool is not an integer code (``{"code": True}`` is a protocol error): the envelope rule
is `reach.core.delivery.envelope`, the one the SDK wraps handler returns with. A 2xx whose body is
not an envelope is a protocol error, classified as BUSINESS_ERROR rather than TRANSIENT:
the agent did answer, and asking again will not change its answer, so retrying would only
add load. So is an agent's 401: it refused the hub's reach token (forged, expired, not
for it), and a new attempt of the same hub would be refused the same way; the caller is
told so (`business_message`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum

from reach.core.delivery import envelope

__all__ = [
    "Outcome",
    "RetryPolicy",
    "RetryPolicyError",
    "backoff_delay",
    "business_message",
    "classify",
    "delay_bounds",
    "nominal_delay",
    "should_retry",
]


class RetryPolicyError(ValueError):
    """A RetryPolicy value is invalid; `field` names the offending setting."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _is_number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a transient failure is retried (delays in seconds)."""

    max_retry: int = 5
    base: float = 1.0
    cap: float = 30.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if isinstance(self.max_retry, bool) or not isinstance(self.max_retry, int):
            raise RetryPolicyError("max_retry", f"must be an integer, got {self.max_retry!r}")
        if self.max_retry < 0:
            raise RetryPolicyError("max_retry", f"must be >= 0, got {self.max_retry!r}")
        for name in ("base", "cap", "jitter"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise RetryPolicyError(name, f"must be a finite number, got {value!r}")
        if self.base <= 0:
            raise RetryPolicyError("base", f"must be > 0, got {self.base!r}")
        if self.cap < self.base:
            raise RetryPolicyError("cap", f"must be >= base ({self.cap!r} < {self.base!r})")
        if not 0 <= self.jitter < 1:
            raise RetryPolicyError("jitter", f"must be within [0, 1), got {self.jitter!r}")


def _check_retry_number(retry_number: int) -> None:
    if isinstance(retry_number, bool) or not isinstance(retry_number, int) or retry_number < 1:
        raise ValueError(f"retry_number: must be an integer >= 1, got {retry_number!r}")


def nominal_delay(retry_number: int, policy: RetryPolicy) -> float:
    """``min(cap, base * 2**(retry_number - 1))``: 1, 2, 4 ... cap; retry_number is 1-based."""
    _check_retry_number(retry_number)
    try:
        delay = math.ldexp(policy.base, retry_number - 1)
    except OverflowError:  # a very late retry: far past the cap anyway
        return policy.cap
    return min(policy.cap, delay)


def delay_bounds(retry_number: int, policy: RetryPolicy) -> tuple[float, float]:
    """The closed range ``backoff_delay`` can return for this retry."""
    nominal = nominal_delay(retry_number, policy)
    low = max(0.0, nominal * (1 - policy.jitter))
    high = min(policy.cap, nominal * (1 + policy.jitter))
    return low, high


def backoff_delay(retry_number: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait before retry `retry_number`: the nominal delay with jitter, <= cap."""
    nominal = nominal_delay(retry_number, policy)
    low, high = 1 - policy.jitter, 1 + policy.jitter
    # uniform() is a + (b - a) * random(); rounding may step a hair outside [a, b].
    factor = min(high, max(low, rng.uniform(low, high)))
    return min(policy.cap, max(0.0, nominal * factor))


def should_retry(retries_so_far: int, policy: RetryPolicy) -> bool:
    """True while fewer than ``max_retry`` retries have been made."""
    if retries_so_far < 0:
        raise ValueError(f"retries_so_far: must be >= 0, got {retries_so_far!r}")
    return retries_so_far < policy.max_retry


class Outcome(StrEnum):
    """What an agent's answer means for delivery."""

    SUCCESS = "success"
    ACCEPTED = "accepted"
    BUSINESS_ERROR = "business_error"
    BACKPRESSURE = "backpressure"
    TRANSIENT = "transient"


def classify(status_code: int | None, body: object) -> Outcome:
    """Classify an agent answer; `body` is the parsed JSON (None when absent or not JSON).

    See the table in the module docstring. `status_code` None means no HTTP answer arrived.
    """
    if status_code is None:
        return Outcome.TRANSIENT
    if status_code == 202:
        return Outcome.ACCEPTED
    if 200 <= status_code < 300:
        code = envelope.code_of(body)
        return Outcome.SUCCESS if code == 0 else Outcome.BUSINESS_ERROR
    if status_code == 429:
        return Outcome.BACKPRESSURE
    if status_code == 408 or 500 <= status_code < 600:
        return Outcome.TRANSIENT
    return Outcome.BUSINESS_ERROR


def business_message(status_code: int | None, message: str) -> str:
    """What the caller is told of a business-error answer: an agent's 401 is its refusal
    of the hub's reach token, which its own message alone would not say."""
    if status_code == 401:
        return f"agent refused the hub's reach token: {message}"
    return message
