"""What operators plug into: JSON logs and the monitoring kit, against one real hub.

The hub (api, worker, beat on PostgreSQL and Redis) runs with ``REACH_LOG_FORMAT=json``,
uvicorn's access log on and API keys required. Tasks go through it with every kind of
secret in play: admin, caller and agent API keys, the reach tokens the hub signs for each
delivery, a callback's signature and a secret in its ``callback_context``. Some fail into
retries, an open breaker and the dead-letter queue, one is refused at admission. Then:

- every metric the Grafana dashboard and the alert rules under deploy/ name is one the
  hub's ``/metrics`` exports;
- every line of every hub process's log parses as JSON with the fields promised, names
  its process's role, and the lines of a delivery name its task; no log file of the run
  (the agents' and the receiver's included) holds any of the secrets used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

import reach
from reach.core.security.auth import Scope
from reach.errors import CircuitOpen
from reach.hub.security import apikeys
from reach.hub.storage import create_engine_for, session_factory
from tests.acceptance.test_reach_tokens import Key, TokenAgent
from tests.support import processes
from tests.support.callback_receiver import CallbackReceiverProcess
from tests.support.monitoring import (
    alert_rules,
    dashboard_queries,
    exported_names,
    metric_names,
)
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, Stack, wait_http_ok
from tests.support.waiting import wait_until

STACK_SETTINGS = {
    "REACH_LOG_FORMAT": "json",
    "REACH_LOGGING__ACCESS_LOG": "true",
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_CALLBACKS__ALLOW_PRIVATE": "true",
    "REACH_ROUTER__MAX_RETRY": "1",
    "REACH_ROUTER__BACKOFF_BASE": "0.1",
    "REACH_ROUTER__BACKOFF_CAP": "0.2",
    "REACH_ROUTER__BREAKER_STREAK": "2",  # two tasks failing in a row open the breaker
    "REACH_ROUTER__BREAKER_TRIAL_INTERVAL": "0.5",
    "REACH_ROUTER__MAX_PAYLOAD_BYTES": "4096",
}
RECORDING_AGENT = REPO / "tests" / "acceptance" / "agents" / "recording_agent.py"
HUB_LOGS = {"api.log": "api", "worker.log": "worker", "beat.log": "beat"}
FIELDS = ("timestamp", "level", "logger", "message", "role")
pytestmark = pytest.mark.timeout(240)  # one hub, three agent processes, retries to dead ends


@dataclass
class Run:
    """What the module's traffic left behind: the secrets it used and the tasks it sent."""

    stack: Stack
    admin: Key
    secrets: dict[str, str] = field(default_factory=dict)
    delivered: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # every log of the run beyond the hub's


