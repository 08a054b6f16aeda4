"""A raw HTTP agent with one dangerous capability, counting every delivery the hub makes.

``orders.cancel`` is declared ``danger_level: high``, so the hub parks each task for a
human; ``work.do`` is harmless. Serving is `tests.support.counting_agent`'s (below any
dedup guard; ``GET /counts``); ``reach.Agent`` only registers and heartbeats, with the
agent key in ``$REACH_API_KEY``. Run from the repository root::

    python -m tests.acceptance.agents.danger_agent --port P --hub URL --journal FILE
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import reach
from tests.support.counting_agent import Journal, make_server

CAPABILITIES = [
    {"type": "orders.cancel", "danger_level": "high", "params_schema": {"type": "object"}},
    {"type": "work.do", "params_schema": {"type": "object"}},
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--agent-id", default="shop")
    args = parser.parse_args()

    server = make_server(args.port, Journal(args.journal))
    agent = reach.Agent(
        args.agent_id,
        addr=f"127.0.0.1:{args.port}",
        allow_loopback=True,
        capabilities=CAPABILITIES,
        heartbeat_interval=0.5,
        hub=args.hub,
    )
    while True:  # the hub may come up after us
        try:
            agent.register()
            break
        except reach.HubUnavailable:
            time.sleep(0.2)
    agent.start_heartbeat()
    server.serve_forever()


if __name__ == "__main__":
    main()
