"""An SDK agent in its own process against a hub running as its own process, on both stores."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests

import reach
from tests.support.holding_proxy import HoldingProxy
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.reach_tokens import HubStore, bearer, encoded, mint
from tests.support.stacks import hub_env
from tests.support.waiting import wait_until


def start_agent(script: Path, hub: str, port: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(script), "--port", str(port), "--hub", hub, *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def instances(hub: str, agent_id: str) -> list[dict[str, Any]]:
    r = requests.get(f"{hub}/api/v1/agents", params={"status": None}, timeout=5)
    for agent in r.json()["agents"]:
        if agent["agent_id"] == agent_id:
            return list(agent["instances"])
    return []


def proxied_agent(agent_id: str, proxy: HoldingProxy, heartbeat_interval: float) -> reach.Agent:
    """An in-process SDK agent that talks to the hub through ``proxy``."""
    return reach.Agent(
        agent_id,
        addr=f"127.0.0.1:{free_port()}",
        hub=proxy.url,
        capabilities=[{"type": "x.y"}],
        heartbeat_interval=heartbeat_interval,
        allow_loopback=True,
    )


def test_sdk_agent_registers_heartbeats_and_deregisters(
    hub_api: str, store_url: str, tmp_path: Path
) -> None:
    port = free_port()
    script = REPO / "examples" / "agents" / "doc_analyzer.py"
    agent = start_agent(script, hub_api, port, "--heartbeat-interval", "0.3")
    try:
        live = wait_until(
            lambda: [i for i in instances(hub_api, "doc-analyzer-01") if i["heartbeat_count"] >= 2],
            timeout=20,
            what="two heartbeats",
        )
        assert live[0]["status"] == "online"
        assert live[0]["endpoint"] == f"http://127.0.0.1:{port}"
        assert live[0]["max_concurrency"] == 8

        # the CLI shows the same fleet, as a table and as JSON
        env = hub_env(store_url, tmp_path)
        table = subprocess.run(
            [sys.executable, "-m", "reach", "agents", "--hub", hub_api],
            env={**env, "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert table.returncode == 0, table.stderr
        assert "doc-analyzer-01" in table.stdout and "online" in table.stdout
        # into a pipe: tab-separated rows under a header, every value whole
        header, row = table.stdout.splitlines()[:2]
        assert "SCORE" in header.split("\t")
        assert row.split("\t")[:3] == ["doc-analyzer-01", live[0]["instance_id"], "online"]
        as_json = subprocess.run(
            [
                sys.executable,
                "-m",
                "reach",
                "agents",
                "--json",
                "--capability",
                "task.process",
                "--hub",
                hub_api,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        body = json.loads(as_json.stdout)
        assert [a["agent_id"] for a in body["agents"]] == ["doc-analyzer-01"]

        # the agent's own endpoint really serves its handler, to a token signed by its hub
        raw = encoded(
            {"task_id": "t-1", "attempt_seq": 1, "payload": {"doc_id": "d", "text": "a b c"}}
        )
        token = mint(
            HubStore(store_url, tmp_path),
            audience="doc-analyzer-01",
            task_id="t-1",
            body=raw,
            method="task.process",
        )
        answer = requests.post(
            f"http://127.0.0.1:{port}/tasks/task.process",
            data=raw,
            headers={**bearer(token), "Content-Type": "application/json"},
            timeout=5,
        )
        assert answer.json() == {"code": 0, "data": {"doc_id": "d", "words": 3, "task_id": "t-1"}}
    finally:
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=15)
    assert agent.returncode == 0, out.decode()
    # a clean shutdown deregisters the instance
    gone = requests.get(f"{hub_api}/api/v1/agents", params={"status": "deregistered"}, timeout=5)
    assert gone.json()["agents"][0]["instances"][0]["status"] == "deregistered"
    assert instances(hub_api, "doc-analyzer-01") == []


def test_an_agent_stopped_before_its_registration_answer_arrives_still_deregisters(
    hub_api: str,
) -> None:
    """The hub lists an instance once it commits the registration; a supervisor may stop
    the agent in the moment before ``register`` returns. It deregisters and exits 0."""
    with HoldingProxy(hub_api, "/v1/agents/register") as proxy:
        agent = start_agent(REPO / "examples" / "agents" / "summarizer.py", proxy.url, free_port())
        try:
            assert proxy.arrived.wait(20), "no registration reached the hub"
            assert [i["status"] for i in instances(hub_api, "summarizer-01")] == ["online"]
            agent.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # the signal lands while the answer is held
            proxy.release()
            out, _ = agent.communicate(timeout=20)
        finally:
            agent.kill()
    assert agent.returncode == 0, out.decode()
    assert ("POST", "/v1/agents/deregister") in proxy.seen
    assert instances(hub_api, "summarizer-01") == []  # only deregistered ones, filtered out


def test_a_registration_whose_answer_timed_out_is_deregistered_on_close(hub_api: str) -> None:
    """The hub committed it, the agent never heard: ``close`` deregisters all the same,
    instead of leaving an instance listed online until its heartbeats are missed."""
    with HoldingProxy(hub_api, "/v1/agents/register") as proxy:
        agent = proxied_agent("timeout-agent", proxy, heartbeat_interval=60)
        agent.hub.timeout = (3.0, 0.5)
        agent.start()  # the register times out: logged, the heartbeat loop would retry
        try:
            assert proxy.arrived.is_set()
            assert [i["status"] for i in instances(hub_api, "timeout-agent")] == ["online"]
        finally:
            proxy.release()
            agent.close()
    assert proxy.seen.count(("POST", "/v1/agents/deregister")) == 1
    assert instances(hub_api, "timeout-agent") == []


def test_stuck_handlers_do_not_stop_heartbeats_and_mark_degraded(hub_api: str) -> None:
    port = free_port()
    agent = start_agent(REPO / "tests" / "acceptance" / "agents" / "stuck_agent.py", hub_api, port)
    try:
        wait_until(lambda: instances(hub_api, "stuck-agent"), timeout=20, what="registration")
        url = f"http://127.0.0.1:{port}/tasks/work.block"
        for n in range(2):  # occupy both workers; these requests never finish
            threading.Thread(
                target=_post_ignoring_timeout,
                args=(url, {"task_id": f"t{n}", "payload": {}}),
                daemon=True,
            ).start()
        wait_until(
            lambda: instances(hub_api, "stuck-agent")[0]["in_flight"] == 2,
            timeout=10,
            what="in_flight 2",
        )
        # a third request is refused at once with backpressure, not queued
        third = requests.post(url, json={"task_id": "t3", "payload": {}}, timeout=5)
        assert third.status_code == 429
        count = instances(hub_api, "stuck-agent")[0]["heartbeat_count"]
        time.sleep(1.5)
        inst = instances(hub_api, "stuck-agent")[0]
        assert inst["heartbeat_count"] >= count + 3, "heartbeats stalled behind stuck handlers"
        # alive (heartbeats fresh) but not consuming: degraded, still in the routing pool
        assert inst["status"] == "degraded"
        assert "business_unreachable" in inst["alerts"]
        assert inst["routable"] is True
        assert inst["current_load"] == 1.0
    finally:
        agent.kill()
        agent.communicate()


def _post_ignoring_timeout(url: str, body: dict[str, Any]) -> None:
    try:
        requests.post(url, json=body, timeout=30)
    except requests.RequestException:
        pass


def test_killed_agent_goes_offline_after_three_missed_intervals(hub_api: str) -> None:
    port = free_port()
    agent = start_agent(
        REPO / "examples" / "agents" / "summarizer.py", hub_api, port, "--heartbeat-interval", "0.5"
    )
    try:
        wait_until(
            lambda: [i for i in instances(hub_api, "summarizer-01") if i["status"] == "online"],
            timeout=20,
            what="online",
        )
    finally:
        agent.kill()  # SIGKILL: no deregistration
        agent.communicate()
    killed_at = time.monotonic()
    wait_until(
        lambda: instances(hub_api, "summarizer-01")[0]["status"] == "offline",
        timeout=10,
        interval=0.05,
        what="offline",
    )
    waited = time.monotonic() - killed_at
    assert 0.5 <= waited <= 3.0, f"went offline after {waited:.2f}s, expected ~1.5s (3 x 0.5s)"


def test_a_heartbeat_answered_late_does_not_register_a_closing_agent_again(hub_api: str) -> None:
    """The hub forgot the instance and answers its heartbeat late, after ``close`` began.
    The heartbeat thread used to register it again: when the late answer and that
    registration together outlasted close's wait for the thread, close deregistered
    first and the hub ended up listing a closed instance as online."""
    with HoldingProxy(hub_api) as proxy:
        agent = proxied_agent("late-beat", proxy, heartbeat_interval=0.2)
        agent.hub.timeout = (0.5, 2.0)  # close waits 0.5 + 2 + 1 s for the thread
        agent.start()
        try:
            beat = ("POST", "/v1/agents/heartbeat")
            wait_until(lambda: beat in proxy.seen, timeout=10)
            # the hub forgets the instance (as after a long partition) and grows slow
            proxy.delays.update({"/v1/agents/heartbeat": 1.9, "/v1/agents/register": 2.5})
            forget = {"agent_id": "late-beat", "instance_id": agent.instance_id}
            assert requests.post(f"{hub_api}/v1/agents/deregister", json=forget, timeout=5).ok
            mark = len(proxy.seen)
            wait_until(lambda: beat in proxy.seen[mark:], timeout=10)  # held on its way
            closing = len(proxy.seen)
        finally:
            agent.close()
        time.sleep(3.5)  # a registration the proxy still held has reached the hub by now
    assert ("POST", "/v1/agents/register") not in proxy.seen[closing:]
    assert instances(hub_api, "late-beat") == []