@pytest.fixture(scope="module")
def run(shared_stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Traffic through the JSON-logging hub: successes with a callback, failures that
    retry, open a breaker and end dead, a submit refused at admission."""
    directory = tmp_path_factory.mktemp("observability")
    admin, caller, echo_key, flaky_key = _keys(
        shared_stack,
        [(Scope.ADMIN, None), (Scope.CALLER, None), (Scope.AGENT, "obs-echo"),
         (Scope.AGENT, "obs-flaky")],
    )  # fmt: skip
    found = Run(shared_stack, admin)
    found.secrets.update(
        admin_key=admin.secret,
        caller_key=caller.secret,
        echo_agent_key=echo_key.secret,
        flaky_agent_key=flaky_key.secret,
    )
    receiver = CallbackReceiverProcess(free_port(), directory / "callbacks.jsonl")
    echo = TokenAgent(shared_stack, "obs-echo", echo_key, directory, admin=admin)
    flaky = _flaky_agent(shared_stack, flaky_key, directory)
    try:
        wait_until(lambda: _listening(receiver), timeout=20, what="callback receiver")
        wait_until(
            lambda: _online(shared_stack, admin, "obs-flaky", flaky),
            timeout=30,
            what="obs-flaky online",
        )
        _send_traffic(found, caller, echo, receiver)
        found.files = [p for p in directory.rglob("*") if p.is_file()]
        yield found
    finally:
        echo.stop()
        processes.stop(flaky)
        receiver.stop()


def _send_traffic(
    run: Run, caller: Key, echo: TokenAgent, receiver: CallbackReceiverProcess
) -> None:
    hub = run.stack.url
    context_secret = f"ctx-{uuid.uuid4().hex}"
    run.secrets["callback_context"] = context_secret
    path = f"/ok/{uuid.uuid4().hex[:8]}"
    for n in range(3):
        extra: dict[str, Any] = {}
        if n == 0:
            extra = {"callback_url": receiver.url + path, "callback_context": {"k": context_secret}}
        sub = reach.send(
            agent_id="obs-echo",
            method="work.do",
            payload={"n": n},
            hub=hub,
            api_key=caller.secret,
            **extra,
        )
        result = reach.wait_for_result(sub.task_id, timeout=30, hub=hub, api_key=caller.secret)
        assert result.data["echo"] == {"n": n}
        run.delivered.append(sub.task_id)
    for n, token in enumerate(t for task_id in run.delivered for t in echo.tokens(task_id)):
        run.secrets[f"reach_token_{n}"] = token
        run.secrets[f"reach_token_signature_{n}"] = token.rsplit(".", 1)[-1]
    assert any(k.startswith("reach_token_") for k in run.secrets), "no token was presented"
    posted = wait_until(lambda: receiver.requests(path), timeout=30, what="the callback")
    headers = {k.lower(): v for k, v in posted[0]["headers"].items()}
    run.secrets["callback_signature"] = headers["reach-signature"]
    # fail, retry once, open the breaker (per worker process), end dead; once the breaker
    # is open, admission refuses the next submit (503 circuit-open) -- how soon depends on
    # how fast the failures come back, so the refusal ends the burst, it is not a fault
    for n in range(4):
        try:
            sub = reach.send(
                agent_id="obs-flaky",
                method="work.do",
                payload={"n": n},
                hub=hub,
                api_key=caller.secret,
            )
        except CircuitOpen:
            assert run.dead, "the breaker was open before any task had failed"
            break
        run.dead.append(sub.task_id)
    first = run.dead[0]  # the others go on through retries and the breaker meanwhile
    wait_until(lambda: _status(run, first) == "dead", timeout=90, what=f"{first} dead-lettered")
    refused = requests.post(
        f"{hub}/v1/tasks",
        json={"agent_id": "obs-echo", "method": "work.do", "payload": {"blob": "x" * 5000}},
        headers=caller.headers,
        timeout=10,
    )
    assert refused.status_code == 413, refused.text


def _keys(stack: Stack, wanted: list[tuple[Scope, str | None]]) -> list[Key]:
    """Keys made in the hub's store, as ``reach keys create`` makes them (in-process: a
    CLI process per key costs seconds on a loaded box)."""
    engine = create_engine_for(stack.env["REACH_DATABASE_URL"])
    try:
        with session_factory(engine).begin() as session:
            made = [
                apikeys.create_key(
                    session, scope=scope, agent_pattern=pattern, name=f"observability {scope}",
                    expires_in_s=None, now=time.time(),
                )
                for scope, pattern in wanted
            ]  # fmt: skip
    finally:
        engine.dispose()
    return [Key(key.key_id, key.secret) for key in made]


def _flaky_agent(stack: Stack, key: Key, directory: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    env["REACH_API_KEY"] = key.secret
    args = [
        sys.executable, str(RECORDING_AGENT), "--port", str(free_port()), "--hub", stack.url,
        "--agent-id", "obs-flaky", "--mode", "fail", "--log", str(directory / "flaky.runs"),
    ]  # fmt: skip
    with (directory / "flaky.out").open("ab") as out:
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def _online(stack: Stack, admin: Key, agent_id: str, proc: subprocess.Popen[bytes]) -> bool:
    assert proc.poll() is None, f"{agent_id} exited"
    r = requests.get(f"{stack.url}/api/v1/agents/{agent_id}", headers=admin.headers, timeout=5)
    return r.ok and any(i["status"] == "online" for i in r.json().get("instances", []))


def _listening(receiver: CallbackReceiverProcess) -> bool:
    try:
        requests.post(f"{receiver.url}/ok/probe", timeout=1)
    except requests.RequestException:
        return False
    return True


def _status(run: Run, task_id: str) -> str:
    r = requests.get(f"{run.stack.url}/v1/tasks/{task_id}", headers=run.admin.headers, timeout=5)
    return str(r.json()["status"])


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines() if line.strip()]


def test_every_metric_the_kit_names_is_exported_by_the_hub(run: Run) -> None:
    named = metric_names(dashboard_queries() + [rule["expr"] for rule in alert_rules()])

    def missing() -> set[str]:
        r = requests.get(f"{run.stack.url}/metrics", headers=run.admin.headers, timeout=10)
        return named - exported_names(r.text)

    # a breaker opens once a worker process has seen two of the failing tasks fail
    wait_until(lambda: not missing(), timeout=60, what="every metric of the kit exported")


def test_every_hub_log_line_is_json_naming_its_role_and_task(run: Run) -> None:
    for name, role in HUB_LOGS.items():
        lines = _lines(run.stack.home / name)
        assert lines, name
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                pytest.fail(f"{name}: not JSON: {line!r}")
            missing = [key for key in FIELDS if key not in record]
            assert not missing, f"{name}: {missing} missing in {line!r}"
            assert record["role"] == role, line
    worker = [json.loads(line) for line in _lines(run.stack.home / "worker.log")]
    named = {r["task_id"] for r in worker if "task_id" in r}
    assert set(run.delivered) <= named  # a delivery's lines name its task
    assert all(isinstance(r["attempt"], int) for r in worker if "task_id" in r)
    api = [json.loads(line) for line in _lines(run.stack.home / "api.log")]
    assert any(r["logger"] == "uvicorn.access" for r in api)  # uvicorn's lines too


def test_flower_logs_json_lines_too(run: Run) -> None:
    port = free_port()
    log = run.stack.home / "flower.log"
    flower = HubProcess(["flower", "--port", str(port)], run.stack.env, log)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthcheck", flower)
    finally:
        flower.stop()
    records = [json.loads(line) for line in _lines(log)]  # every line parses
    assert records and {r["role"] for r in records} == {"flower"}


def test_no_log_of_the_run_holds_a_secret(run: Run) -> None:
    files = [p for p in run.stack.home.rglob("*.log") if p.is_file()] + run.files
    assert {p.name for p in files} >= set(HUB_LOGS)
    assert len(run.secrets) >= 8
    for path in files:
        text = path.read_text(errors="replace")
        if path.name.endswith((".jsonl", ".runs")):
            continue  # the receiver's journal and the agent's run list: the test's records
        leaked = [what for what, secret in run.secrets.items() if secret in text]
        assert not leaked, f"{path.name} holds {leaked}"
