"""The agent-side dedup guard: a redelivered task gets the stored answer, not a second run.

At-least-once delivery means an agent can see the same ``task_id`` twice (a retry after a
lost answer, a redelivery after a worker crash). ``task_id`` is the dedup key — it stays
the same across attempts; ``attempt_seq`` is only the hub's fencing token.

The memory is bounded three ways (an agent runs for months): at most ``capacity``
answers, at most ``max_bytes`` of them in total (measured as their JSON), and none older
than ``ttl`` seconds — the hub's retries and redeliveries of one task are over within
minutes, so a day covers them with room to spare. Least recently used answers go first.

`IdempotencyGuard` keeps answers in memory: they die with the process, so an agent
SIGKILLed after answering runs a redelivered task again. `SqliteIdempotencyGuard` keeps
them in a SQLite file (``Agent(..., dedup_store="dedup.sqlite")``), with the same bounds,
so an agent restarted on the same file answers a redelivery from it.

What the guard cannot cover: it records the answer when the handler returns, so a process
killed after the handler's side effect and before that record runs the handler again on
redelivery. A handler closes that window by writing its side effect and the answer in one
SQLite transaction (`SqliteIdempotencyGuard.atomic`), or by making the effect itself
idempotent on ``task_id``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from reach.core.delivery import envelope

log = logging.getLogger("reach.sdk.dedup")

DEFAULT_CAPACITY = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TTL_S = 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Begin:
    """What to do with an arriving task: run it, answer from memory, or it is running now."""

    action: str  # "run" | "done" | "running"
    answer: Any = None
    running: threading.Event | None = None


def answer_size(answer: Any) -> int:
    """Bytes an answer weighs in the guard: its JSON, as the agent sends it."""
    return max(1, len(json.dumps(answer, default=str, separators=(",", ":")).encode()))


class IdempotencyGuard:
    """In-memory answers; the storage hooks (``_lookup``, ``_remember``, ``_forget``,
    ``_count``, ``_bytes``) are what a persistent guard replaces, always called under
    ``_lock``."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl: float = DEFAULT_TTL_S,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1 or max_bytes < 1 or ttl <= 0:
            raise ValueError("dedup capacity, max_bytes and ttl must be positive")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._lock = threading.RLock()
        self._done: TTLCache[str, Any] = TTLCache(
            maxsize=max_bytes, ttl=ttl, timer=timer, getsizeof=answer_size
        )
        self._running: dict[str, threading.Event] = {}

    def begin(self, task_id: str) -> Begin:
        with self._lock:
            found, answer = self._lookup(task_id)
            if found:
                return Begin("done", answer)
            if task_id in self._running:
                return Begin("running", running=self._running[task_id])
            self._running[task_id] = threading.Event()
            return Begin("run")

    def finish(self, task_id: str, answer: Any, remember: bool) -> None:
        """End a run; remember the answer only if it is final. A transient failure
        (``remember=False``) also drops an answer kept before -- the 202 of a handler that
        reported the failure later -- so the hub's retry runs the task again."""
        with self._lock:
            event = self._running.pop(task_id, None)
            if remember:
                self._remember_bounded(task_id, answer)
            else:
                self._forget(task_id)
        if event is not None:
            event.set()

    def _remember_bounded(self, task_id: str, answer: Any) -> None:
        size = answer_size(answer)
        if size > self.max_bytes:  # alone larger than the budget: a redelivery runs it again
            log.warning(
                "answer of task %s (%d bytes) exceeds the dedup guard's %d bytes: not kept",
                task_id,
                size,
                self.max_bytes,
            )
            return
        self._remember(task_id, answer, size)

    def answer_of(self, task_id: str) -> Any:
        with self._lock:
            return self._lookup(task_id)[1]

    def __len__(self) -> int:
        with self._lock:
            return self._count()

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return self._bytes()

    # -- storage (in memory) ------------------------------------------------------------
    def _lookup(self, task_id: str) -> tuple[bool, Any]:
        if task_id in self._done:
            return True, self._done[task_id]  # a read refreshes its LRU place
        return False, None

    def _remember(self, task_id: str, answer: Any, size: int) -> None:
        self._done.pop(task_id, None)  # re-inserted as the most recent
        self._done[task_id] = answer  # evicts the least recent past max_bytes
        while len(self._done) > self.capacity:
            self._done.popitem()

    def _forget(self, task_id: str) -> None:
        self._done.pop(task_id, None)

    def _count(self) -> int:
        return len(self._done)

    def _bytes(self) -> int:
        return int(self._done.currsize)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS reach_dedup (
    task_id   TEXT PRIMARY KEY,
    answer    TEXT NOT NULL,
    is_tuple  INTEGER NOT NULL,
    size      INTEGER NOT NULL,
    stored_at REAL NOT NULL,
    used_at   REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS reach_dedup_used ON reach_dedup (used_at);
CREATE INDEX IF NOT EXISTS reach_dedup_stored ON reach_dedup (stored_at);
"""


class SqliteIdempotencyGuard(IdempotencyGuard):
    """The guard with its answers in a SQLite file: they survive a restart of the agent.

    Same bounds as in memory (``capacity``, ``max_bytes``, ``ttl`` from when the answer
    was stored, least recently used first), measured on a wall clock so a restart keeps
    ages. WAL, ``synchronous=NORMAL``: a committed answer survives the process being
    killed (not necessarily a power cut). Runs in progress stay in memory — they die with
    the process. One agent process per file: two processes sharing one would not see each
    other's runs in progress and could both run a task.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity: int = DEFAULT_CAPACITY,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl: float = DEFAULT_TTL_S,
        timer: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(capacity, max_bytes, ttl, timer)
        self.path = os.fspath(path)
        self._timer = timer
        # One connection for every thread, serialised by the guard's lock.
        self._db = sqlite3.connect(
            self.path, timeout=30.0, check_same_thread=False, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def atomic(self, task_id: str) -> Iterator[Atomic]:
        """One transaction for a handler's own writes and its answer (closes the window
        between side effect and record, for effects kept in this file)::

            with agent.dedup.atomic(task_id) as tx:
                tx.db.execute("INSERT INTO orders ...")   # the handler's own table
                tx.answer = {"order": 42}                # what the handler returns
            return tx.answer

        Committed together, or neither: a redelivery after a kill finds both or runs
        again from scratch. The answer is stored as a plain 200 reply. The guard is held
        meanwhile (other deliveries wait at ``begin``): keep the transaction short.
        """
        tx = Atomic(self._db)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield tx
                if tx.answer is not _UNSET:
                    self._remember_bounded(task_id, (200, envelope.wrap(tx.answer)))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    # -- storage (SQLite) ---------------------------------------------------------------
    def _lookup(self, task_id: str) -> tuple[bool, Any]:
        now = self._timer()
        row = self._db.execute(
            "SELECT answer, is_tuple FROM reach_dedup WHERE task_id = ? AND stored_at > ?",
            (task_id, now - self.ttl),
        ).fetchone()
        if row is None:
            return False, None
        self._db.execute("UPDATE reach_dedup SET used_at = ? WHERE task_id = ?", (now, task_id))
        answer = json.loads(row[0])
        return True, tuple(answer) if row[1] else answer

    def _remember(self, task_id: str, answer: Any, size: int) -> None:
        now = self._timer()
        encoded = json.dumps(answer, default=str, separators=(",", ":"))
        with self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO reach_dedup VALUES (?, ?, ?, ?, ?, ?)",
                (task_id, encoded, int(isinstance(answer, tuple)), size, now, now),
            )
            self._evict(now)

    def _forget(self, task_id: str) -> None:
        self._db.execute("DELETE FROM reach_dedup WHERE task_id = ?", (task_id,))

    def _evict(self, now: float) -> None:
        self._db.execute("DELETE FROM reach_dedup WHERE stored_at <= ?", (now - self.ttl,))
        count, held = self._db.execute(
            "SELECT count(*), coalesce(sum(size), 0) FROM reach_dedup"
        ).fetchone()
        while count > self.capacity or held > self.max_bytes:
            task_id, size = self._db.execute(
                "SELECT task_id, size FROM reach_dedup ORDER BY used_at, rowid LIMIT 1"
            ).fetchone()
            self._db.execute("DELETE FROM reach_dedup WHERE task_id = ?", (task_id,))
            count, held = count - 1, held - size

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        if self._db.in_transaction:  # inside `atomic`: its transaction holds both
            yield
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def _count(self) -> int:
        return int(
            self._db.execute(
                "SELECT count(*) FROM reach_dedup WHERE stored_at > ?",
                (self._timer() - self.ttl,),
            ).fetchone()[0]
        )

    def _bytes(self) -> int:
        return int(
            self._db.execute(
                "SELECT coalesce(sum(size), 0) FROM reach_dedup WHERE stored_at > ?",
                (self._timer() - self.ttl,),
            ).fetchone()[0]
        )


_UNSET: Any = object()


class Atomic:
    """The handle `SqliteIdempotencyGuard.atomic` yields: its connection and the answer."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.answer: Any = _UNSET
