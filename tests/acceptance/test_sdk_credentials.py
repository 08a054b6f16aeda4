"""The SDK's API keys against a hub that requires them, every part a real process, both stores.

Keys come from ``reach keys create`` (the CLI, on the hub's store); agents run as their own
processes with their key in ``$REACH_API_KEY`` and log everything at DEBUG, so the tests
can show the key never reaches a log line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

import reach
from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until

STACK_SETTINGS = {"REACH_SECURITY__REQUIRE_AUTH": "true"}
AGENT_SCRIPT = REPO / "tests" / "acceptance" / "agents" / "keyed_agent.py"
WORKER = "kw-worker"
PLANNER = "kw-planner"


# -- helpers shared with test_api_keys_cli --------------------------------------------------


def reach_cli(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``reach <args>`` as its own process, with the hub's environment."""
    return subprocess.run(
        [sys.executable, "-m", "reach", *args],
        env={**env, "COLUMNS": "200"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@dataclass(frozen=True)
class Key:
    key_id: str
    secret: str
    scope: str


def create_key(env: dict[str, str], scope: str, *extra: str) -> Key:
    """A key made by ``reach keys create --json`` (the secret is in that one object)."""
    done = reach_cli(env, "keys", "create", "--scope", scope, "--json", *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    body = json.loads(done.stdout)
    return Key(body["key_id"], body["secret"], body["scope"])


def get(url: str, key: Key | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key.secret}"} if key else {}
    return requests.get(url, headers=headers, timeout=10)


def online(stack: Stack, admin: Key, agent_id: str) -> bool:
    r = get(f"{stack.url}/api/v1/agents/{agent_id}", admin)
    return r.ok and any(i["status"] == "online" for i in r.json().get("instances", []))


class KeyedAgent:
    """tests/acceptance/agents/keyed_agent.py with ``key`` in ``$REACH_API_KEY``."""

    def __init__(self, hub: str, agent_id: str, key: Key | str | None, directory: Path) -> None:
        self.agent_id = agent_id
        self.port = free_port()
        self.executions_path = directory / f"{agent_id}-{self.port}.executions"
        self.output_path = directory / f"{agent_id}-{self.port}.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
        secret = key.secret if isinstance(key, Key) else key
        if secret is not None:
            env["REACH_API_KEY"] = secret
        env["PYTHONUNBUFFERED"] = "1"
        with self.output_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(AGENT_SCRIPT),
                    "--port",
                    str(self.port),
                    "--hub",
                    hub,
                    "--agent-id",
                    agent_id,
                    "--log",
                    str(self.executions_path),
                ],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def executions(self) -> list[str]:
        if not self.executions_path.exists():
            return []
        return self.executions_path.read_text().split()

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def stop(self) -> None:
        processes.stop(self.proc)


def assert_no_secret(text: str, *keys: Key) -> None:
    for key in keys:
        assert key.secret not in text
        assert key.secret.split("_", 2)[2] not in text  # not even the random part alone


# -- fixtures ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Keys:
    admin: Key
    caller: Key
    viewer: Key
    worker: Key
    planner: Key

    def all(self) -> tuple[Key, ...]:
        return (self.admin, self.caller, self.viewer, self.worker, self.planner)


@pytest.fixture(scope="module")
def keys(shared_stack: Stack) -> Keys:
    env = shared_stack.env
    return Keys(
        admin=create_key(env, "admin", "--name", "ops"),
        caller=create_key(env, "caller", "--name", "app"),
        viewer=create_key(env, "viewer"),
        worker=create_key(env, "agent", "--agent-id", WORKER),
        planner=create_key(env, "agent", "--agent-id", PLANNER),
    )


@pytest.fixture(scope="module")
def agents(
    shared_stack: Stack, keys: Keys, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, KeyedAgent]]:
    directory = tmp_path_factory.mktemp("agents")
    started = {
        WORKER: KeyedAgent(shared_stack.url, WORKER, keys.worker, directory),
        PLANNER: KeyedAgent(shared_stack.url, PLANNER, keys.planner, directory),
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
        yield started
    finally:
        for agent in started.values():
            agent.stop()
        for agent in started.values():
            assert_no_secret(agent.output(), *keys.all())


@pytest.fixture(autouse=True)
def _no_ambient_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test process itself has no key unless a test passes one."""
    monkeypatch.delenv("REACH_API_KEY", raising=False)


# -- tests ---------------------------------------------------------------------------------


def test_agent_key_registers_and_the_agent_takes_a_caller_key_task(
    shared_stack: Stack, keys: Keys, agents: dict[str, KeyedAgent]
) -> None:
    worker = agents[WORKER]
    before = len(worker.executions())
    sub = reach.send(
        agent_id=WORKER,
        method="work.do",
        payload={"n": 1},
        hub=shared_stack.url,
        api_key=keys.caller.secret,
    )
    result = reach.wait_for_result(
        sub.task_id, timeout=30, hub=shared_stack.url, api_key=keys.caller.secret
    )
    assert result.data == {"echo": {"n": 1}, "by": WORKER}
    assert worker.executions()[before:] == [sub.task_id]  # counted at the agent
    view = reach.get_task(sub.task_id, hub=shared_stack.url, api_key=keys.caller.secret)
    assert view["caller"] == f"key:{keys.caller.key_id}"
    # the agent's registration and heartbeats were its own key's doing
    wait_until(
        lambda: (
            get(f"{shared_stack.url}/api/v1/agents/{WORKER}", keys.admin).json()["instances"][0][
                "heartbeat_count"
            ]
            >= 1
        ),
        timeout=10,
        what="a heartbeat",
    )


def test_the_key_from_the_environment_is_the_default(
    shared_stack: Stack, keys: Keys, agents: dict[str, KeyedAgent], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REACH_API_KEY", keys.caller.secret)
    sub = reach.send(agent_id=WORKER, method="work.do", payload={"n": 2}, hub=shared_stack.url)
    assert reach.wait_for_result(sub.task_id, timeout=30, hub=shared_stack.url).data["echo"] == {
        "n": 2
    }


def test_without_a_key_every_call_is_unauthenticated(
    shared_stack: Stack, keys: Keys, agents: dict[str, KeyedAgent]
) -> None:
    hub = shared_stack.url
    with pytest.raises(reach.Unauthenticated) as caught:
        reach.send(agent_id=WORKER, method="work.do", payload={}, hub=hub)
    assert caught.value.problem_type() == "urn:agent-reach:problem:unauthenticated"
    sub = reach.send(
        agent_id=WORKER, method="work.do", payload={}, hub=hub, api_key=keys.caller.secret
    )
    with pytest.raises(reach.Unauthenticated):
        reach.get_task(sub.task_id, hub=hub)
    with pytest.raises(reach.Unauthenticated):
        reach.wait_for_result(sub.task_id, timeout=5, hub=hub)
    with pytest.raises(reach.Unauthenticated):
        reach.broadcast(method="work.do", capability="work.do", timeout=2, hub=hub)
    with pytest.raises(reach.Unauthenticated):
        reach.report_result(sub.task_id, {"x": 1}, attempt_seq=1, instance_id="i", hub=hub)
    with pytest.raises(reach.Unauthenticated):
        reach.report_progress(sub.task_id, 0.5, attempt_seq=1, instance_id="i", hub=hub)


def test_a_wrong_key_is_unauthenticated_and_its_secret_is_in_no_error(
    shared_stack: Stack, keys: Keys
) -> None:
    forged = f"rk_{keys.caller.key_id}_{'x' * 43}"  # a real id, a wrong secret
    for bad in (forged, "rk_nosuchkey0000_" + "y" * 43, "not-even-shaped-like-a-key"):
        with pytest.raises(reach.Unauthenticated) as caught:
            reach.send(method="work.do", payload={}, hub=shared_stack.url, api_key=bad)
        assert bad not in str(caught.value) and bad not in repr(caught.value.extra)


def test_a_viewer_key_may_read_but_not_send(
    shared_stack: Stack, keys: Keys, agents: dict[str, KeyedAgent]
) -> None:
    hub = shared_stack.url
    with pytest.raises(reach.Forbidden) as caught:
        reach.send(
            agent_id=WORKER, method="work.do", payload={}, hub=hub, api_key=keys.viewer.secret
        )
    assert caught.value.problem_type() == "urn:agent-reach:problem:forbidden"
    assert keys.viewer.secret not in str(caught.value)
    sub = reach.send(
        agent_id=WORKER, method="work.do", payload={}, hub=hub, api_key=keys.caller.secret
    )
    assert (
        reach.get_task(sub.task_id, hub=hub, api_key=keys.viewer.secret)["task_id"] == sub.task_id
    )


def test_a_reach_from_inside_a_handler_goes_as_that_agent(
    shared_stack: Stack, keys: Keys, agents: dict[str, KeyedAgent]
) -> None:
    hub = shared_stack.url
    sub = reach.send(
        agent_id=PLANNER,
        method="forward.do",
        payload={"to": WORKER},
        hub=hub,
        api_key=keys.caller.secret,
    )
    result = reach.wait_for_result(sub.task_id, timeout=60, hub=hub, api_key=keys.caller.secret)
    inner_id = result.data["inner_task_id"]
    assert result.data["inner"] == {"echo": {"from": sub.task_id}, "by": WORKER}
    assert inner_id in agents[WORKER].executions()

    outer = get(f"{hub}/v1/tasks/{sub.task_id}", keys.admin).json()
    inner = get(f"{hub}/v1/tasks/{inner_id}", keys.admin).json()
    assert outer["caller"] == f"key:{keys.caller.key_id}"
    assert inner["caller"] == f"agent:{PLANNER}"  # the planner's own key, not the caller's
    trail = get(f"{hub}/api/v1/tasks/{inner_id}/audit", keys.admin).json()
    submitted = [e for e in trail["events"] if e["kind"] == "accepted"]
    assert submitted and submitted[0]["actor"] == f"agent:{PLANNER}", trail
    # the caller who started it all may read its own task, not the planner's reach
    with pytest.raises(reach.UnknownTask):
        reach.get_task(inner_id, hub=hub, api_key=keys.caller.secret)


def test_an_agent_whose_key_is_refused_fails_at_start(
    shared_stack: Stack, keys: Keys, tmp_path: Path
) -> None:
    wrong_secret = f"rk_{keys.worker.key_id}_{'z' * 43}"
    cases = [
        ("kw-nokey", None, "Unauthenticated"),
        ("kw-badkey", wrong_secret, "Unauthenticated"),
        ("kw-other", keys.worker, "Forbidden"),  # an agent key for another agent ID
        ("kw-caller", keys.caller, "Forbidden"),  # a caller key cannot register agents
    ]
    for agent_id, key, error in cases:
        agent = KeyedAgent(shared_stack.url, agent_id, key, tmp_path)
        try:
            code = agent.proc.wait(timeout=30)
        finally:
            agent.stop()
        out = agent.output()
        assert code != 0, out
        assert f"reach.errors.{error}" in out or f"{error}:" in out, out
        assert_no_secret(out, *keys.all())
        assert wrong_secret not in out
        assert get(f"{shared_stack.url}/api/v1/agents/{agent_id}", keys.admin).status_code == 404


def test_a_revoked_agent_key_stops_heartbeats_and_the_log_says_why_without_the_key(
    shared_stack: Stack, keys: Keys, tmp_path: Path
) -> None:
    key = create_key(shared_stack.env, "agent", "--agent-id", "kw-revoked")
    agent = KeyedAgent(shared_stack.url, "kw-revoked", key, tmp_path)
    try:
        wait_until(lambda: online(shared_stack, keys.admin, "kw-revoked"), 30, what="online")
        done = reach_cli(shared_stack.env, "keys", "revoke", key.key_id)
        assert done.returncode == 0, done.stderr
        wait_until(
            lambda: "heartbeat of kw-revoked refused (Unauthenticated)" in agent.output(),
            timeout=15,
            what="a refused heartbeat in the agent's log",
        )
        assert agent.proc.poll() is None  # it keeps running (and trying), loudly
    finally:
        agent.stop()
    out = agent.output()
    assert f"API key {key.key_id} is revoked" in out  # the key is named by its id only
    assert_no_secret(out, key, *keys.all())
