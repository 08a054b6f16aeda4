"""An SDK agent of ``async def`` handlers that take their time, for the hub's MCP endpoint.

* ``text.echo`` echoes ``text`` after ``delay`` seconds (1.5 by default): its
  ``params_schema`` requires ``text``, a string, and nothing else;
* ``work.steps`` reports ``steps`` progress fractions (``k/steps``, message ``step k``),
  ``interval`` seconds apart, then answers ``{"steps": n}``;
* ``text.fail`` always raises (a 5xx: the hub retries, then dead-letters);
* ``orders.cancel`` needs a human approval (``require_approval``);
* ``doc/summarise:v2`` answers at once: a capability type that is no valid MCP tool name.

Every handler run is one line ``method task_id`` in ``--journal``. ``--only`` declares
some of them (a failing agent leaves the routing pool: keep it apart). The agent key
comes from ``$REACH_API_KEY``. Run from the repository root::

    python -m tests.acceptance.agents.toolbox_agent --port P --hub URL --journal FILE
"""

from __future__ import annotations

import argparse
import asyncio
import threading
from pathlib import Path
from typing import Any

import reach

OBJECT = {"type": "object"}
CAPABILITIES: list[dict[str, Any]] = [
    {
        "type": "text.echo",
        "description": "Echo a text back, after a while.",
        "params_schema": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "delay": {"type": "number"}},
            "required": ["text"],
            "additionalProperties": False,
        },
    },
    {
        "type": "work.steps",
        "description": "Work in steps, reporting each.",
        "params_schema": OBJECT,
    },
    {"type": "text.fail", "description": "Always fails.", "params_schema": OBJECT},
    {"type": "orders.cancel", "require_approval": True, "params_schema": OBJECT},
    {"type": "doc/summarise:v2", "params_schema": OBJECT},
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--agent-id", default="toolbox")
    parser.add_argument("--only", nargs="*", default=None, help="capability types to declare")
    args = parser.parse_args()
    lock = threading.Lock()

    def journal(method: str, task_id: str) -> None:
        with lock, args.journal.open("a") as out:
            out.write(f"{method} {task_id}\n")

    agent = reach.Agent(
        args.agent_id,
        addr=f"127.0.0.1:{args.port}",
        allow_loopback=True,
        tags=["toolbox"],
        capabilities=[c for c in CAPABILITIES if args.only is None or c["type"] in args.only],
        heartbeat_interval=0.5,
        hub=args.hub,
    )

    @agent.route("text.echo")
    async def echo(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        journal("text.echo", task_id)
        await asyncio.sleep(float(payload.get("delay", 1.5)))
        return {"echo": payload["text"], "by": args.agent_id}

    @agent.route("work.steps")
    async def steps(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        journal("work.steps", task_id)
        n = int(payload.get("steps", 3))
        for k in range(1, n + 1):
            await asyncio.sleep(float(payload.get("interval", 0.3)))
            await asyncio.to_thread(agent.report_progress, task_id, k / n, f"step {k}")
        return {"steps": n}

    @agent.route("text.fail")
    async def fail(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        journal("text.fail", task_id)
        await asyncio.sleep(0.1)
        raise RuntimeError("the toolbox is broken")

    @agent.route("orders.cancel")
    async def cancel(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        journal("orders.cancel", task_id)
        return {"cancelled": payload.get("order")}

    @agent.route("doc/summarise:v2")
    async def summarise(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        journal("doc/summarise:v2", task_id)
        return {"summary": "short"}

    agent.serve()


if __name__ == "__main__":
    main()
