"""The harness itself, end to end at its smallest size: every scenario runs against a
real hub on PostgreSQL and Redis, with real agent processes, and writes the contract.

This asserts what must hold at any speed (nothing lost, every scenario and baseline
present, the fault run's callers all answered); the timings are the benchmark's
business (``python -m bench``), never a test's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.flow import FLOW
from bench.report import SCENARIOS
from tests.support.stores import PG_ADMIN_DSN

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    out = tmp_path_factory.mktemp("bench")
    # a database and Redis of this run's own: never one another run (or engineer) uses
    database = f"reach_bench_smoke_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "BENCH_PG_DATABASE": database}
    if os.environ.get("REACH_TEST_REDIS_URL"):
        env["REACH_BENCH_REDIS_URL"] = os.environ["REACH_TEST_REDIS_URL"].rstrip("/") + "/12"
    try:
        run = subprocess.run(
            [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=400,
            env=env,
        )
    finally:
        with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')  # type: ignore[arg-type]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    result: dict[str, object] = json.loads((out / "latest.json").read_text())
    # a part that raised is recorded and the run goes on (bench.cli._guard): here, none may
    assert "failed" not in result["meta"], result["meta"]["failed"]  # type: ignore[index]
    result["_files"] = sorted(p.name for p in out.iterdir())
    result["_stdout"] = run.stdout
    yield result


def test_every_scenario_and_baseline_is_reported(smoke: dict[str, object]) -> None:
    scenarios = smoke["scenarios"]
    assert isinstance(scenarios, dict) and set(scenarios) == set(SCENARIOS)
    for row in scenarios.values():
        assert {"rate", "p50_ms", "p95_ms", "p99_ms", "errors", "lost", "peak_rss_mb"} <= set(row)
        assert row["rate"] > 0
        assert row["peak_rss_mb"] > 0
    assert set(smoke["baselines"]) == {"direct_http", "plain_celery"}  # type: ignore[arg-type]
    # the ladder ran and was recorded; whether its first rung held is the machine's speed
    assert isinstance(smoke["max_throughput"], float)
    steps = smoke["details"]["max_throughput_steps"]  # type: ignore[index]
    assert steps and all(step["lost"] == 0 for step in steps), steps
    assert {"latest.json", "latest.md", "latency.png", "fault.png"} <= set(smoke["_files"])  # type: ignore[arg-type]
    assert "| single_hop |" in str(smoke["_stdout"])


def test_the_run_records_the_machines_speed(smoke: dict[str, object]) -> None:
    calibration = smoke["meta"]["calibration"]  # type: ignore[index]
    assert calibration["calibration_ms"] > 0
    assert "Machine calibration:" in str(smoke["_stdout"])
    # and the hub's own path on it, which the calibration's pure Python can miss
    hot = smoke["meta"]["hot_path"]  # type: ignore[index]
    assert hot["rounds"] == 10
    # heartbeat: an idle beat taken into the API's batch, with its share of the flush;
    # heartbeat_direct: a beat written alone (a busy or returning instance's)
    ops = {"submit", "publish", "deliver", "heartbeat", "heartbeat_direct", "register"}
    assert set(hot["cpu_ms"]) == ops
    assert all(ms > 0 for ms in hot["cpu_ms"].values()), hot
    assert "Hot path before any hub started (`python -m bench.micro --rounds 10`" in str(
        smoke["_stdout"]
    )
    # and the PostgreSQL it ran on, read from the server itself
    pg = smoke["meta"]["postgres"]  # type: ignore[index]
    assert pg["autovacuum"] in ("on", "off") and pg["server_version"][:1].isdigit(), pg
    assert f"autovacuum {pg['autovacuum']}, track_counts" in str(smoke["_stdout"])


def test_cost_per_message_and_the_generators_lag_are_measured(smoke: dict[str, object]) -> None:
    cost = smoke["cost"]
    assert cost["lost"] == 0 and cost["errors"] == 0, cost  # type: ignore[index]
    per_role = cost["cpu_ms_per_msg"]  # type: ignore[index]
    assert per_role["api"] > 0 and per_role["worker"] > 0, per_role
    for row in smoke["scenarios"].values():  # type: ignore[attr-defined]
        assert row["loadgen_lag_max_ms"] is not None and row["loadgen_lag_max_ms"] >= 0
    # the baselines ran with the hub stopped, each ladder recorded
    for row in smoke["baselines"].values():  # type: ignore[attr-defined]
        assert row["ladder"]["median"] == row["max_throughput"]


def test_reach_tokens_cost_is_measured_on_and_off(smoke: dict[str, object]) -> None:
    tokens = smoke["tokens"]
    assert tokens["saturated_on"] and tokens["saturated_off"], tokens  # type: ignore[index]
    for mode in ("on", "off"):
        for run in tokens["runs"][mode]:  # type: ignore[index]
            assert run["lost"] == 0 and run["errors"] == 0 and run["saturated_errors"] == 0, run
    assert "| on (hub signs, agent verifies) |" in str(smoke["_stdout"])


def test_channel_delivery_is_measured_beside_http(smoke: dict[str, object]) -> None:
    pairs = smoke["details"]["channel"]  # type: ignore[index]
    for round_ in pairs["rounds"]:
        assert round_["lost"] == 0 and round_["errors"] == 0, round_
        # both sides of each pair answered: an agent that never took work has no p50
        assert round_["http_p50_ms"] and round_["channel_p50_ms"], round_
        assert round_["http_saturated"] and round_["channel_saturated"], round_
        assert round_["http_cpu_ms_per_msg"] and round_["channel_cpu_ms_per_msg"], round_
    assert "channel ÷ HTTP p50" in str(smoke["_stdout"])


def test_semantic_part_says_why_it_is_not_measured_without_the_model(
    smoke: dict[str, object],
) -> None:
    """This venv has no agent-reach[semantic]: the part is reported as skipped, with the
    reason (tests/semantic/test_bench_semantic.py measures it where the model is)."""
    assert "semantic extra is not installed" in smoke["semantic"]["skipped"]  # type: ignore[index]
    assert "Semantic matching: not measured" in str(smoke["_stdout"])


def test_no_accepted_task_is_lost(smoke: dict[str, object]) -> None:
    for name, row in smoke["scenarios"].items():  # type: ignore[attr-defined]
        assert row["lost"] == 0, name


def test_every_task_to_an_agent_that_thinks_ends_success(smoke: dict[str, object]) -> None:
    """Slow agents (SDK def and async def handlers, a plain HTTP service) and a broadcast
    to many instances of one, on a hub of their own: nothing lost, nothing failed."""
    variants = smoke["slow_agents"]["variants"]  # type: ignore[index]
    assert set(variants) == {"sync", "async", "plain"}
    for name, row in variants.items():
        assert row["not_success"] == row["errors"] == row["lost"] == 0, (name, row["statuses"])
    fan = smoke["broadcast50"]
    assert fan["all_succeeded"] and fan["lost"] == 0, fan["runs"]  # type: ignore[index]
    assert "| slow_agents |" in str(smoke["_stdout"])
    assert "broadcast50: " in str(smoke["_stdout"])


def test_fault_run_callers_all_get_a_definitive_answer(smoke: dict[str, object]) -> None:
    fault = smoke["details"]["fault"]  # type: ignore[index]
    outcomes = fault["outcomes"]
    assert set(outcomes) <= {"success", "fast_failure", "dead"}, outcomes
    assert outcomes.get("success", 0) > 0
    # refusals and dead letters are columns of their own, never counted as successes
    row = smoke["scenarios"]["fault"]  # type: ignore[index]
    assert fault["successes"] == outcomes.get("success", 0)
    assert fault["fast_refusals"] == outcomes.get("fast_failure", 0)
    assert fault["dead_letters"] == outcomes.get("dead", 0)
    assert row["requests"] == sum(outcomes.values()) and row["errors"] == 0
    assert "| successes | fast refusals | dead letters |" in str(smoke["_stdout"])
    # the outage was seen: the agent's timeline has requests before it and none is lost
    assert fault["normal_rate"] > 0
    assert len(fault["timeline_per_s"]) >= fault["outage_to_s"]


def _flow(smoke: dict[str, object], name: str) -> dict[str, Any]:
    flow = smoke["flow"]
    assert isinstance(flow, dict) and set(flow) == set(FLOW), flow
    row: dict[str, Any] = flow[name]
    return row


def test_flow_control_scenarios_are_reported(smoke: dict[str, object]) -> None:
    for name in FLOW:
        assert _flow(smoke, name)["lost"] == 0, name
        assert f"| {name} |" in str(smoke["_stdout"])
    assert "retry_storm.png" in smoke["_files"]  # type: ignore[operator]
    names = {t["name"] for t in smoke["targets"]}  # type: ignore[attr-defined]
    assert any(n.startswith("retry storm:") for n in names)
    assert any(n.startswith("backpressure:") for n in names)


def test_retry_storm_ends_every_accepted_reach_and_dead_letters_none_for_the_breaker(
    smoke: dict[str, object],
) -> None:
    storm = _flow(smoke, "retry_storm")
    assert storm["dead_lettered_breaker"] == 0, storm["dead_letter_kinds"]
    assert storm["not_ended"] == 0 and storm["lost"] == 0, storm["send_outcomes"]
    outcomes = storm["send_outcomes"]
    assert outcomes.get("success", 0) > 0, outcomes
    # every send got a definitive answer: a success, a refusal or a stated failure
    assert all(k == "success" or k.startswith(("refused:", "failed:")) for k in outcomes), outcomes
    # the agent was reached before the outage and counted through it (over HTTP)
    assert storm["normal_rate"] > 0
    assert len(storm["timeline_per_s"]) > storm["outage_to_s"]


def test_loop_stops_at_the_first_repeat_and_raises_the_alert(smoke: dict[str, object]) -> None:
    loop = _flow(smoke, "loop")
    assert loop["tasks_created"] <= 3, loop
    assert loop["stopped_at_first_repeat"], loop
    assert "loop-a" in loop["loop_message"], loop["loop_message"]
    assert loop["root_outcome"] != "success"  # the root ends with the loop as its failure
    assert loop["alert_raised"], loop
    assert loop["alert_root_outcomes"] == {"success": 2 * loop["alert_roots"]}


def test_priority_run_completes_online_and_background(smoke: dict[str, object]) -> None:
    prio = _flow(smoke, "priority")
    assert prio["unloaded"]["errors"] == 0 and prio["loaded"]["errors"] == 0, prio
    assert prio["unloaded"]["requests"] > 0 and prio["loaded"]["requests"] > 0
    assert prio["background_statuses"] == {"success": prio["background_submitted"]}, prio


def test_backpressure_accepted_all_complete_and_refusals_say_when(
    smoke: dict[str, object],
) -> None:
    bp = _flow(smoke, "backpressure")
    assert bp["accepted"] > 0 and bp["accepted_not_completed"] == 0, bp["statuses"]
    assert bp["refused_backpressure"] > 0 and bp["refused_other"] == {}, bp
    assert bp["refusals_unusable"] == 0, bp["unusable_example"]
    assert bp["retry_after_ms_min"] > 0 and bp["retry_after_ms_max"] <= 60_000
    assert bp["limit_seen"] == [bp["max_queue"]] == [100]
    assert bp["depth_max"] >= bp["max_queue"]
    # the SDK raises reach.Backpressure carrying the figures, and a caller that honours
    # retry_after_ms gets its task in
    assert bp["sdk"]["raised"] == "Backpressure" and bp["sdk"]["retry_after_ms"] > 0, bp["sdk"]
    assert bp["polite_caller"]["accepted"], bp["polite_caller"]
