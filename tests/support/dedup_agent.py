"""An SDK agent whose handler writes a side effect to a file; killable after it answered.

Every delivery that reaches the agent over HTTP is journaled before the SDK's dedup guard
sees it (``delivery <task_id> <attempt_seq>``), every handler run after its side effect
(``effect <task_id>``). With ``--hold``, the first delivery's answer is stored by the
guard and then held back (``answered <task_id>`` journaled, the HTTP answer never sent):
the test SIGKILLs the process there — side effect done, answer recorded, hub not told —
and restarts it without ``--hold`` on the same port, instance and store.

    python -m tests.support.dedup_agent --port P --hub URL --journal FILE [--store DB] [--hold]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.support import processes

REPO = Path(__file__).resolve().parents[2]


def append(path: Path, line: str, lock: threading.Lock) -> None:
    with lock, path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def journal_lines(path: Path, kind: str) -> list[list[str]]:
    if not path.exists():
        return []
    return [p[1:] for line in path.read_text().splitlines() if (p := line.split())[0] == kind]


class DedupAgentProcess:
    def __init__(self, hub: str, journal: Path, port: int, instance_id: str, *extra: str) -> None:
        self.journal = journal
        self.base = [
            sys.executable, "-m", "tests.support.dedup_agent", "--port", str(port), "--hub", hub,
            "--journal", str(journal), "--instance-id", instance_id, *extra,
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *flags: str) -> None:
        with self.journal.with_suffix(".out").open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.base, *flags], cwd=REPO, stdout=out, stderr=subprocess.STDOUT
            )

    def kill(self) -> None:
        processes.kill(self.proc)

    def stop(self) -> None:
        processes.stop(self.proc)

    def lines(self, kind: str) -> list[list[str]]:
        return journal_lines(self.journal, kind)


def main() -> None:
    import reach

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hub", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--agent-id", default="dedup")
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--store", default=None)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()
    lock = threading.Lock()
    journal: Path = args.journal

    class HoldingAgent(reach.Agent):
        def invoke(self, method: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
            append(journal, f"delivery {body.get('task_id')} {body.get('attempt_seq')}", lock)
            answer = super().invoke(method, body)
            if args.hold:  # the answer is in the guard; the hub never hears it
                append(journal, f"answered {body.get('task_id')}", lock)
                time.sleep(3600)
            return answer

    agent = HoldingAgent(
        args.agent_id,
        addr=f"127.0.0.1:{args.port}",
        instance_id=args.instance_id,
        allow_loopback=True,
        capabilities=[{"type": "work.do", "params_schema": {"type": "object"}}],
        heartbeat_interval=0.5,
        hub=args.hub,
        dedup_store=args.store,
    )

    @agent.route("work.do")
    def work(task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        append(journal, f"effect {task_id}", lock)  # the side effect: once, or it shows
        return {"task_id": task_id, "pid": os.getpid()}

    agent.serve()


if __name__ == "__main__":
    main()
