"""Fixtures of the fault tests: services of their own that a test may stop and restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tests.support.private_postgres import PrivatePostgres, started_cluster
from tests.support.private_redis import PrivateRedis


@pytest.fixture(scope="session")
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of this run's own (free port, temporary directory): tests may
    stop it; the shared server on 5432 is never touched. Started once per session."""
    cluster = started_cluster()
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def private_pg_url(private_pg: PrivatePostgres) -> str:
    """A fresh, migrated database on the private cluster, started if a test left it down."""
    from reach.hub.storage import upgrade_database

    if not private_pg.accepting():
        private_pg.start()
    url = private_pg.create_database()
    upgrade_database(url)
    return url


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of the test's own (nothing on disk) that it may stop and restart:
    every queued message dies with it, as in a restart of a Redis without persistence."""
    redis = PrivateRedis(tmp_path, free_port())
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()
