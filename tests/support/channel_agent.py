"""A channel agent (``reach.Agent(channel=True)``) as its own process, journaling what it saw.

It serves no port: every delivery comes over the WebSocket it opened to the hub. Each
delivery that reaches the SDK is journaled as ``deliver <task_id> <attempt_seq>`` and each
run of the handler as ``run <task_id>``, flushed at once (so a killed process's journal
still tells), which is how the tests count executions at the agent.

    python -m tests.support.channel_agent --hub URL --journal FILE [--delay S]
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import reach

_lock = threading.Lock()


def journal(path: Path, line: str) -> None:
    with _lock, path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_journal(path: Path) -> tuple[Counter[str], Counter[str]]:
    """(deliveries per task, handler runs per task)."""
    deliveries: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "deliver":
                deliveries[parts[1]] += 1
            elif len(parts) >= 2 and parts[0] == "run":
                runs[parts[1]] += 1
    return deliveries, runs


class JournalingAgent(reach.Agent):
    journal_path: Path

    def invoke(self, method: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        journal(self.journal_path, f"deliver {body.get('task_id')} {body.get('attempt_seq')}")
        return super().invoke(method, body)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hub", required=True)
    parser.add_argument("--agent-id", default="natted")
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--journal", required=True, type=Path)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--heartbeat-interval", type=float, default=0.5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    agent = JournalingAgent(
        args.agent_id,
        tags=["nat"],
        hub=args.hub,
        heartbeat_interval=args.heartbeat_interval,
        instance_id=args.instance_id,
    )
    agent.journal_path = args.journal

    @agent.route("task.process")
    def process(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        journal(args.journal, f"run {task_id}")
        time.sleep(float(payload.get("sleep", args.delay)))
        return {"echo": payload, "pid": os.getpid()}

    agent.serve()


if __name__ == "__main__":
    main()
