"""A test agent for trust levels: it authenticates with ``$REACH_API_KEY`` and records every
handler run, so a test can count at the agent which reaches arrived.

Capabilities: every ``--capability`` given (each records the task and answers who ran
it); ``relay.send`` sends ``payload["payload"]`` on from inside the handler (its own key,
as every reach from a handler) to ``payload["to"]`` or ``payload["tags"]`` with
``payload["method"]`` and answers the inner result -- or, when the hub refuses the inner
reach, the refusal's type and status, so a test sees what an L3 plugin was told;
``late.do`` answers 202 and reports its result a moment later (a report by the agent).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import reach

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--agent-id", required=True)
parser.add_argument("--log", required=True, help="one line per handler run: task_id method")
parser.add_argument("--tag", action="append", default=[])
parser.add_argument("--capability", action="append", default=[])
args = parser.parse_args()

agent = reach.Agent(
    args.agent_id,
    tags=args.tag,
    addr=f"127.0.0.1:{args.port}",
    allow_loopback=True,
    capabilities=[{"type": c} for c in [*args.capability, "relay.send", "late.do"]],
    heartbeat_interval=0.5,
    hub=args.hub,
)
lock = threading.Lock()


def executed(task_id: str, method: str) -> None:
    with lock, open(args.log, "a") as f:
        f.write(f"{task_id} {method}\n")


def _plain(method: str) -> Any:
    def handler(task_id: str, payload: dict[str, Any]) -> object:
        executed(task_id, method)
        return {"by": args.agent_id, "method": method}

    return handler


for capability in args.capability:
    agent.route(capability)(_plain(capability))


@agent.route("relay.send")
def relay(task_id: str, payload: dict[str, Any]) -> object:
    executed(task_id, "relay.send")
    try:
        sub = reach.send(
            agent_id=payload.get("to"),
            tags=payload.get("tags") or (),
            method=payload["method"],
            payload=payload.get("payload") or {},
        )
        inner = reach.wait_for_result(sub.task_id, timeout=30)
    except reach.ReachError as exc:
        return {"refused": type(exc).__name__, "status": exc.status, "detail": exc.detail}
    return {"inner_task_id": sub.task_id, "inner": inner.data}


@agent.route("late.do")
def late(task_id: str, payload: dict[str, Any]) -> object:
    executed(task_id, "late.do")

    def report() -> None:
        time.sleep(0.2)
        agent.report_result(task_id, {"by": args.agent_id, "late": True})

    threading.Thread(target=report, daemon=True).start()
    return reach.ACCEPTED


agent.serve()
