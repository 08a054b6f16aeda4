"""A dedup guard shared by an agent's replicas, in PostgreSQL or Redis (by URL).

The hub's retries deliberately change instance: a task whose first attempt timed out at
replica A (its side effect done, its answer not yet given) is retried at replica B. A
guard that lives in one process (memory, or one SQLite file) cannot know A ran it, and B
runs it again -- seed 003's pitfall 6.3, for replicated agents. Give every replica the
same store (``Agent(..., dedup_store="redis://..." or "postgresql://...")``) and a task
runs once across them:

* **claim**: the first replica to begin a task claims it in the store (a Redis ``SET NX``,
  a PostgreSQL ``INSERT ... ON CONFLICT``), with a lease its process renews while the
  handler runs (every third of ``lease_s``);
* **a copy elsewhere** (a retry at another replica while the first still runs) waits for
  the first one's answer in the store, polling, as long as the delivery allows, and
  answers with it;
* **done**: the answer is stored for ``ttl`` (a day), and any replica answers a later
  redelivery from it; a transient failure releases the claim, so the retry runs again;
* **a replica that died** mid-run stops renewing: its claim lapses after ``lease_s``
  and the next delivery runs the task (at-least-once, as with a local guard).

What it cannot cover is the same as a local guard: a process killed between the side
effect and the stored answer runs again on the next delivery once its claim lapsed.
Bounds: answers expire after ``ttl``; there is no count or byte budget (the store's own
memory or disk is the bound).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from reach.sdk.dedup import DEFAULT_TTL_S, Begin, IdempotencyGuard, answer_size

log = logging.getLogger("reach.sdk.dedup")

DEFAULT_LEASE_S = 60.0
POLL_S = 0.1
RUNNING, DONE = "running", "done"


def _encode(answer: Any) -> str:
    return json.dumps(
        {"tuple": isinstance(answer, tuple), "answer": answer},
        default=str,
        separators=(",", ":"),
    )


def _decode(text: str) -> Any:
    stored = json.loads(text)
    answer = stored["answer"]
    return tuple(answer) if stored["tuple"] else answer


class SharedStore(ABC):
    """Where replicas keep their claims and answers; every call is atomic in the store."""

    @abstractmethod
    def claim(self, task_id: str, owner: str, lease_s: float, now: float) -> tuple[str, Any]:
        """``("run", None)`` if ``owner`` now holds the task (no claim, or a lapsed one);
        else ``("done", answer)`` or ``("running", None)``."""

    @abstractmethod
    def renew(self, task_ids: list[str], owner: str, lease_s: float, now: float) -> None:
        """Extend ``owner``'s claims on ``task_ids``."""

    @abstractmethod
    def done(self, task_id: str, answer_text: str, ttl: float, now: float) -> None:
        """Store the answer (replacing the claim)."""

    @abstractmethod
    def release(self, task_id: str, owner: str) -> None:
        """Drop ``owner``'s claim or answer (a transient failure: the retry runs again)."""

    @abstractmethod
    def answer(self, task_id: str, now: float) -> tuple[str, Any] | None:
        """``(state, answer)`` of the task, or None when the store holds nothing for it."""

    def close(self) -> None:  # noqa: B027 -- a store without connections has nothing to do
        """Close the store's connections."""


