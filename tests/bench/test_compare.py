"""bench.compare's arithmetic: the order of the runs, the figures read from a bench run,
and the side-by-side rows (the comparison itself is `python -m bench.compare`)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import compare


@pytest.mark.parametrize(
    ("rounds", "sides"),
    [
        (1, ["before", "after"]),
        (2, ["before", "after", "after", "before"]),  # drift weighs on both alike
        (3, ["before", "after", "after", "before", "before", "after"]),
    ],
)
def test_runs_alternate(rounds: int, sides: list[str]) -> None:
    assert compare.order(rounds) == sides


def _bench_result(worker: float, rate: float | None = None) -> dict[str, Any]:
    return {
        "meta": {"calibration": {"calibration_ms": 24.0}},
        "cost": {
            "cpu_ms_per_msg": {"api": 6.0, "worker": worker, "beat": 0.5, "postgres": 4.0,
                               "redis": 0.5, "agent": 0.8, "loadgen": 3.0},
            "hub_cpu_ms_per_msg": 11.0 + worker, "total_cpu_ms_per_msg": 14.8 + worker,
        },
        "max_throughput": rate,
    }  # fmt: skip


def test_a_bench_runs_figures() -> None:
    got = compare.figures(_bench_result(9.0, 80.0))
    assert got["cpu.worker"] == 9.0 and got["cpu.hub"] == 20.0 and got["cpu.total"] == 23.8
    assert got["max_throughput"] == 80.0 and got["calibration_ms"] == 24.0
    # a run of the cost part alone has no throughput: left out, not zero
    assert compare.figures({"meta": {}, "cost": None})["max_throughput"] is None


def _runs() -> list[dict[str, Any]]:
    return [
        {"n": 1, "side": "before", "figures": compare.figures(_bench_result(12.0, 70.0))},
        {"n": 2, "side": "after", "figures": compare.figures(_bench_result(9.0, 80.0))},
        {"n": 3, "side": "after", "figures": compare.figures(_bench_result(10.0, 90.0))},
        {"n": 4, "side": "before", "figures": compare.figures(_bench_result(14.0, 60.0))},
        {"n": 5, "side": "after", "error": "python -m bench exited 1",
         "figures": compare.figures(_bench_result(99.0, 1.0))},
    ]  # fmt: skip


def test_each_side_is_the_median_of_its_runs_and_a_failed_run_counts_for_neither() -> None:
    rows = {r["figure"]: r for r in compare.compare(_runs())}
    worker = rows["cpu.worker"]
    assert (worker["before"], worker["after"]) == (13.0, 9.5)
    assert worker["before_runs"] == [12.0, 14.0] and worker["after_runs"] == [9.0, 10.0]
    assert worker["after_to_before"] == 0.731
    assert rows["max_throughput"]["after_to_before"] == pytest.approx(85 / 65, abs=1e-3)
    # a figure no run measured has no row
    assert "cpu.nothing" not in rows


def test_the_table_puts_before_and_after_side_by_side() -> None:
    comparison = {
        "before": {"label": "c830b0b"},
        "after": {"label": "e83830c + changes"},
        "runs": _runs(),
        "rows": compare.compare(_runs()),
    }
    text = compare.table(comparison)
    assert "| figure | before: c830b0b | after: e83830c + changes | after ÷ before |" in text
    assert "| CPU ms/msg: worker | 13.00 (12.00, 14.00) | 9.50 (9.00, 10.00) | 0.73 |" in text
    assert "| max single hop, msg/s (p99 ≤ 100 ms) | 65.00 (70.00, 60.00) " in text
    assert "run 5 (after) failed: python -m bench exited 1" in text
