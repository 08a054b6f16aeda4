"""Issue 37, item 8: a live agent cannot take an offline instance's address.

Through a real ``reach api`` process with auth on, on SQLite and PostgreSQL. Before, an
attacker's agent registering at the address of another agent's offline instance
deregistered that instance, and the victim, coming back, got 409 at its own address. Now
the address stays the victim's: the newcomer is refused, the victim's instance keeps its
registration, and the victim registers again as usual. Agents of one API key (a glob
key's fleet) still hand an address on, as one agent restarting does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from reach.core.security.auth import Scope
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok
from tests.support.trust_agents import PROBLEM, Key, make_key
from tests.support.waiting import wait_until


@pytest.fixture
def hub(store_url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = hub_env(store_url, tmp_path, REACH_SECURITY__REQUIRE_AUTH="true")
    proc = HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(base + "/healthz", proc)
        yield base
    finally:
        proc.stop()


def _register(hub: str, key: Key, agent_id: str, addr: str, **extra: Any) -> requests.Response:
    body = {"agent_id": agent_id, "addr": addr, "allow_loopback": True, **extra}
    return requests.post(hub + "/v1/agents/register", json=body, headers=key.headers(), timeout=10)


def _instances(hub: str, admin: Key, agent_id: str) -> dict[str, str]:
    r = requests.get(f"{hub}/api/v1/agents/{agent_id}", headers=admin.headers(), timeout=10)
    return {i["instance_id"]: i["status"] for i in r.json()["instances"]}


def test_an_offline_instance_keeps_its_address(hub: str, store_url: str) -> None:
    admin = make_key(store_url, Scope.ADMIN)
    victim = make_key(store_url, Scope.AGENT, "doc-victim")
    attacker = make_key(store_url, Scope.AGENT, "doc-attacker")
    addr = f"127.0.0.1:{free_port()}"
    r = _register(hub, victim, "doc-victim", addr, instance_id="v-1", heartbeat_interval=0.1)
    assert r.status_code == 201, r.text
    # three missed heartbeats: the victim's instance is offline
    wait_until(
        lambda: _instances(hub, admin, "doc-victim") == {"v-1": "offline"},
        10,
        what="the victim's instance offline",
    )

    taken = _register(hub, attacker, "doc-attacker", addr, instance_id="a-1")
    assert taken.status_code == 409, taken.text
    assert taken.headers["content-type"].startswith("application/problem+json")
    assert taken.json()["type"] == PROBLEM + "registration-conflict"
    assert "doc-victim" in taken.json()["detail"]
    assert _instances(hub, admin, "doc-victim") == {"v-1": "offline"}  # not deregistered

    back = _register(hub, victim, "doc-victim", addr, instance_id="v-2")
    assert back.status_code == 201, back.text
    assert _instances(hub, admin, "doc-victim") == {"v-1": "deregistered", "v-2": "online"}


def test_agents_of_one_key_hand_an_address_on(hub: str, store_url: str) -> None:
    admin = make_key(store_url, Scope.ADMIN)
    team = make_key(store_url, Scope.AGENT, "team-*")
    addr = f"127.0.0.1:{free_port()}"
    r = _register(hub, team, "team-a", addr, instance_id="t-a", heartbeat_interval=0.1)
    assert r.status_code == 201, r.text
    wait_until(
        lambda: _instances(hub, admin, "team-a") == {"t-a": "offline"},
        10,
        what="team-a's instance offline",
    )
    r = _register(hub, team, "team-b", addr, instance_id="t-b")
    assert r.status_code == 201, r.text
    assert _instances(hub, admin, "team-a") == {"t-a": "deregistered"}
