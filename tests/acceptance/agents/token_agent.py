"""An SDK agent that verifies reach tokens (the default) and lets a test see what it saw.

Beside the agent's own server, a stats server on ``--stats-port`` answers ``GET /counts``::

    {"runs": {task_id: n},                       handler runs
     "presented": {task_id: [authorization...]}, the Authorization header of each request
     "bodies": {task_id: [body...]},             and its body, as received (text)
     "refused": {task_id: [status...]},          the SDK's refusals, before any handler
     "jwks_fetches": n}                          the agent's requests for its hub's keys

Modes of ``work.do``: ``echo`` returns the payload; ``forward`` sends it on to
``--forward-to`` through the hub from inside the handler (the agent's own key, if
``$REACH_API_KEY`` is set) and returns that result; ``relay`` takes the token this
delivery came with and presents it itself to ``--relay-to`` (another agent's base URL)
for the same task, returning that agent's answer -- what a malicious agent B would do
with the token the hub gave it for the hop A -> B.
"""

from __future__ import annotations

import argparse
import json
import threading
from collections import defaultdict
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import requests

import reach
from reach.sdk.tokens import JWKS_PATH

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--stats-port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--agent-id", required=True)
parser.add_argument("--mode", choices=("echo", "forward", "relay"), default="echo")
parser.add_argument("--forward-to", default="")
parser.add_argument("--relay-to", default="")
parser.add_argument("--issuer", default=None, help="pin the tokens' iss (refuse others)")
args = parser.parse_args()

lock = threading.Lock()
runs: dict[str, int] = defaultdict(int)
presented: dict[str, list[str | None]] = defaultdict(list)
bodies: dict[str, list[str]] = defaultdict(list)
refused: dict[str, list[int]] = defaultdict(list)
jwks_fetches = 0


class SeeingAgent(reach.Agent):
    def admit(
        self, body: Mapping[str, Any], authorization: str | None, *, method: str, raw: bytes
    ) -> tuple[int, dict[str, Any]] | None:
        task_id = str(body.get("task_id"))
        with lock:
            presented[task_id].append(authorization)
            bodies[task_id].append(raw.decode(errors="replace"))
        answer = super().admit(body, authorization, method=method, raw=raw)
        if answer is not None:
            with lock:
                refused[task_id].append(answer[0])
        return answer


agent = SeeingAgent(
    args.agent_id,
    addr=f"127.0.0.1:{args.port}",
    allow_loopback=True,
    capabilities=[{"type": "work.do"}],
    heartbeat_interval=0.5,
    hub=args.hub,
)
assert agent.tokens is not None, "this agent verifies tokens"
agent.tokens.issuer = args.issuer
_get = agent.tokens.hub.get


def counting_get(path: str, *a: Any, **kw: Any) -> dict[str, Any]:
    """The verifier's real request to the hub, counted."""
    global jwks_fetches
    if path == JWKS_PATH:
        with lock:
            jwks_fetches += 1
    return _get(path, *a, **kw)


agent.tokens.hub.get = counting_get  # type: ignore[method-assign]


@agent.route("work.do")
def work(task_id: str, payload: dict[str, Any]) -> object:
    with lock:
        runs[task_id] += 1
    if args.mode == "forward":
        sub = reach.send(agent_id=args.forward_to, method="work.do", payload=payload)
        inner = reach.wait_for_result(sub.task_id, timeout=30)
        return {"inner_task_id": sub.task_id, "inner": inner.data}
    if args.mode == "relay":
        with lock:
            token = presented[task_id][-1]
        body = {
            "task_id": task_id,
            "method": "work.do",
            "payload": payload,
            "attempt_seq": agent.accepted_attempt(task_id),
        }
        r = requests.post(
            f"{args.relay_to}/tasks/work.do",
            json=body,
            headers={"Authorization": token or ""},
            timeout=10,
        )
        return {"relayed_status": r.status_code, "relayed_answer": r.json()}
    return {"echo": payload, "by": args.agent_id}


def stats_server() -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                data = json.dumps(
                    {
                        "runs": dict(runs),
                        "presented": dict(presented),
                        "bodies": dict(bodies),
                        "refused": dict(refused),
                        "jwks_fetches": jwks_fetches,
                    }
                ).encode()
            self.send_response(200 if self.path == "/counts" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.stats_port), Handler)
    server.daemon_threads = True
    return server


threading.Thread(target=stats_server().serve_forever, daemon=True).start()
agent.serve()
