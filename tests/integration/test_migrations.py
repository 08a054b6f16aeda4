"""Alembic migrations own the schema: they match the models and run both ways on both stores."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text

from reach.hub.storage.engine import (
    autovacuum_problem,
    database_revision_problem,
    downgrade_database,
    upgrade_database,
)
from reach.hub.storage.models import Base, in_schema_of
from tests.support.stacks import hub_env

TABLES = {"agents", "instances", "tasks", "task_events", "outbox", "dead_letters"}


def test_models_match_migrations(engine: Engine) -> None:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"include_object": in_schema_of(engine.dialect.name)}
        )
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


def test_tables_and_unique_indexes(engine: Engine, store_url: str) -> None:
    insp = inspect(engine)
    assert TABLES <= set(insp.get_table_names())
    outbox_uniques = [tuple(u["column_names"]) for u in insp.get_unique_constraints("outbox")]
    assert ("agent_id", "task_id", "attempt_seq") in outbox_uniques
    task_uniques = [tuple(u["column_names"]) for u in insp.get_unique_constraints("tasks")]
    assert ("task_id",) in task_uniques
    assert database_revision_problem(store_url) is None


def test_downgrade_to_base_and_upgrade_again(engine: Engine, store_url: str) -> None:
    downgrade_database(store_url, "base")
    assert not TABLES & set(inspect(engine).get_table_names())
    assert "reach db upgrade" in (database_revision_problem(store_url) or "")
    upgrade_database(store_url)
    upgrade_database(store_url)  # idempotent
    assert TABLES <= set(inspect(engine).get_table_names())


def test_breaker_columns_come_and_go_with_0006(engine: Engine, store_url: str) -> None:
    breaker = {"breaker_open_until", "breaker_opened_at"}
    downgrade_database(store_url, "0005")
    assert not breaker & {c["name"] for c in inspect(engine).get_columns("instances")}
    upgrade_database(store_url)
    assert breaker <= {c["name"] for c in inspect(engine).get_columns("instances")}
    assert database_revision_problem(store_url) is None


def test_retention_indexes_come_and_go_with_0007(engine: Engine, store_url: str) -> None:
    wanted = {
        "tasks": "ix_tasks_finished_at",
        "outbox": "ix_outbox_task_id",
        "instance_events": "ix_instance_events_at",
        "dead_letters": "ix_dead_letters_replayed_at",
        "dag_runs": "ix_dag_runs_finished_at",
        "broadcasts": "ix_broadcasts_deadline",
        "instances": "ix_instances_status_changed",
    }

    def present() -> set[str]:
        insp = inspect(engine)
        return {
            ix["name"] for table in wanted for ix in insp.get_indexes(table) if ix["name"]
        } & set(wanted.values())

    assert present() == set(wanted.values())
    downgrade_database(store_url, "0006")
    assert present() == set()
    upgrade_database(store_url)
    assert present() == set(wanted.values())
    assert database_revision_problem(store_url) is None


def test_0017_drops_the_task_indexes_that_prefix_others(engine: Engine, store_url: str) -> None:
    def names() -> set[str]:
        return {ix["name"] for ix in inspect(engine).get_indexes("tasks") if ix["name"]}

    prefixes = {"ix_tasks_status", "ix_tasks_agent_id"}
    assert not prefixes & names()
    # what serves their queries stays
    assert {"ix_tasks_status_next_attempt", "ix_tasks_agent_status"} <= names()
    downgrade_database(store_url, "0016")
    assert prefixes <= names()
    upgrade_database(store_url)
    assert not prefixes & names()
    assert database_revision_problem(store_url) is None


AUTOVACUUM = {
    "autovacuum_vacuum_scale_factor=0.02",
    "autovacuum_vacuum_threshold=1000",
    "autovacuum_analyze_scale_factor=0.02",
}


def _reloptions(engine: Engine, table: str) -> set[str]:
    if engine.dialect.name != "postgresql":
        return set()
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT reloptions FROM pg_class WHERE oid = CAST(:t AS regclass)"), {"t": table}
        ).one()
    return set(row[0] or ())


def test_0018_tunes_autovacuum_on_the_task_tables(engine: Engine, store_url: str) -> None:
    """PostgreSQL vacuums tasks and outbox after 2 % of their rows changed; SQLite, which
    has no autovacuum to tune, migrates through 0018 both ways untouched."""
    wanted = AUTOVACUUM if engine.dialect.name == "postgresql" else set()
    for table in ("tasks", "outbox"):
        assert _reloptions(engine, table) == wanted
    assert _reloptions(engine, "task_events") == set()  # only the churning tables
    downgrade_database(store_url, "0017")
    for table in ("tasks", "outbox"):
        assert _reloptions(engine, table) == set()
    upgrade_database(store_url)
    for table in ("tasks", "outbox"):
        assert _reloptions(engine, table) == wanted
    assert database_revision_problem(store_url) is None


def test_autovacuum_problem_reports_the_servers_own_setting(engine: Engine, store_url: str) -> None:
    """The warning `reach api` and `reach db upgrade` print follows what the server says
    (read here independently), whichever way this machine's PostgreSQL is set."""
    problem = autovacuum_problem(store_url)
    if engine.dialect.name != "postgresql":
        assert problem is None
        return
    with engine.connect() as conn:
        autovacuum = conn.execute(text("SHOW autovacuum")).scalar_one()
        track_counts = conn.execute(text("SHOW track_counts")).scalar_one()
    if autovacuum == "on" and track_counts == "on":
        assert problem is None
    else:
        assert problem is not None
        assert "autovacuum is off" in problem and "docs/operations.md" in problem


