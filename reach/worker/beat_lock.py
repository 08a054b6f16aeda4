"""One active beat: a Celery scheduler that sends periodic tasks only while it holds a lease.

Any number of ``reach beat`` processes may run (two started at once, a restarted one, one
per machine); the one holding the ``beat`` lease in the hub's database sends, the others
stand by and ask again every ``beat.lock_poll_s``. The holder renews every
``beat.lock_renew_s``; if it dies, its lease lapses after ``beat.lock_lease_s`` and a
standby takes over within ``lock_lease_s + lock_poll_s``. A holder that cannot renew (the
database is down, the process was paused) stops sending when its own lease would have run
out, measured from before it asked, so it stops no later than a standby may take over.

Compared with celery-redbeat, which keeps a Redis lock (extended on each tick, blocking
acquire at start-up): the lease lives in the hub's own database, so it works with every
broker the hub supports, the embedded one included, and a standby beat keeps running
(and logging who holds the lock) instead of blocking in start-up.

The schedule itself stays in memory (Celery's base ``Scheduler``), not in a shelve file:
beats sharing a ``REACH_HOME`` would otherwise share one file, and every entry is a
periodic sweep that is safe to run as soon as a beat becomes active.
"""

from __future__ import annotations

import math
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.beat import Scheduler
from celery.utils.log import get_logger

from reach.core.ops.lease import LeaseDecision, Outcome
from reach.errors import HubUnavailable
from reach.hub.settings import Settings
from reach.hub.storage import create_engine_for
from reach.hub.storage.leases import LeaseStore
from reach.worker.consumer import RECONNECT_INTERVAL_S

logger = get_logger(__name__)

LEASE_NAME = "beat"
CONFIG_KEY = "reach_beat_lock"  # the app's conf entry the factory fills (BeatLockConfig)


@dataclass(frozen=True)
class BeatLockConfig:
    """What the scheduler needs, taken from Settings by the Celery app factory."""

    database_url: str
    lease_s: float
    renew_s: float
    poll_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> BeatLockConfig:
        beat = settings.beat
        return cls(
            database_url=settings.storage.resolved_database_url,
            lease_s=beat.lock_lease_s,
            renew_s=beat.lock_renew_s,
            poll_s=beat.lock_poll_s,
        )

    def __repr__(self) -> str:  # the URL may carry a password; conf dumps use repr
        return f"BeatLockConfig(lease_s={self.lease_s}, poll_s={self.poll_s})"


