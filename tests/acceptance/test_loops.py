"""Loop detection and the dependency-entropy alert, through real processes (api, worker,
beat, SDK agents with their own agent keys) on SQLite and PostgreSQL.

Two agents whose handlers reach each other are stopped at the first repeat (A -> B -> A),
however the inner reach is sent -- with the SDK's trace, or with the trace dropped or
forged on purpose: the hub derives the path from the authenticated calling agent and its
live task. A chain deeper than ``router.max_hops`` is refused. Busy traffic both ways
between two agents (separate roots, which no path check sees) raises the
``dependency_loop_suspected`` alert, demotes the link to background, and calms.
Deliveries are counted at the agents (their run logs), tasks in the hub's store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from reach.core.security.auth import Scope
from reach.hub.storage import create_engine_for
from reach.hub.storage.models import AuditRow, TaskRow
from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.trust_agents import Key, api, audit_rows, make_key, online
from tests.support.waiting import wait_until

WINDOW_S = 6
STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_ROUTER__MAX_HOPS": "2",
    "REACH_ROUTER__LOOP_ALERT_THRESHOLD": "3",
    "REACH_ROUTER__LOOP_ALERT_WINDOW": str(WINDOW_S),
}
STACK_WORKER_CONCURRENCY = 4  # a chain of awaiting handlers holds one delivery slot each
SCRIPT = REPO / "tests" / "acceptance" / "agents" / "loop_agent.py"
LOOP = "urn:agent-reach:problem:loop-detected"
A, B, C, D, E, F, G, H = (f"lp-{x}" for x in "abcdefgh")


class LoopAgent:
    """tests/acceptance/agents/loop_agent.py with its agent key in ``$REACH_API_KEY``."""

    def __init__(self, hub: str, agent_id: str, key: Key, directory: Path) -> None:
        self.agent_id = agent_id
        self.log = directory / f"{agent_id}.runs"
        self.out = directory / f"{agent_id}.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
        env.update(REACH_API_KEY=key.secret, PYTHONUNBUFFERED="1")
        argv = [
            sys.executable, str(SCRIPT), "--port", str(free_port()), "--hub", hub,
            "--agent-id", agent_id, "--log", str(self.log),
        ]  # fmt: skip
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def runs(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def output(self) -> str:
        return self.out.read_text(errors="replace")


@dataclass(frozen=True)
class Hub:
    stack: Stack
    store: Engine
    admin: Key
    caller: Key
    keys: dict[str, Key]
    agents: dict[str, LoopAgent]


@pytest.fixture(scope="module")
def hub(
    shared_stack: Stack, shared_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hub]:
    directory = tmp_path_factory.mktemp("loop-agents")
    admin = make_key(shared_store_url, Scope.ADMIN)
    caller = make_key(shared_store_url, Scope.CALLER)
    keys = {a: make_key(shared_store_url, Scope.AGENT, a) for a in (A, B, C, D, E, F, G, H)}
    started = {a: LoopAgent(shared_stack.url, a, keys[a], directory) for a in keys}
    store = create_engine_for(shared_store_url)
    try:
        for agent in started.values():
            wait_until(
                lambda a=agent: (
                    a.proc.poll() is not None or online(shared_stack, admin, a.agent_id)
                ),
                timeout=30,
                what=f"{agent.agent_id} online",
            )
            assert agent.proc.poll() is None, agent.output()
        yield Hub(shared_stack, store, admin, caller, keys, started)
    finally:
        for agent in started.values():
            processes.stop(agent.proc)
        store.dispose()


def submit(hub: Hub, key: Key, wait: float = 20, **body: Any) -> dict[str, Any]:
    r = api(hub.stack, "POST", f"/v1/tasks?wait={wait}", key, {"payload": {}, **body})
    assert r.status_code == 201, r.text
    return dict(r.json())


def tasks_of_root(store: Engine, root: str) -> list[TaskRow]:
    """The tasks the hub stored under one root (the edge task included)."""
    with store.connect() as conn:
        rows = conn.execute(select(TaskRow.task_id, TaskRow.trace)).all()
    return [r for r in rows if r.task_id == root or (r.trace or {}).get("root_id") == root]


def runs_of(agent: LoopAgent, task_ids: set[str]) -> list[dict[str, Any]]:
    return [r for r in agent.runs() if r["task_id"] in task_ids]


# -- loops: A -> B -> A ---------------------------------------------------------------


@pytest.mark.parametrize("wait", [True, False], ids=["awaiting", "fire-and-forget"])
@pytest.mark.parametrize("mode", ["sdk", "cleared", "raw", "forged"])
def test_two_agents_reaching_each_other_stop_at_the_first_repeat(
    hub: Hub, mode: str, wait: bool
) -> None:
    first = submit(
        hub,
        hub.caller,
        agent_id=A,
        method="loop.bounce",
        payload={"to": B, "mode": mode, "await": wait},
    )
    root = first["task_id"]

    def b_refused() -> list[dict[str, Any]]:
        ids = {t.task_id for t in tasks_of_root(hub.store, root)}
        return [r for r in runs_of(hub.agents[B], ids) if "refused" in r]

    refused = wait_until(b_refused, timeout=30, what="B told of the loop")
    time.sleep(1.0)  # nothing goes on after the refusal
    created = tasks_of_root(hub.store, root)
    ids = {t.task_id for t in created}
    assert len(created) <= 3, [(t.task_id, t.trace) for t in created]
    assert len(created) == 2  # edge -> A, A -> B; B -> A refused
    assert len(runs_of(hub.agents[A], ids)) == 1  # counted at the agents
    assert len(runs_of(hub.agents[B], ids)) == 1
    told = refused[0]["refused"]
    assert told["kind"] == "LoopDetected"
    assert told["status"] == 508
    assert told["cycle"] == [A, B, A]
    assert f"{A} -> {B} -> {A}" in told["detail"]
    # the trace stored on A -> B is the hub's own, whatever A sent
    inner = next(t for t in created if t.task_id != root)
    assert inner.trace["root_id"] == root
    assert inner.trace["parent_task_id"] == root
    assert inner.trace["path"] == [A]
    assert inner.trace["hops"] == 1
    if wait:
        final = api(hub.stack, "GET", f"/v1/tasks/{root}?wait=20", hub.caller).json()
        assert final["status"] == "success", final
        assert final["result"]["inner"]["refused"]["cycle"] == [A, B, A]


def test_a_self_reach_is_a_loop(hub: Hub) -> None:
    first = submit(
        hub, hub.caller, agent_id=A, method="loop.bounce", payload={"to": A, "mode": "raw"}
    )
    assert first["status"] == "success", first
    told = first["result"]["refused"]
    assert (told["kind"], told["cycle"]) == ("LoopDetected", [A, A])
    assert len(tasks_of_root(hub.store, first["task_id"])) == 1


def test_a_parent_task_named_by_a_caller_continues_its_stored_trace(hub: Hub) -> None:
    """Even a non-agent caller naming a parent gets the parent's path, not its own claim."""
    first = submit(hub, hub.caller, agent_id=A, method="ping")
    assert first["status"] == "success", first
    forged = {"root_id": "elsewhere", "parent_task_id": first["task_id"], "hops": 0, "path": []}
    r = api(
        hub.stack, "POST", "/v1/tasks", hub.caller,
        {"agent_id": A, "method": "ping", "payload": {}, "trace": forged},
    )  # fmt: skip
    assert r.status_code == 508, r.text
    problem = r.json()
    assert problem["type"] == LOOP
    assert problem["cycle"] == [A, A]
    assert r.headers["content-type"].startswith("application/problem+json")


