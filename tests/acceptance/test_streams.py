"""Progress streams through real processes (api, worker, beat, a progress-reporting agent)
on SQLite (embedded broker: streams poll) and PostgreSQL (Redis: streams are woken by
the completion bus).

A task's stream sends its state, every status change and progress report in order and
its result, then closes; a reconnect with ``Last-Event-ID`` gets exactly what it
missed; fifty streams of one task all get every event while the API reads the store a
few times per event, not fifty; DAG-run and broadcast streams send node states and
answers; the SDK iterator and ``reach tasks watch`` follow a task to its end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

import reach
from reach.sdk.stream import parse_sse
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.progress_agent import ProgressAgentProcess
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

STACK_SETTINGS = {"REACH_SERVER__STREAM_PING_S": "1"}
PROBLEM = "urn:agent-reach:problem:"


@pytest.fixture(scope="module")
def agents(shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    home = tmp_path_factory.mktemp("agents")
    procs = [
        ProgressAgentProcess(shared_stack.url, home / f"{name}.log", free_port(), name, "prog")
        for name in ("progress", "progress-b")
    ]
    try:
        for name in ("progress", "progress-b"):
            wait_until(lambda n=name: shared_stack.instances(n), timeout=30, what=name)
        yield
    finally:
        for p in procs:
            p.stop()


def submit(stack: Stack, **payload: Any) -> str:
    r = requests.post(
        f"{stack.url}/v1/tasks",
        json={"agent_id": "progress", "method": "work.do", "payload": payload},
        timeout=10,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["task_id"])


def events_of(
    url: str, headers: dict[str, str] | None = None, *, stop: Any = None, timeout: float = 30
) -> list[dict[str, Any]]:
    """Read a stream until the hub closes it (or ``stop(event)`` says so)."""
    got: list[dict[str, Any]] = []
    with requests.get(url, headers=headers or {}, stream=True, timeout=(3, timeout)) as r:
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        for kind, data, event_id in parse_sse(r.iter_content(chunk_size=None)):
            event = {"kind": kind, "data": json.loads(data), "id": int(event_id or -1)}
            got.append(event)
            if stop is not None and stop(event):
                break
    return got


def test_a_task_stream_sends_state_status_progress_and_result_then_closes(
    shared_stack: Stack, agents: None
) -> None:
    task_id = submit(shared_stack, steps=4, interval=0.15)
    started = time.monotonic()
    events = events_of(f"{shared_stack.url}/v1/tasks/{task_id}/stream")
    assert time.monotonic() - started < 20
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "state" and kinds[-1] == "result", kinds
    assert set(kinds[1:-1]) <= {"status", "progress"}, kinds
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids), ids  # monotonic
    progress = [e["data"]["message"] for e in events if e["kind"] == "progress"]
    assert progress == ["step 1", "step 2", "step 3", "step 4"]
    assert [e["data"]["progress"] for e in events if e["kind"] == "progress"] == [
        0.25,
        0.5,
        0.75,
        1.0,
    ]
    result = events[-1]["data"]
    assert result["status"] == "success" and result["result"] == {"steps": 4, "by": "progress"}
    # the ids are the stored events' ids: the same order as the audit trail
    stored = shared_stack.events(task_id)
    assert [e["detail"]["message"] for e in stored if e["kind"] == "progress"] == progress
    # a stream opened once the task is over: its final state, then closed
    late = events_of(f"{shared_stack.url}/v1/tasks/{task_id}/stream")
    assert [e["kind"] for e in late] == ["state"]
    assert late[0]["data"]["status"] == "success" and late[0]["id"] == events[-1]["id"]


def test_a_reconnect_with_last_event_id_replays_exactly_what_it_missed(
    shared_stack: Stack, agents: None, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    task_id = submit(shared_stack, steps=5, interval=0.1, gate_after=2, gate=str(gate))
    url = f"{shared_stack.url}/v1/tasks/{task_id}/stream"
    first = events_of(url, stop=lambda e: e["data"].get("message") == "step 2")
    last_seen = first[-1]["id"]
    gate.write_text("go")  # the rest happens while nobody listens
    assert reach.wait_for_result(task_id, timeout=30, hub=shared_stack.url).data["steps"] == 5
    missed = events_of(url, {"Last-Event-ID": str(last_seen)})
    assert [e["kind"] for e in missed] == ["progress", "progress", "progress", "result"]
    assert [e["data"]["message"] for e in missed[:3]] == ["step 3", "step 4", "step 5"]
    assert all(e["id"] > last_seen for e in missed)
    # every event exactly once over the two connections, in order
    both = [e["id"] for e in first + missed]
    assert both == sorted(set(both))
    # resuming after the result: nothing is missing, the stream closes at once
    assert events_of(url, {"Last-Event-ID": str(missed[-1]["id"])}) == []
    # the query parameter does the same, for clients that cannot set headers
    again = events_of(f"{url}?last_event_id={last_seen}")
    assert [e["id"] for e in again] == [e["id"] for e in missed]


def test_an_idle_stream_gets_keep_alive_pings(
    shared_stack: Stack, agents: None, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    task_id = submit(shared_stack, steps=2, interval=0.05, gate_after=1, gate=str(gate))
    raw = b""
    url = f"{shared_stack.url}/v1/tasks/{task_id}/stream"
    with requests.get(url, stream=True, timeout=(3, 10)) as r:
        deadline = time.monotonic() + 2.5  # server.stream_ping_s is 1 here
        for chunk in r.iter_content(chunk_size=None):
            raw += chunk
            if time.monotonic() > deadline and b"step 1" in raw:
                break
    gate.write_text("go")
    assert b"\r\n: ping" in raw or raw.startswith(b": ping"), raw[-300:]


@pytest.mark.parametrize(
    ("header", "status", "slug"),
    [
        ("abc", 400, "bad-last-event-id"),
        ("-1", 400, "bad-last-event-id"),
        ("1.5", 400, "bad-last-event-id"),
        ("99999999999999999999999", 400, "bad-last-event-id"),
        ("999999999", 400, "bad-last-event-id"),  # newer than anything the stream sent
    ],
)
def test_a_bad_last_event_id_is_a_clear_400(
    shared_stack: Stack, agents: None, header: str, status: int, slug: str
) -> None:
    task_id = submit(shared_stack, steps=1, interval=0.05)
    r = requests.get(
        f"{shared_stack.url}/v1/tasks/{task_id}/stream",
        headers={"Last-Event-ID": header},
        timeout=10,
    )
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == PROBLEM + slug
    assert "Last-Event-ID" in r.json()["detail"]


def test_unknown_ids_are_404(shared_stack: Stack) -> None:
    for path in (
        "/v1/tasks/t-nope/stream",
        "/v1/broadcasts/b-nope/stream",
        "/api/v1/dag-runs/r-nope/stream",
    ):
        r = requests.get(shared_stack.url + path, timeout=10)
        assert r.status_code == 404, (path, r.text)
        assert r.json()["type"] == PROBLEM + "unknown-task"


def _stream_reads(stack: Stack) -> float:
    found = re.search(
        r'^agentreach_stream_reads_total\{kind="task"\} ([0-9.e+]+)$', stack.metrics(), re.M
    )
    return float(found.group(1)) if found else 0.0


def test_fifty_streams_of_one_task_all_get_every_event_from_shared_reads(
    shared_stack: Stack, agents: None, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    steps = 6
    task_id = submit(shared_stack, steps=steps, interval=0.2, gate_after=1, gate=str(gate))
    results: dict[int, list[tuple[str, int]]] = {}
    errors: list[BaseException] = []
    opened = threading.Barrier(51, timeout=30)

    def follow(n: int) -> None:
        try:
            got = []
            for i, event in enumerate(reach.stream(task_id, hub=shared_stack.url, timeout=60)):
                if i == 0:
                    opened.wait()
                got.append((event.kind, event.id or 0))
            results[n] = got
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=follow, args=(n,)) for n in range(50)]
    for t in threads:
        t.start()
    opened.wait()  # every stream has its first event: the rest happens with all 50 open
    before = _stream_reads(shared_stack)
    gate.write_text("go")
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]
    assert len(results) == 50
    tails = {tuple(e for e in got if e[1] > min(x[1] for x in got)) for got in results.values()}
    reference = max(results.values(), key=len)
    for got in results.values():
        assert [k for k, _ in got if k == "progress"][-(steps - 1) :] == ["progress"] * (steps - 1)
        assert got[-1][0] == "result"
        assert [i for _, i in got] == sorted({i for _, i in got})
        # what happened after the gate opened reached every stream, identically
        assert got[-(steps):] == reference[-(steps):]
    assert len(tails) >= 1
    reads = _stream_reads(shared_stack) - before
    events_after_gate = steps  # five progress reports and the result
    # one feed reads for all fifty streams: a few reads per event, never one per stream
    assert 0 < reads < 5 * events_after_gate + 10, reads
    assert reads < 50, reads


def test_the_sdk_iterator_and_the_cli_follow_a_task(
    shared_stack: Stack, agents: None, tmp_path: Path
) -> None:
    task_id = submit(shared_stack, steps=3, interval=0.1)
    seen = list(reach.stream(task_id, hub=shared_stack.url, timeout=30))
    assert isinstance(seen[0], reach.StreamEvent) and seen[0].kind == "state"
    assert seen[-1].kind == "result" and seen[-1].final
    assert seen[-1].data["result"]["steps"] == 3
    assert [e.data["message"] for e in seen if e.kind == "progress"][-1] == "step 3"
    # resuming from an id: only what came after it
    middle = next(e for e in seen if e.kind == "progress")
    rest = list(reach.stream(task_id, hub=shared_stack.url, last_event_id=middle.id))
    assert [e.id for e in rest] == [e.id for e in seen if (e.id or 0) > (middle.id or 0)]
    with pytest.raises(reach.UnknownTask):
        list(reach.stream("t-missing", hub=shared_stack.url, timeout=10))

    gate = tmp_path / "gate"
    watched = submit(shared_stack, steps=3, interval=0.1, gate_after=1, gate=str(gate))
    cli = subprocess.Popen(
        [sys.executable, "-m", "reach", "tasks", "watch", watched, "--hub", shared_stack.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**_env(), "COLUMNS": "200"},
    )
    with cli, cli.stdout as out:  # type: ignore[union-attr]
        lines = [out.readline()]  # its first event: the stream is open
        gate.write_text("go")
        lines += out.read().splitlines()
    assert cli.returncode == 0, lines
    assert "state" in lines[0], lines
    assert any("progress" in line and "step 3" in line for line in lines), lines
    assert "result" in lines[-1] and "success" in lines[-1], lines
    as_json = subprocess.run(
        [sys.executable, "-m", "reach", "tasks", "watch", watched, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**_env(), "REACH_HUB_URL": shared_stack.url},
    )
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout.splitlines()[0])["kind"] == "state"


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}


def test_a_dag_run_stream_sends_node_states_then_the_run(shared_stack: Stack, agents: None) -> None:
    def node(node_id: str, deps: list[str]) -> dict[str, Any]:
        return {
            "id": node_id,
            "agent_id": "progress",
            "method": "work.do",
            "dependencies": deps,
            "payload": {"steps": 1, "interval": 0.2},
        }

    spec = {"name": "chain", "nodes": [node("a", []), node("b", ["a"])]}
    r = requests.post(f"{shared_stack.url}/api/v1/dag-runs", json={"dag": spec, "input": {}})
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    url = f"{shared_stack.url}/api/v1/dag-runs/{run_id}/stream"
    events = events_of(url, timeout=60)
    assert events[0]["kind"] == "state" and events[-1]["kind"] == "run"
    assert events[-1]["data"]["status"] == "success"
    nodes = [(e["data"]["node_id"], e["data"]["state"]) for e in events if e["kind"] == "node"]
    # every transition once, a before b, each node running before its ending
    already = {
        (n["node_id"], s)
        for n in events[0]["data"]["nodes"]
        for s in (["running"] if n["started_at"] else [])
        + ([n["status"]] if n["finished_at"] else [])
    }
    everything = already | set(nodes)
    assert {("a", "success"), ("b", "success")} <= everything, events
    assert len(nodes) == len(set(nodes))
    if ("a", "success") in nodes and ("b", "success") in nodes:
        assert nodes.index(("a", "success")) < nodes.index(("b", "success"))
    ids = [e["id"] for e in events[1:]]
    assert ids == sorted(set(ids))
    # resume: from the first node event, the rest again
    node_events = [e for e in events if e["kind"] == "node"]
    if node_events:
        after = node_events[0]["id"]
        rest = events_of(url, {"Last-Event-ID": str(after)})
        assert rest[-1]["kind"] == "run"
        assert [e["id"] for e in rest if e["kind"] == "node"] == [e["id"] for e in node_events[1:]]
    bad = requests.get(url, headers={"Last-Event-ID": "99"}, timeout=10)
    assert bad.status_code == 400 and bad.json()["type"] == PROBLEM + "bad-last-event-id"


def test_a_broadcast_stream_sends_each_answer_then_the_aggregate(
    shared_stack: Stack, agents: None
) -> None:
    r = requests.post(
        f"{shared_stack.url}/v1/broadcasts",
        json={
            "tags": ["prog"],
            "method": "work.do",
            "payload": {"steps": 2, "interval": 0.3},
            "timeout_ms": 20_000,
        },
        timeout=10,
    )
    assert r.status_code == 201, r.text
    broadcast_id = r.json()["broadcast_id"]
    url = f"{shared_stack.url}/v1/broadcasts/{broadcast_id}/stream"
    events = events_of(url, timeout=60)
    assert events[0]["kind"] == "state"
    assert events[-1]["kind"] == "complete" and events[-1]["data"]["complete"]
    answers = [e for e in events if e["kind"] == "answer"]
    assert sorted(a["data"]["agent_id"] for a in answers) == ["progress", "progress-b"]
    assert all(a["data"]["state"] == "success" for a in answers)
    assert [a["id"] for a in answers] == [1, 2]
    assert events[-1]["id"] == 3
    rest = events_of(url, {"Last-Event-ID": "1"})
    assert [e["kind"] for e in rest] == ["answer", "complete"]
    assert rest[0]["data"]["task_id"] == answers[1]["data"]["task_id"]