def holder_id() -> str:
    """Readable in logs (which host, which process) and unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class LeasedScheduler(Scheduler):  # type: ignore[misc]  # celery ships no type hints
    """Celery's in-memory scheduler, sending only while this beat holds the beat lease."""

    def __init__(self, app: Celery, *args: Any, **kwargs: Any) -> None:
        config = app.conf.get(CONFIG_KEY)
        if not isinstance(config, BeatLockConfig):
            raise RuntimeError(f"{CONFIG_KEY} is not set: build the app with create_celery")
        self.lock_config = config
        self.holder = holder_id()
        self._store: LeaseStore | None = None  # built on the first tick (lazy instances exist)
        self._active_until = -math.inf  # monotonic time this beat may send until
        self._next_check = -math.inf
        self._state: str | None = None  # "active" / "standby", for logging the changes
        self._seen_holder: str | None = None
        super().__init__(app, *args, **kwargs)

    @property
    def active(self) -> bool:
        return time.monotonic() < self._active_until

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if time.monotonic() >= self._next_check:
            self._check()
        until_check = max(0.0, self._next_check - time.monotonic())
        if not self.active:
            return until_check
        return min(float(super().tick(*args, **kwargs)), until_check)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        # Checked again at the send itself: a beat paused between tick's check and here
        # (SIGSTOP, a frozen VM) may have been replaced meanwhile.
        if not self.active:
            logger.info("beat %s: lease lapsed, %s not sent", self.holder, entry.name)
            return
        super().apply_entry(entry, producer=producer)
        self._reconnect_if_broken(producer)

    def _ensure_connected(self) -> Any:
        """Connect with the worker's flat schedule: one try a second.

        Celery's scheduler connects through kombu's growing schedule (2, 4, 6 … 30 s), so
        after a broker restart beat sent nothing -- no outbox relay for the attempts the
        API could not publish meanwhile -- for up to 30 s with the broker long back
        (measured 6-9 s after a 15 s RabbitMQ outage in tests/faults/test_rabbitmq.py).
        """

        def _error_handler(exc: Exception, interval: float) -> None:
            logger.error("beat: Connection error: %s. Trying again in %s seconds...", exc, interval)

        return self.connection.ensure_connection(
            _error_handler,
            self.app.conf.broker_connection_max_retries,
            interval_start=0,
            interval_step=RECONNECT_INTERVAL_S,
            interval_max=RECONNECT_INTERVAL_S,
        )

    def _reconnect_if_broken(self, producer: Any) -> None:
        """Drop a producer whose channel is gone, so the next tick connects afresh.

        Celery's scheduler keeps one producer (and connection) for good: once its channel
        is closed under it -- seen with the embedded broker when API, worker and beat open
        it at the same moment -- every later send fails with "channel disconnected" and
        the hub's periodic scans (probes, outbox relay) stop for good while beat runs on.
        """
        channel = getattr(
            producer if producer is not None else self.__dict__.get("producer"), "channel", None
        )
        if channel is None or not (
            getattr(channel, "closed", False) or getattr(channel, "connection", True) is None
        ):
            return
        logger.warning("beat %s: the broker channel closed; reconnecting", self.holder)
        for name in ("producer", "connection"):
            stale = self.__dict__.pop(name, None)
            if stale is None:
                continue
            try:
                stale.release()
            except Exception:  # already broken: nothing left to release
                logger.debug("beat %s: releasing a stale %s failed", self.holder, name)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._release()

    def _lease(self) -> LeaseStore:
        if self._store is None:
            config = self.lock_config
            extra: dict[str, Any] = {}
            if config.database_url.startswith("postgresql"):  # an unreachable server: fail fast
                extra["connect_args"] = {"connect_timeout": max(1, math.ceil(config.renew_s))}
            engine = create_engine_for(config.database_url, pool_size=1, max_overflow=1, **extra)
            self._store = LeaseStore(engine, LEASE_NAME, self.holder, config.lease_s)
        return self._store

    def _check(self) -> None:
        config = self.lock_config
        started = time.monotonic()
        try:
            decision = self._lease().claim()
        except HubUnavailable as exc:
            self._next_check = started + min(config.poll_s, config.renew_s)
            logger.warning(
                "beat %s: cannot confirm the lock (%s); %s",
                self.holder,
                exc.detail,
                "sending until the lease lapses" if self.active else "standing by",
            )
            return
        if decision.ours:
            self._active_until = started + config.lease_s
            self._next_check = started + config.renew_s
            self._became_active(decision)
        else:
            self._active_until = -math.inf
            self._next_check = started + config.poll_s
            self._became_standby(decision)

    def _became_active(self, decision: LeaseDecision) -> None:
        if self._state == "active" and decision.outcome is Outcome.RENEWED:
            return
        before = decision.previous
        since = f" (took over from {before})" if before not in (None, self.holder) else ""
        logger.info("beat active: %s holds the lock%s", self.holder, since)
        self._state, self._seen_holder = "active", self.holder

    def _became_standby(self, decision: LeaseDecision) -> None:
        holder = decision.lease.holder
        if self._state == "standby" and holder == self._seen_holder:
            return
        lost = self._state == "active"
        log = logger.warning if lost else logger.info
        log(
            "beat standby: lock held by %s%s; %s waits",
            holder,
            " (this beat lost it)" if lost else "",
            self.holder,
        )
        self._state, self._seen_holder = "standby", holder

    def _release(self) -> None:
        store, self._store = self._store, None  # close() may be called more than once
        if store is None:
            return
        try:
            if store.release():
                logger.info("beat %s released the lock", self.holder)
        except HubUnavailable as exc:
            logger.warning("beat %s could not release the lock (%s)", self.holder, exc.detail)
        finally:
            self._active_until = -math.inf
            store.engine.dispose()
