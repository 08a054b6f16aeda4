"""Issue 37, item 7: an agent key declares only the capabilities and tags an admin allowed.

Through a real ``reach api`` process with auth on and the ``reach keys`` CLI, on SQLite
and PostgreSQL. Before, any agent key declared any tag or capability and received other
callers' reaches (4 of 10 by tag went to the attacker). Now an agent key may carry
allow-lists (``reach keys create --capability/--tag``): a registration beyond them is
refused with 403 ``forbidden`` naming what it may not declare, over HTTP and over the
channel alike, and only an admin widens them (``reach keys allow``), which the key
listing shows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from reach.core.security.auth import Scope
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok
from tests.support.trust_agents import PROBLEM, make_key

pytestmark = pytest.mark.timeout(300)  # four CLI runs: seconds each on a loaded box


@pytest.fixture
def hub(store_url: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    port = free_port()
    env = hub_env(store_url, tmp_path, REACH_SECURITY__REQUIRE_AUTH="true")
    proc = HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(base + "/healthz", proc)
        yield base, env
    finally:
        proc.stop()


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reach", "keys", *args],
        env={**env, "COLUMNS": "200"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _register(hub: str, secret: str, **declared: Any) -> requests.Response:
    body = {
        "agent_id": "fin-pay",
        "instance_id": "fin-pay-1",  # one instance, declaring again: no conflict with itself
        "addr": "127.0.0.1:9",
        "allow_loopback": True,
        **declared,
    }
    headers = {"Authorization": f"Bearer {secret}"}
    return requests.post(hub + "/v1/agents/register", json=body, headers=headers, timeout=10)


def test_a_key_declares_only_what_an_admin_allowed(
    hub: tuple[str, dict[str, str]], store_url: str
) -> None:
    url, env = hub
    made = _cli(
        env, "create", "--scope", "agent", "--agent-id", "fin-*",
        "--capability", "pay*", "--tag", "fin", "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)

    ok = _register(url, key["secret"], tags=["fin"], capabilities=[{"type": "pay.card"}])
    assert ok.status_code == 201, ok.text

    # squatting: another team's tag, another capability
    for declared in (
        {"tags": ["fin", "hr"], "capabilities": [{"type": "pay.card"}]},
        {"tags": ["fin"], "capabilities": [{"type": "pay.card"}, {"type": "refund"}]},
        {"tags": ["fin"], "capabilities": [{"type": "hr.salaries"}]},
    ):
        r = _register(url, key["secret"], **declared)
        assert r.status_code == 403, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["type"] == PROBLEM + "forbidden"
        assert "reach keys allow" in r.json()["detail"]
    r = _register(url, key["secret"], tags=["fin", "hr"])
    assert "tag:hr" in r.json()["detail"]
    admin = make_key(store_url, Scope.ADMIN)
    shown = requests.get(url + "/api/v1/agents/fin-pay", headers=admin.headers(), timeout=10)
    assert shown.json()["tags"] == ["fin"]  # nothing of the refused declarations stuck

    # the admin sees the lists and approves the change
    listed = {k["key_id"]: k for k in json.loads(_cli(env, "list", "--json").stdout)["keys"]}
    assert listed[key["key_id"]]["allowed_tags"] == ["fin"]
    assert listed[key["key_id"]]["allowed_capabilities"] == ["pay*"]
    widened = _cli(env, "allow", key["key_id"], "--tag", "fin", "--tag", "hr")
    assert widened.returncode == 0, widened.stderr
    again = _register(url, key["secret"], tags=["fin", "hr"], capabilities=[{"type": "pay.card"}])
    assert again.status_code == 200, again.text

    refused = _cli(env, "allow", admin.key_id, "--tag", "x")  # only agent keys declare
    assert refused.returncode == 2
