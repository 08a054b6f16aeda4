"""Per-target retry budget, as pure arithmetic: no I/O, no clock reads, no random source.

The field's retry storm: an agent fails for 40 s and every caller's every task retries into
it, so the failing agent sees many times its normal rate exactly when it can least take it.
A budget caps retries toward one target agent to a share of its first requests in a sliding
window, plus a floor that is always allowed (Finagle's ``RetryBudget``, gRPC's retry
throttling)::

    allowance = ratio * first_requests + min_per_s * window_s
    a retry may fire  <=>  retries + 1 <= allowance

``first_requests`` are deliveries of tasks that had not failed before (``requests -
retries``): the ratio is taken of first requests only, so a storm of retries never raises
its own budget. ``min_per_s`` keeps a quiet target retryable (one failed task alone still
gets its retries). Both counts are hub-wide over the last ``window_s`` seconds
(``reach.hub.flow.shared_counts``).

A retry beyond the budget waits (`wait_s`): about as long as it takes for enough of the
window's retries to slide out, assuming they are spread evenly over it, plus a spread so
the retries waiting together do not all wake at once (the budget frees about
``allowance / window_s`` retries a second). When it fires it is checked again.

``ratio`` and ``min_per_s`` both 0 disables the budget (`RetryBudget.enabled`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RetryBudget", "RetryBudgetError", "allowance", "allows", "wait_s"]

MIN_WAIT_S = 0.5  # a retry waiting for budget waits at least this long (no busy loop)


class RetryBudgetError(ValueError):
    """A RetryBudget value is invalid; `field` names the offending setting."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class RetryBudget:
    """Retries toward one target: ``ratio`` of its first requests + ``min_per_s`` a second."""

    ratio: float = 0.2
    min_per_s: float = 3.0
    window_s: int = 20

    def __post_init__(self) -> None:
        if not _number(self.ratio) or self.ratio < 0:
            raise RetryBudgetError("ratio", f"must be a finite number >= 0, got {self.ratio!r}")
        if not _number(self.min_per_s) or self.min_per_s < 0:
            raise RetryBudgetError(
                "min_per_s", f"must be a finite number >= 0, got {self.min_per_s!r}"
            )
        if isinstance(self.window_s, bool) or not isinstance(self.window_s, int):
            raise RetryBudgetError("window_s", f"must be an integer, got {self.window_s!r}")
        if self.window_s < 1:
            raise RetryBudgetError("window_s", f"must be >= 1, got {self.window_s!r}")

    @property
    def enabled(self) -> bool:
        """False when both ``ratio`` and ``min_per_s`` are 0: every retry fires."""
        return self.ratio > 0 or self.min_per_s > 0


def _check_counts(retries: int, requests: int) -> None:
    for name, value in (("retries", retries), ("requests", requests)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: must be an int >= 0, got {value!r}")


def allowance(retries: int, requests: int, budget: RetryBudget) -> float:
    """Retries the window allows: ``ratio * (requests - retries) + min_per_s * window_s``.

    ``requests`` counts every delivery to the target (retries included); a lagging count
    that shows fewer requests than retries is read as no first request."""
    _check_counts(retries, requests)
    first = max(0, requests - retries)
    return budget.ratio * first + budget.min_per_s * budget.window_s


def allows(retries: int, requests: int, budget: RetryBudget) -> bool:
    """True if one more retry fits the window's budget (always, when it is disabled)."""
    if not budget.enabled:
        return True
    return retries + 1 <= allowance(retries, requests, budget)


def wait_s(retries: int, requests: int, waiting: int, budget: RetryBudget, u: float) -> float:
    """Seconds a retry beyond the budget waits before it is checked again; 0 if it fits.

    ``waiting`` is how many retries were deferred for this target within the window (the
    queue the budget is working through); ``u`` is a uniform draw in [0, 1) for the spread.
    """
    if not 0 <= u < 1:
        raise ValueError(f"u: must be within [0, 1), got {u!r}")
    if isinstance(waiting, bool) or not isinstance(waiting, int) or waiting < 0:
        raise ValueError(f"waiting: must be an int >= 0, got {waiting!r}")
    if allows(retries, requests, budget):
        return 0.0
    window = float(budget.window_s)
    deficit = retries + 1 - allowance(retries, requests, budget)
    # the window's retries slide out evenly: ``deficit`` of them are gone after this long
    base = min(window, max(MIN_WAIT_S, window * deficit / max(1, retries)))
    rate = allowance(retries, requests, budget) / window  # retries freed per second
    spread = min(window, waiting / rate) if rate > 0 else window
    return base + u * max(spread, MIN_WAIT_S)
