"""Pure arithmetic of a benchmark run: percentiles, summaries, ratios and target checks.

No I/O and no clock: everything here is table-tested (tests/unit/test_bench_stats.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    """One request of an open-loop run, timed from when it was *due*, not when it left."""

    due: float  # seconds since the run started, by the arrival schedule
    latency_s: float  # due → result visible to the caller (queueing in the client included)
    ok: bool
    error: str = ""
    lag_s: float = 0.0  # due → the request began: the load generator's own lag


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of already collected values; NaN when empty."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0..100")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Summary:
    rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int
    lost: int
    peak_rss_mb: float
    requests: int = 0
    offered_rate: float = 0.0
    # the load generator's own lag (due → the request began): when it is large, the
    # machine could not even offer the load, and latency is partly the generator's
    loadgen_lag_p99_ms: float = math.nan
    loadgen_lag_max_ms: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return {k: _round(v) for k, v in asdict(self).items()}


def summarise(
    samples: Sequence[Sample],
    wall_s: float,
    *,
    offered_rate: float = 0.0,
    lost: int = 0,
    peak_rss_mb: float = 0.0,
) -> Summary:
    """Achieved rate counts completed successes over the wall time of the whole run."""
    ok = [s.latency_s * 1000 for s in samples if s.ok]
    lags = [s.lag_s * 1000 for s in samples]
    return Summary(
        rate=len(ok) / wall_s if wall_s > 0 else 0.0,
        p50_ms=percentile(ok, 50),
        p95_ms=percentile(ok, 95),
        p99_ms=percentile(ok, 99),
        errors=sum(1 for s in samples if not s.ok),
        lost=lost,
        peak_rss_mb=peak_rss_mb,
        requests=len(samples),
        offered_rate=offered_rate,
        loadgen_lag_p99_ms=percentile(lags, 99),
        loadgen_lag_max_ms=max(lags, default=math.nan),
    )


def ladder(start: float, factor: float, ceiling: float) -> list[float]:
    """The offered rates of a throughput ladder: ``start``, then each step ``factor`` times
    the last (rounded to 10 msg/s, always at least 10 more), up to ``ceiling``. A ladder
    is climbed until a step is not sustained; the ceiling only bounds a runaway."""
    if start <= 0 or factor <= 1 or ceiling < start:
        raise ValueError(f"ladder({start}, {factor}, {ceiling}): needs 0 < start <= ceiling")
    rates = [float(start)]
    while True:
        nxt = max(rates[-1] + 10, round(rates[-1] * factor / 10) * 10)
        if nxt > ceiling:
            return rates
        rates.append(float(nxt))


# the columns a repeated scenario reports as the median of its runs, with their spread
MEDIAN_COLUMNS = ("rate", "p50_ms", "p95_ms", "p99_ms", "peak_rss_mb", "loadgen_lag_p99_ms")
WORST_COLUMNS = ("errors", "lost", "loadgen_lag_max_ms")  # reported as the worst run's


def median_row(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row for a scenario run several times: the median of each figure over the runs
    (``MEDIAN_COLUMNS``), the worst run's errors and losses (never hidden by a median),
    and ``spread``: each median column's [min, max] over the runs. Other keys are the
    first run's."""
    if not runs:
        raise ValueError("median_row of no runs")
    row = dict(runs[0])
    spread: dict[str, list[Any]] = {}
    for col in MEDIAN_COLUMNS:
        values = [float(r[col]) for r in runs if _number(r.get(col))]
        row[col] = _round(_median(values)) if values else None
        spread[col] = [_round(min(values)), _round(max(values))] if values else [None, None]
    for col in WORST_COLUMNS:
        values = [r[col] for r in runs if _number(r.get(col))]
        if values:
            row[col] = max(values)
    row["runs"] = len(runs)
    row["spread"] = spread
    return row


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not (isinstance(value, float) and math.isnan(value))


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


P99_LIMIT_MS = 100.0  # a sustained rate keeps p99 within this (issue 17)


def sustainable(summary: Summary, offered: float, p99_limit_ms: float = P99_LIMIT_MS) -> bool:
    """A rate is sustained when nothing failed, p99 stays under the limit and the achieved
    rate keeps up with the offered one (within 5 %: the tail of the run drains late)."""
    return (
        summary.errors == 0
        and summary.lost == 0
        and summary.requests > 0
        and summary.p99_ms <= p99_limit_ms
        and summary.rate >= 0.95 * offered
    )


def ratio(hub: float, baseline: float) -> float:
    """hub / baseline, NaN when the baseline is missing or zero."""
    if not baseline or math.isnan(baseline) or math.isnan(hub):
        return math.nan
    return hub / baseline


def per_second(timestamps: Iterable[float], start: float, end: float) -> list[int]:
    """Counts per whole second of [start, end): a timeline of requests."""
    width = max(0, math.ceil(end - start))
    counts = [0] * width
    for t in timestamps:
        i = math.floor(t - start)
        if 0 <= i < width:
            counts[i] += 1
    return counts


@dataclass(frozen=True, slots=True)
class Target:
    """One published target: ``value`` must be at most (or at least) ``limit``."""

    name: str
    value: float
    limit: float
    at_most: bool = True

    @property
    def met(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": _round(self.value),
            "limit": _round(self.limit),
            "at_most": self.at_most,
            "met": self.met,
        }


def _round(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 2)
    return value
