"""Issue 37, item 11: ``method`` is a name, not a path.

The hub delivers to ``{endpoint}/tasks/{method}``; ``x/../../p`` reached any path on the
agent's host (and on the hub's port too). A real ``reach api`` refuses such a method (and
such a capability type) with a 422 problem that says why; the Python SDK refuses it before
anything is sent (the Node SDK's twin is in sdks/node/test/caller-unit.test.mjs).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

import reach
from reach.errors import InvalidTaskRequest
from tests.support.listeners import closed_port
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok

PROBLEM = "urn:agent-reach:problem:"
PATHS = ["x/../../p", "../admin", "a/./b", "a//b", "x/..", "/tasks"]


@pytest.fixture(scope="module")
def hub_api(shared_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One ``reach api`` per store for the module: its tests refuse requests, and the one
    registration they make (agent ``names``) is the same in every test."""
    home = tmp_path_factory.mktemp("api")
    port = free_port()
    proc = HubProcess(
        ["api", "--port", str(port)], hub_env(shared_store_url, home), home / "api.log"
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(base + "/healthz", proc)
        yield base
    finally:
        proc.stop()


def _problem(answer: requests.Response) -> dict[str, Any]:
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("application/problem+json")
    return dict(answer.json())


@pytest.mark.parametrize("method", PATHS)
def test_the_hub_refuses_a_method_that_is_a_path(hub_api: str, method: str) -> None:
    body = {"agent_id": "names", "method": method, "payload": {}}
    problem = _problem(requests.post(f"{hub_api}/v1/tasks", json=body, timeout=10))
    assert problem["type"] == PROBLEM + "invalid-task-request"
    assert "a path, not a name" in problem["detail"] and "method" in problem["detail"]
    cast = {"capability": "c", "method": method, "payload": {}}
    problem = _problem(requests.post(f"{hub_api}/v1/broadcasts", json=cast, timeout=10))
    assert "a path, not a name" in problem["detail"]


def test_a_capability_type_that_is_a_path_is_refused_at_registration(hub_api: str) -> None:
    body = {"agent_id": "names", "addr": "127.0.0.1:9", "allow_loopback": True,
            "capabilities": [{"type": "pay/../../admin"}]}  # fmt: skip
    problem = _problem(requests.post(f"{hub_api}/v1/agents/register", json=body, timeout=10))
    assert "capability type" in problem["detail"] and "not a name" in problem["detail"]


def test_names_with_parts_still_work(hub_api: str) -> None:
    body = {"agent_id": "names", "addr": "127.0.0.1:9", "allow_loopback": True,
            "capabilities": [{"type": "doc/summarise:v2"}]}  # fmt: skip
    assert requests.post(f"{hub_api}/v1/agents/register", json=body, timeout=10).ok
    sent = {"agent_id": "names", "method": "doc/summarise:v2", "payload": {}}
    assert requests.post(f"{hub_api}/v1/tasks", json=sent, timeout=10).status_code == 201


@pytest.mark.parametrize("method", PATHS)
def test_the_python_sdk_refuses_it_before_sending(method: str) -> None:
    nobody = f"http://127.0.0.1:{closed_port()}"  # a request would be HubUnavailable
    with pytest.raises(InvalidTaskRequest, match="not a name") as err:
        reach.send(agent_id="a", method=method, hub=nobody)
    assert err.value.extra["field"] == "method"
    with pytest.raises(InvalidTaskRequest, match="not a name"):
        reach.broadcast(capability="c", method=method, hub=nobody)
    agent = reach.Agent("names", addr="127.0.0.1:9", allow_loopback=True, hub=nobody)
    with pytest.raises(ValueError, match="not a name"):
        agent.route(method)
