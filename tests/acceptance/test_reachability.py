"""Two channels, real processes: the hub's api, worker and beat probing real listeners."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import REPO, HubProcess, free_port, hub_env, wait_http_ok, wait_until
from tests.support.listeners import slow_listeners

FAST_PROBES = {
    "REACH_PROBE__INTERVAL": "0.3",
    "REACH_PROBE__FAST_INTERVAL": "0.3",
    "REACH_PROBE__TIMEOUT": "1.0",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
}


@dataclass
class Stack:
    url: str
    procs: list[HubProcess]

    def instance(self, agent_id: str) -> dict[str, Any] | None:
        agents = requests.get(f"{self.url}/api/v1/agents", timeout=5).json()["agents"]
        for agent in agents:
            if agent["agent_id"] == agent_id and agent["instances"]:
                return dict(agent["instances"][0])
        return None

    def metrics(self) -> str:
        return requests.get(f"{self.url}/metrics", timeout=5).text


@pytest.fixture
def stack(store_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    extra = dict(FAST_PROBES)
    if "postgres" in store_url:
        redis_url: str = request.getfixturevalue("redis_db")
        extra.update(REACH_BROKER_URL=redis_url, REACH_RESULT_BACKEND=redis_url)
    extra.update(getattr(request, "param", {}))
    env = hub_env(store_url, tmp_path, **extra)
    port = free_port()
    procs = [
        HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log"),
        HubProcess(["worker", "--concurrency", "2"], env, tmp_path / "worker.log"),
        HubProcess(["beat"], env, tmp_path / "beat.log"),
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/healthz", procs[0])
        yield Stack(url, procs)
    finally:
        for p in procs:
            p.stop()


def test_live_sdk_agent_scores_above_95(stack: Stack) -> None:
    port = free_port()
    agent = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "examples" / "doc_analyzer.py"),
            "--port",
            str(port),
            "--hub",
            stack.url,
            "--heartbeat-interval",
            "0.5",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def scored() -> dict[str, Any] | None:
            inst = stack.instance("doc-analyzer-01")
            ok = inst and inst["probe_status"] == "ok" and inst["reach_score"] > 95
            return inst if ok else None

        inst = wait_until(scored, timeout=30, what="score above 95")
        assert inst["status"] == "online" and inst["rtt_ms"] is not None and inst["rtt_ms"] < 20
        assert inst["last_probe_at"] is not None and inst["last_probe_error"] is None
        text = stack.metrics()
        # gauges from the registry and counters written by the worker, merged by the API
        assert re.search(
            r'agentreach_reach_score\{agent_id="doc-analyzer-01".*\} (9[5-9]|100)', text
        )
        assert re.search(r'agentreach_probe_rtt_ms\{agent_id="doc-analyzer-01"', text)
        assert re.search(r'agentreach_probe_total\{outcome="success"\} [1-9]', text)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=15)


def test_heartbeat_lost_while_port_answers_alerts_without_going_offline(stack: Stack) -> None:
    port = free_port()
    agent = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "tests" / "acceptance" / "agents" / "quiet_agent.py"),
            "--port",
            str(port),
            "--hub",
            stack.url,
            "--quiet-after",
            "1.5",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: (i := stack.instance("quiet-agent")) and i["probe_status"] == "ok",
            timeout=30,
            what="first probes",
        )
        inst = wait_until(
            lambda: (i := stack.instance("quiet-agent")) and "heartbeat_lost" in i["alerts"] and i,
            timeout=20,
            what="heartbeat_lost alert",
        )
        assert inst["status"] == "online" and inst["routable"] is True
        assert inst["heartbeat_age_s"] >= 0.9  # 3 x 0.3 s intervals missed
        events_url = f"{stack.url}/api/v1/instances/{inst['instance_id']}/events"

        def alert_recorded() -> list[dict[str, Any]] | None:
            events: list[dict[str, Any]] = requests.get(events_url, timeout=5).json()["events"]
            hit = any(e["kind"] == "alert" and e["alert"] == "heartbeat_lost" for e in events)
            return events if hit else None

        # the reads above recompute the verdict; the sweep or a probe records it
        events = wait_until(alert_recorded, timeout=10, what="alert event recorded")
        assert not any(e["kind"] == "status" and e["to"] == "offline" for e in events)
        assert re.search(
            r'agentreach_alerts_total\{alert="heartbeat_lost"\} [1-9]', stack.metrics()
        )
        time.sleep(2)  # still answering probes: still not offline
        assert stack.instance("quiet-agent")["status"] == "online"  # type: ignore[index]
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.parametrize("stack", [{"REACH_PROBE__MAX_CONCURRENT": "8"}], indirect=True)
def test_fifty_agents_never_exceed_the_probe_pool(stack: Stack) -> None:
    with slow_listeners(50, delay=0.4) as (listeners, gauge):
        for n, listener in enumerate(listeners):
            body = {
                "agent_id": f"fleet-{n:02d}",
                "addr": listener.addr,
                "allow_loopback": True,
                "heartbeat_interval": 120,
            }
            r = requests.post(f"{stack.url}/v1/agents/register", json=body, timeout=5)
            assert r.status_code == 201, r.text

        def probed_everyone() -> bool:
            agents = requests.get(f"{stack.url}/api/v1/agents", timeout=5).json()["agents"]
            return all(a["instances"][0]["last_probe_at"] for a in agents)

        wait_until(probed_everyone, timeout=60, interval=0.5, what="all 50 probed")
        time.sleep(2)
        assert gauge.total >= 50
        assert gauge.peak <= 8, f"{gauge.peak} probes at once, limit 8"
        skipped = re.search(r"agentreach_probe_skipped_total (\d+)", stack.metrics())
        assert skipped and int(float(skipped.group(1))) > 0
        # meanwhile the default queue kept its cadence: probes run on their own threads
        worker_log = stack.procs[1].output()
        assert worker_log.count("reach.reachability_sweep") >= 4
