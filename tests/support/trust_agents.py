"""Helpers of the trust-level and audit acceptance tests: API keys made in the hub's store,
the trust test agent as a process, and reads of what the hub recorded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import Engine, func, select

from reach.core.security.auth import Scope
from reach.hub.security import apikeys
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import AuditRow
from tests.support import processes
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stacks import Stack

AGENT_SCRIPT = REPO / "tests" / "acceptance" / "agents" / "trust_agent.py"
PROBLEM = "urn:agent-reach:problem:"


@dataclass(frozen=True)
class Key:
    key_id: str
    secret: str

    @property
    def identity(self) -> str:
        return f"key:{self.key_id}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}


def make_key(
    store_url: str, scope: Scope, agent_pattern: str | None = None, name: str | None = None
) -> Key:
    engine = create_engine_for(store_url)
    try:
        with session_factory(engine).begin() as session:
            created = apikeys.create_key(
                session,
                scope=scope,
                agent_pattern=agent_pattern,
                name=name if name is not None else f"trust-test-{scope.value}",
                expires_in_s=None,
                now=time.time(),
            )
    finally:
        engine.dispose()
    return Key(created.key_id, created.secret)


class TrustAgent:
    """tests/acceptance/agents/trust_agent.py with its agent key in ``$REACH_API_KEY``."""

    def __init__(
        self, hub: str, agent_id: str, key: Key, directory: Path, tags: list[str], caps: list[str]
    ) -> None:
        self.agent_id = agent_id
        self.port = free_port()
        self.log = directory / f"{agent_id}.runs"
        self.out = directory / f"{agent_id}.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
        env.update(REACH_API_KEY=key.secret, PYTHONUNBUFFERED="1")
        argv = [
            sys.executable, str(AGENT_SCRIPT), "--port", str(self.port), "--hub", hub,
            "--agent-id", agent_id, "--log", str(self.log),
        ]  # fmt: skip
        for tag in tags:
            argv += ["--tag", tag]
        for cap in caps:
            argv += ["--capability", cap]
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def runs(self) -> list[str]:
        """The task IDs this agent's handlers ran, in order."""
        if not self.log.exists():
            return []
        return [line.split()[0] for line in self.log.read_text().splitlines() if line.strip()]

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def stop(self) -> None:
        processes.stop(self.proc)


def api(
    stack: Stack, method: str, path: str, key: Key | None, body: Any = None
) -> requests.Response:
    headers = key.headers() if key else {}
    return requests.request(method, stack.url + path, json=body, headers=headers, timeout=30)


def reach_cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in stack.env.items() if k != "REACH_API_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "reach", *args],
        env={**env, "COLUMNS": "200"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def online(stack: Stack, admin: Key, agent_id: str) -> bool:
    """Whether an instance of the agent is online, as the admin API says."""
    r = api(stack, "GET", f"/api/v1/agents/{agent_id}", admin)
    return r.ok and any(i["status"] == "online" for i in r.json()["instances"])


def count(store: Engine, model: Any, *where: Any) -> int:
    """Rows of ``model`` in the store, e.g. to show a refusal created none."""
    with store.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model).where(*where)).scalar_one())


def audit_rows(store: Engine, *where: Any) -> list[AuditRow]:
    """The audit log's rows matching ``where``, oldest first, detached from any session."""
    with session_factory(store)(expire_on_commit=False) as session:
        rows = list(session.scalars(select(AuditRow).where(*where).order_by(AuditRow.id)).all())
        session.expunge_all()
        return rows
