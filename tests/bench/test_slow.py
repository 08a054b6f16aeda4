"""Agents that think (bench.slow): the plan's sizes, the rows of the batches and the
broadcasts, their targets and their lines in the report (no processes)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bench import slow
from bench.cli import ALL, OWN_HUB, slow_targets, targets
from bench.report import markdown
from bench.scenarios import Plan
from reach.hub.settings import RouterSettings


@pytest.mark.parametrize(
    ("level", "tasks", "instances", "broadcasts"),
    [("smoke", 20, 10, 2), ("quick", 100, 25, 3), ("full", 200, 50, 5)],
)
def test_the_full_run_measures_the_issues_sizes_and_shorter_runs_less(
    level: str, tasks: int, instances: int, broadcasts: int
) -> None:
    plan = Plan(level=level)
    assert (plan.slow_tasks, plan.fan_instances, plan.fan_broadcasts) == (
        tasks,
        instances,
        broadcasts,
    )
    assert plan.slow_handler_s == 2.0
    # a whole batch fits in what each slow agent declares: no task meets a full agent
    assert plan.slow_max_concurrency >= plan.slow_tasks
    # and the hub's queue bound is above it too
    bound = int(plan.hub_settings.get("REACH_ROUTER__MAX_QUEUE", RouterSettings().max_queue))
    assert bound > plan.slow_tasks


@pytest.mark.parametrize("level", ["smoke", "quick", "full"])
def test_every_in_flight_task_fits_at_one_agent(level: str) -> None:
    """The in-flight agents answer in their exchange: each declares room for all the
    tasks, however the hub spreads them over the two."""
    plan = Plan(level=level)
    assert plan.inflight_max_concurrency >= plan.inflight_tasks


def test_the_slow_parts_run_on_a_hub_of_their_own_and_in_the_smoke_run() -> None:
    assert set(slow.SLOW) <= set(ALL)
    assert not set(slow.SLOW) & set(OWN_HUB)  # cheap enough for every smoke run
    assert slow.WORKER == ("prefork", 2)  # `reach worker` as shipped


@pytest.mark.parametrize("count", [1, 20, 100, 200, 2000])
def test_a_batch_at_once_submits_every_task_within_the_spread(count: int) -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def job(i: int) -> None:
        with lock:
            seen.append(i)

    samples, _ = slow.at_once(job, count)
    assert sorted(seen) == list(range(count))
    assert max(s.due for s in samples) < slow.AT_ONCE_S


def _batch(
    wall: float, p99: float, not_success: int = 0, errors: int = 0, accepted: float = 0.5
) -> dict[str, Any]:
    return {
        "rate": 40.0, "p50_ms": 2100.0, "p95_ms": p99 - 10, "p99_ms": p99, "errors": errors,
        "lost": 0, "peak_rss_mb": 650.0, "requests": 200, "offered_rate": 0.0,
        "loadgen_lag_p99_ms": 5.0, "loadgen_lag_max_ms": 9.0, "wall_s": wall,
        "statuses": {"success": 200 - not_success}, "not_success": not_success,
        "accepted_within_s": accepted,
    }  # fmt: skip


def test_a_variants_row_has_the_median_wall_and_the_worst_batch() -> None:
    row = slow.variant_row(
        "SDK `def` handler",
        [_batch(4.0, 3000.0), _batch(6.5, 5000.0, 2, accepted=3.1), _batch(4.2, 3100.0)],
    )
    assert (row["wall_s"], row["wall_max_s"], row["walls_s"]) == (4.2, 6.5, [4.0, 6.5, 4.2])
    assert (row["accepted_within_s"], row["accepted_within_max_s"]) == (0.5, 3.1)
    assert row["p99_ms"] == 3100.0 and row["spread"]["p99_ms"] == [3000.0, 5000.0]
    assert row["not_success"] == 2  # a median never hides a failed task
    assert row["agent"] == "SDK `def` handler" and row["runs"] == 3


def test_broadcasts_report_their_durations_and_every_target_that_did_not_succeed() -> None:
    runs = [
        {"duration_s": d, "targets": 50, "succeeded": ok, "reason": ""}
        for d, ok in ((2.2, 50), (2.4, 50), (2.3, 49), (3.9, 50), (2.1, 50))
    ]
    row = slow.broadcast_row(runs, 50)
    assert (row["p50_s"], row["p99_s"], row["max_s"]) == (2.3, 3.9, 3.9)
    assert row["targets_not_succeeded"] == 1 and not row["all_succeeded"]
    # a broadcast that found fewer targets than there are instances did not reach them all
    fewer = slow.broadcast_row([{"duration_s": 2.0, "targets": 48, "succeeded": 48}], 50)
    assert fewer["targets_not_succeeded"] == 2


def _result() -> dict[str, Any]:
    sync = slow.variant_row("SDK `def` handler, time.sleep", [_batch(4.1, 3500.0)])
    plain = slow.variant_row("plain HTTP service", [_batch(6.4, 6100.0, errors=1)])
    fan_runs = [{"duration_s": d, "targets": 50, "succeeded": 50} for d in (2.2, 2.3, 2.5)]
    return {
        "meta": {"command": "python -m bench --only slow_agents broadcast50",
                 "started": "2026-12-06T18:00:00+00:00", "quick": False, "machine": "2 cores"},
        "scenarios": {}, "baselines": {}, "max_throughput": None, "details": {},
        "slow_agents": {"worker": "prefork x2", "tasks": 200, "handler_s": 2.0,
                        "submitted_within_s": 0.1, "variants": {"sync": sync, "plain": plain}},
        "broadcast50": {"worker": "prefork x2", "handler_s": 2.0, "lost": 0,
                        "warm_up": {"duration_s": 2.6}, **slow.broadcast_row(fan_runs, 50)},
    }  # fmt: skip


def test_the_slow_targets_are_the_issues() -> None:
    verdicts = {t.name: (t.value, t.limit, t.met) for t in slow_targets(_result())}
    name = "slow agents, 200 tasks of 2 s at once"
    assert verdicts[f"{name} (sync): slowest batch wall s"] == (4.1, 6.0, True)
    assert verdicts[f"{name} (plain): slowest batch wall s"] == (6.4, 6.0, False)
    assert verdicts[f"{name} (sync): tasks not ended success (lost or failed)"][2] is True
    fan = "broadcast to 50 instances of a 2 s agent"
    assert verdicts[f"{fan}: slowest of 3, s"] == (2.5, 4.0, True)
    assert verdicts[f"{fan}: targets not succeeded"][2] is True
    assert verdicts["broadcast50 run lost tasks"][2] is True
    # and they are among the run's targets
    assert {t.name for t in slow_targets(_result())} <= {t.name for t in targets(_result())}


def test_the_report_has_a_row_per_slow_agent_and_a_line_for_the_broadcasts() -> None:
    result = _result()
    text = markdown({**result, "targets": [t.as_dict() for t in targets(result)]})
    assert "`reach worker` as shipped: prefork x2" in text
    assert (
        "| SDK `def` handler, time.sleep | 1 | 4.1 | 2,100.0 | 3,500.0 | 0.5 | 0 | 0 | 650.0 |"
        in text
    )
    assert "| plain HTTP service | 1 | 6.4 | 2,100.0 | 6,100.0 | 0.5 | 1 | 0 | 650.0 |" in text
    assert (
        "to 50 instances of an agent whose `def` handler takes 2 s: duration p50 2.3 s, "
        "p99 2.5 s, max 2.5 s; every target succeeded: yes (0 of 150 not)." in text
    )
    assert "(plain): slowest batch wall s | 6.4 | ≤ 6 | **no** |" in text


def test_a_run_without_the_slow_parts_says_nothing_of_them() -> None:
    result = _result()
    del result["slow_agents"], result["broadcast50"]
    assert "Agents that think" not in markdown(result)
    assert slow_targets(result) == []
