"""The demo agents of examples/agents/ as real processes behind a test hub."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack
from tests.support.waiting import wait_until


@contextmanager
def running(stack: Stack, scripts: Mapping[str, str], logs_dir: Path) -> Iterator[dict[str, Path]]:
    """Start each ``agent_id: script`` against ``stack``, wait until all are online, yield
    their log files; SIGTERM (they deregister) on exit, SIGKILL if one lingers."""
    logs: dict[str, Path] = {}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    outs: list[IO[bytes]] = []
    try:
        for agent_id, script in scripts.items():
            logs[agent_id] = logs_dir / f"{agent_id}.log"
            out = logs[agent_id].open("wb")
            outs.append(out)
            procs[agent_id] = subprocess.Popen(
                [
                    sys.executable,
                    str(REPO / "examples" / "agents" / script),
                    "--port",
                    str(free_port()),
                    "--hub",
                    stack.url,
                    "--heartbeat-interval",
                    "0.5",
                ],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        for agent_id, proc in procs.items():

            def online(agent_id: str = agent_id, proc: subprocess.Popen[bytes] = proc) -> bool:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"{agent_id} exited with {proc.returncode}:\n{logs[agent_id].read_text()}"
                    )
                return any(i["status"] == "online" for i in stack.instances(agent_id))

            wait_until(online, timeout=30, what=f"{agent_id} online")
        yield logs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in outs:
            log.close()
