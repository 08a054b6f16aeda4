"""A LangGraph agent behind Agent-Reach: triage a support ticket with a small graph.

    python examples/agents/langgraph_agent.py --port 7110 [--hub http://127.0.0.1:8800]
    # or, the way LangGraph services usually run, under uvicorn:
    REACH_AGENT_ADDR=127.0.0.1:7110 uvicorn --factory --app-dir examples/agents \\
        langgraph_agent:create_app --port 7110

Then ``reach.send(capability="ticket.triage", method="ticket.triage",
payload={"text": "I was charged twice, refund please"})`` answers
``{"category": "billing", "urgency": "normal", "team": "billing", "path": [...]}``.

The graph is deterministic (keywords, no model calls): ``classify`` reads the text and a
conditional edge routes it to one of three team nodes. The agent is served by
``agent.asgi_app()``, whose lifespan registers with the hub at start-up, heartbeats, and
deregisters on shutdown. To add it to an existing FastAPI service instead::

    reach_app = agent.asgi_app()       # agent built with addr="http://host:port/reach"
    api = FastAPI(lifespan=reach_app.lifespan)
    api.mount("/reach", reach_app)

Needs ``pip install 'agent-reach[examples]'`` (langgraph and uvicorn).
"""

from __future__ import annotations

import argparse
import logging
import operator
import os
import re
from typing import Annotated, Any, TypedDict

import uvicorn
from langgraph.graph import END, START, StateGraph

import reach

AGENT_ID = "ticket-triage-01"
CATEGORIES = {
    "billing": ("charge", "charged", "invoice", "refund", "payment", "bill"),
    "technical": ("error", "crash", "bug", "down", "outage", "timeout", "login"),
}
URGENT = ("urgent", "asap", "down", "outage", "immediately")


class Ticket(TypedDict, total=False):
    text: str
    category: str
    urgency: str
    team: str
    path: Annotated[list[str], operator.add]  # every node appends its name


def classify(ticket: Ticket) -> dict[str, Any]:
    words = set(re.findall(r"[a-z]+", ticket["text"].lower()))
    category = next((c for c, keys in CATEGORIES.items() if words & set(keys)), "general")
    urgency = "high" if words & set(URGENT) else "normal"
    return {"category": category, "urgency": urgency, "path": ["classify"]}


def billing(ticket: Ticket) -> dict[str, Any]:
    return {"team": "billing", "path": ["billing"]}


def technical(ticket: Ticket) -> dict[str, Any]:
    team = "on-call" if ticket["urgency"] == "high" else "support"
    return {"team": team, "path": ["technical"]}


def general(ticket: Ticket) -> dict[str, Any]:
    return {"team": "front-desk", "path": ["general"]}


def build_graph() -> Any:
    graph = StateGraph(Ticket)
    graph.add_node("classify", classify)
    graph.add_node("billing", billing)
    graph.add_node("technical", technical)
    graph.add_node("general", general)
    graph.add_edge(START, "classify")
    graph.add_conditional_edges(
        "classify",
        lambda ticket: ticket["category"],
        {"billing": "billing", "technical": "technical", "general": "general"},
    )
    for node in ("billing", "technical", "general"):
        graph.add_edge(node, END)
    return graph.compile()


def build_agent(addr: str, hub: str | None, heartbeat_interval: float) -> reach.Agent:
    agent = reach.Agent(
        agent_id=AGENT_ID,
        tags=["demo", "support", "langgraph"],
        addr=addr,
        allow_loopback=True,  # the demo hub runs on this machine
        capabilities=[
            {
                "type": "ticket.triage",
                "description": "Classify a support ticket and route it to a team.",
                "examples": [
                    "triage this support ticket",
                    "which team should handle this complaint",
                    "classify a customer request as billing or technical",
                    "how urgent is this support issue",
                ],
                "params_schema": {
                    "type": "object",
                    "properties": {"text": {"type": "string", "minLength": 1}},
                    "required": ["text"],
                },
                "return_schema": {
                    "type": "object",
                    "properties": {
                        "category": {"enum": ["billing", "technical", "general"]},
                        "urgency": {"enum": ["high", "normal"]},
                        "team": {"type": "string"},
                        "path": {"type": "array", "items": {"type": "string"}},
                    },
                    "required": ["category", "urgency", "team", "path"],
                },
                "estimated_latency": 20,
            }
        ],
        heartbeat_interval=heartbeat_interval,
        hub=hub,
    )
    graph = build_graph()

    @agent.route("ticket.triage")
    def triage(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        state = graph.invoke({"text": str(payload["text"])})
        return {k: state[k] for k in ("category", "urgency", "team", "path")}

    return agent


def create_app() -> Any:
    """The ASGI app, for ``uvicorn --factory``; the address and hub come from the env."""
    addr = os.environ.get("REACH_AGENT_ADDR", "127.0.0.1:7110")
    return build_agent(addr, None, 10.0).asgi_app()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=7110)
    parser.add_argument("--hub", default=None, help="hub URL (default $REACH_HUB_URL)")
    parser.add_argument("--heartbeat-interval", type=float, default=10.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    agent = build_agent(f"127.0.0.1:{args.port}", args.hub, args.heartbeat_interval)
    uvicorn.run(agent.asgi_app(), host="127.0.0.1", port=args.port, log_level="info")


if __name__ == "__main__":
    main()