# -- the hops limit -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sdk", "raw"])
def test_a_chain_deeper_than_max_hops_is_refused(hub: Hub, mode: str) -> None:
    # edge -> A (hops 0) -> B (1) -> C (2) -> D (3 > max_hops 2): refused at C
    first = submit(
        hub, hub.caller, agent_id=A, method="chain.next", payload={"chain": [B, C, D], "mode": mode}
    )
    assert first["status"] == "success", first
    created = tasks_of_root(hub.store, first["task_id"])
    assert len(created) == 3
    ids = {t.task_id for t in created}
    assert runs_of(hub.agents[D], ids) == []
    told = runs_of(hub.agents[C], ids)[0]["refused"]
    assert told["kind"] == "LoopDetected"
    assert told["cycle"] == [A, B, C, D]
    assert "max_hops" in told["detail"]


def test_a_chain_within_max_hops_goes_through(hub: Hub) -> None:
    first = submit(hub, hub.caller, agent_id=A, method="chain.next", payload={"chain": [B, C]})
    assert first["status"] == "success", first
    assert first["result"]["inner"]["inner"] == {"end": C}
    created = tasks_of_root(hub.store, first["task_id"])
    assert sorted(t.trace["hops"] for t in created) == [0, 1, 2]


# -- the dependency-entropy alert -----------------------------------------------------


