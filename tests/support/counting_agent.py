"""A raw HTTP agent that counts every delivery the hub makes, per task_id.

The SDK's dedup guard answers a repeated delivery from its cache, so handler runs alone
cannot show how often the hub re-delivered. This agent sits below any guard: every
``POST /tasks/{method}`` is a delivery, counted by ``task_id`` (and ``attempt_seq``).
It applies its side effect once per ``task_id`` with a guard of its own that lives in a
journal file (so it survives a restart), and answers repeats with the first answer.

The ``reach.Agent`` object is used only to register and heartbeat; serving is raw.

Run as a process::

    python -m tests.support.counting_agent --port P --hub URL --journal FILE

``GET /counts`` answers ``{"deliveries": {task_id: n}, "attempts": {task_id: [seq...]},
"side_effects": {task_id: n}}``; `read_journal` reads the same from the file (after a
kill). Options: ``--delay`` seconds per delivery, ``--fail-first N`` answers 500 to the
first N deliveries of each task (forces retries).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from reach.sdk.tls import LISTEN_BACKLOG
from tests.support import processes

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Counts:
    """What the agent saw, rebuilt from its journal or reported over HTTP."""

    deliveries: Counter[str] = field(default_factory=Counter)
    attempts: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    side_effects: Counter[str] = field(default_factory=Counter)

    def redeliveries(self) -> Counter[int]:
        """How many tasks were delivered n times: ``{1: 190, 2: 10}``."""
        return Counter(self.deliveries.values())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        return cls(
            Counter(data["deliveries"]),
            defaultdict(list, data["attempts"]),
            Counter(data["side_effects"]),
        )


def read_journal(path: Path) -> Counts:
    """Counts from the journal: ``delivery <task_id> <attempt_seq>`` / ``effect <task_id>``."""
    counts = Counts()
    if not path.exists():
        return counts
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "delivery":
            counts.deliveries[parts[1]] += 1
            counts.attempts[parts[1]].append(int(parts[2]))
        elif len(parts) == 2 and parts[0] == "effect":
            counts.side_effects[parts[1]] += 1
    return counts


class Journal:
    """Append-only, fsynced: a line written is a fact even if the process is killed next."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._effects_lock = threading.Lock()
        self._task_locks: dict[str, threading.Lock] = {}
        self.counts = read_journal(path)
        self.answers: dict[str, int] = {t: 1 for t in self.counts.side_effects}

    def _append(self, line: str) -> None:
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def delivery(self, task_id: str, attempt_seq: int) -> None:
        self._append(f"delivery {task_id} {attempt_seq}")
        with self._lock:
            self.counts.deliveries[task_id] += 1
            self.counts.attempts[task_id].append(attempt_seq)

    def effect_once(self, task_id: str) -> bool:
        """Run the side effect unless it already ran for this task; True if it ran now.

        A per-task lock makes two concurrent copies of one delivery wait for each other."""
        with self._effects_lock:
            task_lock = self._task_locks.setdefault(task_id, threading.Lock())
        with task_lock:
            if task_id in self.answers:
                return False
            self._append(f"effect {task_id}")
            with self._lock:
                self.counts.side_effects[task_id] += 1
                self.answers[task_id] = 1
            return True

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "deliveries": dict(self.counts.deliveries),
                "attempts": {k: list(v) for k, v in self.counts.attempts.items()},
                "side_effects": dict(self.counts.side_effects),
            }


def make_server(
    port: int, journal: Journal, delay: float = 0.0, fail_first: int = 0
) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like a real agent server

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/counts":
                self._answer(200, journal.snapshot())
            elif self.path == "/healthz":
                self._answer(200, {"status": "ok"})
            else:
                self._answer(404, {"code": 404, "message": "not found"})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not self.path.startswith("/tasks/"):
                self._answer(404, {"code": 404, "message": "not found"})
                return
            body = json.loads(raw)
            task_id = str(body["task_id"])
            journal.delivery(task_id, int(body.get("attempt_seq") or 0))
            if delay:
                time.sleep(delay)
            if journal.counts.deliveries[task_id] <= fail_first:
                self._answer(500, {"code": 500, "message": "transient trouble"})
                return
            first = journal.effect_once(task_id)
            self._answer(200, {"code": 0, "data": {"task_id": task_id, "first": first}})

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = LISTEN_BACKLOG  # a burst of exchanges, as for SDK agents

    server = Server(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


class CountingAgentProcess:
    """This module as its own process (``start`` again after ``kill``: the journal stays)."""

    def __init__(
        self, hub: str, journal: Path, port: int, *extra: str, env: dict[str, str] | None = None
    ) -> None:
        self.env = env  # None: this process's environment (e.g. ``REACH_API_KEY`` set here)
        self.journal = journal
        self.port = port
        self.args = [
            sys.executable, "-m", "tests.support.counting_agent", "--port", str(port),
            "--hub", hub, "--journal", str(journal), *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.journal.with_suffix(".out").open("ab") as out:
            self.proc = subprocess.Popen(
                self.args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )

    def counts(self) -> Counts:
        """Live counts over HTTP (the journal file has them too: `read_journal`)."""
        import requests

        return Counts.from_json(requests.get(self.url + "/counts", timeout=5).json())

    def kill(self) -> None:
        processes.kill(self.proc)

    def stop(self) -> None:
        processes.stop(self.proc)


def main() -> None:
    import reach

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--agent-id", default="counter")
    parser.add_argument("--method", default="work.do")
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--fail-first", type=int, default=0)
    parser.add_argument("--max-concurrency", type=int, default=32)
    parser.add_argument("--heartbeat-interval", type=float, default=0.5)
    parser.add_argument("--require-approval", action="store_true")  # a dangerous capability
    parser.add_argument("--tag", action="append", default=[])
    parser.add_argument("--params-schema", default='{"type": "object"}', help="JSON")
    args = parser.parse_args()
    schema = json.loads(args.params_schema)
    capability: dict[str, Any] = {"type": args.method, "params_schema": schema}
    if args.require_approval:
        capability.update(require_approval=True, danger_level="high")

    journal = Journal(args.journal)
    server = make_server(args.port, journal, args.delay, args.fail_first)
    agent = reach.Agent(
        args.agent_id,
        addr=f"127.0.0.1:{args.port}",
        instance_id=args.instance_id,
        allow_loopback=True,
        capabilities=[capability],
        tags=args.tag,
        max_concurrency=args.max_concurrency,
        heartbeat_interval=args.heartbeat_interval,
        hub=args.hub,
    )
    while True:  # the hub may come up after us
        try:
            agent.register()
            break
        except reach.HubUnavailable:
            time.sleep(0.2)
    agent.start_heartbeat()
    server.serve_forever()


if __name__ == "__main__":
    main()
