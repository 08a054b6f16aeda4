"""A mock agent for benchmarks, built on the SDK like any real agent.

Modes: ``sync`` answers after ``--latency`` seconds; ``accept`` answers 202 and
reports the result ``--latency`` seconds later (one scheduler thread and a few reporter
threads, so 2,000 waiting tasks cost no 2,000 threads); ``forward`` answers 202 and
sends the payload on to ``--forward-to`` through the hub, reporting that answer as its
result (a second hop).

``POST /tasks/bench.stats`` returns the per-second count of task requests received, which
the fault run turns into the rate reaching the agent.
"""

from __future__ import annotations

import argparse
import heapq
import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

import reach

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--agent-id", required=True)
parser.add_argument("--mode", choices=("sync", "accept", "forward", "bounce"), default="sync")
parser.add_argument("--latency", type=float, default=0.0)
parser.add_argument("--forward-to", default="")
parser.add_argument("--max-concurrency", type=int, default=256)
parser.add_argument("--reporters", type=int, default=8)
parser.add_argument(
    "--verify-tokens",
    action="store_true",
    help="check the hub's reach tokens (the SDK default); off by default here because the "
    "direct and Celery baselines, and bench.stats, post to the agent without one",
)


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


def main() -> None:
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    agent = reach.Agent(
        args.agent_id,
        addr=f"127.0.0.1:{args.port}",
        allow_loopback=True,
        tags=["bench"],
        capabilities=[{"type": "bench.echo"}, {"type": "bench.stats"}, {"type": "bench.fail"}],
        max_concurrency=args.max_concurrency,
        heartbeat_interval=2.0,
        hub=args.hub,
        verify_tokens=args.verify_tokens,
    )
    received: Counter[int] = Counter()
    lock = threading.Lock()
    reporter = Reporter(args.hub, args.reporters) if args.mode == "accept" else None
    local = threading.local()

    def hub_session() -> requests.Session:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        return local.session  # type: ignore[no-any-return]

    forwarding = args.mode in ("forward", "bounce")
    forwarder = ThreadPoolExecutor(64, thread_name_prefix="fwd") if forwarding else None
    failing_until = [0.0]  # monotonic; bench.fail moves it
    loops: list[str] = []  # what the hub said when it refused a bounce as a loop
    invoke = agent.invoke

    def counted_invoke(method: str, body: Any) -> tuple[int, dict[str, Any]]:
        """Every task request is counted, also those answered 503 while failing."""
        if method == "bench.echo":
            with lock:
                received[int(time.time())] += 1
            if time.monotonic() < failing_until[0]:
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
                hub_session()
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
            hub_session().post(f"{args.hub}/v1/tasks/{task_id}/result", json=report, timeout=10)
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
            with lock:
                loops.append(str(exc)[:300])
            raise reach.BusinessError(3, f"LoopDetected: {exc}"[:500]) from exc
        assert forwarder is not None
        forwarder.submit(bounce_wait, task_id, sub.task_id)
        return reach.ACCEPTED

    @agent.route("bench.echo")
    def echo(task_id: str, payload: dict[str, Any]) -> Any:
        if args.mode == "bounce":
            return bounce(task_id, payload)
        if reporter is not None:
            reporter.later(
                args.latency, task_id, {"code": 0, "data": {"echo": payload}, **claim(task_id)}
            )
            return reach.ACCEPTED
        if args.latency:
            time.sleep(args.latency)
        if forwarder is not None:
            forwarder.submit(forward, task_id, payload)
            return reach.ACCEPTED
        return {"echo": payload}

    @agent.route("bench.stats")
    def stats(task_id: str, payload: dict[str, Any]) -> Any:
        with lock:
            return {"received": {str(k): v for k, v in received.items()}, "loops": list(loops)}

    @agent.route("bench.fail")
    def fail(task_id: str, payload: dict[str, Any]) -> Any:
        failing_until[0] = time.monotonic() + float(payload.get("seconds") or 0)
        return {"failing_for_s": float(payload.get("seconds") or 0)}

    agent.serve()


if __name__ == "__main__":
    main()
