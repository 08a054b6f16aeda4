"""Per-target circuit breaker decisions, as pure functions: no I/O, no clock reads.

DESIGN.md, "Flow control and safety": more than 50 % failures within 10 s opens an
instance's breaker; while it is open the instance is out of the routing pool, and one trial
request is let through every 30 s; a successful trial closes it. The point is the retry
storm: without a breaker, every first attempt *and* every retry keeps hitting an instance
that is failing, and callers wait through the whole backoff schedule for nothing.

The breaker's state is stored on the instance as ``breaker_open_until`` (see `state`):

=====================  ==========  =========================================================
breaker_open_until     state       routing
=====================  ==========  =========================================================
None                   CLOSED      as usual
> now                  OPEN        never; a submit whose every instance is OPEN fails fast
<= now                 TRIAL_DUE   only by the one delivery that claims the trial
=====================  ==========  =========================================================

What an agent answer means for the breaker (`counts_as_success`): no answer, a timeout,
408 or 5xx is a failure; a result, a business error or a 202 is a success (the instance
answered, whatever it said); 429 is neither (a full queue is flow control, not a fault).

`FailureWindow` counts outcomes in 1-second buckets over the last ``window_s`` seconds and
says when to open; `trips` is the same rule over counts summed elsewhere (the hub counts
outcomes hub-wide, ``reach.hub.flow.breakers``). It never opens below ``min_volume`` outcomes in
the window (Hystrix's "request volume threshold"): a handful of failing tasks -- a test,
one caller's retries, the first request after a deploy -- is not evidence that an instance
is broken, and at low volume a ratio swings from 0 % to 100 % on one answer.

`FailureStreak` is the second trigger (``streak``, 10 by default; 0 turns it off): that many
*distinct* tasks failing in a row at the instance, with no success between them and all
within ``window_s``, open it at once. The ratio rule needs the window's older successes
outweighed before it opens (about 3 s into an outage at 30 msg/s), and every failure in
those seconds is retried 1 s later: the failing instance meets about twice its usual
rate exactly while it is down. A streak of distinct tasks is evidence a handful of one
caller's retries cannot fake (a task counts once however often it fails).

**Gradual recovery** (seed 004: "逐步恢复", restore step by step). A successful trial does
not hand the instance its whole share at once: for ``recovery_windows`` windows after it
(`recovery_share`) it takes a growing share of its tasks -- 1/(n+1), 2/(n+1) ... -- as
routing weighs it (``reach.core.fleet.routing``), and any failure in that time opens the breaker
again at once (`reopens`), without waiting for a window's worth of evidence.

Two rules serve the tasks that meet a broken instance (issue 14):

* `routable`: a due trial overrides the agent's own "failing" report (reachability rule
  5, ``consecutive_failure_count >= failure_threshold``). The agent only resets that count
  when a task succeeds, so without a delivery it would stay out of the pool forever; the
  trial is that delivery.
* `retry_at`: when delivery finds no instance to route to only because breakers hold them
  out, the task waits for the next trial instead of spending a retry.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from reach.core.delivery.retry import Outcome

__all__ = [
    "BreakerPolicy",
    "BreakerPolicyError",
    "BreakerState",
    "FailureStreak",
    "FailureWindow",
    "Transition",
    "counts_as_success",
    "recovery_share",
    "reopens",
    "retry_at",
    "routable",
    "state",
    "trips",
]


class BreakerPolicyError(ValueError):
    """A BreakerPolicy value is invalid; `field` names the offending setting."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _is_int(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When a breaker opens and how often it tries again; ``min_volume`` 0 disables opening.

    ``streak``: distinct tasks failing in a row that open it at once (`FailureStreak`);
    0 leaves the ratio rule alone."""

    window_s: int = 10
    failure_ratio: float = 0.5
    min_volume: int = 20
    trial_interval_s: float = 30.0
    streak: int = 10
    recovery_windows: int = 3

    def __post_init__(self) -> None:
        if not _is_int(self.window_s) or self.window_s < 1:
            raise BreakerPolicyError("window_s", f"must be an integer >= 1, got {self.window_s!r}")
        if not _is_int(self.min_volume) or self.min_volume < 0:
            raise BreakerPolicyError(
                "min_volume", f"must be an integer >= 0, got {self.min_volume!r}"
            )
        if not _is_int(self.streak) or self.streak < 0:
            raise BreakerPolicyError("streak", f"must be an integer >= 0, got {self.streak!r}")
        if not _is_int(self.recovery_windows) or self.recovery_windows < 0:
            raise BreakerPolicyError(
                "recovery_windows", f"must be an integer >= 0, got {self.recovery_windows!r}"
            )
        ratio = self.failure_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio < 1:
            raise BreakerPolicyError("failure_ratio", f"must be within [0, 1), got {ratio!r}")
        trial = self.trial_interval_s
        if isinstance(trial, bool) or not isinstance(trial, int | float) or not trial > 0:
            raise BreakerPolicyError("trial_interval_s", f"must be > 0, got {trial!r}")
        if not math.isfinite(trial):
            raise BreakerPolicyError("trial_interval_s", f"must be finite, got {trial!r}")

    @property
    def enabled(self) -> bool:
        """False when ``min_volume`` is 0: no window ever opens a breaker."""
        return self.min_volume > 0


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    TRIAL_DUE = "trial_due"


def state(open_until: float | None, now: float) -> BreakerState:
    """The breaker's state from the stored ``breaker_open_until`` (see the module table)."""
    if open_until is None:
        return BreakerState.CLOSED
    return BreakerState.OPEN if now < open_until else BreakerState.TRIAL_DUE


