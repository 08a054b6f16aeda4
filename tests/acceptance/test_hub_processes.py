"""The hub's processes (api, worker, beat) as real processes on real brokers (`reach up`:
test_reach_up.py; `reach flower`: test_flower.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests
from sqlalchemy import select

from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import InstanceRow
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok
from tests.support.waiting import wait_until

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def broker_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    kind = request.param
    if kind == "embedded":
        yield {}
    elif kind == "redis":
        url: str = request.getfixturevalue("redis_db")
        yield {"REACH_BROKER_URL": url, "REACH_RESULT_BACKEND": url}
    else:
        yield {
            "REACH_BROKER_URL": AMQP_URL,
            "REACH_RESULT_BACKEND": f"db+sqlite:///{tmp_path}/r.db",
        }


STACKS = [
    pytest.param("sqlite", "embedded", id="sqlite-embedded"),
    pytest.param(
        "postgres", "redis", id="postgres-redis", marks=[pytest.mark.postgres, pytest.mark.redis]
    ),
    pytest.param("postgres", "amqp", id="postgres-rabbitmq", marks=pytest.mark.postgres),
]


@pytest.mark.parametrize(("store_url", "broker_env"), STACKS, indirect=True)
def test_beat_and_worker_persist_offline_for_a_killed_agent(
    store_url: str, broker_env: dict[str, str], tmp_path: Path
) -> None:
    env = hub_env(store_url, tmp_path, REACH_HEARTBEAT__SWEEP_INTERVAL="0.5", **broker_env)
    port = free_port()
    procs = [
        HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log"),
        HubProcess(["worker", "--concurrency", "1"], env, tmp_path / "worker.log"),
        HubProcess(["beat"], env, tmp_path / "beat.log"),
    ]
    hub = f"http://127.0.0.1:{port}"
    agent_port = free_port()
    agent = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "examples" / "agents" / "summarizer.py"),
            "--port",
            str(agent_port),
            "--hub",
            hub,
            "--heartbeat-interval",
            "0.5",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    engine = create_engine_for(store_url)
    sessions = session_factory(engine)

    def stored_status() -> str | None:
        with sessions() as s:
            row = s.scalars(select(InstanceRow)).first()
            return row.status if row else None

    try:
        wait_http_ok(hub + "/healthz", procs[0])
        wait_until(lambda: stored_status() == "online", timeout=20, what="registration")
        agent.kill()
        agent.wait()
        # The stored status only changes when beat's sweep runs on the worker.
        wait_until(lambda: stored_status() == "offline", timeout=30, what="sweep to mark offline")
        assert "reach.reachability_sweep" in procs[1].output()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        for p in procs:
            p.stop()
        engine.dispose()


def test_bad_setting_stops_start_up_naming_the_key(tmp_path: Path) -> None:
    env = hub_env(f"sqlite:///{tmp_path}/reach.db", tmp_path, REACH_SERVER__PORT="eighty")
    r = subprocess.run(
        [sys.executable, "-m", "reach", "api"], env=env, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2
    assert "REACH_SERVER__PORT" in r.stderr
    config = tmp_path / "config.yaml"
    config.write_text("server:\n  port: 8800\nprobe:\n  intervall: 5\n")
    env = hub_env(f"sqlite:///{tmp_path}/reach.db", tmp_path, REACH_CONFIG=str(config))
    r = subprocess.run(
        [sys.executable, "-m", "reach", "api"], env=env, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 2
    assert "probe.intervall" in r.stderr


def test_api_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    env = hub_env(f"sqlite:///{tmp_path}/empty.db", tmp_path)
    r = subprocess.run(
        [sys.executable, "-m", "reach", "api", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert "reach db upgrade" in r.stderr
    done = subprocess.run(
        [sys.executable, "-m", "reach", "db", "upgrade"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    started = time.monotonic()
    api = HubProcess(["api", "--port", str(port := free_port())], env, tmp_path / "api.log")
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", api)
    finally:
        api.stop()
    assert time.monotonic() - started < 30


def test_admin_port_serves_the_admin_api_apart(tmp_path: Path) -> None:
    port, admin = free_port(), free_port()
    env = hub_env(f"sqlite:///{tmp_path}/reach.db", tmp_path, REACH_SERVER__ADMIN_PORT=str(admin))
    subprocess.run(
        [sys.executable, "-m", "reach", "db", "upgrade"],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    api = HubProcess(["api", "--port", str(port)], env, tmp_path / "api.log")
    public, internal = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
    try:
        wait_http_ok(public + "/healthz", api)
        wait_http_ok(internal + "/healthz", api)
        body = {"agent_id": "a1", "addr": "10.0.0.1:7000"}
        assert (
            requests.post(f"{public}/v1/agents/register", json=body, timeout=5).status_code == 201
        )
        assert (
            requests.post(f"{internal}/v1/agents/register", json=body, timeout=5).status_code == 404
        )
        assert requests.get(f"{public}/api/v1/agents", timeout=5).status_code == 404
        assert requests.get(f"{public}/metrics", timeout=5).status_code == 404
        agents = requests.get(f"{internal}/api/v1/agents", timeout=5).json()["agents"]
        assert [a["agent_id"] for a in agents] == ["a1"]
        assert "agentreach_reach_score" in requests.get(f"{internal}/metrics", timeout=5).text
    finally:
        assert api.stop() == 0  # one SIGTERM stops both listeners cleanly


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_api_replicas_share_one_port_and_outlive_each_other(store_url: str, tmp_path: Path) -> None:
    """Two ``reach api --reuse-port`` on one port: every new connection is answered, a
    registration through one is read back through whichever answers, and with one
    replica killed the port still serves."""
    port = free_port()
    env = hub_env(store_url, tmp_path)
    replicas = [
        HubProcess(["api", "--port", str(port), "--reuse-port"], env, tmp_path / f"api-{n}.log")
        for n in range(2)
    ]
    url = f"http://127.0.0.1:{port}"
    try:
        for replica in replicas:
            wait_http_ok(url + "/healthz", replica)
        for replica in replicas:  # the port answers once either listens: wait for both
            wait_until(
                lambda r=replica: _listens(r, port), timeout=60, what="both replicas listening"
            )
        registered = requests.post(
            url + "/v1/agents/register",
            json={"agent_id": "shared", "addr": "127.0.0.1:9", "allow_loopback": True},
            headers={"Connection": "close"},
            timeout=10,
        )
        assert registered.status_code == 201, registered.text
        for _ in range(20):  # new connections: the kernel spreads them over both
            seen = requests.get(url + "/api/v1/agents/shared", headers={"Connection": "close"})
            assert seen.status_code == 200 and seen.json()["agent_id"] == "shared"
        replicas[0].kill_group()
        for _ in range(10):
            assert requests.get(url + "/healthz", headers={"Connection": "close"}, timeout=5).ok
    finally:
        for replica in replicas:
            replica.stop()


def _listens(replica: HubProcess, port: int) -> bool:
    """Whether the replica's process (or a child of it) holds a listening socket on port."""
    try:
        root = psutil.Process(replica.proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for proc in procs:
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns):
            return True
    return False


def test_reuse_port_refuses_a_second_admin_port(tmp_path: Path) -> None:
    env = hub_env(
        f"sqlite:///{tmp_path / 'reach.db'}", tmp_path, REACH_SERVER__ADMIN_PORT=str(free_port())
    )
    subprocess.run([sys.executable, "-m", "reach", "db", "upgrade"], env=env, cwd=REPO, check=True)
    done = subprocess.run(
        [sys.executable, "-m", "reach", "api", "--port", str(free_port()), "--reuse-port"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "admin_port" in done.stdout + done.stderr
