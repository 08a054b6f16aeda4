"""A real agent process that answers 202 and reports progress before its result.

Each ``work.do`` task's payload says how: ``steps`` progress reports (``k/steps``,
message ``step k``), ``interval`` seconds apart, then the result ``{"steps": n}``.
With ``gate_after`` and ``gate`` (a file path) it stops after that many steps until the
file exists: a test can hold the task mid-way, disconnect a stream and let it go on.

Run as a process::

    python -m tests.support.progress_agent --port P --hub URL [--agent-id ID] [--tag T]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support import processes

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    import reach

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--agent-id", default="progress")
    parser.add_argument("--tag", default="progress")
    args = parser.parse_args()
    agent = reach.Agent(
        args.agent_id,
        addr=f"127.0.0.1:{args.port}",
        allow_loopback=True,
        tags=[args.tag],
        capabilities=[{"type": "work.do", "params_schema": {"type": "object"}}],
        heartbeat_interval=0.5,
        hub=args.hub,
    )

    def run(task_id: str, payload: dict[str, Any]) -> None:
        steps = int(payload.get("steps", 3))
        interval = float(payload.get("interval", 0.1))
        gate_after, gate = payload.get("gate_after"), payload.get("gate")
        for k in range(1, steps + 1):
            time.sleep(interval)
            agent.report_progress(task_id, k / steps, f"step {k}")
            if gate and k == gate_after:
                while not os.path.exists(gate):
                    time.sleep(0.05)
        time.sleep(interval)
        if payload.get("fail"):
            agent.report_result(task_id, None, code=9, message="asked to fail")
        else:
            agent.report_result(task_id, {"steps": steps, "by": args.agent_id})

    @agent.route("work.do")
    def work(task_id: str, payload: dict[str, Any]) -> object:
        threading.Thread(target=run, args=(task_id, payload), daemon=True).start()
        return reach.ACCEPTED

    agent.serve()


class ProgressAgentProcess:
    """This module as its own process."""

    def __init__(
        self, hub: str, log: Path, port: int, agent_id: str = "progress", tag: str = "progress"
    ) -> None:
        args = [sys.executable, "-m", "tests.support.progress_agent", "--port", str(port)]
        args += ["--hub", hub, "--agent-id", agent_id, "--tag", tag]
        with log.open("ab") as out:
            self.proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        processes.stop(self.proc)


if __name__ == "__main__":
    main()
