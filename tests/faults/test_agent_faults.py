"""Faulty agents: slower than the read timeout, trickling bytes, silent; killed after answering.

The hub (api + worker + beat, PostgreSQL, Redis) is real; the faulty agents are raw HTTP
servers that journal every delivery with the time it arrived and the time the hub hung up,
so redeliveries are counted below any dedup guard and overlaps with a live attempt show.
The SDK agent of the last test is a process SIGKILLed after its handler's side effect and
its stored answer, then restarted on the same port and dedup store.
"""

from __future__ import annotations

import itertools
import json
import math
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests

import reach
from tests.support.dedup_agent import DedupAgentProcess
from tests.support.ports import free_port
from tests.support.stacks import Stack, start_stack, stop_stack
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("store_url", ["postgres"], indirect=True),
]

CONNECT_S = 0.5
TASK_READ_S = 1.0  # the task's own read timeout (timeout_ms), below the router's 5 s
MAX_RETRY = 4
SETTINGS = {
    "REACH_ROUTER__CONNECT_TIMEOUT": str(CONNECT_S),
    "REACH_ROUTER__READ_TIMEOUT": "5",
    "REACH_ROUTER__MAX_RETRY": str(MAX_RETRY),
    "REACH_ROUTER__BACKOFF_BASE": "0.2",
    "REACH_ROUTER__BACKOFF_CAP": "1.6",
    "REACH_ROUTER__REPUBLISH_GRACE": "2",
    "REACH_PROBE__INTERVAL": "1",
    "REACH_HEARTBEAT__SWEEP_INTERVAL": "1",
}
LEASE_S = CONNECT_S + TASK_READ_S + 10.0  # DeliveryPolicy.lease_for, default margin
ATTEMPT_S = CONNECT_S + TASK_READ_S  # the whole exchange's deadline (agent_http.post)


@pytest.fixture
def fault_stack(store_url: str, redis_db: str, tmp_path: Path) -> Iterator[Stack]:
    extra = {**SETTINGS, "REACH_BROKER_URL": redis_db, "REACH_RESULT_BACKEND": redis_db}
    stack = start_stack(store_url, tmp_path, extra)
    try:
        yield stack
    finally:
        stop_stack(stack)


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the hub's TCP probes connect and reset: not a delivery, not an error


@dataclass
class Delivery:
    task_id: str
    attempt_seq: int
    arrived: float
    ended: float | None = None  # the hub hung up, or the answer was written whole


