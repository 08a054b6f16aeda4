"""Shared fixtures: real stores (SQLite file, PostgreSQL), real Redis, hub processes.

Every store-touching test runs against both SQLite and PostgreSQL; tests/acceptance narrows
that to PostgreSQL in its own conftest. The plain helpers these fixtures hand out (stores,
stacks, waiting) live in tests/support.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from reach.hub.storage import create_engine_for, upgrade_database
from tests.support.ports import free_port
from tests.support.stacks import HubProcess, Stack, hub_env, start_stack, stop_stack, wait_http_ok
from tests.support.stores import (
    CLONES,
    PG_URL_TEMPLATE,
    STORES,
    flushed_redis,
    fresh_store,
    pg,
)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = f"reach_tmpl_{uuid.uuid4().hex[:8]}"
    pg(f'CREATE DATABASE "{name}"')
    upgrade_database(PG_URL_TEMPLATE.format(db=name))
    yield name
    CLONES.close()  # the spare clone and the databases still being dropped
    pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tmpl") / "reach.db"
    upgrade_database(f"sqlite:///{path}")
    return path


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database of each kind."""
    with fresh_store(request.param, tmp_path, request) as url:
        yield url


@pytest.fixture(scope="module", params=STORES)
def shared_store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One database of each kind for a whole test module (see ``shared_stack``)."""
    with fresh_store(request.param, tmp_path_factory.mktemp("store"), request) as url:
        yield url


@pytest.fixture
def engine(store_url: str) -> Iterator[Engine]:
    eng = create_engine_for(store_url)
    yield eng
    eng.dispose()


@pytest.fixture
def redis_db() -> Iterator[str]:
    """A Redis database number of our own, flushed before use."""
    with flushed_redis() as url:
        yield url


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


@pytest.fixture
def stack(store_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """api + worker + beat; PostgreSQL stores get the real Redis broker.

    Parametrise indirectly with a dict of extra REACH_* settings.
    """
    extra: dict[str, str] = {
        "REACH_PROBE__INTERVAL": "0.5",
        "REACH_PROBE__FAST_INTERVAL": "0.5",
        "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    }
    if "postgres" in store_url:
        redis_url: str = request.getfixturevalue("redis_db")
        extra.update(REACH_BROKER_URL=redis_url, REACH_RESULT_BACKEND=redis_url)
    extra.update(getattr(request, "param", {}) or {})
    s = start_stack(store_url, tmp_path, extra)
    try:
        yield s
    finally:
        stop_stack(s)


@pytest.fixture(scope="module")
def shared_stack(
    shared_store_url: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One hub (api, worker, beat) for every test of a module, per store: processes start
    once instead of per test. Settings come from the module's ``STACK_SETTINGS``."""
    extra: dict[str, str] = {
        "REACH_PROBE__INTERVAL": "0.5",
        "REACH_PROBE__FAST_INTERVAL": "0.5",
        "REACH_HEARTBEAT__SWEEP_INTERVAL": "0.5",
    }
    extra.update(getattr(request.module, "STACK_SETTINGS", {}))
    home = tmp_path_factory.mktemp("hub")
    with contextlib.ExitStack() as cleanup:
        if "postgres" in shared_store_url:
            redis_url = cleanup.enter_context(flushed_redis())
            extra.update(REACH_BROKER_URL=redis_url, REACH_RESULT_BACKEND=redis_url)
        workers = int(getattr(request.module, "STACK_WORKER_CONCURRENCY", 2))
        s = start_stack(shared_store_url, home, extra, worker_concurrency=workers)
        cleanup.callback(stop_stack, s)
        yield s
