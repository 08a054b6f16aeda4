"""A mock agent for benchmarks, built on the SDK like any real agent.

Modes: ``sync`` answers after ``--latency`` seconds (a ``def`` handler in ``time.sleep``);
``async`` the same from an ``async def`` handler in ``asyncio.sleep``; ``plain`` is an
HTTP service without the SDK (``http.server`` speaking the delivery contract by hand, a
``reach.Agent`` declaration that does not serve registering and heartbeating for it);
``accept`` answers 202 and reports the result ``--latency`` seconds later (one scheduler
thread and a few reporter threads, so 2,000 waiting tasks cost no 2,000 threads);
``forward`` answers 202 and sends the payload on to ``--forward-to`` through the hub,
reporting that answer as its result (a second hop).

``--instances N`` serves N instances of the agent from this one process (each its own
port and instance id, all with the same agent id and capabilities): a broadcast to 50
instances costs one interpreter, not 50.

``POST /tasks/bench.stats`` returns the per-second count of task requests received (by
every instance of the process), which the fault run turns into the rate reaching the agent.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import logging
import signal
import socket
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

import reach
from reach.sdk.tls import LISTEN_BACKLOG

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True, help="the first instance's port")
parser.add_argument("--hub", required=True)
parser.add_argument("--agent-id", required=True)
parser.add_argument(
    "--mode", choices=("sync", "async", "plain", "accept", "forward", "bounce"), default="sync"
)
parser.add_argument("--latency", type=float, default=0.0)
parser.add_argument("--forward-to", default="")
parser.add_argument("--max-concurrency", type=int, default=256)
parser.add_argument("--reporters", type=int, default=8)
parser.add_argument(
    "--instances", type=int, default=1, help="instances served by this process (ports beyond "
    "--port are chosen free here)"
)  # fmt: skip
parser.add_argument("--tags", default="bench", help="comma-separated tags of every instance")
parser.add_argument(
    "--verify-tokens",
    action="store_true",
    help="check the hub's reach tokens (the SDK default); off by default here because the "
    "direct and Celery baselines, and bench.stats, post to the agent without one",
)

CAPABILITIES = [{"type": "bench.echo"}, {"type": "bench.stats"}, {"type": "bench.fail"}]


class Reporter:
    """Reports accepted tasks' results when their latency is up, on a few threads."""

    def __init__(self, hub: str, threads: int) -> None:
        self.hub = hub.rstrip("/")
        self._heap: list[tuple[float, str, dict[str, Any]]] = []
        self._cond = threading.Condition()
        self._local = threading.local()
        for i in range(threads):
            threading.Thread(target=self._run, name=f"reporter-{i}", daemon=True).start()

    def later(self, delay: float, task_id: str, report: dict[str, Any]) -> None:
        """POST ``report`` (the whole result body) as the task's result after ``delay``."""
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, task_id, report))
            self._cond.notify()

    def _run(self) -> None:
        session = requests.Session()
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                _, task_id, report = heapq.heappop(self._heap)
            for _ in range(5):
                try:
                    session.post(
                        f"{self.hub}/v1/tasks/{task_id}/result",
                        json=report,
                        timeout=10,
                    )
                    break
                except requests.RequestException:
                    time.sleep(0.2)


@dataclass
class Shared:
    """What the instances of one process share: the count of requests received, the
    reporter and forwarder threads, and the failure switch ``bench.fail`` moves."""

    args: argparse.Namespace
    received: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    failing_until: float = 0.0  # monotonic
    loops: list[str] = field(default_factory=list)  # the hub's refusals of a bounce as a loop
    reporter: Reporter | None = None
    forwarder: ThreadPoolExecutor | None = None
    local: threading.local = field(default_factory=threading.local)

    def count(self) -> None:
        with self.lock:
            self.received[int(time.time())] += 1

    def stats(self) -> dict[str, Any]:
        with self.lock:
            received = {str(k): v for k, v in self.received.items()}
            return {"received": received, "loops": list(self.loops)}

    def hub_session(self) -> requests.Session:
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
        return self.local.session  # type: ignore[no-any-return]


def declaration(args: argparse.Namespace, port: int) -> reach.Agent:
    """One instance's ``reach.Agent``: its own port and instance id, the process's agent."""
    return reach.Agent(
        args.agent_id,
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,
        tags=[t for t in args.tags.split(",") if t],
        capabilities=CAPABILITIES,
        max_concurrency=args.max_concurrency,
        heartbeat_interval=2.0,
        hub=args.hub,
        verify_tokens=args.verify_tokens,
    )


