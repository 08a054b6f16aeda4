"""Demo agent: explains a region's sales trend (here: from the first and last month) — run
by `reach up`.

python examples/agents/knowledge_agent.py --port 7104 [--hub http://127.0.0.1:8800]

The middle of dags/sales_analysis_flow.json (no angle) and dags/diamond_review.json (the
"pricing" and "supply" reviews). The supply review of "west" answers business error 503,
so the diamond's failure branch (escalate) can be shown.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import reach

ANGLES = {
    None: "Overall",
    "pricing": "Pricing",
    "supply": "Supply",
}
CAUSES = {
    (None, "up"): "demand grew steadily across the period",
    (None, "down"): "demand weakened month after month",
    (None, "flat"): "demand held steady",
    ("pricing", "up"): "the spring price increase stuck without losing volume",
    ("pricing", "down"): "discounting by competitors pulled customers away",
    ("pricing", "flat"): "prices were unchanged, and so were volumes",
    ("supply", "up"): "shorter lead times let stores stay in stock",
    ("supply", "down"): "stock-outs at the regional warehouse cost sales",
    ("supply", "flat"): "deliveries kept pace with demand",
}


def explain(region: str, rows: list[dict[str, Any]], total: float, angle: str | None) -> str:
    first, last = float(rows[0]["revenue"]), float(rows[-1]["revenue"])
    change = (last - first) / first * 100 if first else 0.0
    trend = "up" if change > 1 else "down" if change < -1 else "flat"
    moved = {"up": "rose", "down": "fell", "flat": "held"}[trend]
    return (
        f"{ANGLES[angle]} view of {region}: revenue {moved} {abs(change):.1f}% from "
        f"{rows[0]['month']} to {rows[-1]['month']} ({total:,.0f} in all); "
        f"likely cause: {CAUSES[(angle, trend)]}."
    )


def build_agent(port: int, hub: str | None, heartbeat_interval: float) -> reach.Agent:
    agent = reach.Agent(
        agent_id="knowledge-agent-01",
        tags=["demo", "knowledge"],
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,  # the demo hub runs on this machine
        capabilities=[
            {
                "type": "knowledge.explain",
                "description": (
                    "Explain what drove a region's sales, optionally from a pricing or supply "
                    "angle."
                ),
                "examples": [
                    "why did sales drop in the north",
                    "explain the revenue trend of a region",
                    "what caused the sales increase",
                    "is pricing behind the decline",
                    "why is revenue falling",
                    "did supply problems hurt sales",
                ],
                "params_schema": {
                    "type": "object",
                    "properties": {
                        "region": {"type": "string", "minLength": 1, "maxLength": 100},
                        "rows": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "month": {"type": "string"},
                                    "revenue": {"type": "number"},
                                },
                                "required": ["month", "revenue"],
                            },
                        },
                        "total": {"type": "number"},
                        "angle": {"type": "string", "enum": ["pricing", "supply"]},
                    },
                    "required": ["region", "rows", "total"],
                    "additionalProperties": False,
                },
                "return_schema": {
                    "type": "object",
                    "properties": {"explanation": {"type": "string"}},
                    "required": ["explanation"],
                },
                "estimated_latency": 50,
            }
        ],
        max_concurrency=8,
        heartbeat_interval=heartbeat_interval,
        hub=hub,
    )

    @agent.route("knowledge.explain")
    def explain_sales(task_id: str, payload: dict) -> dict:
        region, angle = str(payload["region"]), payload.get("angle")
        if angle == "supply" and region == "west":
            raise reach.BusinessError(503, "supply data unavailable")
        return {"explanation": explain(region, payload["rows"], payload["total"], angle)}

    return agent


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=7104)
    parser.add_argument("--hub", default=None)
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    build_agent(args.port, args.hub, args.heartbeat_interval).serve()
