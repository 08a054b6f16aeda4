"""A real ``reach api`` process with authentication on, for the attacks on the API's edge
(`test_dashboard_edge`, `test_login_limits`, `test_slow_clients`, `test_sealed_secrets`).

``client(n)`` is the source address ``127.0.0.<n>``: every loopback address is this
machine, so a test can be several clients (the hub counts failures per client address).
"""

from __future__ import annotations

import contextlib
import http.client
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from reach.core.security.auth import Scope
from reach.hub.security import apikeys
from reach.hub.security.apikeys import CreatedKey
from reach.hub.storage import create_engine_for
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, hub_env, wait_http_ok

TYPE = "urn:agent-reach:problem:"
PROBLEM = "application/problem+json"


@dataclass
class EdgeHub:
    url: str
    port: int
    engine: Engine
    proc: HubProcess
    home: Path
    admin: CreatedKey

    def key(self, scope: Scope, pattern: str | None = None) -> CreatedKey:
        return create_key(self.engine, scope, pattern)

    def client(self, n: int) -> requests.Session:
        """A session whose connections leave from 127.0.0.<n>."""
        session = requests.Session()
        adapter = _SourceAdapter(f"127.0.0.{n}")
        session.mount("http://", adapter)
        return session

    def raw(self, n: int = 1, timeout: float = 10) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=timeout, source_address=(f"127.0.0.{n}", 0)
        )


class _SourceAdapter(HTTPAdapter):
    def __init__(self, source: str) -> None:
        self._source = source
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["source_address"] = (self._source, 0)
        super().init_poolmanager(*args, **kwargs)


def create_key(engine: Engine, scope: Scope, pattern: str | None = None) -> CreatedKey:
    with Session(engine) as session, session.begin():
        return apikeys.create_key(
            session,
            scope=scope,
            agent_pattern=pattern,
            name=f"edge {scope.value}",
            expires_in_s=None,
            now=time.time(),
        )


@contextlib.contextmanager
def edge_hub(store_url: str, home: Path, *args: str, **env: str) -> Iterator[EdgeHub]:
    """``reach api --port P [args]`` with ``REACH_SECURITY__REQUIRE_AUTH=true`` and ``env``."""
    engine = create_engine_for(store_url)
    admin = create_key(engine, Scope.ADMIN)
    port = free_port()
    environ = hub_env(store_url, home, REACH_SECURITY__REQUIRE_AUTH="true", **env)
    proc = HubProcess(["api", "--port", str(port), *args], environ, home / "api.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(url + "/healthz", proc)
        yield EdgeHub(url, port, engine, proc, home, admin)
    finally:
        proc.stop()
        engine.dispose()


def assert_problem(answer: requests.Response, status: int, slug: str) -> dict[str, Any]:
    assert answer.status_code == status, (answer.status_code, answer.text[:500])
    assert answer.headers["content-type"].startswith(PROBLEM), answer.headers
    body: dict[str, Any] = answer.json()
    assert body["type"] == TYPE + slug, body
    return body


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, html[:2000]
    return found.group(1)
