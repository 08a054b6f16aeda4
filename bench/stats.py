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
    )


def sustainable(summary: Summary, offered: float, p99_limit_ms: float = 250.0) -> bool:
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
