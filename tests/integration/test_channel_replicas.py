"""A channel agent and several API replicas: a delivery reaches the replica holding its socket.

Two ``reach api`` replicas (A and B) share one store and one broker with one worker and
one beat, per store (PostgreSQL with Redis, SQLite with the embedded broker). The channel
agent (``tests/support/channel_agent.py``, journaling every delivery and handler run)
dials the hub through a TCP load balancer in this process (``Balancer``), pointed at B:
the replica that accepts the socket registers the instance at its own internal URL, so
whatever replica a task is submitted to, the worker posts it to B, which forwards it on
the socket.

Then B goes away with tasks in flight and queued. SIGTERM: the balancer sends the agent's
redial to A, which becomes the holder (the instance's endpoint names A). SIGKILL: B comes
back on the same port and the agent redials it (same address, new socket secret: a stale
delivery to the old secret is refused and retried). Either way every accepted task ends
``success``, each handler ran exactly once at the agent (a redelivery of a task whose
answer was lost with the socket is answered by the agent's dedup guard), nothing is
dead-lettered.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import select

import reach
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import InstanceEventRow, InstanceRow
from tests.integration.test_channel import start_channel_agent
from tests.support import processes
from tests.support.channel_agent import read_journal
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok
from tests.support.stores import flushed_redis
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

SETTINGS = {
    "REACH_PROBE__INTERVAL": "0.5",
    "REACH_PROBE__FAST_INTERVAL": "0.5",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    "REACH_ROUTER__CONNECT_TIMEOUT": "1",
    "REACH_ROUTER__READ_TIMEOUT": "10",
    "REACH_ROUTER__BACKOFF_BASE": "0.3",
    "REACH_ROUTER__BACKOFF_CAP": "2",
    "REACH_ROUTER__MAX_RETRY": "10",  # a window of ~15 s: far more than a failover takes
    # the holder's death trips the instance's breaker for sure; its trials come every 8 s
    # (the default 30 s would make the module slow, not the assertions weaker)
    "REACH_ROUTER__BREAKER_MIN_VOLUME": "4",
    "REACH_ROUTER__BREAKER_TRIAL_INTERVAL": "8",
}
INTERNAL = "/internal/channel/"


class Balancer:
    """A TCP load balancer on loopback: every new connection goes to the current backend;
    a connection ends when either side closes (a dead backend drops its clients)."""

    def __init__(self, backend: int) -> None:
        self.backend = backend
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.backend), timeout=2)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the backend is down: refused, as a balancer without one
                continue
            with self._lock:
                self._open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open.discard(s)
            s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for s in list(self._open):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@dataclass
class Replicas:
    store_url: str
    env: dict[str, str]
    home: Path
    ports: list[int]
    apis: list[HubProcess]
    others: list[HubProcess] = field(default_factory=list)

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    @property
    def a(self) -> str:
        return self.url(0)

    @property
    def b(self) -> str:
        return self.url(1)

    def ensure_up(self, i: int) -> None:
        """Replica ``i`` running (a test that failed midway may have left it stopped)."""
        if self.apis[i].proc.poll() is not None:
            self.restart(i)

    def restart(self, i: int) -> None:
        """Start replica ``i`` again on its port (after it was stopped or killed)."""
        self.apis[i].stop()
        self.apis[i] = _api(self.env, self.home, self.ports[i], f"api-{i}-{time.time_ns()}")
        wait_http_ok(self.url(i) + "/healthz", self.apis[i])

    def instance(self, agent_id: str, via: int = 0) -> dict[str, Any] | None:
        r = requests.get(f"{self.url(via)}/api/v1/agents/{agent_id}", timeout=5)
        found = r.json().get("instances", []) if r.ok else []
        live = [i for i in found if i["status"] != "deregistered"]
        return live[0] if live else None

    def stored(self, instance_id: str) -> tuple[str, list[dict[str, Any]]]:
        """The instance's endpoint as stored (with its socket secret) and its breaker
        events (the API masks the secret and has no route for instance events)."""
        engine = create_engine_for(self.store_url)
        try:
            with session_factory(engine)() as s:
                row = s.get(InstanceRow, instance_id)
                found = s.scalars(
                    select(InstanceEventRow)
                    .where(InstanceEventRow.instance_id == instance_id)
                    .where(InstanceEventRow.kind.startswith("breaker"))
                    .order_by(InstanceEventRow.id)
                )
                breaker = [{"kind": e.kind, "at": e.at, **e.detail} for e in found]
                return (row.endpoint if row is not None else ""), breaker
        finally:
            engine.dispose()

    def holder(self, agent_id: str) -> int | None:
        """The replica the instance's endpoint names (as both replicas show it)."""
        seen = set()
        for via in (0, 1):
            inst = self.instance(agent_id, via)
            endpoint = inst["endpoint"] if inst else ""
            seen.add(next((i for i in (0, 1) if endpoint.startswith(self.url(i) + INTERNAL)), None))
        return seen.pop() if len(seen) == 1 else None


