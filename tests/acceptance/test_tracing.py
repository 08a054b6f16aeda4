"""OpenTelemetry across hops, through real processes: api, worker and beat, two SDK agents
and an SDK caller export over OTLP/HTTP to a receiver on loopback (decoded with
``opentelemetry-proto``). A two-hop reach (caller -> agent A, whose handler reaches agent
B) is one trace whose spans form one tree; a failing task's retries are sibling spans under
its task's span; a DAG run is one trace. An API process with tracing
off (``OTEL_SDK_DISABLED``) exports nothing and never imports the OpenTelemetry SDK, yet
hands the caller's ``traceparent`` on.

One hub for the module, on PostgreSQL (tracing does not depend on the store; the DAG
run's stored context is in the migrations' tests on both).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.support.otlp_receiver import Receiver, Span, otlp_receiver
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import AgentProcess, HubProcess, Stack, wait_http_ok
from tests.support.stores import POSTGRES, fresh_store
from tests.support.waiting import wait_until

RECEIVER_PORT = free_port()
OTEL = {
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{RECEIVER_PORT}",
    "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: spans leave within a moment, not 5 s
}
STACK_SETTINGS = {
    **OTEL,
    "REACH_ROUTER__MAX_RETRY": "2",  # a failing task: three attempts, soon
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "0.5",
}
A, B, FAILING = "tr-a", "tr-b", "tr-fail"

CALLER = """
import sys
import reach
from opentelemetry import trace
from reach.sdk import telemetry

assert telemetry.configure("tr-caller")
hub, agent = sys.argv[1], sys.argv[2]
with trace.get_tracer("test").start_as_current_span("caller") as span:
    sub = reach.send(agent_id=agent, method="work.do", payload={"n": 1}, hub=hub)
    reach.wait_for_result(sub.task_id, timeout=60, hub=hub)
print(f"{span.get_span_context().trace_id:032x} {sub.task_id}")
telemetry.flush()
"""


@pytest.fixture(scope="module", params=[POSTGRES])
def shared_store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with fresh_store(request.param, tmp_path_factory.mktemp("store"), request) as url:
        yield url


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver(RECEIVER_PORT) as r:
        yield r


@pytest.fixture(scope="module")
def hub(
    receiver: Receiver, shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The traced hub with agent B (answers) and agent A (reaches B from its handler)."""
    logs = tmp_path_factory.mktemp("agents")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REACH_", "OTEL_"))}
    env.update(OTEL)
    agents = [
        AgentProcess(shared_stack.url, logs / "b.log", agent_id=B, env=env),
        AgentProcess(
            shared_stack.url,
            logs / "a.log",
            agent_id=A,
            mode="forward",
            extra=("--forward-to", B),
            env=env,
        ),
        AgentProcess(shared_stack.url, logs / "f.log", agent_id=FAILING, mode="fail", env=env),
    ]
    try:
        for agent_id in (A, B, FAILING):
            wait_until(lambda a=agent_id: shared_stack.instances(a), timeout=30, what=agent_id)
        yield shared_stack
    finally:
        for agent in agents:
            agent.stop()


def one_tree(spans: list[Span]) -> bool:
    """All spans in one trace, one root, every parent among them."""
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_id is None]
    return (
        len({s.trace_id for s in spans}) == 1
        and len(roots) == 1
        and all(s.parent_id in ids for s in spans if s.parent_id is not None)
    )


def named(spans: list[Span], name: str, **attrs: object) -> list[Span]:
    return [
        s for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in attrs.items())
    ]  # fmt: skip


def parent(spans: list[Span], child: Span) -> Span:
    return next(s for s in spans if s.span_id == child.parent_id)


def accepted_trace_id(stack: Stack, task_id: str) -> object:
    events = requests.get(f"{stack.url}/v1/tasks/{task_id}/events", timeout=5).json()["events"]
    return next(e for e in events if e["kind"] == "accepted")["detail"].get("trace_id")


def test_a_two_hop_reach_is_one_trace(hub: Stack, receiver: Receiver) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REACH_", "OTEL_"))}
    env.update(OTEL)
    out = subprocess.run(
        [sys.executable, "-c", CALLER, hub.url, A],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=90, check=True,
    ).stdout.split()  # fmt: skip
    trace_id, task_id = out[-2], out[-1]

    def complete() -> list[Span] | None:
        spans = receiver.of_trace(trace_id)
        handles = named(spans, "reach.handle work.do")
        want = (len(named(spans, "reach.task work.do")), len(handles))
        return spans if want == (2, 2) and one_tree(spans) else None

    spans = wait_until(complete, timeout=30, what=f"the spans of trace {trace_id}")
    # caller <- POST <- task A <- attempt A <- handler A <- POST <- task B <- attempt B <- handler B
    (handle_b,) = named(spans, "reach.handle work.do", **{"reach.agent_id": B})
    chain = [handle_b]
    while chain[-1].parent_id is not None:
        chain.append(parent(spans, chain[-1]))
    assert [(s.name, s.service) for s in chain] == [
        ("reach.handle work.do", B),
        ("reach.attempt work.do", "reach-worker"),
        ("reach.task work.do", "reach-api"),
        ("POST /v1/tasks", "reach-api"),
        ("reach.handle work.do", A),
        ("reach.attempt work.do", "reach-worker"),
        ("reach.task work.do", "reach-api"),
        ("POST /v1/tasks", "reach-api"),
        ("caller", "tr-caller"),
    ]
    attempt_a = chain[5]
    assert attempt_a.attributes["reach.task_id"] == task_id
    assert attempt_a.attributes["reach.attempt"] == 1
    assert attempt_a.attributes["reach.agent_id"] == A
    assert attempt_a.attributes["reach.instance_id"] == hub.instances(A)[0]["instance_id"]
    assert attempt_a.attributes["reach.outcome"] == "success"
    assert accepted_trace_id(hub, task_id) == trace_id
    page = requests.get(f"{hub.url}/ui/tasks/{task_id}", timeout=10)
    assert page.status_code == 200 and trace_id in page.text


