"""Demo agent: summarises text (here: its first sentence) — run by `reach up`.

python examples/agents/summarizer.py --port 7102 [--hub http://127.0.0.1:8800]
"""

from __future__ import annotations

import argparse
import logging

import reach


def build_agent(port: int, hub: str | None, heartbeat_interval: float) -> reach.Agent:
    agent = reach.Agent(
        agent_id="summarizer-01",
        tags=["text", "demo"],
        addr=f"127.0.0.1:{port}",
        allow_loopback=True,  # the demo hub runs on this machine
        capabilities=[
            {
                "type": "text.summarize",
                "description": "Summarise a text: its gist in one sentence.",
                "examples": [
                    "summarise this article",
                    "give me the gist of this text",
                    "shorten this long text to one sentence",
                    "tl;dr of this report",
                    "what is this text about, briefly",
                ],
                "params_schema": {
                    "type": "object",
                    "properties": {"text": {"type": "string", "maxLength": 100000}},
                    "required": ["text"],
                },
                "return_schema": {
                    "type": "object",
                    "properties": {"summary": {"type": "string"}},
                },
                "estimated_latency": 20,
            }
        ],
        max_concurrency=4,
        heartbeat_interval=heartbeat_interval,
        hub=hub,
    )

    @agent.route("text.summarize")
    def summarize(task_id: str, payload: dict) -> dict:
        text = str(payload["text"]).strip()
        if not text:
            raise reach.BusinessError(7, "nothing to summarise")
        return {"summary": text.split(". ")[0]}

    return agent


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=7102)
    parser.add_argument("--hub", default=None)
    parser.add_argument("--heartbeat-interval", type=float, default=5.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    build_agent(args.port, args.hub, args.heartbeat_interval).serve()