def _reach_as(hub: Hub, src: str, dst: str, n: int) -> list[dict[str, Any]]:
    """``n`` reaches from agent ``src`` (its key, from outside any handler: a fresh root
    each) to ``dst``, each awaited, so neither agent holds a live task afterwards."""
    views = [submit(hub, hub.keys[src], agent_id=dst, method="ping") for _ in range(n)]
    assert all(v["status"] == "success" for v in views), views
    assert {v["trace"]["root_id"] for v in views} == {v["task_id"] for v in views}
    return views


def _link(hub: Hub, pair: tuple[str, str] = (E, F)) -> dict[str, Any] | None:
    r = api(hub.stack, "GET", "/api/v1/links", hub.admin)
    assert r.status_code == 200, r.text
    found = [link for link in r.json()["links"] if link["agents"] == list(pair)]
    return found[0] if found else None


def _suspected_metric(hub: Hub) -> float:
    r = api(hub.stack, "GET", "/metrics", hub.admin)
    for line in r.text.splitlines():
        if line.startswith("agentreach_dependency_loop_suspected_total "):
            return float(line.split()[1])
    return 0.0


def test_busy_traffic_both_ways_raises_the_alert_demotes_the_link_and_calms(hub: Hub) -> None:
    started = time.time()
    before = _suspected_metric(hub)
    assert [v["priority"] for v in _reach_as(hub, E, F, 4)] == ["online"] * 4
    assert [v["priority"] for v in _reach_as(hub, F, E, 3)] == ["online"] * 3
    assert _link(hub) is None  # F -> E at the threshold, not above it
    tipping = _reach_as(hub, F, E, 1)[0]  # both ways above the threshold now
    assert tipping["priority"] == "background"
    link = _link(hub)
    assert link is not None and link["state"] == "suspected", link
    assert link["detail"]["counts"] == {f"{F}>{E}": 4, f"{E}>{F}": 4}
    assert _suspected_metric(hub) == before + 1
    assert [r.action for r in audit_rows(hub.store, AuditRow.target == f"{E}<->{F}")] == [
        "dependency_loop_suspected"
    ]
    assert "dependency_loop_suspected" in hub.stack.procs[0].output()
    # later reaches on the link, either way, go to the background queue
    assert _reach_as(hub, E, F, 1)[0]["priority"] == "background"
    assert _reach_as(hub, F, E, 1)[0]["priority"] == "background"
    assert time.time() - started < WINDOW_S, "too slow for the alert window"
    # it calms: once the window has passed, the next reach is online again
    time.sleep(WINDOW_S + 1.5)
    assert _reach_as(hub, E, F, 1)[0]["priority"] == "online"
    link = _link(hub)
    assert link is not None and link["state"] == "calm", link
    assert [r.action for r in audit_rows(hub.store, AuditRow.target == f"{E}<->{F}")] == [
        "dependency_loop_suspected",
        "dependency_loop_calmed",
    ]
    assert _suspected_metric(hub) == before + 1
    # the agents took every reach: a demoted link is slower, never refused
    assert len([r for r in hub.agents[F].runs() if r["method"] == "ping"]) == 4 + 1 + 1
    assert len([r for r in hub.agents[E].runs() if r["method"] == "ping"]) == 3 + 1 + 1


def test_links_need_a_fleet_reader(hub: Hub) -> None:
    assert api(hub.stack, "GET", "/api/v1/links", hub.caller).status_code == 403
    assert api(hub.stack, "GET", "/api/v1/links", None).status_code == 401


def test_reaches_by_tags_count_by_the_agent_they_reached(hub: Hub) -> None:
    """Ping-pong routed by tags (no agent named either way) is counted by the agent each
    reach was routed to, and raises the alert as named reaches do."""
    before = _suspected_metric(hub)
    for src, dst, n in ((G, H, 4), (H, G, 4)):
        views = [submit(hub, hub.keys[src], tags=[f"tag-{dst}"], method="ping") for _ in range(n)]
        assert all(v["status"] == "success" and v["agent_id"] == dst for v in views), views
    # each worker process buffers its counts for half a second: the link is judged again
    # at the next reach routed on it, once the others' counts are in
    time.sleep(1.5)
    nxt = submit(hub, hub.keys[G], tags=[f"tag-{H}"], method="ping")
    assert nxt["status"] == "success", nxt
    link = wait_until(lambda: _link(hub, (G, H)), timeout=20, what="the link suspected")
    assert link["state"] == "suspected", link
    counts = link["detail"]["counts"]
    assert counts[f"{H}>{G}"] >= 4 and counts[f"{G}>{H}"] >= 4, counts
    assert _suspected_metric(hub) == before + 1
    assert [r.action for r in audit_rows(hub.store, AuditRow.target == f"{G}<->{H}")] == [
        "dependency_loop_suspected"
    ]
