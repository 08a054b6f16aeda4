"""An agent that stops heartbeating after a while but keeps serving on its port."""

from __future__ import annotations

import argparse
import threading

import reach

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--quiet-after", type=float, default=1.0)
args = parser.parse_args()

agent = reach.Agent(
    "quiet-agent",
    addr=f"127.0.0.1:{args.port}",
    allow_loopback=True,
    capabilities=[{"type": "work.echo"}],
    heartbeat_interval=0.3,
    hub=args.hub,
)
agent.route("work.echo")(lambda task_id, payload: payload)
agent.start()
threading.Timer(args.quiet_after, agent.stop_heartbeat).start()
threading.Event().wait()
