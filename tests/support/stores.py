"""The test stores: migrated SQLite and PostgreSQL databases, and a Redis database per
pytest-xdist worker. The fixtures that hand them out live in tests/conftest.py.

PostgreSQL databases are cloned per test from a migrated template (cheap and isolated).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, MetaData, select

PG_ADMIN_DSN = os.environ.get(
    "REACH_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=test"
)
PG_URL_TEMPLATE = os.environ.get(
    "REACH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
)
REDIS_URL = os.environ.get("REACH_TEST_REDIS_URL", "redis://127.0.0.1:6379")


def pg(sql: str) -> None:
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


POSTGRES = pytest.param("postgres", marks=pytest.mark.postgres)
STORES = ["sqlite", POSTGRES]


@contextmanager
def fresh_store(kind: str, directory: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if kind == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = directory / "reach.db"
        path.write_bytes(template.read_bytes())
        yield f"sqlite:///{path}"
        return
    tmpl: str = request.getfixturevalue("pg_template")
    name = CLONES.take(tmpl)
    try:
        yield PG_URL_TEMPLATE.format(db=name)
    finally:
        CLONES.drop(name)


class Clones:
    """Clones of the migrated template, made one ahead in a thread of their own.

    ``CREATE DATABASE ... TEMPLATE`` takes a quarter of a second and a test waited for
    it, about a thousand times a run; now the next test's clone is made while this one
    runs, and a finished test's database is dropped behind it. Every test still gets a
    database no other test has touched."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._spare: Future[str] | None = None
        self._spare_of = ""
        self._drops: list[Future[None]] = []

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="pg-clones")
        return self._pool

    @staticmethod
    def _create(template: str) -> str:
        name = f"reach_t_{uuid.uuid4().hex[:10]}"
        pg(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        return name

    def take(self, template: str) -> str:
        """A fresh clone of ``template`` (the spare, when it is of this template)."""
        spare, self._spare = self._spare, None
        name = None
        if spare is not None:
            if self._spare_of == template:
                name = spare.result()
            else:
                self._drops.append(self._executor().submit(self._drop_now, spare.result()))
        if name is None:
            name = self._create(template)
        self._spare, self._spare_of = self._executor().submit(self._create, template), template
        return name

    def drop(self, name: str) -> None:
        """Drop a test's database in the background (with its connections, as before).
        Finished drops are let go here, a failed one raising (in the next test's teardown)."""
        for done in [d for d in self._drops if d.done()]:
            self._drops.remove(done)
            done.result()
        self._drops.append(self._executor().submit(self._drop_now, name))

    @staticmethod
    def _drop_now(name: str) -> None:
        pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        """Drop the spare and wait for every drop (before the template is dropped)."""
        if self._spare is not None:
            with suppress(Exception):
                self._drop_now(self._spare.result())
            self._spare = None
        for done in self._drops:
            done.result()
        self._drops.clear()


CLONES = Clones()


def snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to prove a refused request changed nothing. Left out:
    ``flow_counts``, the hub-wide per-second windows, which each process's flusher writes
    and prunes on its own clock whatever the request did."""
    meta = MetaData()
    meta.reflect(engine)
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for name, table in sorted(meta.tables.items()):
            if name in ("alembic_version", "flow_counts"):
                continue
            out[name] = sorted((tuple(r) for r in conn.execute(select(table))), key=repr)
    return out


# One Redis database number per pytest-xdist worker (gw0 -> 14, gw1 -> 13, gw2 -> 9, ...).
# Left out: 15 (tests/install), 12 and 11 (the bench's hub and its plain Celery baseline,
# which tests/bench and tests/semantic run) and 10 (bench.micro). A worker that took one of
# them would share a broker with a bench hub: each hub's worker would take the other's tasks.
WORKER_REDIS_DBS = (14, 13, 9, 8, 7, 6, 5, 4, 3, 2, 1)


def own_redis_url() -> str:
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    if worker >= len(WORKER_REDIS_DBS):
        raise RuntimeError(
            f"pytest-xdist worker gw{worker} has no Redis database of its own: "
            f"run with at most -n {len(WORKER_REDIS_DBS)}"
        )
    return f"{REDIS_URL}/{WORKER_REDIS_DBS[worker]}"


@contextmanager
def flushed_redis() -> Iterator[str]:
    """Flushed at start only: pytest may tear a module's hub down after the next module's
    hub started on the same database, and a flush then would drop that hub's messages."""
    import redis

    url = own_redis_url()
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    yield url