class RedisStore(SharedStore):
    """One key per task, ``reach:dedup:<task_id>``; claims expire by themselves."""

    _RENEW = """
    local v = redis.call('GET', KEYS[1])
    if v and cjson.decode(v)['owner'] == ARGV[1] then
      return redis.call('PEXPIRE', KEYS[1], ARGV[2])
    end
    return 0
    """
    _RELEASE = """
    local v = redis.call('GET', KEYS[1])
    if v and cjson.decode(v)['owner'] == ARGV[1] then return redis.call('DEL', KEYS[1]) end
    return 0
    """

    def __init__(self, url: str) -> None:
        try:
            import redis
        except ImportError as exc:  # the SDK alone does not need it
            raise ValueError(
                "a redis:// dedup_store needs the redis package: pip install 'agent-reach[dedup]'"
            ) from exc
        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._renew = self._redis.register_script(self._RENEW)
        self._release = self._redis.register_script(self._RELEASE)

    @staticmethod
    def _key(task_id: str) -> str:
        return f"reach:dedup:{task_id}"

    def claim(self, task_id: str, owner: str, lease_s: float, now: float) -> tuple[str, Any]:
        value = json.dumps({"state": RUNNING, "owner": owner})
        if self._redis.set(self._key(task_id), value, nx=True, px=int(lease_s * 1000)):
            return "run", None
        found = self.answer(task_id, now)
        if found is None:  # it lapsed or was released just now: try once more
            if self._redis.set(self._key(task_id), value, nx=True, px=int(lease_s * 1000)):
                return "run", None
            found = self.answer(task_id, now) or (RUNNING, None)
        return found

    def renew(self, task_ids: list[str], owner: str, lease_s: float, now: float) -> None:
        for task_id in task_ids:
            self._renew(keys=[self._key(task_id)], args=[owner, int(lease_s * 1000)])

    def done(self, task_id: str, answer_text: str, ttl: float, now: float) -> None:
        value = json.dumps({"state": DONE, "owner": "", "answer": answer_text})
        self._redis.set(self._key(task_id), value, px=int(ttl * 1000))

    def release(self, task_id: str, owner: str) -> None:
        self._release(keys=[self._key(task_id)], args=[owner])

    def answer(self, task_id: str, now: float) -> tuple[str, Any] | None:
        raw = self._redis.get(self._key(task_id))
        if raw is None:
            return None
        stored = json.loads(raw)
        if stored["state"] == DONE:
            return DONE, _decode(stored["answer"])
        return RUNNING, None

    def close(self) -> None:
        self._redis.close()


_PG_SCHEMA = """
CREATE TABLE IF NOT EXISTS reach_dedup_shared (
    task_id    TEXT PRIMARY KEY,
    state      TEXT NOT NULL,
    owner      TEXT NOT NULL,
    answer     TEXT,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS reach_dedup_shared_expires ON reach_dedup_shared (expires_at);
"""
# Takes a task that has no row, or whose row lapsed (a claim not renewed, an old answer).
_PG_CLAIM = """
INSERT INTO reach_dedup_shared (task_id, state, owner, answer, expires_at)
VALUES (%(task_id)s, 'running', %(owner)s, NULL, %(until)s)
ON CONFLICT (task_id) DO UPDATE
   SET state = 'running', owner = EXCLUDED.owner, answer = NULL, expires_at = EXCLUDED.expires_at
 WHERE reach_dedup_shared.expires_at < %(now)s
RETURNING owner
"""


class PostgresStore(SharedStore):
    """A table of its own (``reach_dedup_shared``, made if missing), on one autocommit
    connection per guard, serialised by a lock; lapsed rows are deleted now and then."""

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise ValueError(
                "a postgresql:// dedup_store needs psycopg: pip install 'agent-reach[dedup]'"
            ) from exc
        self._lock = threading.Lock()
        dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
        self._db = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
        self._db.execute(_PG_SCHEMA)
        self._swept = 0.0

    def claim(self, task_id: str, owner: str, lease_s: float, now: float) -> tuple[str, Any]:
        with self._lock:
            row = self._db.execute(
                _PG_CLAIM, {"task_id": task_id, "owner": owner, "until": now + lease_s, "now": now}
            ).fetchone()
        if row is not None and row[0] == owner:
            return "run", None
        return self.answer(task_id, now) or (RUNNING, None)

    def renew(self, task_ids: list[str], owner: str, lease_s: float, now: float) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE reach_dedup_shared SET expires_at = %s "
                "WHERE task_id = ANY(%s) AND owner = %s AND state = 'running'",
                (now + lease_s, task_ids, owner),
            )

    def done(self, task_id: str, answer_text: str, ttl: float, now: float) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO reach_dedup_shared (task_id, state, owner, answer, expires_at) "
                "VALUES (%s, 'done', '', %s, %s) ON CONFLICT (task_id) DO UPDATE "
                "SET state = 'done', owner = '', answer = EXCLUDED.answer, "
                "expires_at = EXCLUDED.expires_at",
                (task_id, answer_text, now + ttl),
            )
            if now - self._swept > 60:  # lapsed rows, now and then: the table stays bounded
                self._swept = now
                self._db.execute("DELETE FROM reach_dedup_shared WHERE expires_at < %s", (now,))

    def release(self, task_id: str, owner: str) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM reach_dedup_shared WHERE task_id = %s AND (owner = %s OR "
                "state = 'done')",
                (task_id, owner),
            )

    def answer(self, task_id: str, now: float) -> tuple[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT state, answer FROM reach_dedup_shared "
                "WHERE task_id = %s AND expires_at >= %s",
                (task_id, now),
            ).fetchone()
        if row is None:
            return None
        return (DONE, _decode(row[1])) if row[0] == DONE else (RUNNING, None)

    def close(self) -> None:
        with self._lock:
            self._db.close()


