"""A test agent that authenticates with the API key in ``$REACH_API_KEY`` (the SDK default)
and logs everything at DEBUG to stdout, so a test can show that no key leaks into logs.

``work.do`` records the task and echoes its payload; ``forward.do`` sends the payload on
to ``payload["to"]`` from inside the handler -- with no ``api_key=`` argument, so the
agent's own key is the one used -- and returns that result.
"""

from __future__ import annotations

import argparse
import logging
import sys

import reach

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--agent-id", required=True)
parser.add_argument("--log", required=True, help="one line per handler execution")
parser.add_argument("--heartbeat-interval", type=float, default=0.5)
args = parser.parse_args()

logging.basicConfig(
    level=logging.DEBUG, stream=sys.stdout, format="%(asctime)s %(name)s %(levelname)s %(message)s"
)

agent = reach.Agent(
    args.agent_id,
    addr=f"127.0.0.1:{args.port}",
    allow_loopback=True,
    capabilities=[{"type": "work.do"}, {"type": "forward.do"}],
    heartbeat_interval=args.heartbeat_interval,
    hub=args.hub,
)


def executed(task_id: str) -> None:
    with open(args.log, "a") as f:
        f.write(f"{task_id}\n")


@agent.route("work.do")
def work(task_id: str, payload: dict) -> object:
    executed(task_id)
    return {"echo": payload, "by": args.agent_id}


@agent.route("forward.do")
def forward(task_id: str, payload: dict) -> object:
    executed(task_id)
    sub = reach.send(agent_id=payload["to"], method="work.do", payload={"from": task_id})
    inner = reach.wait_for_result(sub.task_id, timeout=30)
    return {"inner_task_id": sub.task_id, "inner": inner.data}


agent.serve()