def _api(env: dict[str, str], home: Path, port: int, name: str) -> HubProcess:
    return HubProcess(["api", "--port", str(port)], env, home / f"{name}.log")


@pytest.fixture(scope="module")
def replicas(shared_store_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    home = tmp_path_factory.mktemp("replicas")
    with contextlib.ExitStack() as cleanup:
        extra = dict(SETTINGS)
        if "postgres" in shared_store_url:
            redis_url = cleanup.enter_context(flushed_redis())
            extra.update(REACH_BROKER_URL=redis_url, REACH_RESULT_BACKEND=redis_url)
        env = hub_env(shared_store_url, home, **extra)
        ports = [free_port(), free_port()]
        hub = Replicas(shared_store_url, env, home, ports, [])
        cleanup.callback(lambda: [p.stop() for p in hub.apis + hub.others])
        hub.apis += [_api(env, home, p, f"api-{i}") for i, p in enumerate(ports)]
        hub.others += [
            HubProcess(["worker", "--concurrency", "4"], env, home / "worker.log"),
            HubProcess(["beat"], env, home / "beat.log"),
        ]
        for i, api in enumerate(hub.apis):
            wait_http_ok(hub.url(i) + "/healthz", api)
        yield hub


@contextlib.contextmanager
def channel_agent(
    hub: Replicas, tmp_path: Path, agent_id: str, backend: int, *extra: str
) -> Iterator[tuple[Balancer, Path]]:
    """A journaling channel agent dialling through a balancer pointed at ``backend``."""
    balancer = Balancer(hub.ports[backend])
    journal = tmp_path / f"{agent_id}.journal"
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = start_channel_agent(balancer.url, journal, agent_id, *extra)
        wait_until(
            lambda: (i := hub.instance(agent_id)) and i["status"] == "online",
            30,
            what=f"{agent_id} online through replica {backend}",
        )
        yield balancer, journal
    finally:
        processes.stop(proc)
        balancer.close()


def submit(hub: Replicas, via: int, agent_id: str, payload: dict[str, Any]) -> str:
    """Submit until accepted: while the agent's socket is down its breaker may be open,
    and the hub then refuses new tasks for it at once (``CircuitOpen``), as it should."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return reach.send(
                agent_id=agent_id, method="task.process", payload=payload, hub=hub.url(via)
            ).task_id
        except reach.CircuitOpen:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def task(hub: Replicas, via: int, task_id: str) -> dict[str, Any]:
    r = requests.get(f"{hub.url(via)}/v1/tasks/{task_id}", timeout=5)
    assert r.ok, r.text
    return dict(r.json())


def events(hub: Replicas, task_id: str) -> list[dict[str, Any]]:
    r = requests.get(f"{hub.a}/v1/tasks/{task_id}/events", timeout=5)
    return list(r.json()["events"])


def all_done(hub: Replicas, ids: list[str], via: int = 0) -> bool:
    return all(
        task(hub, via, t)["status"] in ("success", "failed", "dead", "cancelled") for t in ids
    )


def assert_each_ran_once(hub: Replicas, ids: list[str], journal: Path) -> None:
    for via in (0, 1):  # the results, as either replica shows them
        states = {t: task(hub, via, t)["status"] for t in ids}
        assert set(states.values()) == {"success"}, states
    deliveries, runs = read_journal(journal)
    assert runs == dict.fromkeys(ids, 1), ("handler runs per task", runs)
    assert set(deliveries) == set(ids), deliveries
    for t in ids:
        kinds = [e["kind"] for e in events(hub, t)]
        assert "dead_letter" not in kinds, (t, kinds)
        assert kinds.count("terminal_success") == 1, (t, kinds)


def test_deliveries_reach_the_replica_holding_the_socket(
    replicas: Replicas, tmp_path: Path
) -> None:
    hub = replicas
    agent_id = f"nat-rep-{uuid.uuid4().hex[:6]}"
    with channel_agent(hub, tmp_path, agent_id, backend=1) as (_, journal):
        assert hub.holder(agent_id) == 1, hub.instance(agent_id)
        ids = [submit(hub, 0, agent_id, {"n": n}) for n in range(6)]  # through A
        ids += [submit(hub, 1, agent_id, {"n": n}) for n in range(6, 10)]  # through B
        for n, task_id in enumerate(ids):
            result = reach.wait_for_result(task_id, timeout=30, hub=hub.url(n % 2))
            assert result.data["echo"]["n"] == n, result
        assert_each_ran_once(hub, ids, journal)
        for task_id in ids:  # every attempt went to B's internal route, none to A's
            sent = [e for e in events(hub, task_id) if e["kind"] == "dispatched"]
            assert [e["detail"]["endpoint"].startswith(hub.b + INTERNAL) for e in sent] == [True], (
                sent
            )
        # A holds no socket: its internal route refuses a delivery for the instance
        inst = hub.instance(agent_id)
        assert inst is not None
        r = requests.post(
            f"{hub.a}{INTERNAL}{inst['instance_id']}/guess/tasks/task.process",
            json={"task_id": "forged", "attempt_seq": 1},
            timeout=5,
        )
        assert r.status_code == 503 and "no open channel" in r.json()["message"]


def _failover(
    hub: Replicas, tmp_path: Path, how: str, agent_id: str
) -> tuple[list[str], Path, int]:
    """Tasks in flight and queued at the agent's holder B when B goes ``how``; returns
    the task IDs, the journal and the replica that holds the socket afterwards."""
    hub.ensure_up(1)
    with channel_agent(hub, tmp_path, agent_id, 1, "--delay", "0.4") as (balancer, journal):
        assert hub.holder(agent_id) == 1
        ids = [submit(hub, n % 2, agent_id, {"n": n}) for n in range(16)]
        wait_until(
            lambda: sum(read_journal(journal)[1].values()) >= 4,
            30,
            what="handlers running when B goes",
        )
        before = hub.instance(agent_id)
        assert before is not None
        iid = before["instance_id"]
        old_endpoint, _ = hub.stored(iid)
        if how == "sigterm":
            balancer.backend = hub.ports[0]  # the balancer sends redials to A from now on
            hub.apis[1].proc.terminate()
            hub.apis[1].proc.wait(15)
        else:
            hub.apis[1].kill_group()
        unfinished = [t for t in ids if task(hub, 0, t)["status"] != "success"]
        assert unfinished, "some tasks were in flight or queued when B went"
        ids += [submit(hub, 0, agent_id, {"n": n}) for n in range(16, 20)]
        if how == "sigkill":
            # deliveries to the dead replica are refused: the instance's breaker opens
            wait_until(
                lambda: (i := hub.instance(agent_id)) and i["breaker"] != "closed",
                30,
                what="the breaker opened while B was dead",
            )
            hub.restart(1)  # same port: the agent's redial reaches it again
        moved = wait_until(
            lambda: (e := hub.stored(iid)[0]) != old_endpoint and e,
            30,
            interval=0.05,
            what="the agent's socket registered again",
        )
        # the new socket's registration closed the breaker the dead socket opened: the
        # instance's tasks do not wait out the trial interval
        inst = hub.instance(agent_id)
        assert inst is not None and inst["breaker"] == "closed", inst
        target = hub.a if how == "sigterm" else hub.b
        assert moved.startswith(target + INTERNAL), (moved, target)
        wait_until(lambda: all_done(hub, ids), 60, interval=0.2, what="every task finished")
        if how == "sigterm":
            hub.restart(1)  # B back (for both views below, and for the next test)
        holder = hub.holder(agent_id)
        after = hub.instance(agent_id)
        assert after is not None and after["instance_id"] == before["instance_id"]
        assert_each_ran_once(hub, ids, journal)
        # deliveries to the dead socket failed quoting its URL: no secret in what callers see
        for secret in (old_endpoint.rsplit("/", 1)[1], moved.rsplit("/", 1)[1]):
            for t in ids:
                seen = json.dumps([task(hub, 0, t), events(hub, t)])
                assert secret not in seen, f"a socket secret in the task view of {t}"
        breaker = hub.stored(iid)[1]
        if how == "sigkill":
            opened = [e for e in breaker if e["kind"] == "breaker_open"]
            assert opened, breaker
            closed = [e for e in breaker if e["kind"] == "breaker_closed"]
            assert closed and closed[0]["reason"] == "channel_reopened", breaker
        # nothing after the reconnect opened it again (stale attempts' failures included)
        assert not breaker or breaker[-1]["kind"] == "breaker_closed", breaker
        return ids, journal, holder if holder is not None else -1


def test_holder_stopped_agent_redials_through_the_balancer_to_the_other_replica(
    replicas: Replicas, tmp_path: Path
) -> None:
    hub = replicas
    ids, journal, holder = _failover(hub, tmp_path, "sigterm", f"nat-term-{uuid.uuid4().hex[:6]}")
    assert holder == 0, "the instance's endpoint names A, which holds the socket now"
    deliveries, _ = read_journal(journal)
    # some answers were lost with B's socket: the agent saw those tasks again over A's
    # socket, and its dedup guard answered them (each handler ran once, checked above)
    again = [t for t in ids if deliveries[t] > 1]
    for t in again:
        last = [e for e in events(hub, t) if e["kind"] == "dispatched"][-1]
        assert last["detail"]["endpoint"].startswith(hub.a + INTERNAL), last


def test_holder_killed_and_restarted_on_its_port_takes_the_socket_again(
    replicas: Replicas, tmp_path: Path
) -> None:
    hub = replicas
    _, _, holder = _failover(hub, tmp_path, "sigkill", f"nat-kill-{uuid.uuid4().hex[:6]}")
    assert holder == 1, "the restarted B holds the socket again"
