"""PgBouncer in transaction mode between the hub and PostgreSQL (seed 003, stage 2).

psycopg prepares a statement on the server after it ran five times on a connection;
PgBouncer in transaction mode (Debian's 1.18) hands each transaction whichever server
connection is free, where that statement does not exist, or exists under the same name
prepared by another client. ``?prepare_threshold=none`` in the database URL tells every
hub process never to prepare. With it, a whole hub (api, worker, beat) behind a real
PgBouncer with fewer server connections than clients delivers hundreds of slow tasks with
nothing lost, counted at the agent over HTTP.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from reach.hub.storage import create_engine_for
from tests.faults.test_slow_agents import SETTINGS, all_succeeded, check_counted, slow_agent, submit
from tests.support.pgbouncer import pgbouncer
from tests.support.private_redis import PrivateRedis
from tests.support.stacks import Stack, start_stack, stop_stack

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.parametrize("store_url", ["postgres"], indirect=True),
    pytest.mark.timeout(420),
]


def through(store_url: str, port: int, query: str = "") -> str:
    """The same database, reached through PgBouncer's port."""
    return re.sub(r"@[^/]+/", f"@127.0.0.1:{port}/", store_url) + query


def test_psycopgs_prepared_statements_clash_in_transaction_mode_unless_turned_off(
    store_url: str,
) -> None:
    """Two clients, one server connection: the second prepares the name the first did."""
    with pgbouncer(pool_size=1) as port:
        for query, clashes in (("", True), ("?prepare_threshold=none", False)):
            engine = create_engine_for(through(store_url, port, query), pool_size=2)
            try:
                a, b = engine.connect(), engine.connect()
                failure = None
                try:
                    for _ in range(7):
                        for conn in (a, b):
                            conn.execute(text("SELECT count(*) FROM agents")).scalar()
                            conn.commit()
                except DBAPIError as exc:
                    failure = exc
                finally:
                    a.close()
                    b.close()
            finally:
                engine.dispose()
            if clashes:
                assert failure is not None and "prepared statement" in str(failure)
            else:
                assert failure is None, failure


@pytest.fixture
def bounced_stack(store_url: str, private_redis: PrivateRedis, tmp_path: Path) -> Iterator[Stack]:
    with pgbouncer(pool_size=4) as port:
        url = private_redis.url
        stack = start_stack(
            through(store_url, port, "?prepare_threshold=none"),
            tmp_path,
            {**SETTINGS, "REACH_BROKER_URL": url, "REACH_RESULT_BACKEND": url},
        )
        try:
            yield stack
        finally:
            stop_stack(stack)


def test_a_hub_behind_pgbouncer_loses_nothing(
    bounced_stack: Stack, store_url: str, tmp_path: Path
) -> None:
    ids = [f"pgb-{i}" for i in range(300)]
    with slow_agent("sdk-sync", bounced_stack, tmp_path) as agent:
        submit(bounced_stack, ids)
        all_succeeded(store_url, ids)  # read directly from PostgreSQL, not through the hub
        check_counted(agent, ids)
    for proc in bounced_stack.procs:
        said = proc.output()
        assert "prepared statement" not in said, said[-3000:]
    # beat ran through PgBouncer too: it held its lock and its sweeps ran on the worker
    assert "reach.outbox_relay" in bounced_stack.procs[1].output()
