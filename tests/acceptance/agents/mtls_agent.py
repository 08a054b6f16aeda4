"""A test agent served over mutual TLS (``tls=reach.TLSConfig``) that records every run.

``--scheme http`` registers it at an http:// address and serves plain HTTP (no TLS), as
an agent the admin marks L1 by mistake would.
"""

from __future__ import annotations

import argparse
import os

import reach

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--agent-id", required=True)
parser.add_argument("--log", required=True)
parser.add_argument("--scheme", default="https", choices=["https", "http"])
parser.add_argument("--cert")
parser.add_argument("--key")
parser.add_argument("--ca")
args = parser.parse_args()

tls = reach.TLSConfig(cert=args.cert, key=args.key, ca=args.ca) if args.scheme == "https" else None
agent = reach.Agent(
    args.agent_id,
    addr=f"{args.scheme}://127.0.0.1:{args.port}",
    allow_loopback=True,
    capabilities=[{"type": "pay.do", "params_schema": {"type": "object"}}],
    heartbeat_interval=0.5,
    hub=args.hub,
    tls=tls,
)


@agent.route("pay.do")
def pay(task_id: str, payload: dict) -> object:
    with open(args.log, "a") as f:
        f.write(f"{task_id} {os.getpid()}\n")
    return {"paid": payload, "over": args.scheme}


agent.serve()
