"""A worker of ONE slot keeps every kind of exchange in flight at once while agents think.

Each agent here holds every delivery it gets until the test lets go, counting how many
it holds: if a delivery held a worker slot while its agent worked, a one-slot worker
could put only one at a time at the agent. Here all of them arrive together -- for SDK
agents (a ``def`` and an ``async def`` handler), a plain HTTP service, an agent behind
NAT (the channel), an A2A agent, a broadcast's targets, a DAG's parallel nodes, and
the callbacks that announce the results -- and then every task ends ``success``.

Real processes (api, worker with one slot, beat) on SQLite and on PostgreSQL + Redis;
the agents live in the test's process, so they can hold and count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import select

import reach
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import CallbackRow
from reach.sdk.tls import LISTEN_BACKLOG
from tests.support.a2a_echo import A2aEchoProcess, message_ids
from tests.support.ports import free_port
from tests.support.stacks import Stack, wait_http_ok
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

STACK_WORKER_CONCURRENCY = 1  # one slot: whatever runs in parallel, runs off it
STACK_SETTINGS = {"REACH_CALLBACKS__ALLOW_PRIVATE": "true"}
N = 24  # deliveries held at once (a slot per delivery would allow one)


@pytest.fixture
def stack(shared_stack: Stack) -> Stack:
    return shared_stack


class Holder:
    """Counts what arrived and holds each until `release` (thread-safe, loop-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrived: list[str] = []
        self.released = threading.Event()

    def arrive(self, key: str) -> None:
        with self.lock:
            self.arrived.append(key)

    def hold(self) -> None:
        if not self.released.wait(60):
            raise RuntimeError("never released")

    async def hold_async(self) -> None:
        await asyncio.to_thread(self.hold)

    def count(self) -> int:
        with self.lock:
            return len(self.arrived)


@contextmanager
def sdk_agent(
    stack: Stack,
    agent_id: str,
    holder: Holder,
    *,
    handler: str = "sync",
    channel: bool = False,
    method: str = "think",
) -> Iterator[reach.Agent]:
    where = {} if channel else {"addr": f"127.0.0.1:{free_port()}", "allow_loopback": True}
    agent = reach.Agent(
        agent_id, capabilities=[{"type": method}], max_concurrency=100,
        heartbeat_interval=0.5, hub=stack.url, accept_after=None, channel=channel, **where,
    )  # fmt: skip
    if handler == "sync":

        @agent.route(method)
        def think(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
            holder.arrive(task_id)
            holder.hold()
            return {"thought": task_id}

    else:

        @agent.route(method)
        async def think_async(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
            holder.arrive(task_id)
            await holder.hold_async()
            return {"thought": task_id}

    agent.start()
    try:
        wait_until(lambda: stack.instances(agent_id), timeout=30, what=f"{agent_id} registered")
        yield agent
    finally:
        holder.released.set()
        agent.close()


def held_then_done(stack: Stack, holder: Holder, task_ids: list[str], count: int = N) -> None:
    """All ``count`` deliveries reach their agents together, then every task succeeds."""
    wait_until(lambda: holder.count() >= count, timeout=60, what=f"{count} held at once")
    assert holder.count() == count  # nothing was sent twice meanwhile
    holder.released.set()
    for task_id in task_ids:
        view = reach.wait_for_result(task_id, timeout=60, hub=stack.url)
        assert view.task["status"] == "success"


def send_all(stack: Stack, agent_id: str, n: int = N) -> list[str]:
    return [
        reach.send(agent_id=agent_id, method="think", payload={"i": i}, hub=stack.url).task_id
        for i in range(n)
    ]


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_sdk_agents(stack: Stack, handler: str) -> None:
    holder = Holder()
    with sdk_agent(stack, f"sdk-{handler}", holder, handler=handler):
        held_then_done(stack, holder, send_all(stack, f"sdk-{handler}"))


def test_an_agent_behind_nat(stack: Stack) -> None:
    holder = Holder()
    with sdk_agent(stack, "behind-nat", holder, channel=True):
        wait_until(
            lambda: any(i["status"] == "online" for i in stack.instances("behind-nat")),
            timeout=30,
            what="channel online",
        )
        held_then_done(stack, holder, send_all(stack, "behind-nat"))


@contextmanager
def plain_service(holder: Holder) -> Iterator[int]:
    """An HTTP service with no SDK: the delivery contract by hand."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            holder.arrive(body["task_id"])
            holder.hold()
            data = json.dumps({"code": 0, "data": {"done": body["task_id"]}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = LISTEN_BACKLOG
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        holder.released.set()
        server.shutdown()
        server.server_close()


def test_a_plain_http_service(stack: Stack) -> None:
    holder = Holder()
    with plain_service(holder) as port:
        declared = reach.Agent(
            "plain-service", addr=f"127.0.0.1:{port}", allow_loopback=True,
            capabilities=[{"type": "think"}], heartbeat_interval=0.5, hub=stack.url,
            max_concurrency=100,
        )  # fmt: skip
        declared.register()  # the service itself speaks only the delivery contract
        declared.start_heartbeat()
        try:
            held_then_done(stack, holder, send_all(stack, "plain-service"))
        finally:
            declared.close()


def test_a_broadcast_to_instances_that_think(stack: Stack) -> None:
    holder = Holder()
    with contextlib.ExitStack() as stack_of:
        for _ in range(8):
            stack_of.enter_context(sdk_agent(stack, "panel", holder, method="ponder"))
        wait_until(lambda: len(stack.instances("panel")) == 8, timeout=30, what="8 instances")
        done: list[reach.BroadcastResult] = []
        caller = threading.Thread(
            target=lambda: done.append(
                reach.broadcast(method="ponder", capability="ponder", hub=stack.url, timeout=60)
            )
        )
        caller.start()
        wait_until(lambda: holder.count() >= 8, timeout=60, what="every target held at once")
        holder.released.set()
        caller.join(90)
        assert done and done[0].complete and done[0].succeeded >= 8, done


def test_a_dag_of_parallel_nodes_that_think(stack: Stack) -> None:
    holder = Holder()
    with sdk_agent(stack, "dag-worker", holder):
        nodes = [
            {"id": f"n{i}", "agent_id": "dag-worker", "method": "think", "payload": {"i": i}}
            for i in range(8)
        ]
        r = requests.post(
            f"{stack.url}/api/v1/dag-runs",
            json={"dag": {"name": "parallel", "nodes": nodes}, "input": {}},
            timeout=10,
        )
        assert r.status_code in (200, 201, 202), r.text
        run_id = r.json()["run_id"]
        wait_until(lambda: holder.count() >= 8, timeout=60, what="every node held at once")
        holder.released.set()
        view = wait_until(
            lambda: (
                (v := requests.get(f"{stack.url}/api/v1/dag-runs/{run_id}", timeout=5).json())[
                    "status"
                ]
                != "running"
                and v
            ),
            timeout=60,
            what="the run finished",
        )
        assert view["status"] == "success", view


def test_an_a2a_agent_that_thinks(stack: Stack, tmp_path: Path) -> None:
    journal = tmp_path / "a2a.jsonl"
    echo = A2aEchoProcess(free_port(), journal, streaming=False)
    try:
        wait_http_ok(echo.url + "/.well-known/agent-card.json")
        r = requests.post(
            f"{stack.url}/api/v1/agents/a2a",
            json={"card_url": echo.url, "allow_loopback": True, "max_concurrency": 50},
            timeout=30,
        )
        assert r.status_code in (200, 201), r.text
        agent_id = r.json()["agent_id"]
        ids = [
            reach.send(
                agent_id=agent_id,
                method="slow",
                payload={"seconds": 6},
                hub=stack.url,
                timeout_ms=60_000,
            ).task_id
            for _ in range(12)
        ]
        # every SendMessage is at the agent while the first still works (6 s each)
        wait_until(lambda: len(message_ids(journal)) >= 12, timeout=5, what="12 at once")
        for task_id in ids:
            result = reach.wait_for_result(task_id, timeout=60, hub=stack.url)
            assert result.task["status"] == "success"
    finally:
        echo.stop()


@contextmanager
def callback_receiver(holder: Holder) -> Iterator[str]:
    """Takes callbacks and holds each POST until released (a slow receiver)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            holder.arrive(str(body.get("task_id") or body))
            holder.hold()
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = LISTEN_BACKLOG
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        holder.released.set()
        server.shutdown()
        server.server_close()


def test_callbacks_to_a_receiver_that_takes_its_time(stack: Stack) -> None:
    fast = Holder()
    fast.released.set()  # the agent answers at once: only the receiver is slow
    receiver = Holder()
    with sdk_agent(stack, "quick", fast), callback_receiver(receiver) as url:
        ids = [
            reach.send(agent_id="quick", method="think", callback_url=url, hub=stack.url).task_id
            for _ in range(12)
        ]
        wait_until(lambda: receiver.count() >= 12, timeout=60, what="12 callbacks held at once")
        assert sorted(receiver.arrived) == sorted(ids)
        receiver.released.set()
        wait_until(
            lambda: all(callback_status(stack, t) == "delivered" for t in ids),
            timeout=60,
            what="every callback delivered",
        )


def callback_status(stack: Stack, task_id: str) -> str | None:
    engine = create_engine_for(stack.env["REACH_DATABASE_URL"])
    try:
        with session_factory(engine)() as s:
            return s.scalar(select(CallbackRow.status).where(CallbackRow.task_id == task_id))
    finally:
        engine.dispose()
