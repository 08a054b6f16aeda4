"""Hub-wide sliding-window counts: every API and worker process adds to the same windows.

Flow control decides on what the whole hub sees, not one process: a retry budget or a
circuit breaker counted per process needs N processes x the evidence to act (and each
prefork child is a process). The counts live in the store's ``flow_counts`` table, one
row per (name, key, second), so they work on SQLite and PostgreSQL alike and survive a
restart.

Writing a row per request would put a hot row on the delivery path, so each process
buffers its increments and a daemon thread of its own flushes them every ``flush_every``
seconds (one short transaction of upserts). Never the caller's thread: a caller may hold
a transaction open (a delivery's claim does), and on SQLite a second writer in the same
thread would wait for a lock its own thread holds. A reader sees the store's sums
(cached ``read_ttl`` seconds, read in a read-only transaction that never takes SQLite's
write lock) plus its own increments not yet committed: the buffered ones and those a flush
is writing. Another process's latest second may be missing from a total: a lag of about a
second, which every consumer here tolerates (budgets and breakers act on windows of 10 s
and more). This process's own counts are exact: a loop guard tips on the one reach that
crosses its threshold.

A flush's commit and a read race: the read's snapshot may or may not hold the rows the
flush is committing. Each flush moves through writing -> committing -> done (a new
generation), and a read that overlapped a commit is not trusted: read again (or, after a
few tries, count the store's sum without the flush's increments -- a decision delayed,
never one made on doubled evidence) and never cached.

The counts are advisory: a database failure while flushing is logged and the
increments stay buffered (bounded), never raised into a delivery.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Iterable
from typing import Any

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from reach.hub.storage.models import FlowCountRow

log = logging.getLogger("reach.hub.flow.shared_counts")

_Bucket = tuple[str, str, int]  # (name, key, second)
MAX_PENDING = 10_000  # buffered (name, key, second) cells kept through a database outage
READ_TRIES = 3  # reads of one total that may each overlap a flush's commit
KEY_MAX = 300  # the ``flow_counts.key`` column


def bucket_of(now: float) -> int:
    """The one-second bucket ``now`` counts into."""
    return math.floor(now)


def window_start(now: float, window_s: float) -> int:
    """The oldest bucket inside a window of ``window_s`` seconds ending at ``now``."""
    return bucket_of(now) - max(1, math.ceil(window_s)) + 1


class SharedCounts:
    """This process's handle on the hub-wide windows (one per process, thread-safe)."""

    def __init__(
        self,
        db: sessionmaker[Session],
        *,
        read_db: sessionmaker[Session] | None = None,
        flush_every: float = 1.0,
        read_ttl: float = 0.5,
        keep_s: int = 3600,
        background: bool = True,
    ) -> None:
        """``background=False`` (tests with a controlled clock): nothing flushes on its
        own; ``flush`` writes when called."""
        self._sessions = db
        self._read_sessions = read_db or db
        self._background = background
        self._flusher_pid: int | None = None
        self._stopped = threading.Event()
        self._last_now = 0.0
        self._flush_every = flush_every
        self._read_ttl = read_ttl
        self._keep_s = keep_s
        self._pending: dict[_Bucket, int] = {}
        self._flushing: dict[_Bucket, int] = {}  # written by the flush in progress
        self._committing = False  # that flush's rows may be visible to a read
        self._generation = 0  # flushes ended (committed or failed)
        self._cache: dict[tuple[str, str, int], tuple[float, int]] = {}
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._flushed_at = -math.inf
        self._pruned_at = -math.inf

    @property
    def read_db(self) -> sessionmaker[Session]:
        """Read-only transactions on the same store (never SQLite's write lock)."""
        return self._read_sessions

    def add(self, name: str, key: str, now: float, n: int = 1) -> None:
        """Count ``n`` at ``now`` (buffered: the process's flusher writes it)."""
        cell = (name, key[:KEY_MAX], bucket_of(now))
        with self._lock:
            if cell in self._pending or len(self._pending) < MAX_PENDING:
                self._pending[cell] = self._pending.get(cell, 0) + n
            self._last_now = max(self._last_now, now)
        if self._background and self._flusher_pid != os.getpid():
            self._start_flusher()

    def _start_flusher(self) -> None:
        """One flushing thread per process (a forked child starts its own)."""
        with self._lock:
            if self._flusher_pid == os.getpid():
                return
            self._flusher_pid = os.getpid()
        threading.Thread(target=self._flush_forever, name="reach-flow-counts", daemon=True).start()

    def close(self) -> None:
        """Stop the flusher after writing what is buffered."""
        self._stopped.set()
        with self._lock:
            now = self._last_now
        self.flush(now, force=True)

    def _flush_forever(self) -> None:
        while not self._stopped.wait(self._flush_every):
            with self._lock:
                now = self._last_now
            try:
                self.flush(now, force=True)
            except Exception:  # advisory counts: the thread must outlive anything
                log.exception("flow counts flush failed")

    def total(self, name: str, key: str, now: float, window_s: float) -> int:
        """The hub-wide count of ``(name, key)`` over the last ``window_s`` seconds."""
        return self.totals(name, [key], now, window_s)[key[:KEY_MAX]]

    def totals(self, name: str, keys: Iterable[str], now: float, window_s: float) -> dict[str, int]:
        """``total`` for several keys of one name, in at most one read (a few when a flush
        commits meanwhile)."""
        first = window_start(now, window_s)
        wanted = [k[:KEY_MAX] for k in keys]
        stored: dict[str, int] = {}
        missing: list[str] = []
        with self._lock:
            for key in wanted:
                hit = self._cache.get((name, key, first))
                if hit is not None and now - hit[0] < self._read_ttl:
                    stored[key] = hit[1]
                else:
                    missing.append(key)
        own_unwritten = True  # the stored sums exclude the flush in progress
        if missing:
            own_unwritten = self._read_missing(name, missing, first, now, stored)
        with self._lock:  # what this process counted and the store does not hold yet
            cells = [self._pending, self._flushing] if own_unwritten else [self._pending]
            for buffered in cells:
                for (n, key, second), count in buffered.items():
                    if n == name and key in stored and second >= first:
                        stored[key] += count
        return stored

    def _read_missing(
        self, name: str, keys: list[str], first: int, now: float, stored: dict[str, int]
    ) -> bool:
        """Read ``keys``' sums into ``stored``; whether they exclude the increments of the
        flush in progress (True for a read no commit overlapped: then it is cached)."""
        for _ in range(READ_TRIES):
            with self._lock:
                generation, committing = self._generation, self._committing
            read = self._read(name, keys, first)
            with self._lock:
                clean = not committing and not self._committing
                clean = clean and generation == self._generation
                if clean and len(self._cache) > MAX_PENDING:
                    self._cache.clear()
                for key in keys:
                    stored[key] = read.get(key, 0)
                    if clean:
                        self._cache[(name, key, first)] = (now, stored[key])
            if clean:
                return True
        # still overlapping: the last read may hold the flush's rows; a count delayed
        # beats a count doubled (a breaker opening on half its evidence)
        return False

    def flush(self, now: float, *, force: bool = False) -> None:
        """Write the buffered increments (when due, or ``force``) in a transaction of
        their own -- never call it inside another one; a failure keeps them. One flush at
        a time (the flusher thread and ``close`` may both call it)."""
        with self._flush_lock:
            self._flush_serialised(now, force)

    def _flush_serialised(self, now: float, force: bool) -> None:
        with self._lock:
            if not self._pending or (not force and now - self._flushed_at < self._flush_every):
                return
            pending, self._pending = self._pending, {}
            self._flushing = pending
            self._flushed_at = now
            prune = now - self._pruned_at >= 60
            if prune:
                self._pruned_at = now
        try:
            with self._sessions.begin() as session:
                _upsert(session, pending)
                if prune:
                    horizon = bucket_of(now) - self._keep_s
                    session.execute(delete(FlowCountRow).where(FlowCountRow.bucket < horizon))
                with self._lock:  # the commit follows as the block ends
                    self._committing = True
        except BaseException as exc:
            with self._lock:
                self._end_flush()
                for cell, count in pending.items():
                    if cell in self._pending or len(self._pending) < MAX_PENDING:
                        self._pending[cell] = self._pending.get(cell, 0) + count
            if not isinstance(exc, SQLAlchemyError):
                raise
            log.warning("flow counts not written (kept for the next flush): %s", exc)
            return
        with self._lock:  # a cached stored sum predates these rows: read it afresh
            self._end_flush()
            flushed = {(name, key) for name, key, _ in pending}
            self._cache = {k: v for k, v in self._cache.items() if (k[0], k[1]) not in flushed}

    def _end_flush(self) -> None:
        """(Under the lock.) The flush in progress is over: a read that overlapped it
        sees a new generation."""
        self._flushing = {}
        self._committing = False
        self._generation += 1

    def _read(self, name: str, keys: list[str], first: int) -> dict[str, int]:
        try:
            with self._read_sessions.begin() as session:
                rows = session.execute(
                    select(FlowCountRow.key, func.sum(FlowCountRow.count))
                    .where(FlowCountRow.name == name)
                    .where(FlowCountRow.key.in_(keys))
                    .where(FlowCountRow.bucket >= first)
                    .group_by(FlowCountRow.key)
                ).all()
        except SQLAlchemyError as exc:
            log.warning("flow counts not read (taken as zero): %s", exc)
            return {}
        return {key: int(total or 0) for key, total in rows}


def _upsert(session: Session, pending: dict[_Bucket, int]) -> None:
    """Add each cell's count to its row, creating it if needed: one prebuilt statement
    executed for all cells (building and compiling one per cell cost more than the write)."""
    rows = [
        {"b_name": name, "b_key": key, "b_bucket": second, "b_count": count}
        for (name, key, second), count in sorted(pending.items())  # one lock order everywhere
    ]
    if rows:
        session.execute(_UPSERT[session.get_bind().dialect.name == "postgresql"], rows)


def _upsert_statement(insert_: Any) -> Any:
    table = FlowCountRow.__table__
    stmt = insert_(table).values(
        name=bindparam("b_name"),
        key=bindparam("b_key"),
        bucket=bindparam("b_bucket"),
        count=bindparam("b_count"),
    )
    return stmt.on_conflict_do_update(
        index_elements=["name", "key", "bucket"],
        set_={"count": table.c.count + stmt.excluded.count},
    )


_UPSERT = (_upsert_statement(sqlite_insert), _upsert_statement(pg_insert))  # by "is postgres"
