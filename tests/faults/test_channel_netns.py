"""An agent behind NAT for real: its own network namespace, reachable by no one.

The agent process runs in a namespace of its own (``ip netns``), joined to the host by a
veth pair on a private /30. It serves no port and the host cannot open a connection to
it; it can dial the hub, which listens on every address (so auth is on: the agent and the
test use keys made with ``reach keys create``). Through the channel it opens, it
registers, is scored from the channel's pings, takes tasks (counted in its journal),
survives its link going down mid-task (the task is redelivered after the reconnect, and
the handler runs once), and goes offline when the link stays down.

Runs only where ``ip netns`` works (root); skipped elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

import reach
from tests.support import processes
from tests.support.channel_agent import read_journal
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok
from tests.support.waiting import wait_until

HOST_ADDR, AGENT_ADDR = "10.231.10.1", "10.231.10.2"  # a /30 of this helper's own
AGENT_ID = "nat-ns"


def _netns_works() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"reach-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True)
    if made.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True


pytestmark = [
    pytest.mark.netns,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not _netns_works(), reason="needs root and a working `ip netns`"),
]


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr}"


@dataclass
class Namespace:
    name: str
    host_veth: str

    def link(self, up: bool) -> None:
        ip("link", "set", self.host_veth, "up" if up else "down")

    def exec(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]


@pytest.fixture
def netns() -> Iterator[Namespace]:
    tag = uuid.uuid4().hex[:6]
    ns = Namespace(f"reach-h10-{tag}", f"rh{tag}a")
    peer = f"rh{tag}b"
    try:
        ip("netns", "add", ns.name)
        ip("link", "add", ns.host_veth, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", ns.name)
        ip("addr", "add", f"{HOST_ADDR}/30", "dev", ns.host_veth)
        ip("link", "set", ns.host_veth, "up")
        ip("-n", ns.name, "addr", "add", f"{AGENT_ADDR}/30", "dev", peer)
        ip("-n", ns.name, "link", "set", peer, "up")
        ip("-n", ns.name, "link", "set", "lo", "up")
        yield ns
    finally:
        subprocess.run(["ip", "link", "del", ns.host_veth], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)


def create_key(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "reach", "keys", "create", "--json", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return str(json.loads(done.stdout)["secret"])


@dataclass
class Hub:
    url: str  # as the test reads it (loopback)
    agent_url: str  # as the agent in the namespace reaches it
    env: dict[str, str]
    admin: str
    procs: list[HubProcess]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    def instance(self) -> dict[str, Any] | None:
        r = requests.get(f"{self.url}/api/v1/agents/{AGENT_ID}", headers=self.headers, timeout=5)
        found = [i for i in r.json().get("instances", []) if i["status"] != "deregistered"]
        return found[0] if r.ok and found else None

    def events(self, task_id: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/v1/tasks/{task_id}/events", headers=self.headers, timeout=5)
        return list(r.json()["events"])


@pytest.fixture
def hub(store_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Hub]:
    extra = {
        "REACH_PROBE__INTERVAL": "0.5",
        "REACH_PROBE__FAST_INTERVAL": "0.5",
        "REACH_PROBE__TIMEOUT": "1.0",
        "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    }
    if "postgres" in store_url:
        redis_url: str = request.getfixturevalue("redis_db")
        extra.update(REACH_BROKER_URL=redis_url, REACH_RESULT_BACKEND=redis_url)
    env = hub_env(store_url, tmp_path, **extra)
    admin = create_key(env, "--scope", "admin")
    port = free_port()
    procs = [
        HubProcess(["api", "--host", "0.0.0.0", "--port", str(port)], env, tmp_path / "api.log"),
        HubProcess(["worker", "--concurrency", "2"], env, tmp_path / "worker.log"),
        HubProcess(["beat"], env, tmp_path / "beat.log"),
    ]
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", procs[0])
        yield Hub(f"http://127.0.0.1:{port}", f"http://{HOST_ADDR}:{port}", env, admin, procs)
    finally:
        for p in procs:
            p.stop()


def test_agent_behind_nat_works_through_its_channel(
    netns: Namespace, hub: Hub, tmp_path: Path
) -> None:
    key = create_key(hub.env, "--scope", "agent", "--agent-id", AGENT_ID)
    journal = tmp_path / "journal.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    env.update(REACH_API_KEY=key, PYTHONUNBUFFERED="1")
    with (tmp_path / "agent.out").open("ab") as out:
        agent = subprocess.Popen(
            netns.exec(
                sys.executable,
                "-m",
                "tests.support.channel_agent",
                "--hub",
                hub.agent_url,
                "--journal",
                str(journal),
                "--agent-id",
                AGENT_ID,
                "--heartbeat-interval",
                "0.5",
            ),
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # registers through the channel (no HTTP server anywhere in the namespace) ...
        inst = wait_until(
            lambda: (i := hub.instance()) and i["status"] == "online" and i,
            30,
            what="the NAT'd agent registered over its channel",
        )
        assert "/internal/channel/" in inst["endpoint"]
        # ... and the hub cannot reach it: nothing listens beyond the namespace's loopback,
        # and a direct connection attempt fails
        listening = subprocess.run(netns.exec("ss", "-Hltn"), capture_output=True, text=True).stdout
        assert AGENT_ADDR not in listening and "0.0.0.0" not in listening, listening
        with pytest.raises(OSError), socket.create_connection((AGENT_ADDR, 8000), timeout=2):
            pass

        # scored from the channel: the pings' RTT and loss
        scored = wait_until(
            lambda: (i := hub.instance()) and i.get("rtt_ms") is not None and i,
            15,
            what="an RTT from the channel",
        )
        assert scored["probe_status"] == "ok" and scored["reach_score"] > 0

        # receives tasks, each run once
        ids = [
            reach.send(
                agent_id=AGENT_ID,
                method="task.process",
                payload={"n": n},
                hub=hub.url,
                api_key=hub.admin,
            ).task_id
            for n in range(5)
        ]
        for task_id in ids:
            result = reach.wait_for_result(task_id, timeout=30, hub=hub.url, api_key=hub.admin)
            assert result.data["echo"]["n"] == ids.index(task_id)
        _, runs = read_journal(journal)
        assert all(runs[t] == 1 for t in ids), runs

        # the link drops mid-task: redelivered after the reconnect, run once
        slow = reach.send(
            agent_id=AGENT_ID,
            method="task.process",
            payload={"sleep": 3},
            hub=hub.url,
            api_key=hub.admin,
            timeout_ms=60_000,
        ).task_id
        wait_until(lambda: read_journal(journal)[1][slow] == 1, 15, what="the slow task running")
        netns.link(up=False)
        time.sleep(6)  # both ends notice the silence; the handler finishes meanwhile
        netns.link(up=True)
        result = reach.wait_for_result(slow, timeout=60, hub=hub.url, api_key=hub.admin)
        assert result.data["echo"] == {"sleep": 3}
        deliveries, runs = read_journal(journal)
        assert runs[slow] == 1, runs
        assert deliveries[slow] >= 2, deliveries  # redelivered, answered by the dedup guard
        dispatched = [e for e in hub.events(slow) if e["kind"] == "dispatched"]
        assert len(dispatched) >= 2, hub.events(slow)

        # the channel stays down: offline
        netns.link(up=False)
        wait_until(
            lambda: (i := hub.instance()) and i["status"] == "offline",
            30,
            what="the agent offline once its channel stayed down",
        )
    finally:
        processes.stop(agent)
