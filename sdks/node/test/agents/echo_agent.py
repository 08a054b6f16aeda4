"""A Python agent for the Node SDK's integration tests (run with the repo's venv).

``echo`` answers ``{"echo": payload, "by": agent_id}`` (its params_schema requires a
string ``text``); ``fail`` answers with business code 7; ``work.do`` answers 202 and
reports ``steps`` progress reports (``k/steps``) before its result
``{"steps": n, "by": agent_id}``; with ``gate`` (a file path) it holds after the first
progress report until that file exists.

    python test/agents/echo_agent.py --port P --hub URL --agent-id ID --tag T
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

import reach

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--agent-id", required=True)
parser.add_argument("--tag", action="append", default=[])
args = parser.parse_args()

agent = reach.Agent(
    args.agent_id,
    addr=f"127.0.0.1:{args.port}",
    allow_loopback=True,
    tags=args.tag,
    capabilities=[
        {
            "type": "echo",
            "params_schema": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
        {"type": "fail"},
        {"type": "work.do", "params_schema": {"type": "object"}},
    ],
    heartbeat_interval=0.5,
    hub=args.hub,
)


@agent.route("echo")
def echo(task_id: str, payload: dict[str, Any]) -> object:
    return {"echo": payload, "by": args.agent_id}


@agent.route("fail")
def fail(task_id: str, payload: dict[str, Any]) -> object:
    raise reach.BusinessError(7, "asked to fail")


def run(task_id: str, payload: dict[str, Any]) -> None:
    steps = int(payload.get("steps", 3))
    gate = payload.get("gate")
    for k in range(1, steps + 1):
        time.sleep(0.05)
        agent.report_progress(task_id, k / steps, f"step {k}")
        if gate and k == 1:
            while not os.path.exists(gate):
                time.sleep(0.05)
    time.sleep(0.05)
    agent.report_result(task_id, {"steps": steps, "by": args.agent_id})


@agent.route("work.do")
def work(task_id: str, payload: dict[str, Any]) -> object:
    threading.Thread(target=run, args=(task_id, payload), daemon=True).start()
    return reach.ACCEPTED


agent.serve()
