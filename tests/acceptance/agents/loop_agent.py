"""A test agent whose handlers reach other agents, to show the hub stopping loops.

It authenticates with ``$REACH_API_KEY`` and appends one JSON line per handler run to
``--log`` (``task_id``, ``method``, and ``refused`` when the hub refused its inner reach),
so a test counts at the agent what arrived and what it was told.

* ``loop.bounce`` sends ``loop.bounce`` on to ``payload["to"]`` asking it to bounce back
  to this agent (A -> B -> A -> ...), awaiting the inner result or not (``await``);
  ``mode`` says how the inner reach is sent: ``sdk`` (``reach.send``, the trace the SDK
  carries), ``cleared`` (``reach.send`` in a fresh context: no trace at all), ``raw``
  (a hand-made HTTP POST without ``trace``) or ``forged`` (raw, with a made-up fresh
  trace) -- the last three drop the chain on purpose.
* ``chain.next`` sends ``chain.next`` to the first agent of ``payload["chain"]`` with the
  rest, awaiting it (A -> B -> C -> ...); the last one answers who it is.
* ``ping`` answers who it is.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import threading
import uuid
from typing import Any

import requests

import reach
from reach.errors import error_for_problem

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--hub", required=True)
parser.add_argument("--agent-id", required=True)
parser.add_argument("--log", required=True)
args = parser.parse_args()
ME = args.agent_id

agent = reach.Agent(
    ME,
    addr=f"127.0.0.1:{args.port}",
    allow_loopback=True,
    capabilities=[{"type": c} for c in ("loop.bounce", "chain.next", "ping")],
    tags=[f"tag-{ME}"],  # reached by tags too (the dependency alert counts those)
    heartbeat_interval=0.5,
    hub=args.hub,
)
lock = threading.Lock()


def record(task_id: str, method: str, **extra: Any) -> None:
    with lock, open(args.log, "a") as f:
        f.write(json.dumps({"task_id": task_id, "method": method, **extra}) + "\n")


def send(mode: str, to: str, method: str, payload: dict[str, Any]) -> str:
    """Send one inner reach the way ``mode`` says; its task id (raises the refusal)."""
    if mode == "sdk":
        return reach.send(agent_id=to, method=method, payload=payload).task_id
    if mode == "cleared":  # a context without the handler's trace
        sub = contextvars.Context().run(
            reach.send,
            agent_id=to,
            method=method,
            payload=payload,
            hub=args.hub,
            api_key=os.environ["REACH_API_KEY"],
        )
        return sub.task_id
    body: dict[str, Any] = {"agent_id": to, "method": method, "payload": payload}
    if mode == "forged":
        body["trace"] = {"root_id": f"forged-{uuid.uuid4().hex}", "hops": 0, "path": []}
    r = requests.post(
        f"{args.hub}/v1/tasks",
        json=body,
        headers={"Authorization": f"Bearer {os.environ['REACH_API_KEY']}"},
        timeout=10,
    )
    if r.status_code >= 400:
        raise error_for_problem(r.json(), r.status_code)
    return str(r.json()["task_id"])


def refusal(exc: reach.ReachError) -> dict[str, Any]:
    return {
        "kind": type(exc).__name__,
        "status": exc.status,
        "cycle": exc.extra.get("cycle"),
        "detail": exc.detail,
    }


@agent.route("loop.bounce")
def bounce(task_id: str, payload: dict[str, Any]) -> object:
    mode = payload.get("mode", "sdk")
    wait = bool(payload.get("await", True))
    onward = {"to": ME, "mode": mode, "await": wait}
    try:
        inner = send(mode, payload["to"], "loop.bounce", onward)
        result = reach.wait_for_result(inner, timeout=30).data if wait else None
    except reach.ReachError as exc:
        record(task_id, "loop.bounce", refused=refusal(exc))
        return {"by": ME, "refused": refusal(exc)}
    record(task_id, "loop.bounce", inner=inner)
    return {"by": ME, "inner_task_id": inner, "inner": result}


@agent.route("chain.next")
def chain(task_id: str, payload: dict[str, Any]) -> object:
    rest = list(payload.get("chain") or [])
    if not rest:
        record(task_id, "chain.next")
        return {"end": ME}
    mode = payload.get("mode", "sdk")
    try:
        inner = send(mode, rest[0], "chain.next", {"chain": rest[1:], "mode": mode})
        result = reach.wait_for_result(inner, timeout=30).data
    except reach.ReachError as exc:
        record(task_id, "chain.next", refused=refusal(exc))
        return {"by": ME, "refused": refusal(exc)}
    record(task_id, "chain.next", inner=inner)
    return {"by": ME, "inner": result}


@agent.route("ping")
def ping(task_id: str, payload: dict[str, Any]) -> object:
    record(task_id, "ping")
    return {"by": ME}


agent.serve()