def sdk_instance(shared: Shared, port: int) -> reach.Agent:
    """An instance served by the SDK, its handlers as the mode says."""
    args = shared.args
    agent = declaration(args, port)
    invoke = agent.invoke

    def counted_invoke(method: str, body: Any) -> tuple[int, dict[str, Any]]:
        """Every task request is counted, also those answered 503 while failing."""
        if method == "bench.echo":
            shared.count()
            if time.monotonic() < shared.failing_until:
                return 503, {"code": -1, "message": "down (bench.fail)"}
        return invoke(method, body)

    agent.invoke = counted_invoke  # type: ignore[method-assign]

    def claim(task_id: str) -> dict[str, Any]:
        """What a result report must name: the attempt delivered here, and this instance."""
        return {"attempt_seq": agent.accepted_attempt(task_id), "instance_id": agent.instance_id}

    def forward(task_id: str, payload: dict[str, Any]) -> None:
        """The second hop, off the handler: the first hop was answered 202, so no hub
        worker slot waits on this one (a sync chain can starve the pool it runs on)."""
        try:
            view = (
                shared.hub_session()
                .post(
                    f"{args.hub}/v1/tasks",
                    params={"wait": 30},
                    json={"agent_id": args.forward_to, "method": "bench.echo", "payload": payload},
                    timeout=40,
                )
                .json()
            )
            ok = view.get("status") == "success"
            report = (
                {"code": 0, "data": {"forwarded": view.get("result")}}
                if ok
                else {"code": 1, "message": f"second hop {view.get('status')}"}
            ) | claim(task_id)
            shared.hub_session().post(
                f"{args.hub}/v1/tasks/{task_id}/result", json=report, timeout=10
            )
        except Exception as exc:  # the hub's watchdog retries the first hop
            logging.warning("second hop of %s failed: %s", task_id, exc)

    def bounce_wait(task_id: str, sub: str) -> None:
        """The bounce's answer becomes this task's result (or its stated failure)."""
        try:
            got = reach.wait_for_result(sub, timeout=60, hub=args.hub)
            agent.report_result(task_id, {"bounced": got.data})
        except reach.ReachError as exc:
            agent.report_result(task_id, code=2, message=f"{type(exc).__name__}: {exc}"[:500])

    def bounce(task_id: str, payload: dict[str, Any]) -> Any:
        left = int(payload.get("bounce") or 0)
        if left <= 0:
            return {"echo": payload}
        try:  # inside the handler: the reach continues this task's trace
            sub = reach.send(
                agent_id=args.forward_to,
                method="bench.echo",
                payload={**payload, "bounce": left - 1},
                hub=args.hub,
            )
        except reach.LoopDetected as exc:
            with shared.lock:
                shared.loops.append(str(exc)[:300])
            raise reach.BusinessError(3, f"LoopDetected: {exc}"[:500]) from exc
        assert shared.forwarder is not None
        shared.forwarder.submit(bounce_wait, task_id, sub.task_id)
        return reach.ACCEPTED

    def echo(task_id: str, payload: dict[str, Any]) -> Any:
        if args.mode == "bounce":
            return bounce(task_id, payload)
        if shared.reporter is not None:
            shared.reporter.later(
                args.latency, task_id, {"code": 0, "data": {"echo": payload}, **claim(task_id)}
            )
            return reach.ACCEPTED
        if args.latency:
            time.sleep(args.latency)
        if shared.forwarder is not None:
            shared.forwarder.submit(forward, task_id, payload)
            return reach.ACCEPTED
        return {"echo": payload}

    async def echo_async(task_id: str, payload: dict[str, Any]) -> Any:
        await asyncio.sleep(args.latency)
        return {"echo": payload}

    agent.route("bench.echo")(echo_async if args.mode == "async" else echo)

    @agent.route("bench.stats")
    def stats(task_id: str, payload: dict[str, Any]) -> Any:
        return shared.stats()

    @agent.route("bench.fail")
    def fail(task_id: str, payload: dict[str, Any]) -> Any:
        shared.failing_until = time.monotonic() + float(payload.get("seconds") or 0)
        return {"failing_for_s": float(payload.get("seconds") or 0)}

    return agent


class PlainService:
    """An HTTP service that never imports the SDK's server: ``POST /tasks/{method}`` with
    the delivery's JSON body, answered ``200 {"code": 0, "data": ...}`` after ``--latency``
    seconds; ``GET`` anything (the hub's probe) 200. A ``reach.Agent`` declaration that
    does not serve registers it and heartbeats for it."""

    def __init__(self, shared: Shared, port: int) -> None:
        latency = shared.args.latency

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body leave in two writes

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                method = self.path.rsplit("/", 1)[-1]
                if method == "bench.stats":
                    self._answer(200, {"code": 0, "data": shared.stats()})
                    return
                shared.count()
                time.sleep(latency)
                self._answer(200, {"code": 0, "data": {"echo": body.get("payload")}})

            def do_GET(self) -> None:
                self._answer(200, {"status": "ok"})

            def _answer(self, status: int, reply: dict[str, Any]) -> None:
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            # the standard library's backlog of 5 drops SYNs under a hub's burst
            request_queue_size = LISTEN_BACKLOG
            daemon_threads = True

        self.server = Server(("127.0.0.1", port), Handler)
        self.declared = declaration(shared.args, port)

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.declared.register()  # the service itself speaks only the delivery contract
        self.declared.start_heartbeat()

    def close(self) -> None:
        self.declared.close()  # heartbeats stop, the instance deregisters
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    shared = Shared(args)
    if args.mode == "accept":
        shared.reporter = Reporter(args.hub, args.reporters)
    if args.mode in ("forward", "bounce"):
        shared.forwarder = ThreadPoolExecutor(64, thread_name_prefix="fwd")
    ports = [args.port, *(free_port() for _ in range(args.instances - 1))]
    instances: list[reach.Agent | PlainService] = [
        PlainService(shared, port) if args.mode == "plain" else sdk_instance(shared, port)
        for port in ports
    ]
    # the handlers are in place before registering (see reach.Agent.serve): a stop that
    # comes while instances register still deregisters those that did
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    started: list[reach.Agent | PlainService] = []
    try:
        for instance in instances:
            instance.start()
            started.append(instance)
        stop.wait()
    finally:
        # together: each instance's server takes up to half a second to stop polling
        with ThreadPoolExecutor(max(1, len(started))) as closing:
            list(closing.map(lambda i: i.close(), started))


if __name__ == "__main__":
    main()
