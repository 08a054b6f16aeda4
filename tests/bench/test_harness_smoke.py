"""The harness itself, end to end at its smallest size: every scenario runs against a
real hub on PostgreSQL and Redis, with real agent processes, and writes the contract.

This asserts what must hold at any speed (nothing lost, every scenario and baseline
present, the fault run's callers all answered); the timings are the benchmark's
business (``python -m bench``), never a test's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report import SCENARIOS

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("bench")
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    result: dict[str, object] = json.loads((out / "latest.json").read_text())
    result["_files"] = sorted(p.name for p in out.iterdir())
    result["_stdout"] = run.stdout
    return result


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


def test_reach_tokens_cost_is_measured_on_and_off(smoke: dict[str, object]) -> None:
    tokens = smoke["tokens"]
    assert tokens["saturated_on"] and tokens["saturated_off"], tokens  # type: ignore[index]
    for mode in ("on", "off"):
        for run in tokens["runs"][mode]:  # type: ignore[index]
            assert run["lost"] == 0 and run["errors"] == 0 and run["saturated_errors"] == 0, run
    assert "| on (hub signs, agent verifies) |" in str(smoke["_stdout"])


def test_no_accepted_task_is_lost(smoke: dict[str, object]) -> None:
    for name, row in smoke["scenarios"].items():  # type: ignore[attr-defined]
        assert row["lost"] == 0, name


def test_fault_run_callers_all_get_a_definitive_answer(smoke: dict[str, object]) -> None:
    fault = smoke["details"]["fault"]  # type: ignore[index]
    outcomes = fault["outcomes"]
    assert set(outcomes) <= {"success", "fast_failure", "dead"}, outcomes
    assert outcomes.get("success", 0) > 0
    # the outage was seen: the agent's timeline has requests before it and none is lost
    assert fault["normal_rate"] > 0
    assert len(fault["timeline_per_s"]) >= fault["outage_to_s"]