class FaultyAgent:
    """A raw HTTP agent with one behaviour, registered and heartbeating through the SDK.

    ``slow``: answers after 3x the task's read timeout; ``trickle``: sends headers, then
    a byte every 0.2 s; ``silent``: never answers; ``flaky``: slow for the first two
    deliveries of a task, then answers at once; ``healthy``: answers at once.
    """

    def __init__(self, behaviour: str, hub: str) -> None:
        self.behaviour = behaviour
        self.port = free_port()
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        self._server = _QuietServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.agent = reach.Agent(
            behaviour,
            addr=f"127.0.0.1:{self.port}",
            allow_loopback=True,
            capabilities=[{"type": "work.do", "params_schema": {"type": "object"}}],
            max_concurrency=32,
            heartbeat_interval=0.5,
            hub=hub,
        )
        self.agent.register()
        self.agent.start_heartbeat()

    def close(self) -> None:
        self.agent.stop_heartbeat()
        self._server.shutdown()
        self._server.server_close()

    def of(self, task_id: str) -> list[Delivery]:
        with self._lock:
            return sorted(
                (d for d in self.deliveries if d.task_id == task_id), key=lambda d: d.arrived
            )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        agent = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                d = Delivery(str(body["task_id"]), int(body["attempt_seq"]), time.time())
                with agent._lock:
                    agent.deliveries.append(d)
                    nth = sum(1 for x in agent.deliveries if x.task_id == d.task_id)
                behaviour = agent.behaviour
                if behaviour == "flaky":
                    behaviour = "slow" if nth <= 2 else "healthy"
                try:
                    if behaviour == "slow" and self._hub_left_within(3 * TASK_READ_S):
                        return
                    if behaviour == "silent":
                        self._hub_left_within(30)
                        return
                    if behaviour == "trickle":
                        self._trickle(d)
                        return
                    data = json.dumps({"code": 0, "data": {"nth": nth}}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                    d.ended = time.time()
                finally:
                    if d.ended is None:
                        d.ended = time.time()
                    self.close_connection = True

            def _hub_left_within(self, seconds: float) -> bool:
                """Wait, watching the socket; True (and ``ended`` set) if the hub hung up."""
                until = time.monotonic() + seconds
                sock: socket.socket = self.connection
                while time.monotonic() < until:
                    readable, _, _ = select.select([sock], [], [], 0.02)
                    if readable and not sock.recv(1, socket.MSG_PEEK):
                        return True
                return False

            def _trickle(self, d: Delivery) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.flush()
                for _ in range(1000):
                    if self._hub_left_within(0.2):
                        return
                    try:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    except OSError:
                        return

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def submit(stack: Stack, agent_id: str, task_id: str) -> None:
    reach.send(
        agent_id=agent_id,
        method="work.do",
        payload={},
        task_id=task_id,
        timeout_ms=int(TASK_READ_S * 1000),
        hub=stack.url,
    )


def dead_letter(stack: Stack, task_id: str) -> dict[str, Any] | None:
    rows = requests.get(f"{stack.url}/api/v1/dead-letters", timeout=5).json()["dead_letters"]
    return next((r for r in rows if r["task_id"] == task_id), None)


def assert_no_overlap(deliveries: list[Delivery]) -> None:
    """Each attempt ended (the hub hung up) within its deadline, well inside its lease,
    and the next delivery came only after it: never two copies while a lease is live."""
    for d in deliveries:
        assert d.ended is not None
        assert d.ended - d.arrived <= ATTEMPT_S + 0.5 < LEASE_S, d
    for first, then in itertools.pairwise(deliveries):
        assert first.ended is not None
        assert then.arrived >= first.ended, (first, then)
        assert then.attempt_seq > first.attempt_seq, (first, then)


def test_slow_trickling_and_silent_agents_end_in_their_contract_state(
    fault_stack: Stack,
) -> None:
    stack = fault_stack
    agents = {b: FaultyAgent(b, stack.url) for b in ("slow", "trickle", "silent", "flaky")}
    healthy = FaultyAgent("healthy", stack.url)
    try:
        for name in (*agents, "healthy"):
            wait_until(lambda n=name: stack.instance(n), timeout=30, what=f"{name} registered")
        started = time.monotonic()
        for name in agents:
            submit(stack, name, f"{name}-1")

        # Meanwhile the worker keeps delivering to a healthy agent, one task at a time.
        latencies: list[float] = []
        n = 0
        while time.monotonic() - started < 20 and (
            n < 5 or any(stack.task(f"{a}-1")["status"] not in reach_terminal() for a in agents)
        ):
            t0 = time.monotonic()
            submit(stack, "healthy", f"healthy-{n}")
            result = reach.wait_for_result(f"healthy-{n}", timeout=15, hub=stack.url)
            assert result.data == {"nth": 1}
            latencies.append(time.monotonic() - t0)
            n += 1

        final = {
            a: wait_until(
                lambda a=a: (t := stack.task(f"{a}-1"))["status"] in reach_terminal() and t,
                timeout=60,
                interval=0.5,
                what=f"{a} terminal",
            )
            for a in agents
        }
        for name in ("slow", "trickle", "silent"):
            assert final[name]["status"] == "dead", final[name]
            row = dead_letter(stack, f"{name}-1")
            assert row is not None and row["attempts"] == MAX_RETRY + 1, row
            assert "timed out" in json.dumps(row["last_error"]) + row["reason"], row
            deliveries = agents[name].of(f"{name}-1")
            assert len(deliveries) == MAX_RETRY + 1, deliveries
            assert_no_overlap(deliveries)
        assert final["flaky"]["status"] == "success", final["flaky"]
        flaky = agents["flaky"].of("flaky-1")
        assert len(flaky) == 3
        assert_no_overlap(flaky)
        assert all(len(healthy.of(f"healthy-{i}")) == 1 for i in range(n))
        # Responsive: a healthy task waits at most for the faulty attempts queued ahead of
        # it, two at a time (prefork -c 2), each over by its deadline; then no longer than
        # the one faulty attempt that may hold a slot.
        head_of_line = (math.ceil(len(agents) / 2) + 1) * ATTEMPT_S + 1.0
        assert max(latencies) < head_of_line, latencies
        assert sorted(latencies)[len(latencies) // 2] < ATTEMPT_S + 0.5, latencies
        print(
            "\nagent faults:",
            {a: (final[a]["status"], len(agents[a].of(f"{a}-1"))) for a in agents},
            f"healthy tasks {n}, max latency {max(latencies):.2f}s",
        )
    finally:
        for agent in (*agents.values(), healthy):
            agent.close()


def reach_terminal() -> set[str]:
    return {"success", "failed", "dead", "cancelled"}


@pytest.mark.parametrize(
    ("store", "effects"),
    [(True, 1), (False, 2)],
    ids=["sqlite-store-runs-once", "in-memory-runs-again"],
)
def test_agent_killed_after_its_side_effect_answers_the_redelivery_from_its_store(
    fault_stack: Stack, tmp_path: Path, store: bool, effects: int
) -> None:
    stack = fault_stack
    journal = tmp_path / "dedup-agent.log"
    extra = ("--store", str(tmp_path / "dedup.sqlite")) if store else ()
    agent = DedupAgentProcess(stack.url, journal, free_port(), uuid.uuid4().hex, *extra)
    agent.start("--hold")
    try:
        wait_until(lambda: stack.instance("dedup"), timeout=30, what="dedup agent registered")
        reach.send(agent_id="dedup", method="work.do", payload={}, task_id="kill-1", hub=stack.url)
        wait_until(lambda: agent.lines("answered"), timeout=20, what="first answer stored")
        assert agent.proc is not None
        killed_pid = agent.proc.pid
        agent.kill()  # side effect done, answer stored (or not), the hub never told
        agent.start()
        result = reach.wait_for_result("kill-1", timeout=40, hub=stack.url)
        deliveries = agent.lines("delivery")
        runs = agent.lines("effect")
        assert len(runs) == effects, (runs, deliveries)
        assert len(deliveries) == 2, deliveries  # the held one and the redelivery
        assert int(deliveries[1][1]) > int(deliveries[0][1])
        # With the store, the answer the hub got is the one the killed process computed.
        assert (result.data["pid"] == killed_pid) is store, result.data
        print(
            f"\nkilled after side effect (store={store}): deliveries {len(deliveries)}, "
            f"side effects {len(runs)}, status success"
        )
    finally:
        agent.stop()
