"""Each hub process keeps its PostgreSQL connections open under concurrent requests.

A connection above the pool is opened for one transaction and closed after it: a
PostgreSQL backend started and torn down each time, which costs more CPU than the short
transactions the API runs (a fleet's heartbeats, registrations, submits). The pool is
``storage.pool_size`` (with ``storage.max_overflow`` for bursts above it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event, text

from reach.hub.settings import load_settings
from reach.worker.context import HubContext
from tests.support.stores import fresh_store

CONCURRENT = 16  # the fleet bench sends heartbeats from 16 threads at once


@pytest.fixture
def pg_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_store("postgres", tmp_path, request) as url:
        yield url


def _ctx(store_url: str, home: Path, **storage: str) -> HubContext:
    environ = {"REACH_DATABASE_URL": store_url, "REACH_HOME": str(home)}
    environ |= {f"REACH_STORAGE__{k.upper()}": v for k, v in storage.items()}
    return HubContext.from_settings(load_settings(environ=environ))


def _opened_by_rounds(ctx: HubContext, rounds: int = 3) -> list[int]:
    """Connections the engine opened in each round of ``CONCURRENT`` threads, each
    holding a transaction while all the others hold theirs."""
    opened = [0]
    event.listen(ctx.engine, "connect", lambda *_: opened.__setitem__(0, opened[0] + 1))
    out = []
    for _ in range(rounds):
        before = opened[0]
        barrier = threading.Barrier(CONCURRENT)

        def work(barrier: threading.Barrier = barrier) -> None:
            with ctx.transaction() as session:
                session.execute(text("SELECT 1"))
                barrier.wait(timeout=30)  # all of them inside a transaction at once

        threads = [threading.Thread(target=work) for _ in range(CONCURRENT)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out.append(opened[0] - before)
    return out


@pytest.mark.postgres
def test_concurrent_transactions_reuse_their_connections(pg_store_url: str, tmp_path: Path) -> None:
    ctx = _ctx(pg_store_url, tmp_path)
    try:
        assert ctx.settings.storage.pool_size == 20
        first, *later = _opened_by_rounds(ctx)
        assert first == CONCURRENT  # the pool grows to what the load needs
        assert later == [0, 0]  # and keeps it: nothing is opened again
    finally:
        ctx.engine.dispose()


@pytest.mark.postgres
def test_a_pool_smaller_than_the_load_opens_connections_every_time(
    pg_store_url: str, tmp_path: Path
) -> None:
    # what the setting is for: below the load, every round opens the overflow again
    ctx = _ctx(pg_store_url, tmp_path, pool_size="5", max_overflow="20")
    try:
        assert _opened_by_rounds(ctx)[1:] == [CONCURRENT - 5] * 2
    finally:
        ctx.engine.dispose()


def test_sqlite_takes_no_pool_sizing(tmp_path: Path) -> None:
    # an in-memory SQLite pool takes no overflow argument: the sizes are PostgreSQL's
    for url in ("sqlite://", f"sqlite:///{tmp_path / 'reach.db'}"):
        ctx = _ctx(url, tmp_path)
        with ctx.transaction() as session:
            assert session.execute(text("SELECT 1")).scalar_one() == 1
        ctx.engine.dispose()


@pytest.mark.parametrize("bad", [{"pool_size": "0"}, {"max_overflow": "-1"}])
def test_pool_settings_are_checked(bad: dict[str, str], tmp_path: Path) -> None:
    from reach.errors import ConfigError

    environ = {f"REACH_STORAGE__{k.upper()}": v for k, v in bad.items()}
    name = next(iter(environ))
    with pytest.raises(ConfigError, match=f"invalid setting {name}"):
        load_settings(environ={"REACH_HOME": str(tmp_path), **environ})
