"""A hub of real processes for a test: ``reach api``, ``reach worker`` and ``reach beat`` on
one store and broker, and the recording agent that answers its deliveries. The fixtures
that start them (``stack``, ``shared_stack``, ``hub_api``) live in tests/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port


class HubProcess:
    """``reach <command>`` running as its own process, with its output kept for failures."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self._terminated = False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reach", *args],
            # faulthandler: `dump_stacks` can show where a process that never came up hangs
            env={**env, "PYTHONFAULTHANDLER": "1"},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            start_new_session=True,  # its own process group: kill_group() reaches the children
        )

    def kill_group(self) -> None:
        """SIGKILL the process and all its children (a prefork worker dies mid-flight)."""
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def dump_stacks(self) -> str:
        """SIGABRT a process that is still running (faulthandler writes every thread's stack
        to its log, then it dies) and return its output: why it never answered."""
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        return self.output()

    def terminate(self) -> None:
        """SIGTERM, once, without waiting (`stop` reaps it)."""
        if self.proc.poll() is None and not self._terminated:
            self.proc.terminate()
            self._terminated = True

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def hub_env(store_url: str, home: Path, **extra: str) -> dict[str, str]:
    """A hub process's environment. Test agents listen on 127.0.0.1, and a hub that
    requires API keys calls loopback agents only when the operator says so: the test
    stacks say so (pass ``REACH_SECURITY__ALLOW_LOOPBACK_AGENTS="false"`` to test the
    refusal)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    env["REACH_SECURITY__ALLOW_LOOPBACK_AGENTS"] = "true"
    env.update({"REACH_DATABASE_URL": store_url, "REACH_HOME": str(home), **extra})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_http_ok(url: str, proc: HubProcess | None = None, timeout: float = 60) -> None:
    """Until ``url`` answers 2xx. The minute is for a 2-core box under the whole suite (a hub
    that starts in 1.5 s alone once gave no output for 30 s); a process that never answers
    has its stacks dumped into the failure."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"process exited early:\n{proc.output()}")
        try:
            if requests.get(url, timeout=1).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(
        f"{url} not healthy after {timeout}s" + (f"\n{proc.dump_stacks()}" if proc else "")
    )


AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


class Stack:
    """A hub of real processes (api, worker, beat) on one store and broker."""

    def __init__(self, url: str, env: dict[str, str], home: Path, procs: list[HubProcess]) -> None:
        self.url = url
        self.env = env
        self.home = home
        self.procs = procs

    @property
    def worker(self) -> HubProcess:
        return self.procs[1]

    def instance(self, agent_id: str) -> dict[str, Any] | None:
        """The agent's first registered instance (the fleet listing is paged: the agent's
        own view is one read, wherever it would sort)."""
        found = self.instances(agent_id)
        return dict(found[0]) if found else None

    def instances(self, agent_id: str) -> list[dict[str, Any]]:
        """Registered instances of the agent (deregistered ones left out)."""
        r = requests.get(f"{self.url}/api/v1/agents/{agent_id}", timeout=5)
        found = r.json().get("instances", []) if r.ok else []
        return [i for i in found if i["status"] != "deregistered"]

    def metrics(self) -> str:
        return str(requests.get(f"{self.url}/metrics", timeout=5).text)

    def task(self, task_id: str) -> dict[str, Any]:
        return dict(requests.get(f"{self.url}/v1/tasks/{task_id}", timeout=5).json())

    def events(self, task_id: str) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/v1/tasks/{task_id}/events", timeout=5)
        return list(r.json()["events"])

    def start_worker(self, concurrency: int = 2) -> HubProcess:
        n = len(self.procs)
        proc = HubProcess(
            ["worker", "--concurrency", str(concurrency)], self.env, self.home / f"worker-{n}.log"
        )
        self.procs.append(proc)
        return proc


def start_stack(
    store_url: str, home: Path, extra: dict[str, str], worker_concurrency: int = 2
) -> Stack:
    env = hub_env(store_url, home, **extra)
    port = free_port()
    procs = [
        HubProcess(["api", "--port", str(port)], env, home / "api.log"),
        HubProcess(["worker", "--concurrency", str(worker_concurrency)], env, home / "worker.log"),
        HubProcess(["beat"], env, home / "beat.log"),
    ]
    stack = Stack(f"http://127.0.0.1:{port}", env, home, procs)
    try:
        wait_http_ok(stack.url + "/healthz", procs[0])
    except BaseException:
        stop_stack(stack)
        raise
    return stack


def stop_stack(stack: Stack) -> None:
    """SIGTERM every process first, then reap each: the worker's warm shutdown and the
    API's graceful one overlap instead of adding up (a stack's teardown took 3 to 10 s)."""
    for p in stack.procs:
        p.terminate()
    for p in stack.procs:
        p.stop()


class AgentProcess:
    """tests/acceptance/agents/recording_agent.py as its own process."""

    SCRIPT = REPO / "tests" / "acceptance" / "agents" / "recording_agent.py"

    def __init__(
        self,
        hub: str,
        log: Path,
        *,
        agent_id: str = "recorder",
        mode: str = "sync",
        delay: float = 0.0,
        port: int | None = None,
        max_concurrency: int = 8,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.log = log
        self.env = env  # None: this process's
        self.args = [
            sys.executable,
            str(self.SCRIPT),
            "--port",
            str(self.port),
            "--hub",
            hub,
            "--agent-id",
            agent_id,
            "--mode",
            mode,
            "--delay",
            str(delay),
            "--log",
            str(log),
            "--max-concurrency",
            str(max_concurrency),
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with self.log.with_suffix(".out").open("ab") as out:  # the agent's own log, for failures
            self.proc = subprocess.Popen(
                self.args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )

    def kill(self) -> None:
        processes.kill(self.proc)

    def stop(self) -> None:
        processes.stop(self.proc)

    def executions(self) -> list[str]:
        if not self.log.exists():
            return []
        return [line.split()[0] for line in self.log.read_text().splitlines() if line.strip()]
