"""A task's audit trail (``GET /api/v1/tasks/{id}/audit``, ``reach tasks audit``): which
identities and agents touched it, when, with what outcome -- through real processes
(api, worker, beat, SDK agents with their own keys) on SQLite and PostgreSQL.

A caller key reaches an L3 plugin, whose handler reaches a core agent that answers
later (202, then a report with its agent key): three identities and the hub's own steps,
each on the events it caused, and the L3 reaches in the audit log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from reach.core.security.auth import Scope
from tests.support.stacks import Stack
from tests.support.trust_agents import (
    PROBLEM,
    Key,
    TrustAgent,
    api,
    make_key,
    online,
    reach_cli,
)
from tests.support.waiting import wait_until

STACK_SETTINGS = {"REACH_SECURITY__REQUIRE_AUTH": "true"}
PLUGIN = "au-plugin"  # L3: may call late.do, callable by the caller key
CORE = "au-core"  # L2: answers late.do with 202, then reports


@dataclass(frozen=True)
class Keys:
    admin: Key
    caller: Key
    stranger: Key
    viewer: Key
    plugin: Key
    core: Key


@pytest.fixture(scope="module")
def keys(shared_stack: Stack, shared_store_url: str) -> Keys:
    return Keys(
        admin=make_key(shared_store_url, Scope.ADMIN),
        caller=make_key(shared_store_url, Scope.CALLER),
        stranger=make_key(shared_store_url, Scope.CALLER),
        viewer=make_key(shared_store_url, Scope.VIEWER),
        plugin=make_key(shared_store_url, Scope.AGENT, PLUGIN),
        core=make_key(shared_store_url, Scope.AGENT, CORE),
    )


@dataclass(frozen=True)
class Chain:
    outer: str  # caller -> plugin (relay.send)
    inner: str  # plugin -> core (late.do, reported later)


@pytest.fixture(scope="module")
def chain(
    shared_stack: Stack, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Chain]:
    directory = tmp_path_factory.mktemp("audit-agents")
    started = [
        TrustAgent(shared_stack.url, PLUGIN, keys.plugin, directory, [], []),
        TrustAgent(shared_stack.url, CORE, keys.core, directory, [], []),
    ]
    try:
        for agent in started:
            wait_until(
                lambda a=agent: (
                    a.proc.poll() is not None or online(shared_stack, keys.admin, a.agent_id)
                ),
                timeout=30,
                what=f"{agent.agent_id} online",
            )
            assert agent.proc.poll() is None, agent.output()
        admin = keys.admin
        r = api(shared_stack, "PUT", f"/api/v1/agents/{PLUGIN}/trust", admin, {"level": "L3"})
        assert r.status_code == 200, r.text
        for rule in ({"call": "late.*"}, {"callable_by": keys.caller.identity}):
            r = api(shared_stack, "POST", f"/api/v1/agents/{PLUGIN}/allow", admin, rule)
            assert r.status_code == 200, r.text
        r = api(
            shared_stack,
            "POST",
            "/v1/tasks?wait=30",
            keys.caller,
            {
                "task_id": "au-outer",
                "agent_id": PLUGIN,
                "method": "relay.send",
                "payload": {"to": CORE, "method": "late.do"},
            },
        )
        assert r.status_code == 201 and r.json()["status"] == "success", r.text
        inner = r.json()["result"]["inner_task_id"]
        assert r.json()["result"]["inner"] == {"by": CORE, "late": True}
        yield Chain("au-outer", inner)
    finally:
        for agent in started:
            agent.stop()


def audit_of(stack: Stack, task_id: str, key: Key | None) -> Any:
    return api(stack, "GET", f"/api/v1/tasks/{task_id}/audit", key)


def test_the_audit_lists_identities_agents_and_outcomes(
    shared_stack: Stack, keys: Keys, chain: Chain
) -> None:
    r = audit_of(shared_stack, chain.outer, keys.caller)  # the caller reads its own task
    assert r.status_code == 200, r.text
    outer = r.json()
    assert (outer["task_id"], outer["status"], outer["caller"]) == (
        chain.outer,
        "success",
        keys.caller.identity,
    )
    assert outer["identities"] == sorted([keys.caller.identity, "hub"])
    assert outer["agents"] == [PLUGIN]
    steps = [(e["actor"], e["kind"], e["outcome"]) for e in outer["events"]]
    assert steps[0] == (keys.caller.identity, "accepted", "accepted")
    assert ("hub", "dispatched", "dispatched") in steps
    assert steps[-1] == ("hub", "terminal_success", "success")
    assert all(isinstance(e["at"], float) and e["attempt_seq"] == 1 for e in outer["events"])
    # the reach to the L3 plugin, at submit and at dispatch, with the caller's identity
    reaches = [
        (a["actor"], a["action"], a["outcome"], a["detail"]["stage"]) for a in outer["audit"]
    ]
    assert reaches == [
        (keys.caller.identity, "reach", "allowed", "submit"),
        (keys.caller.identity, "reach", "allowed", "dispatch"),
    ]
    assert all(a["target"] == f"agent:{PLUGIN}" for a in outer["audit"])

    # the next hop: sent by the plugin as itself, answered by a report of the core agent
    inner = audit_of(shared_stack, chain.inner, keys.admin).json()
    assert inner["caller"] == f"agent:{PLUGIN}"
    assert inner["identities"] == sorted([f"agent:{PLUGIN}", f"agent:{CORE}", "hub"])
    assert inner["agents"] == [CORE]
    by_kind = {e["kind"]: e for e in inner["events"]}
    assert by_kind["accepted"]["actor"] == f"agent:{PLUGIN}"
    assert by_kind["ack"]["actor"] == "hub"
    assert (by_kind["terminal_success"]["actor"], by_kind["terminal_success"]["outcome"]) == (
        f"agent:{CORE}",
        "success",
    )
    assert by_kind["terminal_success"]["instance_id"] == by_kind["dispatched"]["instance_id"]
    assert [(a["actor"], a["outcome"], a["detail"]["caller_trust"]) for a in inner["audit"]] == [
        (f"agent:{PLUGIN}", "allowed", "L3")
    ]


def test_who_may_read_a_trail(shared_stack: Stack, keys: Keys, chain: Chain) -> None:
    for key in (keys.admin, keys.viewer, keys.plugin, keys.core):
        assert audit_of(shared_stack, chain.inner, key).status_code == 200, key
    for key in (keys.caller, keys.plugin, keys.viewer):
        assert audit_of(shared_stack, chain.outer, key).status_code == 200, key
    # not yours looks exactly like not there
    theirs = audit_of(shared_stack, chain.outer, keys.stranger)
    missing = audit_of(shared_stack, "au-no-such-task", keys.stranger)
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["type"] == missing.json()["type"] == PROBLEM + "unknown-task"
    assert theirs.json()["detail"] == missing.json()["detail"].replace(
        "au-no-such-task", chain.outer
    )
    assert set(theirs.json()) == set(missing.json())
    assert audit_of(shared_stack, chain.outer, keys.core).status_code == 404  # not its task
    r = audit_of(shared_stack, chain.outer, None)
    assert r.status_code == 401 and r.json()["type"] == PROBLEM + "unauthenticated"


def test_reach_tasks_audit_prints_the_trail(shared_stack: Stack, keys: Keys, chain: Chain) -> None:
    hub = ["--hub", shared_stack.url, "--api-key", keys.admin.secret]
    done = reach_cli(shared_stack, "tasks", "audit", chain.inner, *hub)
    assert done.returncode == 0, done.stdout + done.stderr
    for fragment in (f"agent:{PLUGIN}", f"agent:{CORE}", "hub", "terminal_success", "audit log"):
        assert fragment in done.stdout, done.stdout
    done = reach_cli(shared_stack, "tasks", "audit", chain.inner, "--json", *hub)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == audit_of(shared_stack, chain.inner, keys.admin).json()
    assert keys.admin.secret not in done.stdout + done.stderr

    done = reach_cli(
        shared_stack, "tasks", "audit", chain.outer, "--hub", shared_stack.url,
        "--api-key", keys.stranger.secret,
    )  # fmt: skip
    assert done.returncode == 1 and "UnknownTask" in done.stderr
