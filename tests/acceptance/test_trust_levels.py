"""Trust levels and L3 allow-lists against a hub that requires API keys: every part a real
process (api, worker, beat, SDK agents), on SQLite and PostgreSQL.

Keys are created in the hub's store with `reach.hub.security.apikeys.create_key`; agents run as
their own processes (tests/acceptance/agents/trust_agent.py) with their agent key, and
count at the agent which reaches arrived. The admin changes go through the hub's API and
the ``reach agents`` CLI; what they and the L3 screen recorded is read from the store.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from sqlalchemy import Engine, select

from reach.core.security.auth import Scope
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import AgentRow, AuditRow, TaskEventRow, TaskRow
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.trust_agents import (
    PROBLEM,
    Key,
    TrustAgent,
    api,
    audit_rows,
    count,
    make_key,
    online,
    reach_cli,
)
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_SECURITY__L3_MAX_PAYLOAD_BYTES": "1024",
}

PLUGIN = "tl-plugin"  # L3: may call search.*, callable by the caller key
CORE = "tl-core"  # L2, tag "pool"
SHADY = "tl-shady"  # L3, tag "pool" too, callable by the "friend" key only


@dataclass(frozen=True)
class Keys:
    admin: Key
    caller: Key  # in the plugin's callable_by
    stranger: Key  # in nobody's
    friend: Key  # in SHADY's callable_by
    viewer: Key
    direct: Key  # an agent key for agents this module registers by hand (tl-direct-*)
    agents: dict[str, Key]

    def all(self) -> list[Key]:
        return [
            self.admin, self.caller, self.stranger, self.friend, self.viewer, self.direct,
            *self.agents.values(),
        ]  # fmt: skip


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(shared_store_url: str) -> Iterator[Engine]:
    engine = create_engine_for(shared_store_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def keys(shared_stack: Stack, shared_store_url: str) -> Keys:
    return Keys(
        admin=make_key(shared_store_url, Scope.ADMIN),
        caller=make_key(shared_store_url, Scope.CALLER),
        stranger=make_key(shared_store_url, Scope.CALLER),
        friend=make_key(shared_store_url, Scope.CALLER),
        viewer=make_key(shared_store_url, Scope.VIEWER),
        direct=make_key(shared_store_url, Scope.AGENT, "tl-direct-*"),
        agents={a: make_key(shared_store_url, Scope.AGENT, a) for a in (PLUGIN, CORE, SHADY)},
    )


@pytest.fixture(scope="module")
def agents(
    shared_stack: Stack, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, TrustAgent]]:
    directory = tmp_path_factory.mktemp("trust-agents")
    url = shared_stack.url
    started = {
        PLUGIN: TrustAgent(url, PLUGIN, keys.agents[PLUGIN], directory, [], ["search.web"]),
        CORE: TrustAgent(
            url, CORE, keys.agents[CORE], directory, ["pool"], ["search.web", "payments.charge"]
        ),
        SHADY: TrustAgent(
            url, SHADY, keys.agents[SHADY], directory, ["pool", "shady"], ["search.web"]
        ),
    }
    try:
        for agent in started.values():
            wait_until(
                lambda a=agent: (
                    a.proc.poll() is not None or online(shared_stack, keys.admin, a.agent_id)
                ),
                timeout=30,
                what=f"{agent.agent_id} online",
            )
            assert agent.proc.poll() is None, agent.output()
        admin = keys.admin
        for agent_id in (PLUGIN, SHADY):
            r = api(shared_stack, "PUT", f"/api/v1/agents/{agent_id}/trust", admin, {"level": "L3"})
            assert r.status_code == 200, r.text
        rules = [
            (PLUGIN, {"call": "search.*"}),
            (PLUGIN, {"callable_by": keys.caller.identity}),
            (SHADY, {"callable_by": keys.friend.identity}),
        ]
        for agent_id, rule in rules:
            r = api(shared_stack, "POST", f"/api/v1/agents/{agent_id}/allow", admin, rule)
            assert r.status_code == 200, r.text
        yield started
    finally:
        for agent in started.values():
            agent.stop()
        for agent in started.values():
            for key in keys.all():
                assert key.secret not in agent.output()


def submit(stack: Stack, key: Key, **body: Any) -> requests.Response:
    return api(stack, "POST", "/v1/tasks?wait=20", key, {"payload": {}, **body})


def register_direct(stack: Stack, key: Key, agent_id: str, **extra: Any) -> requests.Response:
    body = {
        "agent_id": agent_id,
        "instance_id": f"{agent_id}-i1",
        "addr": f"127.0.0.1:{free_port()}",
        "allow_loopback": True,
        "heartbeat_interval": 3600,
        **extra,
    }
    return api(stack, "POST", "/v1/agents/register", key, body)


# -- trust is set by admins only ---------------------------------------------------------


def test_registration_cannot_set_or_reset_the_trust_level(
    shared_stack: Stack, keys: Keys, store: Engine
) -> None:
    agent_id = "tl-direct-self"
    body = {
        "agent_id": agent_id,
        "instance_id": "self-1",
        "addr": f"127.0.0.1:{free_port()}",
        "allow_loopback": True,
        "heartbeat_interval": 3600,
        "tags": ["a"],
    }
    # a registration that declares its own trust is refused outright
    r = api(shared_stack, "POST", "/v1/agents/register", keys.direct, {**body, "trust_level": "L1"})
    assert r.status_code == 422, r.text
    assert r.json()["type"] == PROBLEM + "invalid-request"
    assert count(store, AgentRow, AgentRow.agent_id == agent_id) == 0

    r = api(shared_stack, "POST", "/v1/agents/register", keys.direct, body)
    assert r.status_code == 201, r.text
    assert (
        api(shared_stack, "GET", f"/api/v1/agents/{agent_id}", keys.admin).json()["trust_level"]
        == "L2"
    )  # the default, never the agent's say

    r = api(shared_stack, "PUT", f"/api/v1/agents/{agent_id}/trust", keys.admin, {"level": "L3"})
    assert r.status_code == 200 and r.json() == {
        "agent_id": agent_id,
        "trust_level": "L3",
        "previous": "L2",
    }
    # re-registering (the same declaration, then a new one) keeps the admin's level
    r = api(shared_stack, "POST", "/v1/agents/register", keys.direct, body)
    assert r.status_code == 200, r.text
    r = api(shared_stack, "POST", "/v1/agents/register", keys.direct, {**body, "tags": ["b"]})
    assert r.status_code == 200, r.text
    r = api(shared_stack, "POST", "/v1/agents/register", keys.direct, {**body, "trust_level": "L2"})
    assert r.status_code == 422
    agent = api(shared_stack, "GET", f"/api/v1/agents/{agent_id}", keys.admin).json()
    assert agent["tags"] == ["b"] and agent["trust_level"] == "L3"


def test_trust_and_allow_list_via_cli_are_audited(
    shared_stack: Stack, keys: Keys, store: Engine
) -> None:
    agent_id = "tl-direct-cli"
    assert register_direct(shared_stack, keys.direct, agent_id).status_code == 201
    hub = ["--hub", shared_stack.url]
    admin = ["--api-key", keys.admin.secret]

    done = reach_cli(shared_stack, "agents", "trust", agent_id, "L3", *hub, *admin)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "L2 -> L3" in done.stdout
    trust_rows = audit_rows(
        store, AuditRow.action == "agent.trust", AuditRow.target == f"agent:{agent_id}"
    )
    assert [(a.actor, a.outcome, a.detail) for a in trust_rows] == [
        (keys.admin.identity, "allowed", {"old": "L2", "new": "L3"})
    ]

    done = reach_cli(shared_stack, "agents", "allow", agent_id, "--call", "search.*", *hub, *admin)
    assert done.returncode == 0, done.stdout + done.stderr
    done = reach_cli(
        shared_stack, "agents", "allow", agent_id, "--callable-by", "agent:tl-core", *hub, *admin
    )
    assert done.returncode == 0, done.stdout + done.stderr
    done = reach_cli(shared_stack, "agents", "allow", agent_id, "--json", *hub, *admin)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert (shown["trust_level"], shown["call"], shown["callable_by"]) == (
        "L3",
        ["search.*"],
        ["agent:tl-core"],
    )
    assert {r["created_by"] for r in shown["rules"]} == {keys.admin.identity}
    done = reach_cli(
        shared_stack, "agents", "allow", agent_id, "--call", "search.*", "--remove", *hub, *admin
    )
    assert done.returncode == 0, done.stdout + done.stderr
    allow_rows = audit_rows(
        store,
        AuditRow.action.in_(["agent.allow", "agent.disallow"]),
        AuditRow.target == f"agent:{agent_id}",
    )
    assert [
        (a.action, a.actor, a.detail["kind"], a.detail["old"], a.detail["new"]) for a in allow_rows
    ] == [
        ("agent.allow", keys.admin.identity, "call", [], ["search.*"]),
        ("agent.allow", keys.admin.identity, "callable_by", [], ["agent:tl-core"]),
        ("agent.disallow", keys.admin.identity, "call", ["search.*"], []),
    ]

    # the bare group still lists the fleet, now with the level
    done = reach_cli(shared_stack, "agents", "--json", *hub, *admin)
    assert done.returncode == 0, done.stderr
    listed = {a["agent_id"]: a for a in json.loads(done.stdout)["agents"]}
    assert listed[agent_id]["trust_level"] == "L3"

    # a caller key may not; nothing changes and the refusal is audited by the auth layer
    before = [
        a.id
        for a in audit_rows(
            store, AuditRow.target == f"agent:{agent_id}", AuditRow.outcome == "allowed"
        )
    ]
    done = reach_cli(
        shared_stack, "agents", "trust", agent_id, "L1", *hub, "--api-key", keys.caller.secret
    )
    assert done.returncode == 1 and "Forbidden" in done.stderr
    assert keys.caller.secret not in done.stderr + done.stdout
    done = reach_cli(
        shared_stack,
        "agents",
        "allow",
        agent_id,
        "--call",
        "x",
        *hub,
        "--api-key",
        keys.viewer.secret,
    )
    assert done.returncode == 1 and "Forbidden" in done.stderr
    after = audit_rows(store, AuditRow.target == f"agent:{agent_id}", AuditRow.outcome == "allowed")
    assert [a.id for a in after] == before
    assert (
        api(shared_stack, "GET", f"/api/v1/agents/{agent_id}", keys.admin).json()["trust_level"]
        == "L3"
    )
    # bad input: one exit code, no change
    done = reach_cli(shared_stack, "agents", "trust", agent_id, "L4", *hub, *admin)
    assert done.returncode == 2


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "slug"),
    [
        ("PUT", "/api/v1/agents/tl-nobody/trust", {"level": "L3"}, 404, "unknown-agent"),
        ("POST", "/api/v1/agents/tl-nobody/allow", {"call": "x"}, 404, "unknown-agent"),
        ("GET", "/api/v1/agents/tl-nobody/allow", None, 404, "unknown-agent"),
        ("PUT", f"/api/v1/agents/{CORE}/trust", {"level": "L4"}, 422, "invalid-request"),
        (
            "PUT",
            f"/api/v1/agents/{CORE}/trust",
            {"level": "L3", "by": "me"},
            422,
            "invalid-request",
        ),
        ("PUT", f"/api/v1/agents/{CORE}/trust", {}, 422, "invalid-request"),
        ("POST", f"/api/v1/agents/{CORE}/allow", {}, 422, "invalid-request"),
        (
            "POST",
            f"/api/v1/agents/{CORE}/allow",
            {"call": "a", "callable_by": "b"},
            422,
            "invalid-request",
        ),
        ("POST", f"/api/v1/agents/{CORE}/allow", {"call": "has space"}, 422, "invalid-request"),
        ("POST", f"/api/v1/agents/{CORE}/allow", {"call": "x" * 161}, 422, "invalid-request"),
        ("DELETE", f"/api/v1/agents/{CORE}/allow", {"kind": "call"}, 422, "invalid-request"),
    ],
)
def test_bad_admin_requests_are_problems_and_change_nothing(
    shared_stack: Stack,
    keys: Keys,
    agents: dict[str, TrustAgent],
    store: Engine,
    method: str,
    path: str,
    body: Any,
    status: int,
    slug: str,
) -> None:
    before = count(store, AuditRow)
    r = api(shared_stack, method, path, keys.admin, body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == PROBLEM + slug
    assert count(store, AuditRow) == before
    assert (
        api(shared_stack, "GET", f"/api/v1/agents/{CORE}", keys.admin).json()["trust_level"] == "L2"
    )


# -- L3 enforcement ----------------------------------------------------------------------


def test_l3_agent_calling_outside_its_allow_list_is_refused(
    shared_stack: Stack, keys: Keys, agents: dict[str, TrustAgent], store: Engine
) -> None:
    core_runs = len(agents[CORE].runs())
    tasks_before = count(store, TaskRow)
    # the caller may reach the plugin; the plugin, from its handler, asks for payments
    r = submit(
        shared_stack,
        keys.caller,
        agent_id=PLUGIN,
        method="relay.send",
        payload={"to": CORE, "method": "payments.charge", "payload": {"amount": 5}},
    )
    assert r.status_code == 201, r.text
    outer = r.json()
    assert outer["status"] == "success", outer
    told = outer["result"]
    assert (told["refused"], told["status"]) == ("Forbidden", 403), told
    assert "may not call 'payments.charge'" in told["detail"]
    # the outer task only: the refused reach left no task row, and never reached CORE
    assert count(store, TaskRow) == tasks_before + 1
    assert len(agents[CORE].runs()) == core_runs
    refused = audit_rows(store, AuditRow.actor == f"agent:{PLUGIN}", AuditRow.outcome == "refused")
    assert refused and refused[-1].action == "reach"
    assert refused[-1].target == f"agent:{CORE}"
    assert refused[-1].detail["refusal"] == "forbidden"
    assert refused[-1].detail["invoked"] == ["payments.charge"]

    # inside the allow-list: delivered, and the reach from the L3 agent audited as allowed
    r = submit(
        shared_stack,
        keys.caller,
        agent_id=PLUGIN,
        method="relay.send",
        payload={"to": CORE, "method": "search.web", "payload": {"q": "x"}},
    )
    assert r.status_code == 201, r.text
    result = r.json()["result"]
    inner_id = result["inner_task_id"]
    assert result["inner"] == {"by": CORE, "method": "search.web"}
    assert inner_id in agents[CORE].runs()
    allowed = audit_rows(store, AuditRow.task_id == inner_id)
    assert [(a.actor, a.action, a.outcome, a.target) for a in allowed] == [
        (f"agent:{PLUGIN}", "reach", "allowed", f"agent:{CORE}")
    ]
    with session_factory(store)() as session:
        inner = session.scalar(select(TaskRow).where(TaskRow.task_id == inner_id))
        assert inner is not None and inner.caller == f"agent:{PLUGIN}"


def test_a_caller_not_in_callable_by_is_refused(
    shared_stack: Stack, keys: Keys, agents: dict[str, TrustAgent], store: Engine
) -> None:
    plugin_runs = len(agents[PLUGIN].runs())
    for key in (keys.stranger, keys.admin):  # an admin key is not exempt (core.trust)
        tasks_before = count(store, TaskRow)
        task_id = f"tl-refused-{key.key_id}"
        r = submit(shared_stack, key, agent_id=PLUGIN, method="search.web", task_id=task_id)
        assert r.status_code == 403, r.text
        problem = r.json()
        assert problem["type"] == PROBLEM + "forbidden"
        assert "allow-list" in problem["detail"] and key.secret not in r.text
        assert count(store, TaskRow) == tasks_before
        assert count(store, TaskEventRow, TaskEventRow.task_id == task_id) == 0
        rows = audit_rows(store, AuditRow.task_id == task_id)
        assert [(a.actor, a.action, a.outcome, a.target) for a in rows] == [
            (key.identity, "reach", "refused", f"agent:{PLUGIN}")
        ]
    # the listed caller gets through, audited too
    r = submit(shared_stack, keys.caller, agent_id=PLUGIN, method="search.web", task_id="tl-ok-1")
    assert r.status_code == 201 and r.json()["status"] == "success", r.text
    assert agents[PLUGIN].runs()[plugin_runs:] == ["tl-ok-1"]
    rows = audit_rows(store, AuditRow.task_id == "tl-ok-1")
    assert {(a.actor, a.outcome, a.detail["stage"]) for a in rows} == {
        (keys.caller.identity, "allowed", "submit"),
        (keys.caller.identity, "allowed", "dispatch"),
    }


def test_payload_over_the_l3_cap_is_refused(
    shared_stack: Stack, keys: Keys, agents: dict[str, TrustAgent], store: Engine
) -> None:
    tasks_before = count(store, TaskRow)
    big = {"blob": "x" * 1100}  # over the 1024-byte L3 cap, far under the body limit
    r = submit(
        shared_stack,
        keys.caller,
        agent_id=PLUGIN,
        method="search.web",
        payload=big,
        task_id="tl-big",
    )
    assert r.status_code == 413, r.text
    assert r.json()["type"] == PROBLEM + "payload-too-large"
    assert r.json()["limit"] == 1024
    assert count(store, TaskRow) == tasks_before
    [row] = audit_rows(store, AuditRow.task_id == "tl-big")
    assert (row.actor, row.outcome, row.detail["refusal"]) == (
        keys.caller.identity,
        "refused",
        "payload-too-large",
    )
    # the same payload to an L2 agent is fine: the cap is L3's
    r = submit(shared_stack, keys.caller, agent_id=CORE, method="search.web", payload=big)
    assert r.status_code == 201 and r.json()["status"] == "success", r.text
    small = {"blob": "x" * 900}
    r = submit(shared_stack, keys.caller, agent_id=PLUGIN, method="search.web", payload=small)
    assert r.status_code == 201 and r.json()["status"] == "success", r.text


def test_tag_routing_skips_an_l3_instance_the_caller_may_not_reach(
    shared_stack: Stack, keys: Keys, agents: dict[str, TrustAgent], store: Engine
) -> None:
    shady_runs, core_runs = len(agents[SHADY].runs()), len(agents[CORE].runs())
    sent = []
    for n in range(16):
        r = submit(
            shared_stack, keys.stranger, tags=["pool"], method="search.web", task_id=f"tl-pool-{n}"
        )
        assert r.status_code == 201, r.text
        assert r.json()["status"] == "success" and r.json()["agent_id"] == CORE, r.json()
        sent.append(r.json()["task_id"])
    assert agents[SHADY].runs()[shady_runs:] == []
    assert sorted(agents[CORE].runs()[core_runs:]) == sorted(sent)
    with session_factory(store)() as session:
        dispatched = session.scalars(
            select(TaskEventRow).where(
                TaskEventRow.task_id.in_(sent), TaskEventRow.kind == "dispatched"
            )
        ).all()
    assert len(dispatched) == len(sent)
    assert all(e.detail["screened_out"] == [SHADY] for e in dispatched)

    # a route only L3 agents answer, none reachable: refused at submit, audited, no task
    tasks_before = count(store, TaskRow)
    r = submit(
        shared_stack, keys.stranger, tags=["shady"], method="search.web", task_id="tl-shady-only"
    )
    assert r.status_code == 403 and r.json()["type"] == PROBLEM + "forbidden", r.text
    assert count(store, TaskRow) == tasks_before
    [row] = audit_rows(store, AuditRow.task_id == "tl-shady-only")
    assert (row.actor, row.outcome) == (keys.stranger.identity, "refused")

    # the control: a caller SHADY lists is routed to it too (the pool is spread)
    reached = []
    for n in range(16):
        r = submit(
            shared_stack, keys.friend, tags=["pool"], method="search.web", task_id=f"tl-friend-{n}"
        )
        assert r.status_code == 201 and r.json()["status"] == "success", r.text
        reached.append(r.json()["agent_id"])
    assert SHADY in reached, reached
    shady_tasks = [f"tl-friend-{n}" for n, a in enumerate(reached) if a == SHADY]
    rows = audit_rows(store, AuditRow.task_id.in_(shady_tasks), AuditRow.action == "reach")
    dispatch = [a for a in rows if a.detail["stage"] == "dispatch"]
    assert {a.task_id for a in dispatch} == set(shady_tasks)
    assert all(
        (a.actor, a.outcome, a.target) == (keys.friend.identity, "allowed", f"agent:{SHADY}")
        for a in dispatch
    )


def test_a_broadcast_leaves_out_l3_instances_the_caller_may_not_reach(
    shared_stack: Stack, keys: Keys, agents: dict[str, TrustAgent]
) -> None:
    def broadcast(key: Key) -> dict[str, Any]:
        r = api(
            shared_stack, "POST", "/v1/broadcasts", key, {"tags": ["pool"], "method": "search.web"}
        )
        assert r.status_code == 201, r.text
        done = api(shared_stack, "GET", f"/v1/broadcasts/{r.json()['broadcast_id']}?wait=20", key)
        assert done.status_code == 200 and done.json()["complete"], done.text
        return dict(done.json())

    shady_runs = len(agents[SHADY].runs())
    stranger = broadcast(keys.stranger)
    assert [t["agent_id"] for t in stranger["results"]] == [CORE]
    assert len(agents[SHADY].runs()) == shady_runs
    friend = broadcast(keys.friend)
    assert sorted(t["agent_id"] for t in friend["results"]) == [CORE, SHADY]
    assert all(t["status"] == "success" for t in friend["results"])
    # a broadcast only L3 agents the caller may not reach would answer: refused
    r = api(
        shared_stack,
        "POST",
        "/v1/broadcasts",
        keys.stranger,
        {"tags": ["shady"], "method": "search.web"},
    )
    assert r.status_code == 403 and r.json()["type"] == PROBLEM + "forbidden", r.text
