"""An agent whose handlers block until released: its heartbeats must keep flowing."""

from __future__ import annotations

import argparse
import threading

import reach

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--max-concurrency", type=int, default=2)
args = parser.parse_args()

release = threading.Event()
agent = reach.Agent(
    "stuck-agent",
    addr=f"127.0.0.1:{args.port}",
    allow_loopback=True,
    capabilities=[{"type": "work.block"}],
    max_concurrency=args.max_concurrency,
    heartbeat_interval=0.3,
    hub=args.hub,
    verify_tokens=False,  # the test posts to it directly: it is about heartbeats, not tokens
)


@agent.route("work.block")
def block(task_id: str, payload: dict) -> dict:
    release.wait()  # never set: the worker is stuck for good
    return {}


agent.serve()