def store_for(url: str) -> SharedStore:
    """The store a ``dedup_store`` URL names (``redis://``, ``rediss://``, ``postgresql://``)."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStore(url)
    if url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        return PostgresStore(url)
    raise ValueError(
        f"no shared dedup store for {url.split('://')[0]!r}: redis:// or postgresql://"
    )


def is_shared_url(value: object) -> bool:
    return isinstance(value, str) and "://" in value


class _RemoteRun:
    """What a copy of a task running at another replica waits on: set once the store
    holds its answer, or no longer holds its claim (it failed, or its replica died)."""

    def __init__(self, store: SharedStore, task_id: str, timer: Callable[[], float]) -> None:
        self._store, self._task_id, self._timer = store, task_id, timer

    def wait(self, timeout: float | None = None) -> bool:
        deadline = time.monotonic() + (timeout if timeout is not None else 30.0)
        while True:
            found = self._store.answer(self._task_id, self._timer())
            if found is None or found[0] == DONE:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)


class SharedIdempotencyGuard(IdempotencyGuard):
    """The guard with claims and answers in a store every replica of the agent uses."""

    def __init__(
        self,
        url: str,
        ttl: float = DEFAULT_TTL_S,
        lease_s: float = DEFAULT_LEASE_S,
        timer: Callable[[], float] = time.time,
        store: SharedStore | None = None,
    ) -> None:
        super().__init__(ttl=ttl)
        if lease_s <= 0:
            raise ValueError("dedup lease_s must be positive")
        self.url = url
        self.lease_s = lease_s
        self._timer = timer
        self._store = store or store_for(url)
        self._owner = f"{uuid.uuid4().hex}"  # this process's claims
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_loop, daemon=True, name="dedup-lease")
        self._renewer.start()

    def begin(self, task_id: str) -> Begin:
        with self._lock:
            if task_id in self._running:  # a copy in this process: wait for it locally
                return Begin("running", running=self._running[task_id])
            action, answer = self._store.claim(task_id, self._owner, self.lease_s, self._timer())
            if action == "run":
                self._running[task_id] = threading.Event()
                return Begin("run")
            if action == DONE:
                return Begin("done", answer)
            remote = _RemoteRun(self._store, task_id, self._timer)
            return Begin("running", running=remote)  # type: ignore[arg-type]

    def finish(self, task_id: str, answer: Any, remember: bool) -> None:
        with self._lock:
            event = self._running.pop(task_id, None)
            if remember and answer_size(answer) <= self.max_bytes:
                self._store.done(task_id, _encode(answer), self.ttl, self._timer())
            else:
                self._store.release(task_id, self._owner)
        if event is not None:
            event.set()

    def answer_of(self, task_id: str) -> Any:
        found = self._store.answer(task_id, self._timer())
        return found[1] if found is not None and found[0] == DONE else None

    def close(self) -> None:
        self._stop.set()
        self._renewer.join(timeout=2)
        self._store.close()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            with self._lock:
                running = list(self._running)
            if running:
                try:
                    self._store.renew(running, self._owner, self.lease_s, self._timer())
                except Exception as exc:  # a store outage: the claims may lapse meanwhile
                    log.warning("dedup: renewing %d claims failed: %s", len(running), exc)

    # counts of what this process runs (the store holds the rest, bounded by ttl)
    def _count(self) -> int:
        return len(self._running)

    def _bytes(self) -> int:
        return 0
