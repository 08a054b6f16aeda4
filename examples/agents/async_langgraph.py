"""An async LangGraph flow that reaches another agent through the hub with ``reach.aio``.

Two processes, against a running hub (``reach up``, or ``--hub URL``)::

    # the agent it reaches: a plain ``def`` handler on the SDK's own server
    python examples/agents/async_langgraph.py --serve-helper --port 7120 [--hub URL]
    # the graph, run once per ticket (all at once, on one event loop); JSON lines out
    python examples/agents/async_langgraph.py [--hub URL] "Where is my order A-1001?" "Hi!"

or both in one process: ``--start-helper 7120`` starts the helper agent in this process
for the run and stops it after.

The graph answers a support ticket: ``read`` finds an order number in the text; when there
is one, ``lookup`` -- an ``async def`` node -- asks whichever agent offers ``order.lookup``
through the hub (``await reach.aio.send(...)``, then ``await reach.aio.wait_for_result(...)``)
and ``reply`` writes the answer from what came back. Awaiting the hub holds no thread: many
tickets wait at once on one loop. A typed error comes back typed: an unknown order is the
helper's ``BusinessError``, answered as such. Deterministic: no model calls.

Each ticket's line: ``{"ticket", "order_id", "order", "reach": {"task_id", "agent_id"},
"reply", "path"}``; the reach's ``task_id`` is the hub's record of it
(``GET {hub}/v1/tasks/{task_id}``). Needs ``pip install 'agent-reach[examples]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import operator
import re
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

import reach
import reach.aio

HELPER_ID = "order-desk-01"
CAPABILITY = "order.lookup"
ORDER_ID = re.compile(r"\b[A-Z]-\d{4}\b")
ORDERS = {  # the helper's little database
    "A-1001": {"status": "shipped", "carrier": "DHL", "eta_days": 2},
    "A-1002": {"status": "packing", "eta_days": 4},
    "B-2001": {"status": "delivered"},
}


# -- the helper: a plain SDK agent ---------------------------------------------------------
def build_helper(port: int, hub: str | None, heartbeat_interval: float = 5.0) -> reach.Agent:
    agent = reach.Agent(
        HELPER_ID,
        tags=["demo", "support"],
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,  # the demo hub runs on this machine
        capabilities=[
            {
                "type": CAPABILITY,
                "description": "Look up an order's shipping status by its number.",
                "params_schema": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string", "pattern": ORDER_ID.pattern}},
                    "required": ["order_id"],
                },
            }
        ],
        heartbeat_interval=heartbeat_interval,
        hub=hub,
    )

    @agent.route(CAPABILITY)
    def lookup(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        order_id = str(payload["order_id"])
        if order_id not in ORDERS:
            raise reach.BusinessError(404, f"no order {order_id}")
        return {"order_id": order_id, **ORDERS[order_id]}

    return agent


# -- the graph -----------------------------------------------------------------------------
class Ticket(TypedDict, total=False):
    text: str
    order_id: str | None
    order: dict[str, Any] | None
    reach: dict[str, Any] | None
    reply: str
    path: Annotated[list[str], operator.add]  # every node appends its name


def build_graph(hub: str | None) -> Any:
    async def read(ticket: Ticket) -> dict[str, Any]:
        found = ORDER_ID.search(ticket["text"])
        return {"order_id": found.group(0) if found else None, "path": ["read"]}

    async def lookup(ticket: Ticket) -> dict[str, Any]:
        sub = await reach.aio.send(
            capability=CAPABILITY,
            method=CAPABILITY,
            payload={"order_id": ticket["order_id"]},
            hub=hub,
        )
        try:
            result = await reach.aio.wait_for_result(sub.task_id, timeout=30, hub=hub)
            order, by = result.data, result.agent_id
        except reach.BusinessError as exc:  # the helper said no: an answer, not a crash
            order = {"order_id": ticket["order_id"], "status": "unknown", "detail": exc.message}
            by = None
        return {
            "order": order,
            "reach": {"task_id": sub.task_id, "agent_id": by},
            "path": ["lookup"],
        }

    async def reply(ticket: Ticket) -> dict[str, Any]:
        order = ticket.get("order")
        if order is None:
            text = "Thanks for writing! Which order is it about (a number like A-1234)?"
        elif order["status"] == "unknown":
            text = f"We could not find order {order['order_id']}: please check the number."
        elif "eta_days" in order:
            text = (
                f"Order {order['order_id']} is {order['status']}: "
                f"expect it in {order['eta_days']} days."
            )
        else:
            text = f"Order {order['order_id']} is {order['status']}."
        return {"reply": text, "path": ["reply"]}

    graph = StateGraph(Ticket)
    graph.add_node("read", read)
    graph.add_node("lookup", lookup)
    graph.add_node("reply", reply)
    graph.add_edge(START, "read")
    graph.add_conditional_edges(
        "read", lambda t: "lookup" if t["order_id"] else "reply", ["lookup", "reply"]
    )
    graph.add_edge("lookup", "reply")
    graph.add_edge("reply", END)
    return graph.compile()


async def answer_all(texts: list[str], hub: str | None) -> list[dict[str, Any]]:
    """Run the graph once per ticket, all at once on this loop."""
    graph = build_graph(hub)
    states = await asyncio.gather(*(graph.ainvoke({"text": text}) for text in texts))
    return [
        {
            "ticket": state["text"],
            "order_id": state["order_id"],
            "order": state.get("order"),
            "reach": state.get("reach"),
            "reply": state["reply"],
            "path": state["path"],
        }
        for state in states
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tickets", nargs="*", help="ticket texts, one graph run each")
    parser.add_argument("--hub", default=None, help="hub URL (default $REACH_HUB_URL)")
    parser.add_argument("--serve-helper", action="store_true", help="be the helper agent")
    parser.add_argument("--port", type=int, default=7120, help="the helper's port")
    parser.add_argument("--start-helper", type=int, metavar="PORT", help="run it here too")
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if args.serve_helper:
        build_helper(args.port, args.hub, args.heartbeat_interval).serve()  # until SIGTERM
        return
    if not args.tickets:
        parser.error("give at least one ticket text (or --serve-helper)")
    helper = None
    if args.start_helper:
        helper = build_helper(args.start_helper, args.hub, args.heartbeat_interval)
        helper.start()
    try:
        for line in asyncio.run(answer_all(args.tickets, args.hub)):
            print(json.dumps(line), flush=True)
    finally:
        if helper is not None:
            helper.close()


if __name__ == "__main__":
    main()
