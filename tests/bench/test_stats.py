"""Tables for the benchmark's pure arithmetic: percentiles, summaries, sustainability,
timelines and target checks. A wrong percentile would make the whole table lie."""

from __future__ import annotations

import math

import pytest

from bench.stats import (
    Sample,
    Summary,
    Target,
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
        ([10.0] * 98 + [300.0] * 2, 0, 0, 1.0, 100, False),  # p99 over 250 ms
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
