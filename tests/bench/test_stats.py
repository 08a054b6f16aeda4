"""Tables for the benchmark's pure arithmetic: percentiles, summaries, sustainability,
timelines and target checks. A wrong percentile would make the whole table lie."""

from __future__ import annotations

import math

import pytest

from bench.stats import (
    Sample,
    Summary,
    Target,
    ladder,
    median_row,
    per_second,
    percentile,
    ratio,
    summarise,
    sustainable,
)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([5.0], 50, 5.0),
        ([5.0], 99, 5.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([4.0, 3.0, 2.0, 1.0], 50, 2.0),  # order of arrival does not matter
        ([1.0, 2.0, 3.0, 4.0], 75, 3.0),
        ([1.0, 2.0, 3.0, 4.0], 76, 4.0),
        ([float(i) for i in range(1, 101)], 99, 99.0),
        ([float(i) for i in range(1, 101)], 100, 100.0),
        ([float(i) for i in range(1, 101)], 0, 1.0),
        ([float(i) for i in range(1, 1001)], 95, 950.0),
    ],
)
def test_nearest_rank_percentile(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected


def test_percentile_of_nothing_is_nan_and_out_of_range_is_refused() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def _samples(latencies_ms: list[float], failed: int = 0) -> list[Sample]:
    ok = [Sample(i * 0.01, ms / 1000, True) for i, ms in enumerate(latencies_ms)]
    return ok + [Sample(1.0, 5.0, False, "boom") for _ in range(failed)]


def test_summary_counts_only_successes_in_rate_and_latency() -> None:
    s = summarise(_samples([10.0] * 98 + [200.0, 300.0], failed=3), wall_s=2.0, offered_rate=50)
    assert s.rate == 50.0  # 100 successes in 2 s; the 3 failures do not count
    assert (s.p50_ms, s.p99_ms) == (10.0, 200.0)
    assert s.errors == 3
    assert s.requests == 103


@pytest.mark.parametrize(
    ("latencies", "failed", "lost", "wall", "offered", "expected"),
    [
        ([10.0] * 100, 0, 0, 1.0, 100, True),
        ([10.0] * 100, 1, 0, 1.0, 100, False),  # any error
        ([10.0] * 100, 0, 1, 1.0, 100, False),  # any lost task
        ([10.0] * 98 + [150.0] * 2, 0, 0, 1.0, 100, False),  # p99 over 100 ms
        ([10.0] * 98 + [100.0] * 2, 0, 0, 1.0, 100, True),  # p99 at 100 ms
        ([10.0] * 100, 0, 0, 1.2, 100, False),  # fell behind: 83/s achieved of 100 offered
        ([10.0] * 100, 0, 0, 1.04, 100, True),  # within 5 % (the tail drains late)
        ([], 0, 0, 1.0, 100, False),  # nothing ran
    ],
)
def test_sustainable(
    latencies: list[float], failed: int, lost: int, wall: float, offered: float, expected: bool
) -> None:
    s = summarise(_samples(latencies, failed), wall, lost=lost)
    assert sustainable(s, offered) is expected


@pytest.mark.parametrize(
    ("hub", "base", "expected"),
    [(10.0, 5.0, 2.0), (5.0, 10.0, 0.5), (1.0, 0.0, math.nan), (math.nan, 1.0, math.nan)],
)
def test_ratio(hub: float, base: float, expected: float) -> None:
    got = ratio(hub, base)
    assert (math.isnan(got) and math.isnan(expected)) or got == expected


def test_per_second_buckets_by_whole_seconds_and_drops_outside() -> None:
    times = [100.0, 100.5, 100.99, 101.0, 103.2, 99.9, 104.0]
    assert per_second(times, 100.0, 104.0) == [3, 1, 0, 1]


@pytest.mark.parametrize(
    ("value", "limit", "at_most", "met"),
    [
        (10.0, 15.0, True, True),
        (15.0, 15.0, True, True),
        (15.1, 15.0, True, False),
        (250.0, 200.0, False, True),
        (199.9, 200.0, False, False),
        (math.nan, 15.0, True, False),  # not measured is not met
    ],
)
def test_target(value: float, limit: float, at_most: bool, met: bool) -> None:
    target = Target("t", value, limit, at_most)
    assert target.met is met
    assert target.as_dict()["met"] is met


def test_summary_dict_rounds_and_turns_nan_into_null() -> None:
    s = Summary(1.23456, math.nan, 2.0, 3.0, 0, 0, 10.126)
    d = s.as_dict()
    assert d["rate"] == 1.23 and d["p50_ms"] is None and d["peak_rss_mb"] == 10.13


@pytest.mark.parametrize(
    ("start", "factor", "ceiling", "expected"),
    [
        (60, 1.25, 200, [60, 80, 100, 120, 150, 190]),
        (100, 1.5, 500, [100, 150, 220, 330, 500]),
        (10, 1.01, 40, [10, 20, 30, 40]),  # always at least 10 more
        (20, 2, 20, [20]),
    ],
)
def test_a_ladder_climbs_by_its_factor_up_to_the_ceiling(
    start: float, factor: float, ceiling: float, expected: list[float]
) -> None:
    assert ladder(start, factor, ceiling) == expected


@pytest.mark.parametrize(
    ("start", "factor", "ceiling"), [(0, 1.5, 10), (10, 1.0, 100), (50, 2, 40)]
)
def test_a_ladder_that_cannot_climb_is_refused(start: float, factor: float, ceiling: float) -> None:
    with pytest.raises(ValueError):
        ladder(start, factor, ceiling)


def test_the_load_generators_own_lag_is_summarised() -> None:
    samples = [Sample(i / 100, 0.01, True, lag_s=i / 1000) for i in range(100)]
    summary = summarise(samples, 1.0)
    assert summary.loadgen_lag_p99_ms == pytest.approx(98.0)
    assert summary.loadgen_lag_max_ms == pytest.approx(99.0)


def test_a_repeated_scenario_reports_medians_the_spread_and_the_worst_losses() -> None:
    runs = [
        {"rate": 100.0, "p50_ms": 5.0, "p99_ms": 20.0, "errors": 0, "lost": 0, "name": "a"},
        {"rate": 90.0, "p50_ms": 9.0, "p99_ms": 15.0, "errors": 2, "lost": 0, "name": "b"},
        {"rate": 95.0, "p50_ms": 6.0, "p99_ms": 30.0, "errors": 0, "lost": 1, "name": "c"},
    ]
    row = median_row(runs)
    assert (row["rate"], row["p50_ms"], row["p99_ms"]) == (95.0, 6.0, 20.0)
    assert row["spread"]["rate"] == [90.0, 100.0] and row["spread"]["p99_ms"] == [15.0, 30.0]
    assert (row["errors"], row["lost"], row["runs"], row["name"]) == (2, 1, 3, "a")
    assert median_row(runs[:2])["p50_ms"] == 7.0  # an even count: the middle two's mean
    with pytest.raises(ValueError):
        median_row([])
