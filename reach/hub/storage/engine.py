"""Engines for both stores, with the settings each one needs to survive several processes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine, Select, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# The newest migration's revision: what a running hub checks the database against.
# Alembic itself (11 MB and 150 modules, with mako and pygments) loads only to migrate,
# not in every API, worker and beat process; tests/unit/test_schema_head.py keeps this
# equal to the migrations' head.
SCHEMA_HEAD = "0029"


def create_engine_for(url: str, **kwargs: Any) -> Engine:
    """Create an engine; SQLite gets WAL and a busy timeout (API, worker and beat all write).

    Statement parameters are kept out of SQLAlchemy's exception messages: a failing write
    must not put a payload, a result or a secret into a log line."""
    kwargs.setdefault("hide_parameters", True)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        # opening a SQLite connection costs little, and ":memory:" takes no overflow
        kwargs.pop("pool_size", None)
        kwargs.pop("max_overflow", None)
        database = parsed.database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin_immediate)
        return engine
    # No pre-ping: it costs a round trip on every checkout, i.e. on every transaction of
    # the hot path. After a database restart the first use of each stale connection
    # fails instead (a 503, or a delivery the overdue net re-publishes) and SQLAlchemy
    # invalidates the whole pool on that disconnect; recycling bounds connection age.
    kwargs.setdefault("pool_recycle", 1800)
    parsed, threshold = _prepare_threshold(parsed)
    if threshold is not _UNSET:
        kwargs["connect_args"] = {**kwargs.get("connect_args", {}), "prepare_threshold": threshold}
    return create_engine(parsed, **kwargs)


_UNSET = object()


def _prepare_threshold(url: URL) -> tuple[URL, object]:
    """``?prepare_threshold=none`` (or a number) in a PostgreSQL URL: psycopg's own option,
    which libpq's URL would refuse, taken out of the URL and passed to psycopg.

    PgBouncer in transaction mode (before 1.21) hands each transaction any server
    connection, where a statement psycopg prepared on another does not exist: ``none``
    never prepares. Every process reads the same ``REACH_DATABASE_URL``, so one URL says it
    for all of them."""
    raw = url.query.get("prepare_threshold")
    if raw is None:
        return url, _UNSET
    if isinstance(raw, tuple):
        raise ValueError("prepare_threshold is given more than once in the database URL")
    value = raw.strip().lower()
    stripped = url.difference_update_query(["prepare_threshold"])
    if value in ("none", "off", ""):
        return stripped, None
    if value.isdigit():
        return stripped, int(value)
    raise ValueError(
        f"prepare_threshold in the database URL is 'none' or a whole number, not {raw!r}"
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy issue BEGIN itself (below), instead of pysqlite's lazy deferred BEGIN.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


READ_ONLY = "reach_read_only"  # execution option of the engine behind read-only db


def _sqlite_begin_immediate(conn: Any) -> None:
    """Take the write lock at BEGIN: two processes that read-then-write the same row would
    otherwise both read, and one would fail at commit (SQLITE_BUSY_SNAPSHOT, not retried).

    Read-only transactions begin deferred instead: WAL lets them read beside a writer, so
    long-poll readers never queue behind (or in front of) heartbeats and deliveries."""
    if conn.get_execution_options().get(READ_ONLY):
        conn.exec_driver_sql("BEGIN")
    else:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


T = TypeVar("T")


def skip_locked(session: Session, query: Select[T]) -> Select[T]:
    """Lock the selected rows, skipping rows another worker holds (PostgreSQL).

    SQLite has no row locks; there every write transaction holds the database lock
    (BEGIN IMMEDIATE), which serialises sweeps just as well at embedded scale.
    """
    if session.get_bind().dialect.name == "postgresql":
        return query.with_for_update(skip_locked=True)
    return query


_ADVISORY_LOCKS = {
    1: text("SELECT pg_advisory_xact_lock(:k1)"),
    2: text("SELECT pg_advisory_xact_lock(:k1, :k2)"),
}


def advisory_xact_lock(session: Session, *key: int) -> None:
    """Take turns with every transaction that asks for ``key`` (one bigint, or two ints)
    until this one ends (PostgreSQL). SQLite's write transactions take turns already
    (BEGIN IMMEDIATE): nothing to do there."""
    if session.get_bind().dialect.name == "postgresql":
        params = {f"k{i}": k for i, k in enumerate(key, 1)}
        session.connection().execute(_ADVISORY_LOCKS[len(key)], params)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def read_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions for transactions that only read (deferred BEGIN on SQLite)."""
    return sessionmaker(engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False)


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade_database(url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (idempotent)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def downgrade_database(url: str, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)


def database_revision_problem(url: str) -> str | None:
    """Say why the database is not at the code's schema head, or None if it is."""
    engine = create_engine_for(url)
    try:
        with engine.connect() as conn:
            current = _current_revision(conn)
    except Exception as exc:  # any driver error means "not usable"; say which
        return f"cannot connect: {exc}"
    finally:
        engine.dispose()
    if current != SCHEMA_HEAD:
        return (
            f"schema is at {current or 'nothing'}, code needs {SCHEMA_HEAD}: run `reach db upgrade`"
        )
    return None


AUTOVACUUM_OFF = (
    "PostgreSQL's autovacuum is off ({setting}): nothing removes the dead row versions "
    "every task's status changes leave, and every submit's queue count walks all of "
    "them, so PostgreSQL's cost per message grows with the traffic since the last "
    "VACUUM. Turn autovacuum on, or VACUUM the tasks and outbox tables on a schedule "
    '(docs/operations.md, "PostgreSQL upkeep").'
)


def autovacuum_verdict(autovacuum: str, track_counts: str) -> str | None:
    """What to tell the operator about PostgreSQL's settings, or None when autovacuum
    runs (it needs both: without ``track_counts`` it never finds a table to vacuum)."""
    off = [
        f"{name} = {value}"
        for name, value in (("autovacuum", autovacuum), ("track_counts", track_counts))
        if value != "on"
    ]
    return AUTOVACUUM_OFF.format(setting=", ".join(off)) if off else None


def autovacuum_problem(url: str) -> str | None:
    """Say why the database will not clean up after the hub's churn, or None when it
    will (or it is SQLite, which frees its pages itself). Why it matters: after the
    same 30,000 tasks, ``docs/benchmarks.md`` measured 422.3 blocks touched per message
    with autovacuum off against 178.8 with it on."""
    if make_url(url).get_backend_name() != "postgresql":
        return None
    engine = create_engine_for(url)
    try:
        with engine.connect() as conn:
            autovacuum, track_counts = conn.execute(
                text("SELECT current_setting('autovacuum'), current_setting('track_counts')")
            ).one()
    except Exception:  # unreachable or refused: database_revision_problem says so
        return None
    finally:
        engine.dispose()
    return autovacuum_verdict(str(autovacuum), str(track_counts))


def _current_revision(conn: Connection) -> str | None:
    """The revision Alembic recorded, or None on a database it never migrated."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    rows = conn.execute(text("SELECT version_num FROM alembic_version")).all()
    return str(rows[0][0]) if len(rows) == 1 else None
