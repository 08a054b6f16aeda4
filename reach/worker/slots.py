"""Each worker reports its places to the store, so background work knows its share.

Background deliveries may hold ``router.background_share`` of the hub's exchange places
while online work waits (``reach.hub.flow.priority``); the hub's places are what the running
workers report: each pool process keeps up to ``exchanges.max_in_flight`` exchanges in
flight (``reach.hub.delivery.exchanger``). A worker's main process reports them when it is ready and
every ``HEARTBEAT_S`` after, from a daemon thread with a connection of its own (no pool:
the prefork children it forks later must not inherit an open database connection), and
withdraws it on shutdown. A worker killed without a shutdown stops counting after
``SLOTS_TTL_S``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from reach.hub.flow.priority import HEARTBEAT_S, forget_slots, record_slots
from reach.hub.storage import create_engine_for, session_factory

log = logging.getLogger("reach.worker.slots")


class SlotReporter:
    """Reports ``slots`` for ``worker`` (its node name) until stopped."""

    def __init__(
        self, database_url: str, worker: str, slots: int, interval: float = HEARTBEAT_S
    ) -> None:
        self.worker = worker
        self.slots = slots
        self.interval = interval
        self._engine = create_engine_for(database_url, poolclass=NullPool)
        self._sessions = session_factory(self._engine)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self) -> bool:
        """One report; a database failure is logged and tried again next time."""
        try:
            with self._sessions.begin() as session:
                record_slots(session, self.worker, self.slots, time.time())
        except SQLAlchemyError as exc:
            log.warning("worker slots not reported (next try in %.0fs): %s", self.interval, exc)
            return False
        return True

    def start(self) -> None:
        self.report()
        self._thread = threading.Thread(target=self._run, name="reach-slots", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            with self._sessions.begin() as session:
                forget_slots(session, self.worker)
        except SQLAlchemyError as exc:
            log.warning("worker slots not withdrawn (they lapse on their own): %s", exc)
        self._engine.dispose()


def slots_of(consumer: Any) -> int:
    """A ready worker's slots: its pool's size (prefork children, threads; solo: 1)."""
    pool = getattr(consumer, "pool", None)
    limit = getattr(pool, "limit", None)
    if isinstance(limit, int) and limit > 0:
        return limit
    controller = getattr(consumer, "controller", None)
    return max(1, int(getattr(controller, "concurrency", 1) or 1))
