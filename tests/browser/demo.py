"""A hub with the demo fleet and a little history, for the browser tests and the screenshots.

One real stack (api, worker, beat) on a SQLite store with API keys required, the five demo
agents ``reach up`` starts (examples/agents/, with the admin key in ``$REACH_API_KEY`` as
``reach up`` gives them), plus two test agents the dashboard's live pages need:

- ``slow-agent-01`` (tests/support/progress_agent.py): ``work.do`` answers 202 and reports
  progress ``steps`` times, ``interval`` seconds apart, then succeeds; a task page watches
  it finish live.
- ``flaky-agent-01`` (tests/support/counting_agent.py ``--fail-first 2``): the first two
  deliveries of each task answer 500; with ``router.max_retry`` 1 every task it gets is
  dead-lettered after its second attempt, and a replay (the third delivery) succeeds.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from reach.cli.supervisor import DEMO_AGENTS
from reach.core.security.auth import Scope
from reach.hub.security import apikeys
from reach.hub.storage import create_engine_for, session_factory, upgrade_database
from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack, start_stack, stop_stack
from tests.support.trust_agents import Key
from tests.support.waiting import wait_until

SETTINGS = {
    "REACH_SECURITY__REQUIRE_AUTH": "true",
    "REACH_PROBE__INTERVAL": "0.5",
    "REACH_PROBE__FAST_INTERVAL": "0.5",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    "REACH_ROUTER__MAX_RETRY": "1",
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "0.5",
    "REACH_APPROVAL__TIMEOUT_S": "3600",
}
SLOW = "slow-agent-01"
FLAKY = "flaky-agent-01"
FLAKY_METHOD = "report.build"
DEMO_IDS = tuple(agent_id for _, agent_id in DEMO_AGENTS)


@dataclass
class DemoHub:
    """The running hub, its keys and its agent processes."""

    stack: Stack
    home: Path
    store_url: str
    admin: Key
    viewer: Key
    caller: Key
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.stack.url

    def api(
        self, method: str, path: str, body: Any = None, key: Key | None = None
    ) -> requests.Response:
        headers = (key or self.admin).headers()
        return requests.request(method, self.url + path, json=body, headers=headers, timeout=30)

    def submit(self, key: Key | None = None, **body: Any) -> str:
        """POST /v1/tasks (as the caller key unless told); the new task's id."""
        r = self.api("POST", "/v1/tasks", body, key or self.caller)
        assert r.status_code == 201, r.text
        return str(r.json()["task_id"])

    def task(self, task_id: str) -> dict[str, Any]:
        r = self.api("GET", f"/v1/tasks/{task_id}")
        assert r.ok, r.text
        return dict(r.json())

    def wait_status(self, task_id: str, *statuses: str, timeout: float = 30) -> dict[str, Any]:
        """The task once its status is one of ``statuses``; past ``timeout``, an
        AssertionError that carries the task and its event trail (what it was doing)."""
        deadline = time.monotonic() + timeout
        while (task := self.task(task_id))["status"] not in statuses:
            if time.monotonic() > deadline:
                events = self.api("GET", f"/v1/tasks/{task_id}/events").text
                raise AssertionError(
                    f"task {task_id} not {'/'.join(statuses)} after {timeout}s: "
                    f"{task}\nevents: {events}"
                )
            time.sleep(0.1)
        return task

    def dead_letter_of(self, task_id: str) -> dict[str, Any] | None:
        r = self.api("GET", "/api/v1/dead-letters?limit=500")
        assert r.ok, r.text
        found = [d for d in r.json()["dead_letters"] if d["task_id"] == task_id]
        return dict(found[0]) if found else None

    def approval_of(self, task_id: str) -> dict[str, Any] | None:
        r = self.api("GET", "/api/v1/approvals?all=true&limit=500")
        assert r.ok, r.text
        found = [a for a in r.json()["approvals"] if a["task_id"] == task_id]
        return dict(found[0]) if found else None

    def online(self, agent_id: str) -> bool:
        r = self.api("GET", f"/api/v1/agents/{agent_id}")
        return r.ok and any(i["status"] == "online" for i in r.json()["instances"])


def make_key(store_url: str, scope: Scope, name: str) -> Key:
    """A key as ``reach keys create --scope S --name N`` makes it (the name shows on pages)."""
    engine = create_engine_for(store_url)
    try:
        with session_factory(engine).begin() as session:
            created = apikeys.create_key(
                session, scope=scope, agent_pattern=None, name=name, expires_in_s=None,
                now=time.time(),
            )  # fmt: skip
    finally:
        engine.dispose()
    return Key(created.key_id, created.secret)


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def _agent_argvs(hub: str, directory: Path) -> dict[str, list[str]]:
    """How to start each agent of the demo fleet, by agent id."""
    py = sys.executable
    argvs = {
        agent_id: [
            *(py, str(REPO / "examples" / "agents" / script), "--port", str(free_port())),
            *("--hub", hub, "--heartbeat-interval", "0.5"),
        ]
        for script, agent_id in DEMO_AGENTS
    }
    argvs[SLOW] = [py, "-m", "tests.support.progress_agent", "--port", str(free_port())]
    argvs[SLOW] += ["--hub", hub, "--agent-id", SLOW, "--tag", "demo"]
    argvs[FLAKY] = [py, "-m", "tests.support.counting_agent", "--port", str(free_port())]
    argvs[FLAKY] += ["--hub", hub, "--journal", str(directory / "flaky.journal")]
    argvs[FLAKY] += ["--agent-id", FLAKY, "--method", FLAKY_METHOD, "--fail-first", "2"]
    return argvs


@contextlib.contextmanager
def demo_hub(directory: Path) -> Iterator[DemoHub]:
    """Start the hub and every agent, wait until all are online, stop them all after."""
    directory.mkdir(parents=True, exist_ok=True)
    store_url = f"sqlite:///{directory / 'reach.db'}"
    upgrade_database(store_url)
    admin = make_key(store_url, Scope.ADMIN, "ops-admin")
    hub = DemoHub(
        stack=start_stack(store_url, directory, dict(SETTINGS)),
        home=directory,
        store_url=store_url,
        admin=admin,
        viewer=make_key(store_url, Scope.VIEWER, "ops-viewer"),
        caller=make_key(store_url, Scope.CALLER, "shop-frontend"),
    )
    env = {k: v for k, v in hub.stack.env.items() if not k.startswith("REACH_")}
    env["REACH_API_KEY"] = admin.secret  # as `reach up` gives its demo agents the user's key
    try:
        for agent_id, argv in _agent_argvs(hub.url, directory).items():
            hub.agents[agent_id] = _spawn(argv, env, directory / f"{agent_id}.log")
        for agent_id, proc in hub.agents.items():

            def up(agent_id: str = agent_id, proc: subprocess.Popen[bytes] = proc) -> bool:
                if proc.poll() is not None:
                    log = (directory / f"{agent_id}.log").read_text(errors="replace")
                    raise AssertionError(f"{agent_id} exited with {proc.returncode}:\n{log}")
                return hub.online(agent_id)

            wait_until(up, timeout=60, what=f"{agent_id} online")
        yield hub
    finally:
        for proc in hub.agents.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in hub.agents.values():
            processes.stop(proc)
        for hub_proc in hub.stack.procs:  # all at once: worker and beat each take seconds
            if hub_proc.proc.poll() is None:
                hub_proc.proc.terminate()
        stop_stack(hub.stack)
