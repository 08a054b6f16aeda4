"""ReachScore: one number (0-100) saying how well the hub can reach an agent instance *now*.

Routing trusts this score to rank instances (and the prober uses it to decide how often to
probe), so it has to be cheap, deterministic and explainable from its inputs alone. This
module is therefore pure: no I/O, no clock, no globals. Callers pass the heartbeat age (from
the hub's own timestamp, never the agent's clock), the smoothed probe RTT and the probe loss
rate, and get a float back.

The score blends the two reachability signals::

    score = w_hb * heartbeat + w_rtt * rtt + w_loss * loss        (weights sum to 100)

Each sub-score is 1.0 at or better than its "good" bound, 0.0 at or worse than its "bad"
bound, and linear in between. Defaults (see `ScoreConfig`): heartbeat 50 (10 s -> 30 s),
rtt 30 (20 ms -> 500 ms), loss 20 (0 % -> 30 %).

Worked example with the defaults -- heartbeat 12 s old, RTT 150 ms, 5 % loss::

    heartbeat = (30 - 12) / (30 - 10)     = 0.900  -> 50 * 0.900 = 45.0
    rtt       = (500 - 150) / (500 - 20)  = 0.729  -> 30 * 0.729 = 21.9
    loss      = (0.30 - 0.05) / 0.30      = 0.833  -> 20 * 0.833 = 16.7
                                                      ReachScore ~= 83.5

Missing evidence earns no credit: no heartbeat yet, or no successful probe yet (RTT None),
scores 0 on that signal. A window with no probes at all has a loss rate of 0; the RTT
signal already withholds its credit in that case.

`ProbeWindow` keeps the last N probe outcomes (default 10) from which the prober derives the
loss rate, the smoothed RTT and the trailing failure count.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Final

__all__ = [
    "DEFAULT_SCORE_CONFIG",
    "DEFAULT_WINDOW_SIZE",
    "ProbeSample",
    "ProbeWindow",
    "ScoreConfig",
    "ScoreConfigError",
    "heartbeat_subscore",
    "loss_subscore",
    "reach_score",
    "rtt_subscore",
]

DEFAULT_WINDOW_SIZE: Final = 10
_WEIGHT_TOTAL: Final = 100.0


class ScoreConfigError(ValueError):
    """A ScoreConfig value is invalid; `field` names the offending setting."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class ScoreConfig:
    """Weights and bounds of the ReachScore, validated on construction.

    Weights are points out of 100 and must sum to 100. For each signal the sub-score is full
    at or below `*_good*` and zero at or above `*_bad*`; `good` must be strictly below `bad`.
    Loss bounds are fractions (0.30 == 30 %).
    """

    heartbeat_weight: float = 50.0
    rtt_weight: float = 30.0
    loss_weight: float = 20.0
    heartbeat_good_s: float = 10.0
    heartbeat_bad_s: float = 30.0
    rtt_good_ms: float = 20.0
    rtt_bad_ms: float = 500.0
    loss_good: float = 0.0
    loss_bad: float = 0.30

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ScoreConfigError(f.name, f"must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ScoreConfigError(f.name, f"must be finite, got {value!r}")
            if value < 0:
                raise ScoreConfigError(f.name, f"must not be negative, got {value!r}")
        for name in ("loss_good", "loss_bad"):
            if getattr(self, name) > 1:
                raise ScoreConfigError(
                    name, f"is a fraction and must be within [0, 1], got {getattr(self, name)!r}"
                )
        for good, bad in (
            ("heartbeat_good_s", "heartbeat_bad_s"),
            ("rtt_good_ms", "rtt_bad_ms"),
            ("loss_good", "loss_bad"),
        ):
            if getattr(self, good) >= getattr(self, bad):
                raise ScoreConfigError(
                    good,
                    f"must be below {bad} ({getattr(self, good)!r} >= {getattr(self, bad)!r})",
                )
        total = self.heartbeat_weight + self.rtt_weight + self.loss_weight
        if not math.isclose(total, _WEIGHT_TOTAL, abs_tol=1e-9):
            raise ScoreConfigError(
                "heartbeat_weight+rtt_weight+loss_weight",
                f"weights must sum to 100, got {total!r}",
            )


DEFAULT_SCORE_CONFIG: Final = ScoreConfig()


def _ramp(value: float | None, good: float, bad: float) -> float:
    """1.0 at or below `good`, 0.0 at or above `bad`, linear between; unknown (None/NaN) -> 0."""
    if value is None or math.isnan(value):
        return 0.0
    if value <= good:
        return 1.0
    if value >= bad:
        return 0.0
    return (bad - value) / (bad - good)


def heartbeat_subscore(age_s: float | None, cfg: ScoreConfig = DEFAULT_SCORE_CONFIG) -> float:
    """Heartbeat freshness in [0, 1]; None (never heard from) gives 0.

    A negative age (the hub's clock stepped back between stamping and scoring) falls below the
    good bound, so it counts as a fresh heartbeat rather than an error.
    """
    return _ramp(age_s, cfg.heartbeat_good_s, cfg.heartbeat_bad_s)


def rtt_subscore(rtt_ms: float | None, cfg: ScoreConfig = DEFAULT_SCORE_CONFIG) -> float:
    """Probe round-trip time in [0, 1]; None (no successful probe yet) gives 0."""
    return _ramp(rtt_ms, cfg.rtt_good_ms, cfg.rtt_bad_ms)


def loss_subscore(loss_rate: float, cfg: ScoreConfig = DEFAULT_SCORE_CONFIG) -> float:
    """Probe loss (a fraction, 0.05 == 5 %) in [0, 1]; NaN gives 0."""
    return _ramp(loss_rate, cfg.loss_good, cfg.loss_bad)


def reach_score(
    heartbeat_age_s: float | None,
    rtt_ms: float | None,
    loss_rate: float,
    cfg: ScoreConfig = DEFAULT_SCORE_CONFIG,
) -> float:
    """The ReachScore in [0, 100]: weighted sum of the three sub-scores (see module doc)."""
    score = (
        cfg.heartbeat_weight * heartbeat_subscore(heartbeat_age_s, cfg)
        + cfg.rtt_weight * rtt_subscore(rtt_ms, cfg)
        + cfg.loss_weight * loss_subscore(loss_rate, cfg)
    )
    # Weights may sum to 100 only within float tolerance; keep the promise of [0, 100].
    return min(max(score, 0.0), _WEIGHT_TOTAL)


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """One active-probe outcome: success flag, RTT in ms, and hub time `at` (epoch seconds).

    A successful probe must carry its RTT. A failed probe may carry the time spent before it
    failed, but that figure is never used as an RTT.
    """

    ok: bool
    rtt_ms: float | None
    at: float

    def __post_init__(self) -> None:
        if not isinstance(self.ok, bool):
            raise ValueError(f"ok: must be a bool, got {self.ok!r}")
        if self.rtt_ms is not None and (
            isinstance(self.rtt_ms, bool)
            or not isinstance(self.rtt_ms, int | float)
            or not math.isfinite(self.rtt_ms)
            or self.rtt_ms < 0
        ):
            raise ValueError(f"rtt_ms: must be a finite number >= 0 or None, got {self.rtt_ms!r}")
        if self.ok and self.rtt_ms is None:
            raise ValueError("rtt_ms: a successful probe must carry its RTT")
        if (
            isinstance(self.at, bool)
            or not isinstance(self.at, int | float)
            or not math.isfinite(self.at)
        ):
            raise ValueError(f"at: must be a finite number, got {self.at!r}")


@dataclass(frozen=True, slots=True)
class ProbeWindow:
    """The last `size` probe outcomes, oldest first. Immutable: `push` returns a new window.

    Smoothing choice -- median, not mean. Routing compares scores and treats two instances
    within 5 points as equal, so one slow probe must not move the score by more than that.
    With the default window and bounds, nine 20 ms probes plus one 2000 ms spike give a mean
    of 218 ms, which costs about 12 points; the median stays at 20 ms and costs none. The
    price is that a lasting slowdown shows only once it covers half of the successful probes
    in the window; sustained trouble that matters more (timeouts, refusals) arrives through
    the loss rate and the consecutive-failure count, which react on the next probe.
    """

    samples: tuple[ProbeSample, ...] = ()
    size: int = DEFAULT_WINDOW_SIZE

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size: must be a positive int, got {self.size!r}")
        if len(self.samples) > self.size:
            raise ValueError(f"samples: {len(self.samples)} samples exceed size {self.size}")

    def push(self, sample: ProbeSample) -> ProbeWindow:
        """A new window with `sample` appended and the oldest sample evicted when full."""
        return ProbeWindow((*self.samples, sample)[-self.size :], self.size)

    @property
    def loss_rate(self) -> float:
        """Fraction of failed probes in the window; 0.0 when the window is empty."""
        if not self.samples:
            return 0.0
        return sum(not s.ok for s in self.samples) / len(self.samples)

    @property
    def smoothed_rtt_ms(self) -> float | None:
        """Median RTT of the successful probes in the window; None when there are none."""
        rtts = [s.rtt_ms for s in self.samples if s.ok and s.rtt_ms is not None]
        if not rtts:
            return None
        return float(statistics.median(rtts))

    @property
    def consecutive_failures(self) -> int:
        """Number of failed probes since the most recent success (trailing failures)."""
        count = 0
        for sample in reversed(self.samples):
            if sample.ok:
                break
            count += 1
        return count

    def to_list(self) -> list[dict[str, bool | float | None]]:
        """JSON-ready samples, oldest first (the size is configuration, not state)."""
        return [{"ok": s.ok, "rtt_ms": s.rtt_ms, "at": s.at} for s in self.samples]

    @classmethod
    def from_list(
        cls, items: Iterable[Mapping[str, object]], size: int = DEFAULT_WINDOW_SIZE
    ) -> ProbeWindow:
        """Rebuild a window from `to_list` output, keeping the newest `size` samples.

        Raises ValueError naming the item index and field when an item is malformed.
        """
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size: must be a positive int, got {size!r}")
        samples: list[ProbeSample] = []
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise ValueError(f"items[{index}]: must be an object, got {item!r}")
            try:
                ok, rtt_ms, at = item["ok"], item["rtt_ms"], item["at"]
            except KeyError as exc:
                raise ValueError(f"items[{index}]: missing field {exc}") from exc
            try:
                samples.append(ProbeSample(ok=ok, rtt_ms=rtt_ms, at=at))  # type: ignore[arg-type]
            except ValueError as exc:
                raise ValueError(f"items[{index}].{exc}") from exc
        return cls(tuple(samples[-size:]), size)
