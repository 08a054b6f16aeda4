"""A2A interop both ways, with the real ``a2a-sdk`` on both sides and real processes (API,
worker, beat; on SQLite with the embedded broker and on PostgreSQL with Redis).

Hub → A2A: an echo agent built only with a2a-sdk's route factories is registered by its
card (the CLI and the admin API), reached with ``reach.send`` over JSON-RPC (streaming
and not, with a bearer scheme), its executions counted at the agent; its stream's status
updates are the task's progress; failed and input-required tasks end or wait as they
should; an agent killed mid-task is followed, retried and dead-lettered.

A2A → hub: a2a-sdk's own client calls a hub SDK agent through ``/a2a/{agent_id}``
(blocking, streaming, GetTask, CancelTask); the protocol's errors come from the protocol
(version header, v0.3 names unless compatibility is on, unknown methods, bad params).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
from a2a.client import ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.types import CancelTaskRequest, GetTaskRequest, Message, SendMessageRequest
from a2a.utils.errors import A2AError, TaskNotCancelableError
from google.protobuf import json_format

import reach
from reach.sdk.stream import parse_sse
from tests.support.a2a_echo import A2aEchoProcess, message_ids
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.progress_agent import ProgressAgentProcess
from tests.support.stacks import HubProcess, Stack, wait_http_ok
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_A2A__CARD_REFRESH_S": "1",
    "REACH_A2A__POLL_INTERVAL_S": "0.5",
    "REACH_ROUTER__MAX_RETRY": "2",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "1",
    "REACH_SERVER__STREAM_PING_S": "1",
}
PROBLEM = "urn:agent-reach:problem:"
BEARER = "s3cret-token-of-the-plain-agent"


@pytest.fixture(scope="module")
def fleet(
    shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A streaming echo agent (registered with the CLI), a non-streaming one behind a
    bearer scheme (registered with the API) and a hub SDK agent reporting progress."""
    home = tmp_path_factory.mktemp("a2a")
    echo = A2aEchoProcess(free_port(), home / "echo.jsonl", streaming=True)
    plain = A2aEchoProcess(free_port(), home / "plain.jsonl", streaming=False, bearer=BEARER)
    progress = ProgressAgentProcess(shared_stack.url, home / "progress.log", free_port())
    try:
        for agent in (echo, plain):
            wait_http_ok(agent.url + "/.well-known/agent-card.json")
        cli = subprocess.run(
            [sys.executable, "-m", "reach", "agents", "add-a2a", echo.url, "--allow-loopback",
             "--hub", shared_stack.url, "--json"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
        assert cli.returncode == 0, cli.stderr
        added = json.loads(cli.stdout)
        assert added["agent_id"] == "echo-agent"
        assert added["skills"] == ["echo", "steps", "slow", "fail", "ask"]
        wait_until(lambda: shared_stack.instances("progress"), timeout=30, what="progress agent")
        yield {"echo": echo, "plain": plain, "home": home}
    finally:
        for proc in (echo, plain, progress):
            proc.stop()


def add_a2a(stack: Stack, **body: Any) -> requests.Response:
    return requests.post(f"{stack.url}/api/v1/agents/a2a", json=body, timeout=30)


def agents(stack: Stack) -> list[str]:
    body = requests.get(f"{stack.url}/api/v1/agents", timeout=5).json()
    return [a["agent_id"] for a in body["agents"]]


# -- hub -> A2A agent ---------------------------------------------------------------------


def test_a_bad_card_is_refused_with_its_reason_and_nothing_is_registered(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    before = agents(shared_stack)
    plain: A2aEchoProcess = fleet["plain"]
    loopback = add_a2a(shared_stack, card_url=plain.url, credential=BEARER)
    assert loopback.status_code == 422 and loopback.json()["type"] == PROBLEM + "loopback-address"
    nobody = add_a2a(shared_stack, card_url=f"http://127.0.0.1:{free_port()}", allow_loopback=True)
    assert nobody.status_code == 502, nobody.text
    assert nobody.json()["type"] == PROBLEM + "agent-card-unavailable"
    no_secret = add_a2a(shared_stack, card_url=plain.url, allow_loopback=True)
    assert (
        no_secret.status_code == 422 and no_secret.json()["type"] == PROBLEM + "invalid-agent-card"
    )
    assert "requires bearer authentication" in no_secret.json()["detail"]
    not_a_card = add_a2a(
        shared_stack, card_url=f"{shared_stack.url}/healthz.json", allow_loopback=True
    )
    assert not_a_card.status_code in (422, 502), not_a_card.text  # 404 there: unavailable
    hub_json = add_a2a(
        shared_stack, card_url=f"{shared_stack.url}/openapi.json", allow_loopback=True
    )
    assert hub_json.status_code == 422 and hub_json.json()["type"] == PROBLEM + "invalid-agent-card"
    assert agents(shared_stack) == before


def test_a_card_registers_an_agent_of_its_skills_probed_and_kept_alive_by_its_card(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    body = requests.get(f"{shared_stack.url}/api/v1/agents/echo-agent", timeout=5).json()
    assert [c["type"] for c in body["capabilities"]] == ["echo", "steps", "slow", "fail", "ask"]
    assert {"a2a", "test", "echo"} <= set(body["tags"])
    inst = body["instances"][0]
    assert inst["protocol"] == "a2a" and inst["status"] == "online"
    assert inst["a2a"]["streaming"] is True and inst["a2a"]["security"] == "none"
    assert inst["a2a"]["skills"][0]["input_modes"] == ["text/plain", "application/json"]
    # probes ask for the card; beat re-reads it (the hub-stamped heartbeat moves on)
    first = inst["last_heartbeat"]
    probed = wait_until(
        lambda: (i := shared_stack.instance("echo-agent")) and i["probe_status"] == "ok" and i,
        timeout=20,
        what="a probe of the card",
    )
    assert probed["rtt_ms"] is not None
    wait_until(
        lambda: shared_stack.instance("echo-agent")["heartbeat_count"] >= 1,  # type: ignore[index]
        timeout=20,
        what="the card read again (counted as a heartbeat)",
    )
    wait_until(
        lambda: shared_stack.instance("echo-agent")["last_heartbeat"] != first,  # type: ignore[index]
        timeout=20,
        what="the card read again",
    )


def test_send_reaches_the_a2a_agent_once_per_task_with_the_payload_mapped_both_ways(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    echo: A2aEchoProcess = fleet["echo"]
    task_id = f"t-{uuid.uuid4().hex[:10]}"
    sub = reach.send(
        agent_id="echo-agent",
        method="echo",
        payload={"text": "hello a2a", "n": 1, "nested": {"k": [1, 2]}},
        task_id=task_id,
        hub=shared_stack.url,
    )
    result = reach.wait_for_result(sub.task_id, timeout=30, hub=shared_stack.url)
    assert result.data == {
        "text": "echo: hello a2a",
        "n": 1,
        "nested": {"k": [1, 2]},
        "by": "a2a-echo",
    }
    again = reach.send(
        agent_id="echo-agent", method="echo", payload={"text": "hello a2a", "n": 1,
        "nested": {"k": [1, 2]}}, task_id=task_id, hub=shared_stack.url,
    )  # fmt: skip
    assert again.task_id == task_id
    time.sleep(1)
    assert echo.counts()[task_id] == 1  # counted at the A2A agent: one execution
    assert message_ids(echo.journal)[task_id] == {task_id}  # the task ID is the message ID
    kinds = [e["kind"] for e in shared_stack.events(task_id)]
    assert kinds.count("dispatched") == 1 and kinds[-1] == "terminal_success", kinds


def test_the_streaming_skills_updates_are_the_tasks_progress_in_its_stream(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    sub = reach.send(
        agent_id="echo-agent",
        method="steps",
        payload={"steps": 3, "interval": 0.3},
        hub=shared_stack.url,
    )
    events: list[tuple[str, dict[str, Any]]] = []
    url = f"{shared_stack.url}/v1/tasks/{sub.task_id}/stream"
    with requests.get(url, stream=True, timeout=(3, 30)) as r:
        assert r.status_code == 200
        for kind, data, _id in parse_sse(r.iter_content(chunk_size=None)):
            events.append((kind, json.loads(data)))
            if kind == "result":
                break
    progress = [d for k, d in events if k == "progress"]
    assert [p["message"] for p in progress] == ["step 1", "step 2", "step 3"]
    assert [p["progress"] for p in progress] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert events[-1][1]["status"] == "success"
    assert events[-1][1]["result"] == {
        "steps": 3,
        "interval": 0.3,
        "by": "a2a-echo",
        "text": "echo: ",
    }


def test_a_failed_task_is_a_business_error_and_input_required_waits_where_the_caller_sees_it(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    failed = reach.send(agent_id="echo-agent", method="fail", hub=shared_stack.url)
    with pytest.raises(reach.BusinessError) as caught:
        reach.wait_for_result(failed.task_id, timeout=30, hub=shared_stack.url)
    assert "no such order" in str(caught.value)
    asked = reach.send(
        agent_id="echo-agent", method="ask", payload={"text": "q"}, hub=shared_stack.url
    )
    waiting = wait_until(
        lambda: shared_stack.task(asked.task_id)["status"] == "waiting", timeout=30, what="waiting"
    )
    assert waiting
    with pytest.raises(reach.ResultTimeout) as still:
        reach.wait_for_result(asked.task_id, timeout=0.5, hub=shared_stack.url)
    assert still.value.extra["status"] == "waiting" and "asked for input" in str(still.value)
    waited = [e for e in shared_stack.events(asked.task_id) if e["kind"] == "waiting"]
    assert waited[0]["detail"]["message"] == "which region?"
    assert waited[0]["detail"]["reason"] == "input_required"


def test_a_non_streaming_agent_behind_a_bearer_scheme_is_reached_with_its_credential(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    plain: A2aEchoProcess = fleet["plain"]
    r = add_a2a(
        shared_stack, card_url=plain.url, agent_id="plain", credential=BEARER, allow_loopback=True
    )
    assert r.status_code == 201, r.text
    view = requests.get(f"{shared_stack.url}/api/v1/agents/plain", timeout=5).json()
    shown = json.dumps(view)
    assert BEARER not in shown and view["instances"][0]["a2a"]["security"] == "bearer"
    sub = reach.send(agent_id="plain", method="echo", payload={"text": "hi"}, hub=shared_stack.url)
    result = reach.wait_for_result(sub.task_id, timeout=30, hub=shared_stack.url)
    assert result.data == {"text": "echo: hi", "by": "a2a-echo"}
    assert plain.counts()[sub.task_id] == 1
    assert BEARER not in json.dumps(shared_stack.events(sub.task_id))


def test_an_a2a_agent_killed_mid_task_is_followed_retried_then_dead_lettered(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    victim = A2aEchoProcess(free_port(), fleet["home"] / "victim.jsonl", streaming=True)
    try:
        wait_http_ok(victim.url + "/.well-known/agent-card.json")
        r = add_a2a(shared_stack, card_url=victim.url, agent_id="victim", allow_loopback=True)
        assert r.status_code == 201, r.text
        sub = reach.send(
            agent_id="victim",
            method="slow",
            payload={"seconds": 60},
            timeout_ms=120_000,
            hub=shared_stack.url,
        )
        wait_until(lambda: victim.counts()[sub.task_id] == 1, timeout=30, what="the execution")
        wait_until(
            lambda: any(e["kind"] == "progress" for e in shared_stack.events(sub.task_id)),
            timeout=30,
            what="the stream's first update",
        )
        victim.kill()
        dead = wait_until(
            lambda: (t := shared_stack.task(sub.task_id))["status"] == "dead" and t,
            timeout=60,
            what="the dead letter",
        )
    finally:
        victim.stop()
    kinds = [e["kind"] for e in shared_stack.events(sub.task_id)]
    assert "follow_failed" in kinds, kinds  # the cut stream's task was followed with GetTask
    assert kinds.count("retry") == 2 and kinds[-1] == "dead_letter", kinds
    assert dead["error"]["reason"] == "2 retries exhausted"
    letters = requests.get(f"{shared_stack.url}/api/v1/dead-letters", timeout=5).json()
    assert sub.task_id in [d["task_id"] for d in letters["dead_letters"]]
    assert victim.counts()[sub.task_id] == 1  # executed once: the agent was gone after


def test_an_a2a_agent_restarted_mid_task_without_its_tasks_gets_the_task_again(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    phoenix = A2aEchoProcess(free_port(), fleet["home"] / "phoenix.jsonl", streaming=True)
    try:
        wait_http_ok(phoenix.url + "/.well-known/agent-card.json")
        r = add_a2a(shared_stack, card_url=phoenix.url, agent_id="phoenix", allow_loopback=True)
        assert r.status_code == 201, r.text
        phoenix.standby()  # ready to take the port at once: the task is still running then
        sub = reach.send(
            agent_id="phoenix",
            method="slow",
            payload={"seconds": 4},
            timeout_ms=60_000,
            hub=shared_stack.url,
        )
        wait_until(lambda: phoenix.counts()[sub.task_id] == 1, timeout=30, what="the execution")
        phoenix.swap()  # same port, an empty task store: GetTask answers TaskNotFound
        result = reach.wait_for_result(sub.task_id, timeout=60, hub=shared_stack.url)
    finally:
        phoenix.stop()
    assert result.data["by"] == "a2a-echo"
    assert phoenix.counts()[sub.task_id] == 2  # run again after the restart, not lost
    kinds = [e["kind"] for e in shared_stack.events(sub.task_id)]
    assert kinds.count("retry") >= 1 and kinds[-1] == "terminal_success", kinds


# -- A2A client -> hub agent --------------------------------------------------------------


def a2a_message(text: str, skill: str | None = None, **data: Any) -> Message:
    body: dict[str, Any] = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": []}
    if text:
        body["parts"].append({"text": text})
    if data:
        body["parts"].append({"data": data})
    if skill:
        body["metadata"] = {"skill": skill}
    return json_format.ParseDict(body, Message())


async def _client_calls(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=60) as http:
        blocking = await create_client(url, ClientConfig(streaming=False, httpx_client=http))
        request = SendMessageRequest(message=a2a_message("", steps=2, interval=0.1))
        out["blocking"] = [
            json_format.MessageToDict(e) async for e in blocking.send_message(request)
        ]
        task_id = out["blocking"][-1]["task"]["id"]
        out["get"] = json_format.MessageToDict(await blocking.get_task(GetTaskRequest(id=task_id)))
        try:
            await blocking.cancel_task(CancelTaskRequest(id=task_id))
        except (A2AError, A2AClientError) as exc:
            out["cancel_error"] = exc
        streaming = await create_client(url, ClientConfig(streaming=True, httpx_client=http))
        request = SendMessageRequest(message=a2a_message("go", steps=3, interval=0.2))
        out["stream"] = [
            json_format.MessageToDict(e) async for e in streaming.send_message(request)
        ]
    return out


def test_an_a2a_sdk_client_reaches_a_hub_sdk_agent_blocking_and_streaming(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    card = requests.get(f"{shared_stack.url}/a2a/progress/.well-known/agent-card.json", timeout=5)
    assert card.status_code == 200
    assert [s["id"] for s in card.json()["skills"]] == ["work.do"]  # its only capability
    assert card.json()["supportedInterfaces"][0]["url"] == f"{shared_stack.url}/a2a/progress"
    got = asyncio.run(_client_calls(f"{shared_stack.url}/a2a/progress"))
    task = got["blocking"][-1]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    parts = task["artifacts"][0]["parts"]
    assert parts == [{"data": {"steps": 2.0, "by": "progress"}}]
    assert got["get"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert isinstance(got["cancel_error"], TaskNotCancelableError), got["cancel_error"]
    hub_task = shared_stack.task(task["id"])  # the A2A task is the hub's task
    assert hub_task["status"] == "success" and hub_task["agent_id"] == "progress"
    stream = got["stream"]
    updates = [e["statusUpdate"]["status"] for e in stream if "statusUpdate" in e]
    said = [u["message"]["parts"][0]["text"] for u in updates if "message" in u]
    assert said == ["step 1", "step 2", "step 3"], stream
    assert updates[-1]["state"] == "TASK_STATE_COMPLETED"
    artifacts = [e["artifactUpdate"]["artifact"] for e in stream if "artifactUpdate" in e]
    assert artifacts[0]["parts"] == [{"data": {"steps": 3.0, "by": "progress"}}]


def rpc(url: str, method: str, params: Any, version: str | None = "1.0") -> dict[str, Any]:
    headers = {"A2A-Version": version} if version else {}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    r = requests.post(url, json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_the_protocols_own_errors_for_versions_methods_and_params(
    shared_stack: Stack, fleet: dict[str, Any]
) -> None:
    url = f"{shared_stack.url}/a2a/progress"
    message = json_format.MessageToDict(a2a_message("hi", steps=1, interval=0.05))
    assert rpc(url, "SendMessage", {"message": message}, version=None)["error"]["code"] == -32009
    assert rpc(url, "SendMessage", {"message": message}, version="0.3")["error"]["code"] == -32009
    v03 = {"message": {"messageId": "x", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}}
    assert rpc(url, "message/send", v03)["error"]["code"] == -32601  # v0.3 name: no compat
    assert rpc(url, "Teleport", {})["error"]["code"] == -32601
    assert rpc(url, "SendMessage", {"message": "not an object"})["error"]["code"] == -32602
    # several skills and none named: invalid params, listing them
    many = rpc(f"{shared_stack.url}/a2a/echo-agent", "SendMessage", {"message": message})
    assert many["error"]["code"] == -32602
    assert "echo, steps, slow, fail, ask" in many["error"]["message"]
    unknown = requests.post(
        f"{shared_stack.url}/a2a/nobody", json={}, headers={"A2A-Version": "1.0"}, timeout=5
    )
    assert unknown.status_code == 404 and unknown.json()["type"] == PROBLEM + "unknown-agent"
    # a capability's card and endpoint: whichever agent has it answers
    card = requests.get(
        f"{shared_stack.url}/a2a/capability/work.do/.well-known/agent-card.json", timeout=5
    ).json()
    assert card["skills"][0]["id"] == "work.do"
    done = rpc(f"{shared_stack.url}/a2a/capability/work.do", "SendMessage", {"message": message})
    assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", done


def test_v03_method_names_work_once_compatibility_is_on(
    shared_stack: Stack, fleet: dict[str, Any], tmp_path: Path
) -> None:
    port = free_port()
    env = {**shared_stack.env, "REACH_A2A__V03_COMPAT": "true"}
    api = HubProcess(["api", "--port", str(port)], env, tmp_path / "api-compat.log")
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", api)
        message = {
            "messageId": uuid.uuid4().hex,
            "role": "user",
            "parts": [{"kind": "data", "data": {"steps": 1, "interval": 0.05}}],
        }
        answer = rpc(
            f"http://127.0.0.1:{port}/a2a/progress",
            "message/send",
            {"message": message},
            version=None,
        )
        assert answer.get("result", {}).get("status", {}).get("state") == "completed", answer
    finally:
        api.stop()
    assert os.environ.get("REACH_A2A__V03_COMPAT") is None


def _key(stack: Stack, scope: str) -> str:
    made = subprocess.run(
        [sys.executable, "-m", "reach", "keys", "create", "--scope", scope, "--name",
         f"a2a-{scope}", "--json"],
        env=stack.env, capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return str(json.loads(made.stdout.strip().splitlines()[-1])["secret"])


async def _send_with_key(url: str, key: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as http:
        client = await create_client(url, ClientConfig(streaming=False, httpx_client=http))
        request = SendMessageRequest(message=a2a_message("", steps=1, interval=0.05))
        return [json_format.MessageToDict(e) async for e in client.send_message(request)][-1]


def test_with_auth_on_the_a2a_endpoints_take_a_callers_key_and_the_card_says_so(
    shared_stack: Stack, fleet: dict[str, Any], tmp_path: Path
) -> None:
    port = free_port()
    env = {**shared_stack.env, "REACH_SECURITY__REQUIRE_AUTH": "true"}
    api = HubProcess(["api", "--port", str(port)], env, tmp_path / "api-auth.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{base}/healthz", api)
        caller, viewer = _key(shared_stack, "caller"), _key(shared_stack, "viewer")
        card_url = f"{base}/a2a/progress/.well-known/agent-card.json"
        nobody = requests.get(card_url, timeout=5)
        assert nobody.status_code == 401 and nobody.json()["type"] == PROBLEM + "unauthenticated"
        rpc_url = f"{base}/a2a/progress"
        anonymous = requests.post(rpc_url, json={}, headers={"A2A-Version": "1.0"}, timeout=5)
        assert anonymous.status_code == 401
        looker = requests.post(
            rpc_url, json={}, headers={"Authorization": f"Bearer {viewer}"}, timeout=5
        )
        assert looker.status_code == 403 and looker.json()["type"] == PROBLEM + "forbidden"
        card = requests.get(card_url, headers={"Authorization": f"Bearer {caller}"}, timeout=5)
        assert card.status_code == 200
        scheme = card.json()["securitySchemes"]["reach"]["httpAuthSecurityScheme"]
        assert scheme["scheme"] == "bearer"
        assert card.json()["securityRequirements"] == [{"schemes": {"reach": {}}}]
        answer = asyncio.run(_send_with_key(rpc_url, caller))
        assert answer["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert shared_stack.task(answer["task"]["id"])["caller"].startswith("key:")
    finally:
        api.stop()
