"""An MCP server is an agent: a server built only with the ``mcp`` package's ``MCPServer``
(``tests.support.mcp_tool_server``, its own process on loopback) is registered with
``reach agents add-mcp`` against real hub processes (API, worker, beat) on PostgreSQL and
Redis. Its tools are the agent's capabilities; a reach is a ``tools/call`` (results,
``isError``, progress); the hub probes and scores it; a server killed mid-call is retried
and then dead-lettered (its calls counted at the server); the beat's re-read of the tool
list adds and removes tools, but does not take over a capability another agent owns.
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

import reach
from tests.support.mcp_tool_server import TOOLS, McpToolServer
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_MCP_AGENTS__REFRESH_S": "3",  # its heartbeat: offline after 9 s without a read
    "REACH_ROUTER__MAX_RETRY": "2",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "1",
    # a restarted tool server is back in the pool at its next probe, not 30 s later
    "REACH_PROBE__RETRY_INTERVAL": "1",
}
PROBLEM = "urn:agent-reach:problem:"
AGENT = "tool-server"  # from the server's name, "Tool Server"

pytestmark = pytest.mark.timeout(300)


def _wait_mcp(server: McpToolServer) -> None:
    def answers() -> bool:
        try:
            requests.get(server.url, timeout=1)
        except requests.ConnectionError:
            return False
        return True

    wait_until(answers, timeout=30, what=f"the tool server on {server.port}")


@pytest.fixture(scope="module")
def tools(shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpToolServer]:
    """The tool server, registered with the CLI as agent ``tool-server``."""
    home = tmp_path_factory.mktemp("mcp")
    server = McpToolServer(free_port(), home / "tools.jsonl")
    try:
        _wait_mcp(server)
        cli = subprocess.run(
            [sys.executable, "-m", "reach", "agents", "add-mcp", server.url, "--allow-loopback",
             "--tag", "tools", "--hub", shared_stack.url, "--json"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        added = json.loads(cli.stdout)
        assert added["agent_id"] == AGENT and added["tools"] == list(TOOLS)
        yield server
    finally:
        server.stop()


def add_mcp(stack: Stack, **body: Any) -> requests.Response:
    return requests.post(f"{stack.url}/api/v1/agents/mcp", json=body, timeout=30)


def agent(stack: Stack, agent_id: str = AGENT) -> dict[str, Any]:
    return dict(requests.get(f"{stack.url}/api/v1/agents/{agent_id}", timeout=5).json())


def test_add_mcp_registers_the_tools_as_capabilities(
    shared_stack: Stack, tools: McpToolServer
) -> None:
    body = agent(shared_stack)
    caps = {c["type"]: c for c in body["capabilities"]}
    assert list(caps) == list(TOOLS)
    assert caps["echo"]["description"] == "Echo the text back."
    assert caps["echo"]["params_schema"]["required"] == ["text"]  # the tool's inputSchema
    assert set(body["tags"]) == {"mcp", "tools"}
    inst = body["instances"][0]
    assert inst["protocol"] == "mcp" and inst["endpoint"] == tools.url
    assert inst["mcp"]["name"] == "Tool Server" and inst["mcp"]["tools"] == list(TOOLS)
    # the same network rule as any agent address; a URL that answers no MCP is refused
    loopback = add_mcp(shared_stack, url=tools.url)
    assert loopback.status_code == 422 and loopback.json()["type"] == PROBLEM + "loopback-address"
    nobody = add_mcp(shared_stack, url=f"http://127.0.0.1:{free_port()}/mcp", allow_loopback=True)
    assert nobody.status_code == 502, nobody.text
    assert nobody.json()["type"] == PROBLEM + "mcp-server-unavailable"
    not_mcp = add_mcp(shared_stack, url=f"{shared_stack.url}/healthz", allow_loopback=True)
    assert not_mcp.status_code == 502
    assert not_mcp.json()["type"] == PROBLEM + "mcp-server-unavailable"
    listed = requests.get(f"{shared_stack.url}/api/v1/agents", timeout=5).json()["agents"]
    assert [a["agent_id"] for a in listed if "mcp" in a["tags"]] == [AGENT]


def test_a_reach_is_a_tool_call(shared_stack: Stack, tools: McpToolServer) -> None:
    before = tools.calls()
    sub = reach.send(agent_id=AGENT, method="echo", payload={"text": "hi"}, hub=shared_stack.url)
    result = reach.wait_for_result(sub.task_id, timeout=30, hub=shared_stack.url)
    assert result.data == {"text": "hi", "by": "mcp-tools"}
    # by capability, as any agent's
    cap = reach.send(capability="echo", method="echo", payload={"text": "2"}, hub=shared_stack.url)
    by_cap = reach.wait_for_result(cap.task_id, timeout=30, hub=shared_stack.url)
    assert by_cap.data["text"] == "2"
    # the tool's isError is a business error, told at once (not retried)
    failed = reach.send(
        agent_id=AGENT, method="fail", payload={"order_id": "A-1"}, hub=shared_stack.url
    )
    with pytest.raises(reach.BusinessError) as caught:
        reach.wait_for_result(failed.task_id, timeout=30, hub=shared_stack.url)
    assert "fail" in caught.value.message
    assert "retry" not in [e["kind"] for e in shared_stack.events(failed.task_id)]
    # the inputSchema is the params_schema: a bad payload never reaches the server
    with pytest.raises(reach.InvalidPayload):
        reach.send(agent_id=AGENT, method="echo", payload={"txt": "x"}, hub=shared_stack.url)
    # progress notifications are the task's progress
    steps = reach.send(agent_id=AGENT, method="steps", payload={"steps": 3}, hub=shared_stack.url)
    stepped = reach.wait_for_result(steps.task_id, timeout=30, hub=shared_stack.url)
    assert stepped.data == {"steps": 3}
    progress = [e for e in shared_stack.events(steps.task_id) if e["kind"] == "progress"]
    assert [p["detail"]["message"] for p in progress] == ["step 1", "step 2", "step 3"]
    assert progress[-1]["detail"]["progress"] == 1.0 and "a2a_state" not in progress[-1]["detail"]
    # an answer past the hub's cap (1 MiB) is refused, as an SDK agent's is, not retried
    big = reach.send(
        agent_id=AGENT, method="big", payload={"size": 1_100_000}, hub=shared_stack.url
    )
    with pytest.raises(reach.BusinessError):
        reach.wait_for_result(big.task_id, timeout=30, hub=shared_stack.url)
    assert "retry" not in [e["kind"] for e in shared_stack.events(big.task_id)]
    calls = tools.calls() - before
    assert calls == {"echo": 2, "fail": 1, "steps": 1, "big": 1}


def test_the_server_is_probed_scored_and_kept_alive_by_its_tool_list(
    shared_stack: Stack, tools: McpToolServer
) -> None:
    first = shared_stack.instance(AGENT)
    assert first is not None
    probed = wait_until(
        lambda: (
            (i := shared_stack.instance(AGENT))
            and i["probe_status"] == "ok"
            and i["rtt_ms"] is not None
            and i["last_heartbeat"] != first["last_heartbeat"]
            and i
        ),
        timeout=30,
        what="an MCP ping and a re-read of the tool list",
    )
    assert probed["status"] == "online" and probed["reach_score"] > 50
    assert probed["heartbeat_count"] > first["heartbeat_count"]


def test_a_server_killed_mid_call_is_retried_then_dead_lettered(
    shared_stack: Stack, tools: McpToolServer, tmp_path: Path
) -> None:
    victim = McpToolServer(free_port(), tmp_path / "victim.jsonl")
    try:
        _wait_mcp(victim)
        r = add_mcp(shared_stack, url=victim.url, agent_id="victim", allow_loopback=True)
        assert r.status_code == 201, r.text
        sub = reach.send(
            agent_id="victim",
            method="slow",
            payload={"seconds": 60},
            timeout_ms=120_000,
            hub=shared_stack.url,
        )
        wait_until(lambda: victim.calls()["slow"] == 1, timeout=30, what="the call")
        victim.kill()
        dead = wait_until(
            lambda: (t := shared_stack.task(sub.task_id))["status"] == "dead" and t,
            timeout=90,
            what="the dead letter",
        )
    finally:
        victim.stop()
        gone = requests.post(  # it owns no capability any more (the refresh test's tools)
            f"{shared_stack.url}/v1/agents/deregister",
            json={"agent_id": "victim", "instance_id": r.json()["instance_id"]},
            timeout=10,
        )
        assert gone.status_code in (200, 204), gone.text
    kinds = [e["kind"] for e in shared_stack.events(sub.task_id)]
    assert kinds.count("retry") == 2 and kinds[-1] == "dead_letter", kinds
    assert dead["error"]["reason"] == "2 retries exhausted"
    letters = requests.get(f"{shared_stack.url}/api/v1/dead-letters", timeout=5).json()
    assert sub.task_id in [d["task_id"] for d in letters["dead_letters"]]
    assert victim.calls()["slow"] == 1  # called once: the server was gone for the retries


def _capabilities(stack: Stack) -> list[str]:
    return [c["type"] for c in agent(stack)["capabilities"]]


def _online(stack: Stack) -> None:
    """Once restarted, the server is routable again when a probe has answered."""
    wait_until(
        lambda: (i := stack.instance(AGENT)) and i["status"] == "online" and i["routable"],
        timeout=30,
        what="the restarted server online",
    )


def test_a_changed_tool_list_adds_and_removes_tools(
    shared_stack: Stack, tools: McpToolServer
) -> None:
    try:
        tools.restart("--extra", "search.web", "--without", "steps")
        _wait_mcp(tools)
        wait_until(
            lambda: _capabilities(shared_stack) == ["echo", "slow", "fail", "big", "search.web"],
            timeout=30,
            what="the re-read tool list",
        )
        _online(shared_stack)
        sub = reach.send(agent_id=AGENT, method="search.web", hub=shared_stack.url)
        result = reach.wait_for_result(sub.task_id, timeout=30, hub=shared_stack.url)
        assert result.data == {"tool": "search.web"}
        with pytest.raises(reach.NoSuitableAgent):
            reach.send(agent_id=AGENT, method="steps", payload={"steps": 1}, hub=shared_stack.url)
    finally:
        tools.restart()
        _wait_mcp(tools)
    wait_until(lambda: _capabilities(shared_stack) == list(TOOLS), timeout=30, what="restored")
    _online(shared_stack)


def test_a_reread_tool_list_takes_over_no_capability_another_agent_owns(
    shared_stack: Stack, tools: McpToolServer
) -> None:
    owner = requests.post(
        f"{shared_stack.url}/v1/agents/register",
        json={
            "agent_id": "ledger",
            "instance_id": "ledger-1",
            "addr": f"http://127.0.0.1:{free_port()}",
            "allow_loopback": True,
            "capabilities": [{"type": "ledger.pay"}],
        },
        timeout=10,
    )
    assert owner.status_code in (200, 201), owner.text
    trust = requests.put(
        f"{shared_stack.url}/api/v1/agents/ledger/trust", json={"level": "L1"}, timeout=10
    )
    assert trust.status_code == 200, trust.text
    try:
        tools.restart("--extra", "ledger.pay", "--extra", "notes.add")
        _wait_mcp(tools)
        # the new tool nobody owns is taken; the one the L1 ledger owns is held
        inst = wait_until(
            lambda: (
                "notes.add" in _capabilities(shared_stack)
                and (i := shared_stack.instance(AGENT))
                and i
            ),
            timeout=30,
            what="the re-read tool list",
        )
        assert "ledger.pay" not in _capabilities(shared_stack)
        assert inst["mcp"]["held"] == {"ledger.pay": "ledger"}
        events = requests.get(
            f"{shared_stack.url}/api/v1/instances/{inst['instance_id']}/events", timeout=5
        ).json()
        held = [e for e in events["events"] if e.get("alert") == "mcp_tools_held"]
        assert len(held) == 1 and "ledger.pay (owned by ledger)" in held[0]["reason"]
        # an admin who registers the server again declares it: a decision, audited
        again = add_mcp(shared_stack, url=tools.url, allow_loopback=True, tags=["tools"])
        assert again.status_code == 201, again.text
        assert "ledger.pay" in again.json()["tools"]
    finally:
        tools.restart()
        _wait_mcp(tools)
    wait_until(lambda: _capabilities(shared_stack) == list(TOOLS), timeout=30, what="restored")
    _online(shared_stack)
