"""On SQLite, transactions that only read begin deferred: WAL lets them read while another
process holds the write lock, so long-poll readers never queue behind writers."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from sqlalchemy import func, select

from reach.hub.storage import create_engine_for, read_session_factory, session_factory
from reach.hub.storage.models import TaskRow


def test_reads_do_not_wait_for_a_writer_but_writes_do(
    sqlite_template: Path, tmp_path: Path
) -> None:
    path = tmp_path / "reach.db"
    path.write_bytes(sqlite_template.read_bytes())
    engine = create_engine_for(f"sqlite:///{path}")
    writer = sqlite3.connect(path, isolation_level=None, timeout=30)
    writer.execute("PRAGMA journal_mode=WAL")
    try:
        writer.execute("BEGIN IMMEDIATE")  # another process mid-write holds the lock

        started = time.monotonic()
        with read_session_factory(engine).begin() as session:
            assert session.scalar(select(func.count()).select_from(TaskRow)) == 0
        assert time.monotonic() - started < 1.0

        done = threading.Event()

        def write_transaction() -> None:
            with session_factory(engine).begin() as session:
                session.scalar(select(func.count()).select_from(TaskRow))
            done.set()

        thread = threading.Thread(target=write_transaction, daemon=True)
        thread.start()
        # a read-write transaction takes the lock at BEGIN: it waits for the writer
        assert not done.wait(0.5)
        writer.execute("COMMIT")
        assert done.wait(10)
        thread.join(5)
    finally:
        writer.close()
        engine.dispose()
