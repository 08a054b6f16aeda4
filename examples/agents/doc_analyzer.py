"""Demo agent: analyses a document (here: counts its words) — run by `reach up`.

python examples/agents/doc_analyzer.py --port 7101 [--hub http://127.0.0.1:8800]
"""

from __future__ import annotations

import argparse
import logging

import reach


def build_agent(port: int, hub: str | None, heartbeat_interval: float) -> reach.Agent:
    agent = reach.Agent(
        agent_id="doc-analyzer-01",
        tags=["doc", "demo"],
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,  # the demo hub runs on this machine
        capabilities=[
            {
                "type": "task.process",
                "description": (
                    "Analyse a document and return simple statistics about it, such as its "
                    "word count."
                ),
                "examples": [
                    "analyse this document",
                    "how many words are in this text",
                    "count the words of a file",
                    "give me statistics about a document",
                    "inspect a document and report its length",
                ],
                "params_schema": {
                    "type": "object",
                    "properties": {"doc_id": {"type": "string"}, "text": {"type": "string"}},
                    "required": ["doc_id"],
                },
                "estimated_latency": 50,
            }
        ],
        max_concurrency=8,
        heartbeat_interval=heartbeat_interval,
        hub=hub,
    )

    @agent.route("task.process")
    def process(task_id: str, payload: dict) -> dict:
        text = str(payload.get("text", ""))
        return {"doc_id": payload["doc_id"], "words": len(text.split()), "task_id": task_id}

    return agent


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=7101)
    parser.add_argument("--hub", default=None)
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    build_agent(args.port, args.hub, args.heartbeat_interval).serve()
