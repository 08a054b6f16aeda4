"""The embedded broker: kombu's SQLAlchemy transport over SQLite, tuned for several processes.

kombu hands ``broker_transport_options`` straight to ``create_engine``, so the polling
interval (1 s by default, which would add up to a second to every hop) is set on the
transport class instead, and SQLite gets WAL and a busy timeout like the hub's own store.

kombu's virtual channels poll their queues round robin (``FairCycle``); here every poll
starts from the first queue consumed, so a worker started with ``reach.probe,reach,
reach.background`` takes a due probe sweep first and online work before background
(Redis: ``queue_order_strategy``).
"""

from __future__ import annotations

from queue import Empty
from typing import Any

from kombu.transport import sqlalchemy as kombu_sqla
from kombu.utils.scheduling import FairCycle
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError, OperationalError

POLLING_INTERVAL = 0.05
TABLE_RACE_TRIES = 5


class InOrder(FairCycle):
    """A cycle whose every poll starts from the first resource: earlier queues first."""

    def get(self, callback: Any, **kwargs: Any) -> Any:
        self.pos = 0
        return super().get(callback, **kwargs)  # type: ignore[no-untyped-call]


class Channel(kombu_sqla.Channel):
    def _reset_cycle(self) -> None:
        self._cycle = InOrder(  # type: ignore[no-untyped-call]
            self._get_and_deliver, self._active_queues, Empty
        )

    def _get_or_create(self, queue: str) -> Any:
        # kombu guards queue creation with a lock of its own process only; the API, the
        # worker and beat declare the same queues at start-up, and the loser of that race
        # must read the winner's row instead of crashing (a worker would stop for good).
        try:
            return super()._get_or_create(queue)  # type: ignore[no-untyped-call]
        except IntegrityError:
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()

    def _open(self) -> Any:
        # kombu creates its tables (create_all, which checks first) when a process first
        # opens the broker; the API, the worker and beat open a new embedded broker at
        # once, and the loser got "table kombu_queue already exists", which the worker
        # took for a lost broker connection. The winner made the table: open again.
        for _ in range(TABLE_RACE_TRIES - 1):
            try:
                return super()._open()  # type: ignore[no-untyped-call]
            except OperationalError as exc:
                if "already exists" not in str(exc):
                    raise
        return super()._open()  # type: ignore[no-untyped-call]

    def _engine_from_config(self) -> Any:
        engine = super()._engine_from_config()  # type: ignore[no-untyped-call]
        if engine.dialect.name == "sqlite":
            event.listen(engine, "connect", _sqlite_pragmas)
        return engine


class Transport(kombu_sqla.Transport):
    Channel = Channel
    polling_interval = POLLING_INTERVAL


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
