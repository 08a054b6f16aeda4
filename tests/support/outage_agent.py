"""An SDK agent with an outage switch: its handler fails (500) while a file exists.

Every handler execution is journaled as ``<unix time> <task_id>`` (fsynced), so a test
counts at the agent what the hub sent: a task's first line is its first request, every
later line a re-send. The SDK remembers no failed answer, so every re-send runs the
handler. While failing, the SDK's heartbeats report the consecutive failures (the
reachability rule that takes an instance out of routing past ``failure_threshold``).

Run as a process::

    python -m tests.support.outage_agent --port P --hub URL --journal FILE --down-file F
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from tests.support import processes

REPO = Path(__file__).resolve().parents[2]


def read_journal(path: Path) -> list[tuple[float, str]]:
    """(time, task_id) of every handler execution, in order."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out.append((float(parts[0]), parts[1]))
    return out


def split(entries: list[tuple[float, str]]) -> tuple[int, int]:
    """(first requests, re-sends) among journal entries."""
    seen: Counter[str] = Counter(task for _, task in entries)
    firsts = len(seen)
    return firsts, len(entries) - firsts


class OutageAgentProcess:
    """This module as its own process; ``down()`` / ``up()`` switch the outage."""

    def __init__(
        self,
        hub: str,
        home: Path,
        port: int,
        *,
        agent_id: str = "outage",
        instance_id: str | None = None,
        delay: float = 0.0,
        down: bool = True,
        max_concurrency: int = 64,
    ) -> None:
        self.journal = home / f"{agent_id}.journal"
        self.down_file = home / f"{agent_id}.down"
        if down:
            self.down()
        self.port = port
        self.args = [
            sys.executable, "-m", "tests.support.outage_agent", "--port", str(port),
            "--hub", hub, "--journal", str(self.journal), "--down-file", str(self.down_file),
            "--agent-id", agent_id, "--delay", str(delay),
            "--max-concurrency", str(max_concurrency),
            *(["--instance-id", instance_id] if instance_id else []),
        ]  # fmt: skip
        with self.journal.with_suffix(".out").open("ab") as out:
            self.proc = subprocess.Popen(self.args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def down(self) -> None:
        self.down_file.touch()

    def up(self) -> None:
        self.down_file.unlink(missing_ok=True)

    def entries(self) -> list[tuple[float, str]]:
        return read_journal(self.journal)

    def stop(self) -> None:
        processes.stop(self.proc)


def main() -> None:
    import reach

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--down-file", type=Path, required=True)
    parser.add_argument("--agent-id", default="outage")
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--max-concurrency", type=int, default=64)
    args = parser.parse_args()
    lock = threading.Lock()

    agent = reach.Agent(
        args.agent_id,
        addr=f"127.0.0.1:{args.port}",
        instance_id=args.instance_id,
        allow_loopback=True,
        capabilities=[{"type": "work.do", "params_schema": {"type": "object"}}],
        max_concurrency=args.max_concurrency,
        heartbeat_interval=0.5,
        hub=args.hub,
    )

    @agent.route("work.do")
    def work(task_id: str, payload: dict[str, object]) -> object:
        with lock, args.journal.open("a") as f:
            f.write(f"{time.time():.6f} {task_id}\n")
            f.flush()
            os.fsync(f.fileno())
        if args.delay:
            time.sleep(args.delay)
        if args.down_file.exists():
            raise RuntimeError("down for maintenance")
        return {"ok": True}

    agent.serve()


if __name__ == "__main__":
    main()
