"""The hub as an MCP server (issue 41, part 1): the real ``mcp`` client (``ClientSession``
over ``streamable_http_client``) against the real ``reach api`` (with worker and beat, on
PostgreSQL and Redis, auth on), and a slow SDK agent of ``async def`` handlers answering
(tests/acceptance/agents/toolbox_agent.py, which journals every handler run).

The hub's capabilities are listed as tools (schema and description shown, scoped by
agent, tag or capability); a call is a reach under the caller's key and answers with the
result; bad arguments, an agent that keeps failing (retried, then dead-lettered) and a
gated capability (awaiting approval, with its id) are tool results saying so; progress
reports arrive as MCP progress notifications; no key, a forged one or one that may not
submit is refused before the MCP SDK sees the request.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import requests
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from reach.core.security.auth import Scope
from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.trust_agents import PROBLEM, Key, api, make_key
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_ROUTER__MAX_RETRY": "2",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "1",
    "REACH_APPROVAL__TIMEOUT_S": "600",
}
AGENT = "toolbox"
BROKEN = "toolbox-broken"  # text.fail alone: three failures take an instance out of routing
SUMMARISE = "doc/summarise:v2"  # no valid tool name: mapped


@dataclass(frozen=True)
class Hub:
    stack: Stack
    caller: Key
    admin: Key
    viewer: Key
    journal: Path

    @property
    def mcp(self) -> str:
        return self.stack.url + "/mcp"

    def runs(self) -> Counter[tuple[str, str]]:
        if not self.journal.exists():
            return Counter()
        lines = self.journal.read_text().splitlines()
        return Counter((m, t) for m, t in (line.split() for line in lines if line.strip()))


@pytest.fixture(scope="module")
def hub(
    shared_stack: Stack, shared_store_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hub]:
    home = tmp_path_factory.mktemp("mcp")
    journal = home / "runs.log"
    agents = []

    def start(agent_id: str, *only: str) -> None:
        env = {k: v for k, v in shared_stack.env.items() if not k.startswith("REACH_")}
        env["REACH_API_KEY"] = make_key(shared_store_url, Scope.AGENT, agent_id).secret
        args = [sys.executable, "-m", "tests.acceptance.agents.toolbox_agent", "--port",
                str(free_port()), "--hub", shared_stack.url, "--journal", str(journal),
                "--agent-id", agent_id, "--only", *only]  # fmt: skip
        with (home / f"{agent_id}.log").open("ab") as out:
            agents.append(
                subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
            )

    try:
        start(AGENT, "text.echo", "work.steps", "orders.cancel", SUMMARISE)
        start(BROKEN, "text.fail")
        found = Hub(
            shared_stack,
            caller=make_key(shared_store_url, Scope.CALLER),
            admin=make_key(shared_store_url, Scope.ADMIN),
            viewer=make_key(shared_store_url, Scope.VIEWER),
            journal=journal,
        )
        for agent_id in (AGENT, BROKEN):
            wait_until(lambda a=agent_id: _online(found, a), timeout=30, what=f"{agent_id} online")
        yield found
    finally:
        for agent in agents:
            processes.stop(agent)


def _online(hub: Hub, agent_id: str) -> bool:
    r = api(hub.stack, "GET", f"/api/v1/agents/{agent_id}", hub.admin)
    return r.ok and any(i["status"] == "online" for i in r.json()["instances"])


@asynccontextmanager
async def session(url: str, key: str | None, modern: bool = False) -> AsyncIterator[ClientSession]:
    """A client session: the ``initialize`` handshake (2025-11-25), or with ``modern`` the
    per-request era (``server/discover``, 2026-07-28)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    timeout = httpx2.Timeout(30, read=120)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as s,
    ):
        await (s.discover() if modern else s.initialize())
        yield s


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def structured(result: types.CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


# -- tools -----------------------------------------------------------------------------------


def test_the_hubs_capabilities_are_its_tools_with_their_schemas_scoped_by_the_url(
    hub: Hub,
) -> None:
    async def lists(query: str, modern: bool = False) -> list[types.Tool]:
        async with session(hub.mcp + query, hub.caller.secret, modern) as s:
            return (await s.list_tools()).tools

    tools = {t.name: t for t in run(lists(""))}
    assert [t.name for t in run(lists("", modern=True))] == sorted(tools)
    mapped = next(n for n in tools if n.startswith("doc_summarise_v2-"))
    assert set(tools) >= {"text.echo", "work.steps", "text.fail", "orders.cancel", mapped}
    echo = tools["text.echo"]
    assert echo.description == "Echo a text back, after a while."
    assert echo.input_schema == {
        "type": "object",
        "properties": {"text": {"type": "string"}, "delay": {"type": "number"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    assert echo.meta == {"reach/capability": "text.echo", "reach/agents": [AGENT]}
    assert tools[mapped].meta["reach/capability"] == SUMMARISE  # type: ignore[index]
    assert "human approval" in (tools["orders.cancel"].description or "")
    assert [t.name for t in run(lists("?capability=text.echo"))] == ["text.echo"]
    assert {t.name for t in run(lists(f"?agent={AGENT}&tag=toolbox"))} == set(tools) - {"text.fail"}
    assert [t.name for t in run(lists(f"?agent={BROKEN}"))] == ["text.fail"]

    # the mapped name calls the capability it stands for
    async def summarise() -> types.CallToolResult:
        async with session(hub.mcp, hub.caller.secret) as s:
            return await s.call_tool(mapped, {})

    assert structured(run(summarise())) == {"summary": "short"}
    # a scope naming what the hub does not know is told, not served empty
    for query, kind in (("?agent=nobody", "unknown-agent"), ("?tag=nope", "no-suitable-agent"),
                        ("?shelf=1", "invalid-query")):  # fmt: skip
        r = requests.post(hub.mcp + query, headers=hub.caller.headers(), json={}, timeout=10)
        assert r.headers["content-type"] == "application/problem+json", r.text
        assert r.json()["type"] == PROBLEM + kind, r.text


def test_a_call_is_a_reach_under_the_callers_key_and_answers_with_the_result(hub: Hub) -> None:
    async def call() -> types.CallToolResult:
        async with session(hub.mcp + f"?agent={AGENT}", hub.caller.secret) as s:
            return await s.call_tool("text.echo", {"text": "hello mcp", "delay": 1.5})

    result = run(call())
    assert not result.is_error, result
    assert structured(result) == {"echo": "hello mcp", "by": AGENT}
    assert isinstance(result.content[0], types.TextContent)
    assert '"echo": "hello mcp"' in result.content[0].text
    task_id = (result.meta or {})["reach/task_id"]
    task = api(hub.stack, "GET", f"/v1/tasks/{task_id}", hub.caller).json()
    assert task["status"] == "success" and task["caller"] == hub.caller.identity
    assert task["method"] == "text.echo" and task["agent_id"] == AGENT
    assert hub.runs()[("text.echo", task_id)] == 1


def test_bad_arguments_are_a_tool_error_naming_the_schema_and_nothing_runs(hub: Hub) -> None:
    async def calls() -> tuple[types.CallToolResult, MCPError]:
        async with session(hub.mcp, hub.caller.secret) as s:
            bad = await s.call_tool("text.echo", {"text": 5})
            with pytest.raises(MCPError) as unknown:
                await s.call_tool("no.such.tool", {})
            return bad, unknown.value

    before = sum(hub.runs().values())
    bad, unknown = run(calls())
    assert bad.is_error
    body = structured(bad)
    assert body["type"] == PROBLEM + "invalid-payload" and body["status"] == 422
    assert "params_schema" in body["detail"]
    assert "no.such.tool" in unknown.error.message
    assert sum(hub.runs().values()) == before


def test_an_agent_that_keeps_failing_is_a_tool_error_once_its_retries_are_spent(
    hub: Hub,
) -> None:
    async def call() -> types.CallToolResult:
        async with session(hub.mcp, hub.caller.secret) as s:
            return await s.call_tool("text.fail", {"n": 1})

    result = run(call())
    assert result.is_error, result
    body = structured(result)
    assert body["type"] == PROBLEM + "dead-lettered", body
    task_id = body["task_id"]
    assert hub.runs()[("text.fail", task_id)] == 3  # the first attempt and max_retry=2
    dead = api(hub.stack, "GET", "/api/v1/dead-letters", hub.admin).json()["dead_letters"]
    assert task_id in {d["task_id"] for d in dead}


def test_a_gated_capability_answers_at_once_awaiting_approval_with_its_id(hub: Hub) -> None:
    async def call() -> types.CallToolResult:
        async with session(hub.mcp, hub.caller.secret) as s:
            return await s.call_tool("orders.cancel", {"order": "A-1"})

    result = run(call())
    assert not result.is_error, result
    body = structured(result)
    assert body["status"] == "awaiting_approval", body
    approval_id, task_id = body["approval_id"], body["task_id"]
    assert approval_id.startswith("ap-") and approval_id in result.content[0].text  # type: ignore[union-attr]
    approval = api(hub.stack, "GET", f"/api/v1/approvals/{approval_id}", hub.admin).json()
    assert approval["task_id"] == task_id and approval["status"] == "pending"
    assert ("orders.cancel", task_id) not in hub.runs()


def test_progress_reports_become_mcp_progress_notifications(hub: Hub) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def call() -> types.CallToolResult:
        async with session(hub.mcp, hub.caller.secret) as s:
            return await s.call_tool(
                "work.steps", {"steps": 3, "interval": 0.4}, progress_callback=on_progress
            )

    result = run(call())
    assert not result.is_error, result
    assert structured(result) == {"steps": 3}
    assert [(round(p, 3), t, m) for p, t, m in seen] == [
        (0.333, 1.0, "step 1"),
        (0.667, 1.0, "step 2"),
        (1.0, 1.0, "step 3"),
    ]


def test_no_key_a_forged_one_or_one_that_may_not_submit_is_refused(hub: Hub) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "1"}},
    }  # fmt: skip
    accept = {"Accept": "application/json, text/event-stream"}
    for headers, status, kind in (
        (accept, 401, "unauthenticated"),
        (
            {**accept, "Authorization": f"Bearer rk_{hub.caller.key_id}_{'x' * 43}"},
            401,
            "unauthenticated",
        ),  # a real key id, a forged secret
        ({**accept, **hub.viewer.headers()}, 403, "forbidden"),
    ):
        r = requests.post(hub.mcp, headers=headers, json=init, timeout=10)
        assert r.status_code == status, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["type"] == PROBLEM + kind
    r = requests.post(hub.mcp, headers={**accept, **hub.caller.headers()}, json=init, timeout=10)
    assert r.status_code == 200, r.text

    async def without_key() -> None:
        async with session(hub.mcp, None) as s:
            await s.list_tools()

    with pytest.raises(Exception):  # noqa: B017 -- the client's own error for a 401
        run(without_key())


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_on_sqlite_an_open_loopback_hub_serves_its_tools_and_parks_a_gated_call(
    hub_api: str,
) -> None:
    """The embedded store (the API alone: a parked call needs no worker); an open hub on
    loopback takes no key, and refuses a Host that is not a loopback name (DNS rebinding)."""
    capabilities = [
        {"type": "orders.cancel", "require_approval": True},
        {"type": "text.echo", "description": "Echo."},
    ]
    body = {"agent_id": "lite", "addr": "127.0.0.1:9", "allow_loopback": True,
            "capabilities": capabilities}  # fmt: skip
    assert requests.post(hub_api + "/v1/agents/register", json=body, timeout=10).ok

    async def calls() -> tuple[list[types.Tool], types.CallToolResult]:
        async with session(hub_api + "/mcp?agent=lite", None) as s:
            tools = (await s.list_tools()).tools
            return tools, await s.call_tool("orders.cancel", {"order": 1})

    tools, parked = run(calls())
    assert [(t.name, t.description) for t in tools][1] == ("text.echo", "Echo.")
    assert not parked.is_error and structured(parked)["status"] == "awaiting_approval"
    approval = requests.get(
        f"{hub_api}/api/v1/approvals/{structured(parked)['approval_id']}", timeout=10
    ).json()
    assert approval["status"] == "pending" and approval["agent_id"] == "lite"
    foreign = requests.post(
        hub_api + "/mcp",
        headers={"Host": "reach.attacker.example", "Accept": "application/json, text/event-stream"},
        json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
        timeout=10,
    )
    assert foreign.status_code == 403, foreign.text
    assert foreign.json()["type"] == PROBLEM + "forbidden" and "Host" in foreign.json()["detail"]
