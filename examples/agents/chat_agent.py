"""Demo agent: composes the reply for the user from figures, explanations or an error — run
by `reach up`.

python examples/agents/chat_agent.py --port 7105 [--hub http://127.0.0.1:8800]

The last node of dags/sales_analysis_flow.json (compose_reply) and dags/diamond_review.json
(merge, and the failure branch escalate, which passes the failed review's error).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import reach

TONES = ["concise", "detailed", "escalation"]


def compose(payload: dict[str, Any]) -> str:
    region, tone = str(payload["region"]), str(payload["tone"])
    if "error" in payload or tone == "escalation":
        error: dict[str, Any] = payload.get("error") or {}
        detail = str(error.get("message") or "no details")
        if error.get("code") is not None:
            detail += f", code {error['code']}"
        return f"Needs a human: the analysis of {region} did not complete ({detail})."
    if "total" in payload:
        headline = f"{region.capitalize()}: total revenue {payload['total']:,.0f}."
    else:
        headline = f"{region.capitalize()}: no figures available."
    explanations = [str(e) for e in payload.get("explanations", [])]
    if tone == "concise":
        return " ".join([headline, *explanations])
    return "\n".join([headline, *(f"- {e}" for e in explanations)])


def build_agent(port: int, hub: str | None, heartbeat_interval: float) -> reach.Agent:
    agent = reach.Agent(
        agent_id="chat-agent-01",
        tags=["demo", "chat"],
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,  # the demo hub runs on this machine
        capabilities=[
            {
                "type": "chat.compose",
                "description": (
                    "Write the answer for the user from figures and explanations, or an "
                    "escalation note."
                ),
                "examples": [
                    "write a reply to the customer",
                    "compose a short answer for the user",
                    "draft an escalation note for a human",
                    "turn these figures into a message for the user",
                    "word the final answer",
                ],
                "params_schema": {
                    "type": "object",
                    "properties": {
                        "tone": {"type": "string", "enum": TONES},
                        "region": {"type": "string", "minLength": 1, "maxLength": 100},
                        "total": {"type": "number"},
                        "explanations": {
                            "type": "array",
                            "items": {"type": "string", "maxLength": 10000},
                            "maxItems": 20,
                        },
                        "error": {"type": "object"},
                    },
                    "required": ["tone", "region"],
                    "additionalProperties": False,
                },
                "return_schema": {
                    "type": "object",
                    "properties": {"reply": {"type": "string"}},
                    "required": ["reply"],
                },
                "estimated_latency": 20,
            }
        ],
        max_concurrency=8,
        heartbeat_interval=heartbeat_interval,
        hub=hub,
    )

    @agent.route("chat.compose")
    def compose_reply(task_id: str, payload: dict) -> dict:
        return {"reply": compose(payload)}

    return agent


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=7105)
    parser.add_argument("--hub", default=None)
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    build_agent(args.port, args.hub, args.heartbeat_interval).serve()
