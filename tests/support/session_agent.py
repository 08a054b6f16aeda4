"""A ``reach.Agent`` process for session liveness: it counts every task its handler is
given, and a task whose payload says ``hold`` keeps working until ``reach.session_alive()``
turns False (or ``hold`` seconds pass), the way a handler stops spending model calls when
the user has left.

Run as a process::

    python -m tests.support.session_agent --port P --stats-port S --hub URL

``GET /stats`` on the stats port answers ``{"received": [task_id...], "observed":
{task_id: {"closed_after_s": x, "nested": "<what a reach sent from there raised>"}},
"instance_id": ...}``: counted at the agent, over HTTP.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support import processes

REPO = Path(__file__).resolve().parents[2]


class SessionAgentProcess:
    def __init__(
        self, hub: str, port: int, stats_port: int, log: Path, *extra: str, env: dict[str, str]
    ) -> None:
        self.port, self.stats_port = port, stats_port
        args = [
            sys.executable, "-m", "tests.support.session_agent", "--port", str(port),
            "--stats-port", str(stats_port), "--hub", hub, *extra,
        ]  # fmt: skip
        with log.open("ab") as out:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env
            )

    def stats(self) -> dict[str, Any]:
        import requests

        return dict(requests.get(f"http://127.0.0.1:{self.stats_port}/stats", timeout=5).json())

    def stop(self) -> None:
        processes.stop(self.proc)


def main() -> None:
    import reach

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stats-port", type=int, required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--agent-id", default="sessioned")
    parser.add_argument("--heartbeat-interval", type=float, default=0.5)
    parser.add_argument("--max-concurrency", type=int, default=8)
    args = parser.parse_args()

    agent = reach.Agent(
        args.agent_id,
        addr=f"127.0.0.1:{args.port}",
        allow_loopback=True,
        capabilities=[
            {"type": "work.do", "params_schema": {"type": "object"}},
            {"type": "policy.pay", "params_schema": {"type": "object"}},  # gated by the hub
        ],
        max_concurrency=args.max_concurrency,
        heartbeat_interval=args.heartbeat_interval,
        hub=args.hub,
    )
    lock = threading.Lock()
    received: list[str] = []
    observed: dict[str, dict[str, Any]] = {}

    @agent.route("policy.pay")
    @agent.route("work.do")
    def work(task_id: str, payload: dict[str, Any]) -> object:
        with lock:
            received.append(task_id)
        hold = float(payload.get("hold") or 0)
        started = time.monotonic()
        while time.monotonic() - started < hold:
            if not reach.session_alive():
                try:  # a reach from here inherits the task's session: refused now
                    reach.send(agent_id=args.agent_id, method="work.do", payload={})
                    nested = "accepted"
                except reach.ReachError as exc:
                    nested = type(exc).__name__
                with lock:
                    observed[task_id] = {
                        "closed_after_s": time.monotonic() - started,
                        "nested": nested,
                    }
                return {"stopped": True}
            time.sleep(0.05)
        return {"stopped": False}

    class Stats(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                body = json.dumps(
                    {"received": received, "observed": observed, "instance_id": agent.instance_id}
                ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    stats = ThreadingHTTPServer(("127.0.0.1", args.stats_port), Stats)
    threading.Thread(target=stats.serve_forever, daemon=True).start()
    agent.serve()


if __name__ == "__main__":
    main()
