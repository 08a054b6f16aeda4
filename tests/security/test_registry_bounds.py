"""Issue 37, item 18 (and item 1's bound): what one API key and one agent may hold.

Through a real ``reach api`` process with auth on, on SQLite and PostgreSQL, with small
``registry.*`` bounds. Before, one agent key registered any number of agents, instances,
capabilities and tags (30 agents of 256 capabilities made one fleet page 28 MB). Now each
registration past a bound is refused with 409 ``registry-limit`` naming the bound, and
nothing of it is written.
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

BOUNDS = {
    "REACH_REGISTRY__MAX_AGENTS_PER_KEY": "3",
    "REACH_REGISTRY__MAX_INSTANCES_PER_KEY": "5",
    "REACH_REGISTRY__MAX_INSTANCES_PER_AGENT": "3",
    "REACH_REGISTRY__MAX_CAPABILITIES_PER_AGENT": "4",
    "REACH_REGISTRY__MAX_TAGS_PER_AGENT": "3",
    "REACH_REGISTRY__MAX_DECLARATION_BYTES": "4096",
}


@pytest.fixture
def hub(store_url: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = hub_env(store_url, tmp_path, REACH_SECURITY__REQUIRE_AUTH="true", **BOUNDS)
    proc = HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(base + "/healthz", proc)
        yield base
    finally:
        proc.stop()


def _register(hub: str, key: Key, agent_id: str, **extra: Any) -> requests.Response:
    body = {
        "agent_id": agent_id,
        "addr": f"127.0.0.1:{free_port()}",
        "allow_loopback": True,
        "heartbeat_interval": 3600,
        **extra,
    }
    return requests.post(hub + "/v1/agents/register", json=body, headers=key.headers(), timeout=10)


def _refused(r: requests.Response, bound: str) -> None:
    assert r.status_code == 409, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["type"] == PROBLEM + "registry-limit"
    assert f"registry.{bound}" in r.json()["detail"]


def _agents(hub: str, admin: Key) -> list[str]:
    r = requests.get(hub + "/api/v1/agents", headers=admin.headers(), timeout=10)
    return sorted(a["agent_id"] for a in r.json()["agents"])


def test_one_key_holds_bounded_agents_and_instances(hub: str, store_url: str) -> None:
    admin = make_key(store_url, Scope.ADMIN)
    bulk = make_key(store_url, Scope.AGENT, "bulk-*")
    for n in range(3):
        assert _register(hub, bulk, f"bulk-{n}").status_code == 201
    _refused(_register(hub, bulk, "bulk-3"), "max_agents_per_key")
    assert _agents(hub, admin) == ["bulk-0", "bulk-1", "bulk-2"]

    assert _register(hub, bulk, "bulk-0").status_code == 201
    assert _register(hub, bulk, "bulk-0").status_code == 201
    _refused(_register(hub, bulk, "bulk-0"), "max_instances_per_agent")
    _refused(_register(hub, bulk, "bulk-1"), "max_instances_per_key")  # 5 held already

    # another key's agents are counted apart
    other = make_key(store_url, Scope.AGENT, "solo")
    assert _register(hub, other, "solo").status_code == 201


def test_one_agent_declares_bounded_capabilities_tags_and_bytes(hub: str, store_url: str) -> None:
    key = make_key(store_url, Scope.AGENT, "wide")
    caps = [{"type": f"c{n}"} for n in range(5)]
    _refused(_register(hub, key, "wide", capabilities=caps), "max_capabilities_per_agent")
    _refused(_register(hub, key, "wide", tags=["a", "b", "c", "d"]), "max_tags_per_agent")
    big = [{"type": "c", "description": "x" * 2000, "examples": ["y" * 300] * 8}]
    _refused(_register(hub, key, "wide", capabilities=big), "max_declaration_bytes")
    ok = _register(hub, key, "wide", capabilities=caps[:4], tags=["a", "b", "c"])
    assert ok.status_code == 201, ok.text
