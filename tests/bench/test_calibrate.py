"""The machine calibration the bench writes into every run's ``meta``."""

from __future__ import annotations

import pytest

from bench.calibrate import calibrate, speed_ratio, workload
from bench.report import markdown
from tests.bench.test_report import _result


def test_the_workload_is_fixed() -> None:
    # the same work every time: its checksum does not depend on the machine or the run
    assert workload(50) == workload(50)
    assert workload(50) != workload(51)


def test_calibration_takes_the_least_of_its_repeats() -> None:
    cal = calibrate(repeats=3, rounds=200)
    low, high = cal["calibration_spread_ms"]
    assert cal["calibration_ms"] == low > 0
    assert high >= low
    assert len(cal["loadavg"]) == 3
    assert "least of 3" in cal["workload"]


@pytest.mark.parametrize(("repeats", "rounds"), [(0, 10), (3, 0), (-1, -1)])
def test_calibration_refuses_no_work(repeats: int, rounds: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        calibrate(repeats=repeats, rounds=rounds)


@pytest.mark.parametrize(
    ("ours", "theirs", "ratio"),
    [
        ({"calibration_ms": 40.0}, {"calibration_ms": 80.0}, 2.0),  # we are twice as fast
        ({"calibration_ms": 80.0}, {"calibration_ms": 40.0}, 0.5),
        ({"calibration_ms": 80.0}, {}, None),  # a run from before calibration
        ({}, {"calibration_ms": 80.0}, None),
    ],
)
def test_speed_ratio(ours: dict[str, float], theirs: dict[str, float], ratio: float | None) -> None:
    assert speed_ratio(ours, theirs) == ratio


def test_the_report_says_the_calibration_when_the_run_has_one() -> None:
    result = _result()
    assert "Machine calibration" not in markdown(result)  # older runs: nothing invented
    result["meta"]["calibration"] = {
        "calibration_ms": 79.9,
        "calibration_spread_ms": [79.9, 84.8],
        "workload": "bench.calibrate.workload(2000), least of 7",
        "loadavg": [1.14, 0.58, 0.23],
    }
    text = markdown(result)
    assert "took 79.9 ms of CPU (load average 1.1, 0.6, 0.2 at the start)" in text


def test_the_report_says_the_hot_path_when_the_run_has_it() -> None:
    result = _result()
    assert "Hot path" not in markdown(result)  # older runs: nothing invented
    result["meta"]["hot_path"] = {
        "command": "python -m bench.micro --rounds 150",
        "rounds": 150,
        "cpu_ms": {"submit": 2.28, "publish": 0.91, "deliver": 4.66},
        "postgres_cpu_ms": {"submit": 0.52, "deliver": 1.04},
        "loadavg": 1.2,
    }
    text = markdown(result)
    assert "(`python -m bench.micro --rounds 150`: one thread's CPU per operation" in text
    assert "ms): submit 2.3, publish 0.9, deliver 4.7; PostgreSQL's CPU per submit 0.5" in text


def test_the_report_says_which_postgresql_and_warns_when_nothing_vacuums() -> None:
    result = _result()
    assert "PostgreSQL 1" not in markdown(result)  # older runs: nothing invented
    pg = {
        "server_version": "15.20",
        "autovacuum": "on",
        "track_counts": "on",
        "shared_buffers": "128MB",
    }
    result["meta"]["postgres"] = pg
    text = markdown(result)
    assert "PostgreSQL 15.20: autovacuum on, track_counts on, shared_buffers 128MB." in text
    assert "Nothing vacuums" not in text
    for off in ({"autovacuum": "off"}, {"track_counts": "off"}):
        result["meta"]["postgres"] = {**pg, **off}
        assert "**Nothing vacuums during this run**" in markdown(result)