def test_retries_are_sibling_spans_under_the_task(hub: Stack, receiver: Receiver) -> None:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    r = requests.post(
        f"{hub.url}/v1/tasks",
        json={"agent_id": FAILING, "method": "work.do", "payload": {}},
        headers={"traceparent": f"00-{trace_id}-{span_id}-01"},
        timeout=10,
    )
    assert r.status_code == 201, r.text

    def attempts() -> list[Span] | None:
        found = named(receiver.of_trace(trace_id), "reach.attempt work.do")
        return found if len(found) == 3 else None

    tried = wait_until(attempts, timeout=60, what="three attempts")
    spans = receiver.of_trace(trace_id)
    (task,) = named(spans, "reach.task work.do")
    assert {a.parent_id for a in tried} == {task.span_id}  # siblings under the task
    assert sorted(a.attributes["reach.attempt"] for a in tried) == [1, 2, 3]
    assert {a.attributes["reach.outcome"] for a in tried} == {"transient"}
    assert parent(spans, task).name == "POST /v1/tasks"
    assert parent(spans, task).parent_id == span_id  # the caller's context, continued


def test_a_dag_run_is_one_trace(hub: Stack, receiver: Receiver) -> None:
    nodes = [
        {"id": "first", "agent_id": B, "method": "work.do", "payload": {"n": 1}},
        {"id": "second", "agent_id": B, "method": "work.do", "dependencies": ["first"]},
    ]
    r = requests.post(
        f"{hub.url}/api/v1/dag-runs",
        json={"dag": {"name": "traced", "nodes": nodes}, "input": {}},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]

    def complete() -> list[Span] | None:
        runs = named(receiver.all(), "reach.dag_run traced", **{"reach.dag_run_id": run_id})
        if not runs:
            return None
        spans = receiver.of_trace(runs[0].trace_id)
        tasks = named(spans, "reach.task work.do")
        handles = named(spans, "reach.handle work.do")
        return spans if (len(tasks), len(handles)) == (2, 2) and one_tree(spans) else None

    spans = wait_until(complete, timeout=60, what=f"the spans of DAG run {run_id}")
    (run,) = named(spans, "reach.dag_run traced")
    assert parent(spans, run).name == "POST /api/v1/dag-runs"
    assert {t.parent_id for t in named(spans, "reach.task work.do")} == {run.span_id}


def test_tracing_off_exports_nothing_and_passes_the_trace_on(
    hub: Stack, receiver: Receiver, tmp_path: Path
) -> None:
    """A second API process on the same store, tracing off: the task it accepts still
    continues the caller's trace in the (traced) worker and agent."""
    env = {k: v for k, v in hub.env.items() if not k.startswith("OTEL_")}
    env.update(
        OTEL_SDK_DISABLED="true",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=OTEL["OTEL_EXPORTER_OTLP_ENDPOINT"],
        OTEL_SERVICE_NAME="reach-api-off",
        PYTHONPROFILEIMPORTTIME="1",  # every import, to stderr (the log)
    )
    port = free_port()
    api = HubProcess(["api", "--port", str(port)], env, tmp_path / "api-off.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(url + "/healthz", api)
        trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
        r = requests.post(
            f"{url}/v1/tasks?wait=30",
            json={"agent_id": B, "method": "work.do", "payload": {"n": 2}},
            headers={"traceparent": f"00-{trace_id}-{span_id}-01"},
            timeout=40,
        )
        assert r.status_code == 201 and r.json()["status"] == "success", r.text
        task_id = r.json()["task_id"]

        def continued() -> list[Span] | None:
            # each process exports on its own schedule: the agent's span may come first
            spans = receiver.of_trace(trace_id)
            done = named(spans, "reach.handle work.do") and named(spans, "reach.attempt work.do")
            return spans if done else None

        spans = wait_until(continued, timeout=30, what="the worker's and agent's spans")
        (attempt,) = named(spans, "reach.attempt work.do")
        assert attempt.parent_id == span_id  # no task span: the caller's context as it came
        assert accepted_trace_id(hub, task_id) == trace_id
    finally:
        api.stop()
    assert not [s for s in receiver.all() if s.service == "reach-api-off"]
    imported = api.log_path.read_text(errors="replace")
    assert "reach.hub.tracing" in imported  # the import log is there
    # the tracing SDK and the exporter never load (redis-py imports the SDK's metrics
    # package for its own observability when the SDK is installed: not ours)
    assert "opentelemetry.sdk.trace" not in imported
    assert "opentelemetry.exporter" not in imported
