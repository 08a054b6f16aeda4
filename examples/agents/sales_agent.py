"""Demo agent: a region's monthly sales (deterministic fake figures) — run by `reach up`.

python examples/agents/sales_agent.py --port 7103 [--hub http://127.0.0.1:8800]

The first node of dags/sales_analysis_flow.json and dags/diamond_review.json. The figures
are computed from the region's name, so every run shows the same numbers. A region the
schema does not list ("nowhere") is refused by the hub before it is queued; "south" is a
known region without data and answers business error 404, so a DAG run can show the
failure path.

``orders.cancel`` and ``orders.refund`` are the demo's dangerous capabilities
(``danger_level: high``): the hub parks each such task in ``awaiting_approval`` until a
human approves it (``reach approvals approve ID``); only then is it delivered here.

Every capability has a description and examples, so a caller may also ask in words:
``reach.send(intent="refund a damaged order", payload={"order_id": "o-1"})`` is matched
to ``orders.refund`` (semantic matching, ``pip install 'agent-reach[semantic]'``).
"""

from __future__ import annotations

import argparse
import logging
import zlib
from typing import Any

import reach

REGIONS = ["east", "west", "north", "south"]
MONTHS = ("2024-01", "2024-02", "2024-03", "2024-04", "2024-05", "2024-06")


def sales_figures(region: str) -> dict[str, Any]:
    """Six months of revenue and their total, the same for a region on every run and machine
    (crc32, unlike ``hash()``, is not salted per process)."""
    seed = zlib.crc32(region.encode())
    base = 10_000 + seed % 40_000
    growth = seed % 11 - 5  # -5 … +5 percent a month
    revenues = [base * (100 + growth * i) // 100 for i in range(len(MONTHS))]
    rows = [{"month": m, "revenue": r} for m, r in zip(MONTHS, revenues, strict=True)]
    return {"rows": rows, "total": sum(revenues)}


def build_agent(port: int, hub: str | None, heartbeat_interval: float) -> reach.Agent:
    agent = reach.Agent(
        agent_id="sales-agent-01",
        tags=["demo", "sales"],
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,  # the demo hub runs on this machine
        capabilities=[
            {
                "type": "sales.fetch",
                "description": "Monthly revenue rows and their total for one region.",
                "examples": [
                    "sales figures for the east region",
                    "how much revenue did the west make",
                    "monthly revenue for a region",
                    "get the sales numbers for the south",
                    "show me the revenue by month",
                ],
                "params_schema": {
                    "type": "object",
                    "properties": {"region": {"type": "string", "enum": REGIONS}},
                    "required": ["region"],
                    "additionalProperties": False,
                },
                "return_schema": {
                    "type": "object",
                    "properties": {
                        "rows": {
                            "type": "array",
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
                    },
                    "required": ["rows", "total"],
                },
                "estimated_latency": 20,
            },
            {
                "type": "orders.cancel",
                "description": "Cancel a customer order (irreversible: a human approves it).",
                "examples": [
                    "cancel my order",
                    "the customer wants to cancel order 1234",
                    "stop this order before it ships",
                    "call off a purchase",
                ],
                "danger_level": "high",
                "params_schema": {
                    "type": "object",
                    "properties": {
                        "order_id": {"type": "string", "minLength": 1, "maxLength": 64},
                        "reason": {"type": "string", "maxLength": 500},
                    },
                    "required": ["order_id"],
                    "additionalProperties": False,
                },
                "return_schema": {
                    "type": "object",
                    "properties": {
                        "order_id": {"type": "string"},
                        "status": {"type": "string"},
                    },
                    "required": ["order_id", "status"],
                },
                "estimated_latency": 20,
            },
            {
                "type": "orders.refund",
                "description": (
                    "Refund a customer order in full or in part (money leaves the company: "
                    "a human approves it)."
                ),
                "examples": [
                    "refund a damaged order",
                    "give the customer their money back",
                    "the item arrived broken, reimburse the buyer",
                    "issue a partial refund",
                    "pay a customer back for a faulty product",
                ],
                "danger_level": "high",
                "params_schema": {
                    "type": "object",
                    "properties": {
                        "order_id": {"type": "string", "minLength": 1, "maxLength": 64},
                        "amount": {"type": "number", "exclusiveMinimum": 0},
                        "reason": {"type": "string", "maxLength": 500},
                    },
                    "required": ["order_id"],
                    "additionalProperties": False,
                },
                "return_schema": {
                    "type": "object",
                    "properties": {
                        "order_id": {"type": "string"},
                        "status": {"type": "string"},
                        "amount": {"type": ["number", "null"]},
                    },
                    "required": ["order_id", "status"],
                },
                "estimated_latency": 20,
            },
        ],
        max_concurrency=8,
        heartbeat_interval=heartbeat_interval,
        hub=hub,
    )

    @agent.route("sales.fetch")
    def fetch(task_id: str, payload: dict) -> dict:
        region = str(payload["region"])
        if region == "south":
            raise reach.BusinessError(404, "no sales data for south")
        return sales_figures(region)

    @agent.route("orders.cancel")
    def cancel(task_id: str, payload: dict) -> dict:
        # reached only once a human approved this very payload (the hub binds the two)
        logging.getLogger("sales-agent").info("cancelling order %s", payload["order_id"])
        return {"order_id": payload["order_id"], "status": "cancelled"}

    @agent.route("orders.refund")
    def refund(task_id: str, payload: dict) -> dict:
        # like a cancel: reached only once a human approved this very payload
        amount = payload.get("amount")
        log = logging.getLogger("sales-agent")
        log.info("refunding order %s (amount %s)", payload["order_id"], amount)
        return {"order_id": payload["order_id"], "status": "refunded", "amount": amount}

    return agent


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=7103)
    parser.add_argument("--hub", default=None)
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    build_agent(args.port, args.hub, args.heartbeat_interval).serve()
