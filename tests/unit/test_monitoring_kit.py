"""The monitoring kit (deploy/grafana, deploy/prometheus): its PromQL is valid for
Prometheus's own checker (Debian's promtool, which scripts/test installs), and it covers
what operators were promised. That the hub exports every metric it names is checked
against a running hub in tests/acceptance/test_observability.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.monitoring import (
    ALERTS,
    alert_rules,
    dashboard,
    dashboard_queries,
    metric_names,
    panels,
)

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def promtool_check_rules(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


def test_the_alert_rules_pass_promtool() -> None:
    done = promtool_check_rules(ALERTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_every_dashboard_query_is_promql_promtool_accepts(tmp_path: Path) -> None:
    # promtool checks expressions in rule files: each query as a recording rule
    rules = [
        {"record": f"agentreach:dashboard_query_{n}", "expr": query}
        for n, query in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = promtool_check_rules(path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_broken_query_is_refused(tmp_path: Path) -> None:
    """The check above can fail: promtool refuses PromQL that does not parse."""
    path = tmp_path / "broken.yml"
    rule = {"record": "agentreach:broken", "expr": "sum by (agent_id (agentreach_reach_score)"}
    path.write_text(yaml.safe_dump({"groups": [{"name": "broken", "rules": [rule]}]}))
    assert promtool_check_rules(path).returncode != 0


def test_the_alerts_cover_what_operators_were_promised() -> None:
    names = {rule["alert"] for rule in alert_rules()}
    assert names == {
        "AgentReachDeadLettersRising",
        "AgentReachBreakerOpen",
        "AgentReachInstanceOffline",
        "AgentReachHeartbeatLost",
        "AgentReachBacklogGrowing",
        "AgentReachApprovalsWaiting",
    }
    for rule in alert_rules():
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert rule["labels"]["severity"] in ("info", "warning", "critical")


@pytest.mark.parametrize(
    ("topic", "metric"),
    [
        ("throughput", "agentreach_tasks_total"),
        ("throughput", "agentreach_router_delivery_total"),
        ("latency by outcome", "agentreach_router_delivery_seconds_bucket"),
        ("queue depths", "agentreach_tasks_open"),
        ("breakers", "agentreach_breaker_open"),
        ("dead letters", "agentreach_router_dead_letter_total"),
        ("fleet ReachScore", "agentreach_reach_score"),
        ("heartbeat age", "agentreach_heartbeat_age_seconds"),
    ],
)
def test_the_dashboard_shows(topic: str, metric: str) -> None:
    assert metric in metric_names(dashboard_queries()), topic


def test_latency_is_drawn_by_outcome() -> None:
    latency = [q for q in dashboard_queries() if "agentreach_router_delivery_seconds_bucket" in q]
    assert latency and all("outcome" in q for q in latency)


def test_the_dashboard_imports_into_grafana() -> None:
    board = dashboard()
    assert board["uid"] == "agent-reach" and board["title"]
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for panel in panels(board):
        place = panel["gridPos"]
        assert place["x"] + place["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
