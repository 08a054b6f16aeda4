"""The demo agents the shipped DAGs need (examples/agents/sales_agent.py, knowledge_agent.py,
chat_agent.py) as real processes behind a real hub, and `reach up` starting all of them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

import reach
from tests.support.demo_agents import running
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

DEMO_AGENTS = {
    "sales-agent-01": "sales_agent.py",
    "knowledge-agent-01": "knowledge_agent.py",
    "chat-agent-01": "chat_agent.py",
}


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    """Every test here shares one hub per store."""
    return shared_stack


@pytest.fixture(scope="module")
def demo_agents(
    shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Path]]:
    """The three demo agents, started once per hub, online; yields their log files."""
    with running(shared_stack, DEMO_AGENTS, tmp_path_factory.mktemp("demo-agents")) as logs:
        yield logs


def run(stack: Stack, method: str, payload: dict[str, object]) -> reach.TaskResult:
    sub = reach.send(capability=method, method=method, payload=payload, hub=stack.url)
    return reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url)


def test_sales_fetch(stack: Stack, demo_agents: dict[str, Path]) -> None:
    result = run(stack, "sales.fetch", {"region": "east"})
    assert result.agent_id == "sales-agent-01"
    rows, total = result.data["rows"], result.data["total"]
    assert len(rows) == 6 and all(set(r) == {"month", "revenue"} for r in rows)
    assert total == sum(r["revenue"] for r in rows)
    # deterministic: the same region gives the same figures; another region other figures
    assert run(stack, "sales.fetch", {"region": "east"}).data == result.data
    assert run(stack, "sales.fetch", {"region": "west"}).data["total"] != total

    with pytest.raises(reach.BusinessError) as failed:
        run(stack, "sales.fetch", {"region": "south"})
    assert failed.value.code == 404 and "south" in failed.value.message

    # not in the schema's enum: refused by the hub at submit, nothing is queued
    with pytest.raises(reach.InvalidPayload):
        reach.send(
            capability="sales.fetch",
            method="sales.fetch",
            payload={"region": "nowhere"},
            hub=stack.url,
        )
    with pytest.raises(reach.InvalidPayload):
        reach.send(capability="sales.fetch", method="sales.fetch", payload={}, hub=stack.url)


def test_knowledge_explain(stack: Stack, demo_agents: dict[str, Path]) -> None:
    sales = run(stack, "sales.fetch", {"region": "west"}).data
    payload = {"region": "west", "rows": sales["rows"], "total": sales["total"]}

    plain = run(stack, "knowledge.explain", payload)
    assert plain.agent_id == "knowledge-agent-01"
    assert isinstance(plain.data["explanation"], str) and "west" in plain.data["explanation"]
    pricing = run(stack, "knowledge.explain", {**payload, "angle": "pricing"}).data
    assert "Pricing" in pricing["explanation"]
    east = run(stack, "sales.fetch", {"region": "east"}).data
    supply_east = {"region": "east", "angle": "supply", **east}
    assert run(stack, "knowledge.explain", supply_east).data["explanation"]

    # the diamond's failure branch: the supply review of west fails
    with pytest.raises(reach.BusinessError) as failed:
        run(stack, "knowledge.explain", {**payload, "angle": "supply"})
    assert failed.value.code == 503 and failed.value.message == "supply data unavailable"

    with pytest.raises(reach.InvalidPayload):  # angle outside the enum, rows missing
        reach.send(
            capability="knowledge.explain",
            method="knowledge.explain",
            payload={"region": "west", "total": 1, "angle": "weather"},
            hub=stack.url,
        )


def test_chat_compose(stack: Stack, demo_agents: dict[str, Path]) -> None:
    reply = run(
        stack,
        "chat.compose",
        {"tone": "concise", "region": "east", "total": 1234, "explanations": ["Demand grew."]},
    )
    assert reply.agent_id == "chat-agent-01"
    assert "1,234" in reply.data["reply"] and "Demand grew." in reply.data["reply"]
    escalation = run(
        stack,
        "chat.compose",
        {
            "tone": "escalation",
            "region": "west",
            "error": {"code": 503, "message": "supply data unavailable"},
        },
    )
    assert "supply data unavailable" in escalation.data["reply"]
    with pytest.raises(reach.InvalidPayload):  # tone is required
        reach.send(
            capability="chat.compose", method="chat.compose", payload={"region": "x"}, hub=stack.url
        )


def test_orders_cancel_waits_for_a_human_then_is_delivered_once(
    stack: Stack, demo_agents: dict[str, Path]
) -> None:
    """The demo's dangerous capability (``danger_level: high``) parks until approved."""
    order = f"A-{free_port()}"  # unique per run: the agent's log is shared by the module
    sub = reach.send(
        capability="orders.cancel",
        method="orders.cancel",
        payload={"order_id": order, "reason": "customer asked"},
        hub=stack.url,
    )
    assert reach.get_task(sub.task_id, hub=stack.url)["status"] == "awaiting_approval"
    pending = requests.get(f"{stack.url}/api/v1/approvals", timeout=5).json()["approvals"]
    (approval,) = [a for a in pending if a["task_id"] == sub.task_id]
    assert approval["capability"] == "orders.cancel" and approval["status"] == "pending"
    # sales.fetch on the same agent is not dangerous: delivered at once, as before
    assert run(stack, "sales.fetch", {"region": "east"}).agent_id == "sales-agent-01"
    log = demo_agents["sales-agent-01"]
    assert f"cancelling order {order}" not in log.read_text(errors="replace")

    r = requests.post(
        f"{stack.url}/api/v1/approvals/{approval['approval_id']}/approve",
        json={"name": "Demo Approver"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    result = reach.wait_for_result(sub.task_id, timeout=30, hub=stack.url)
    assert result.agent_id == "sales-agent-01"
    assert result.data == {"order_id": order, "status": "cancelled"}
    wait_until(
        lambda: f"cancelling order {order}" in log.read_text(errors="replace"),
        timeout=10,
        what="the agent's log of the cancellation",
    )
    assert log.read_text(errors="replace").count(f"cancelling order {order}") == 1


# -- the shipped sales DAG, run on the canvas through the real hub ---------------------------


def start_dag(stack: Stack, name: str, run_input: dict[str, object]) -> dict[str, object]:
    import json

    spec = json.loads((REPO / "dags" / f"{name}.json").read_text())
    r = requests.post(
        f"{stack.url}/api/v1/dag-runs", json={"dag": spec, "input": run_input}, timeout=10
    )
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    return dict(
        wait_until(
            lambda: (
                (v := requests.get(f"{stack.url}/api/v1/dag-runs/{run_id}", timeout=5).json())
                and v["status"] != "running"
                and v
            ),
            timeout=60,
            interval=0.25,
            what=f"DAG run {run_id} to finish",
        )
    )


def test_sales_flow_runs_end_to_end_across_three_agents(
    stack: Stack, demo_agents: dict[str, Path]
) -> None:
    run = start_dag(stack, "sales_analysis_flow", {"region": "east"})
    nodes = {n["node_id"]: n for n in run["nodes"]}  # type: ignore[attr-defined]
    assert run["status"] == "success", run
    assert [nodes[n]["status"] for n in ("fetch_sales_data", "analyze_cause", "compose_reply")] == [
        "success"
    ] * 3
    assert nodes["fetch_sales_data"]["data"]["total"] > 0
    assert "east" in nodes["compose_reply"]["data"]["reply"].lower()
    # each node was one reach task, traced under the run
    task = requests.get(
        f"{stack.url}/v1/tasks/{nodes['analyze_cause']['task_id']}", timeout=5
    ).json()
    assert task["trace"]["root_id"] == run["run_id"]
    assert task["status"] == "success"


def test_failed_fetch_skips_its_dependents_and_the_run_says_why(
    stack: Stack, demo_agents: dict[str, Path]
) -> None:
    run = start_dag(stack, "sales_analysis_flow", {"region": "south"})
    nodes = {n["node_id"]: n for n in run["nodes"]}  # type: ignore[attr-defined]
    assert run["status"] == "failed"
    assert nodes["fetch_sales_data"]["status"] == "failed"
    assert nodes["fetch_sales_data"]["error"]["code"] == 404
    assert nodes["analyze_cause"]["status"] == "skipped"
    assert "condition not met" in nodes["analyze_cause"]["reason"]
    assert nodes["compose_reply"]["status"] == "skipped"
    assert "fetch_sales_data" in str(run["reason"])


@pytest.mark.parametrize(
    ("region", "review_b", "escalate"),
    [("east", "success", "skipped"), ("west", "failed", "success")],
)
def test_shipped_diamond_runs_its_failure_branch_only_on_failure(
    stack: Stack, demo_agents: dict[str, Path], region: str, review_b: str, escalate: str
) -> None:
    run = start_dag(stack, "diamond_review", {"region": region})
    nodes = {n["node_id"]: n for n in run["nodes"]}  # type: ignore[attr-defined]
    assert nodes["review_a"]["status"] == "success"
    assert (nodes["review_b"]["status"], nodes["escalate"]["status"]) == (review_b, escalate)


def test_cli_runs_a_dag_and_shows_it(stack: Stack, demo_agents: dict[str, Path]) -> None:
    env = {**stack.env, "COLUMNS": "200"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "reach",
            "dag",
            "run",
            "dags/sales_analysis_flow.json",
            "--input",
            '{"region": "north"}',
            "--hub",
            stack.url,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "compose_reply" in out.stdout and "success" in out.stdout
    run_id = next(w for w in out.stdout.split() if w.startswith("dag-"))
    shown = subprocess.run(
        [sys.executable, "-m", "reach", "dag", "show", run_id, "--json", "--hub", stack.url],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(shown.stdout)["status"] == "success"


@pytest.mark.parametrize(
    ("mutate", "node"),
    [
        (lambda d: d["nodes"][0].update(dependencies=["compose_reply"]), "fetch_sales_data"),
        (lambda d: d["nodes"][1].update(capability="no.such.capability"), "analyze_cause"),
    ],
    ids=["cycle", "unknown-target"],
)
def test_invalid_dags_are_refused_naming_the_node(stack: Stack, mutate: object, node: str) -> None:
    spec = json.loads((REPO / "dags" / "sales_analysis_flow.json").read_text())
    mutate(spec)  # type: ignore[operator]
    r = requests.post(f"{stack.url}/api/v1/dag-runs", json={"dag": spec, "input": {}}, timeout=10)
    assert r.status_code == 422
    assert r.json()["type"] == "urn:agent-reach:problem:dag-error"
    assert r.json()["node"] == node


def test_hand_composed_canvas_is_tracked_by_the_hub(
    stack: Stack, demo_agents: dict[str, Path]
) -> None:
    from celery import chain, chord

    from reach.hub.settings import load_settings
    from reach.worker.factory import create_celery

    app = create_celery(load_settings(environ=stack.env))

    def step(method: str, payload: dict[str, object]) -> object:
        return app.signature(
            "reach.reach_task",
            args=(method, payload),
            kwargs={"capability": method},
            immutable=True,
        )

    compose = {"tone": "concise", "region": "east"}
    flow = chain(
        step("sales.fetch", {"region": "east"}),
        chord(
            [step("chat.compose", compose), step("chat.compose", {**compose, "total": 1})],
            step("chat.compose", {**compose, "tone": "detailed"}),
        ),
    )
    try:
        last = flow.apply_async().get(timeout=90)
    finally:
        app.close()
    assert last["status"] == "success", last
    assert "reply" in last["data"]
    tracked = requests.get(f"{stack.url}/v1/tasks/{last['task_id']}", timeout=5).json()
    assert tracked["status"] == "success" and tracked["method"] == "chat.compose"
    events = requests.get(f"{stack.url}/v1/tasks/{last['task_id']}/events", timeout=5).json()
    assert [e["kind"] for e in events["events"]][-1] == "terminal_success"
