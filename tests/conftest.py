"""Shared fixtures: real stores (SQLite file, PostgreSQL), real Redis, hub processes.

Every store-touching test runs against both SQLite and PostgreSQL. PostgreSQL databases
are cloned per test from a migrated template (cheap and isolated).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from sqlalchemy import Engine, MetaData, select

from reach.storage import create_engine_for, upgrade_database

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_DSN = os.environ.get(
    "REACH_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)
PG_URL_TEMPLATE = os.environ.get(
    "REACH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
)
REDIS_URL = os.environ.get("REACH_TEST_REDIS_URL", "redis://127.0.0.1:6379")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg(sql: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = f"reach_tmpl_{uuid.uuid4().hex[:8]}"
    _pg(f'CREATE DATABASE "{name}"')
    upgrade_database(PG_URL_TEMPLATE.format(db=name))
    yield name
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tmpl") / "reach.db"
    upgrade_database(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database of each kind."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "reach.db"
        path.write_bytes(template.read_bytes())
        yield f"sqlite:///{path}"
        return
    tmpl: str = request.getfixturevalue("pg_template")
    name = f"reach_t_{uuid.uuid4().hex[:10]}"
    _pg(f'CREATE DATABASE "{name}" TEMPLATE "{tmpl}"')
    try:
        yield PG_URL_TEMPLATE.format(db=name)
    finally:
        _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = create_engine_for(store_url)
    yield eng
    eng.dispose()


def snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to prove a refused request changed nothing."""
    meta = MetaData()
    meta.reflect(engine)
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for name, table in sorted(meta.tables.items()):
            if name == "alembic_version":
                continue
            out[name] = sorted((tuple(r) for r in conn.execute(select(table))), key=repr)
    return out


@pytest.fixture
def redis_db() -> Iterator[str]:
    """A Redis database number of our own, flushed before and after."""
    import redis

    url = f"{REDIS_URL}/{14}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


class HubProcess:
    """``reach <command>`` running as its own process, with its output kept for failures."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reach", *args],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def hub_env(store_url: str, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    env.update({"REACH_DATABASE_URL": store_url, "REACH_HOME": str(home), **extra})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def wait_http_ok(url: str, proc: HubProcess | None = None, timeout: float = 30) -> None:
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
        f"{url} not healthy after {timeout}s" + (f"\n{proc.output()}" if proc else "")
    )


def wait_until(predicate: Any, timeout: float, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}: {last!r}")


@pytest.fixture
def hub_api(store_url: str, tmp_path: Path) -> Iterator[str]:
    """``reach api`` as its own process on a fresh store; yields its base URL."""
    port = free_port()
    proc = HubProcess(
        ["api", "--port", str(port)], hub_env(store_url, tmp_path), tmp_path / "api.log"
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(base + "/healthz", proc)
        yield base
    finally:
        proc.stop()