def test_db_upgrade_warns_when_autovacuum_is_off(
    engine: Engine, store_url: str, tmp_path: Path
) -> None:
    """``reach db upgrade`` says so on stderr, and still migrates (exit 0)."""
    env = hub_env(store_url, tmp_path, NO_COLOR="1")
    done = subprocess.run(
        [sys.executable, "-m", "reach", "db", "upgrade"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    expected = autovacuum_problem(store_url)
    warned = "autovacuum is off" in done.stderr
    assert warned == (expected is not None), done.stderr


def test_0019_adds_the_live_index_on_postgres_only(engine: Engine, store_url: str) -> None:
    def present() -> bool:
        return "ix_tasks_agent_live" in {ix["name"] for ix in inspect(engine).get_indexes("tasks")}

    postgres = engine.dialect.name == "postgresql"
    assert present() is postgres
    downgrade_database(store_url, "0018")
    assert not present()
    upgrade_database(store_url)
    assert present() is postgres
    assert database_revision_problem(store_url) is None


def test_0020_carries_open_claims_over_and_indexes_them(engine: Engine, store_url: str) -> None:
    """A claim open at upgrade time (published, its task still pending at that attempt and
    not published since) keeps lapsing after 0020; settled publications open none."""
    downgrade_database(store_url, "0019")
    rows = {  # task: (status, attempt_seq, last_published_at, outbox published_at)
        "claimed": ("pending", 1, None, 10.0),
        "republished-since": ("pending", 1, 12.0, 10.0),
        "settled": ("pending", 1, 10.0, 10.0),
        "moved-on": ("pending", 2, None, 10.0),
        "finished": ("success", 1, None, 10.0),
        "unpublished": ("pending", 1, None, None),
    }
    with engine.begin() as conn:
        for task_id, (status, seq, last, published) in rows.items():
            conn.execute(
                text(
                    "INSERT INTO tasks (task_id, target, method, payload, status, attempt_seq,"
                    " created_at, updated_at, last_published_at, trace, redeliveries,"
                    " priority, timeout_ms) VALUES (:t, '{}', 'm', '{}', :s, :q, 1, 1, :l,"
                    " '{}', 0, 'normal', 1000)"
                ),
                {"t": task_id, "s": status, "q": seq, "l": last},
            )
            conn.execute(
                text(
                    "INSERT INTO outbox (task_id, agent_id, attempt_seq, message, created_at,"
                    " available_at, published_at) VALUES (:t, 'a', 1, '{}', 1, 1, :p)"
                ),
                {"t": task_id, "p": published},
            )
    upgrade_database(store_url)
    with engine.connect() as conn:
        claims = dict(conn.execute(text("SELECT task_id, claimed_at FROM outbox")).all())
    assert claims == {task_id: 10.0 if task_id == "claimed" else None for task_id in rows}
    assert "ix_outbox_claimed" in {ix["name"] for ix in inspect(engine).get_indexes("outbox")}
    downgrade_database(store_url, "0019")
    assert "claimed_at" not in {c["name"] for c in inspect(engine).get_columns("outbox")}
    upgrade_database(store_url)
    assert database_revision_problem(store_url) is None
