"""``reach up``: the whole hub (API, worker, beat, demo agents) as child processes.

Each part runs as the same process it would be in production (``reach api`` …), so the
one-command demo exercises the real topology. If any child dies, everything stops and the
exit code says so: a half-running hub is worse than none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests
from rich.console import Console

from reach.core.auth import auth_required, is_loopback_host
from reach.hub.settings import Settings
from reach.hub.storage import upgrade_database

console = Console()
# Started in this order on consecutive ports from --demo-port (7101 …); the last three
# serve the capabilities the shipped DAGs in dags/ use.
DEMO_AGENTS = (
    "doc_analyzer.py",
    "summarizer.py",
    "sales_agent.py",
    "knowledge_agent.py",
    "chat_agent.py",
)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]


def find_examples_dir() -> Path | None:
    for candidate in (
        Path.cwd() / "examples" / "agents",
        Path(__file__).resolve().parents[2] / "examples" / "agents",
    ):
        if (candidate / DEMO_AGENTS[0]).exists():
            return candidate
    return None


def run_up(
    settings: Settings, *, port: int, demo: bool, concurrency: int, demo_port: int = 7101
) -> int:
    url = settings.storage.resolved_database_url
    console.print(
        f"[bold]Agent-Reach[/bold] store: {_kind(url)}  broker: "
        f"{_kind(settings.storage.resolved_broker_url)}"
    )
    upgrade_database(url)
    # Counters of an earlier run would be merged into this one's; nobody writes yet.
    for stale in (settings.storage.home_path / "metrics").glob("*.db"):
        stale.unlink(missing_ok=True)
    hub_url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "REACH_HUB_URL": hub_url}
    me = [sys.executable, "-m", "reach"]
    children: list[Child] = []
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        children.append(_spawn("api", [*me, "api", "--port", str(port)], env))
        children.append(_spawn("worker", [*me, "worker", "--concurrency", str(concurrency)], env))
        children.append(_spawn("beat", [*me, "beat"], env))
        if not _wait_healthy(hub_url, children, timeout=60):
            console.print("[red]the API did not become healthy; stopping[/red]")
            return 1
        if demo:
            examples = find_examples_dir()
            if examples is None:
                console.print(
                    "[yellow]examples/agents/ not found; starting without demo agents[/yellow]"
                )
            else:
                for offset, script in enumerate(DEMO_AGENTS):
                    agent_port = demo_port + offset
                    children.append(
                        _spawn(
                            script.removesuffix(".py"),
                            [sys.executable, str(examples / script), "--port", str(agent_port)],
                            env,
                        )
                    )
        console.print(
            f"hub ready at [bold]{hub_url}[/bold]  (agents: {hub_url}/api/v1/agents, "
            f"OpenAPI: {hub_url}/docs) — `reach agents` lists the fleet; Ctrl-C stops"
        )
        open_notice = _open_notice(settings)
        if open_notice:
            console.print(f"[yellow]{open_notice}[/yellow]")
        while not stopping:
            for child in children:
                code = child.proc.poll()
                if code is not None:
                    console.print(f"[red]{child.name} exited with {code}; stopping the hub[/red]")
                    return 1
            time.sleep(0.5)
        return 0
    finally:
        _terminate(children)


def _open_notice(settings: Settings) -> str | None:
    """The line saying the hub runs without authentication, if it does."""
    host = settings.server.host
    if auth_required(settings.security.require_auth, host):
        return None
    if is_loopback_host(host):
        return (
            "auth is off: the API listens on loopback only; "
            "set REACH_SECURITY__REQUIRE_AUTH=true to require API keys"
        )
    return f"auth is off on {host}: security.require_auth is false, anyone who reaches it is admin"


def _spawn(name: str, argv: list[str], env: dict[str, str]) -> Child:
    return Child(name, subprocess.Popen(argv, env=env, start_new_session=True))


def _wait_healthy(hub_url: str, children: list[Child], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.proc.poll() is not None for c in children):
            return False
        try:
            if requests.get(f"{hub_url}/healthz", timeout=1).ok:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.2)
    return False


def _terminate(children: list[Child]) -> None:
    # Agents first, so they can deregister while the API still answers.
    for child in reversed(children):
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)
            try:
                child.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


def _kind(url: str) -> str:
    return url.split("://", 1)[0]