def recovery_share(closed_at: float | None, now: float, policy: BreakerPolicy) -> float:
    """The share of its tasks an instance takes while it recovers: ``k / (n + 1)`` in the
    ``k``-th window after the successful trial closed its breaker at ``closed_at``, for
    ``n = recovery_windows`` windows; 1.0 once they passed (or never opened, or n = 0)."""
    n = policy.recovery_windows
    if closed_at is None or n == 0:
        return 1.0
    elapsed = now - closed_at
    if elapsed < 0:
        return 1.0 / (n + 1)  # clocks of two processes: the first step, not a full share
    step = int(elapsed // policy.window_s) + 1
    return 1.0 if step > n else step / (n + 1)


def reopens(closed_at: float | None, now: float, policy: BreakerPolicy) -> bool:
    """Whether a failure now opens the breaker again at once: it is still recovering."""
    return recovery_share(closed_at, now, policy) < 1.0


def counts_as_success(outcome: Outcome) -> bool | None:
    """True for a success, False for a failure, None for an answer that counts as neither."""
    if outcome is Outcome.TRANSIENT:
        return False
    if outcome is Outcome.BACKPRESSURE:
        return None
    return True


@dataclass(frozen=True, slots=True)
class Transition:
    """The verdict: the breaker goes to ``to``, on this evidence, by this rule."""

    to: BreakerState
    failures: int
    total: int
    rule: str = "window"  # or "streak"


def trips(failures: int, total: int, policy: BreakerPolicy) -> Transition | None:
    """The window's rule over (failures, total) within it: a Transition to OPEN, or None.

    Opens only with at least ``min_volume`` outcomes and strictly more than
    ``failure_ratio`` of them failures."""
    for name, value in (("failures", failures), ("total", total)):
        if not _is_int(value) or value < 0:
            raise ValueError(f"{name}: must be an int >= 0, got {value!r}")
    if failures > total:
        raise ValueError(f"failures ({failures}) exceed total ({total})")
    if not policy.enabled or total < policy.min_volume or total == 0:
        return None
    if failures / total <= policy.failure_ratio:
        return None
    return Transition(BreakerState.OPEN, failures, total)


def routable(verdict_routable: bool, failing_only: bool, breaker: BreakerState) -> bool:
    """Whether routing may pick the instance, breaker included.

    ``failing_only``: the verdict held it out for its consecutive task failures alone; a
    due trial overrides that (the trial is how such an instance can come back)."""
    if breaker is BreakerState.OPEN:
        return False
    if breaker is BreakerState.TRIAL_DUE:
        return verdict_routable or failing_only
    return verdict_routable


def retry_at(open_until: list[float | None], now: float, recheck_s: float) -> float | None:
    """When a task that found no route should try again, if only breakers held it back.

    ``open_until``: the breaker_open_until of every live instance that could take the task
    (status online or degraded), as routing saw them. None (no waiting) when there is none,
    or one of them has a closed breaker (something else holds it out). Else the earliest
    next trial; a trial already due (another delivery claimed it) is looked at again after
    ``recheck_s``."""
    if not open_until or any(u is None for u in open_until):
        return None
    return min(u if u is not None and u > now else now + recheck_s for u in open_until)


class FailureWindow:
    """One instance's recent outcomes, in 1-second buckets over ``policy.window_s``.

    Mutable and cheap: one per instance per process, fed on every answer. After it says
    "open" it starts afresh, so one run of failures makes one transition, not one per
    failure that follows. A clock that steps back counts into the newest bucket.
    """

    __slots__ = ("_buckets", "policy")

    def __init__(self, policy: BreakerPolicy) -> None:
        self.policy = policy
        # [second, failures, total], oldest first
        self._buckets: deque[list[int]] = deque()

    def record(self, success: bool, now: float) -> Transition | None:
        """Count one outcome at ``now``; a Transition to OPEN when the window trips."""
        second = math.floor(now)
        self._slide(second)
        if self._buckets and self._buckets[-1][0] >= second:
            bucket = self._buckets[-1]
        else:
            bucket = [second, 0, 0]
            self._buckets.append(bucket)
        bucket[1] += 0 if success else 1
        bucket[2] += 1
        transition = trips(*self._sums(), self.policy)
        if transition is not None:
            self._buckets.clear()
        return transition

    def clear(self) -> None:
        """Start afresh (another rule opened the breaker on this evidence)."""
        self._buckets.clear()

    def counts(self, now: float) -> tuple[int, int]:
        """(failures, total) within the window as of ``now``."""
        self._slide(math.floor(now))
        return self._sums()

    def _slide(self, second: int) -> None:
        oldest = second - self.policy.window_s + 1
        while self._buckets and self._buckets[0][0] < oldest:
            self._buckets.popleft()

    def _sums(self) -> tuple[int, int]:
        return sum(b[1] for b in self._buckets), sum(b[2] for b in self._buckets)


class FailureStreak:
    """One instance's current run of failing tasks, as one process saw them.

    A success ends the run; so does time: a failure older than ``policy.window_s`` drops
    out of it. Each task counts once (its retries are one task failing again). After it
    says "open" it starts afresh. Kept per process: the first process to see a streak
    opens the breaker hub-wide, and no count crosses processes (no read, no lag).
    """

    __slots__ = ("_tasks", "policy")

    def __init__(self, policy: BreakerPolicy) -> None:
        self.policy = policy
        self._tasks: dict[str, float] = {}  # task -> its latest failure, oldest first

    def record(self, task_id: str, success: bool, now: float) -> Transition | None:
        """Count one outcome of ``task_id``; a Transition to OPEN when the streak is long
        enough."""
        if success:
            self._tasks.clear()
            return None
        if self.policy.streak < 1 or not self.policy.enabled:
            return None
        horizon = now - self.policy.window_s
        while self._tasks:
            oldest, at = next(iter(self._tasks.items()))
            if at > horizon:
                break
            del self._tasks[oldest]
        self._tasks.pop(task_id, None)
        self._tasks[task_id] = now
        if len(self._tasks) < self.policy.streak:
            return None
        tasks = len(self._tasks)
        self._tasks.clear()
        return Transition(BreakerState.OPEN, tasks, tasks, "streak")

    def __len__(self) -> int:
        return len(self._tasks)
