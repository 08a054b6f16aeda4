"""The beat lock on both stores: one holder at a time, take-over after a lapse, and a beat
that cannot confirm its lease stops sending when the lease would have run out."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, inspect, text

from reach.core.ops.lease import Lease, Outcome
from reach.errors import HubUnavailable
from reach.hub.clock import ManualClock
from reach.hub.settings import load_settings
from reach.hub.storage import create_engine_for
from reach.hub.storage.engine import downgrade_database, upgrade_database
from reach.hub.storage.leases import LeaseStore
from reach.hub.storage.models import LeaseRow
from reach.worker.beat_lock import LEASE_NAME, LeasedScheduler
from reach.worker.factory import create_celery


def test_one_holder_then_take_over_after_the_lease_lapses(engine: Engine) -> None:
    clock = ManualClock()
    a = LeaseStore(engine, "beat", "a", 15, clock)
    b = LeaseStore(engine, "beat", "b", 15, clock)

    assert a.claim().outcome is Outcome.ACQUIRED
    assert b.claim().outcome is Outcome.STANDBY
    clock.advance(10)
    assert a.claim().outcome is Outcome.RENEWED  # renewed from now: good for 15 s more
    clock.advance(14)
    standby = b.claim()
    assert (standby.outcome, standby.lease.holder) == (Outcome.STANDBY, "a")

    clock.advance(1.5)  # "a" died after its last renewal: its lease lapsed
    took = b.claim()
    assert (took.outcome, took.previous) == (Outcome.ACQUIRED, "a")
    assert a.claim().outcome is Outcome.STANDBY  # "a" back from the dead stands by
    assert a.current() == Lease("b", clock.now() + 15)
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT acquired_at FROM leases")) == clock.now()


def test_release_frees_the_lease_at_once_and_only_for_its_holder(engine: Engine) -> None:
    clock = ManualClock()
    a = LeaseStore(engine, "beat", "a", 15, clock)
    b = LeaseStore(engine, "beat", "b", 15, clock)
    assert b.release() is False  # never created: nothing to release
    a.claim()
    assert b.release() is False
    assert a.current() == Lease("a", clock.now() + 15)
    assert a.release() is True
    assert b.claim().outcome is Outcome.ACQUIRED  # no waiting for the lapse


def test_leases_of_different_names_are_independent(engine: Engine) -> None:
    clock = ManualClock()
    assert LeaseStore(engine, "beat", "a", 15, clock).claim().ours
    assert LeaseStore(engine, "other", "b", 15, clock).claim().ours


def _race(engine: Engine, name: str, contenders: int) -> list[Outcome]:
    barrier = threading.Barrier(contenders)
    outcomes: list[Outcome] = []
    errors: list[BaseException] = []

    def contend(me: str) -> None:
        store = LeaseStore(engine, name, me, 15)
        barrier.wait()
        try:
            outcomes.append(store.claim().outcome)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=contend, args=(f"c{i}",)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    return outcomes


def test_contenders_starting_at_once_elect_exactly_one(engine: Engine) -> None:
    """No row yet, every contender at the same instant, the database's own clock."""
    for round_ in range(5):
        outcomes = _race(engine, f"race-{round_}", contenders=4)
        assert sorted(outcomes) == sorted([Outcome.ACQUIRED] + [Outcome.STANDBY] * 3)


def test_without_a_clock_the_lease_runs_on_the_database_clock(engine: Engine) -> None:
    before = time.time()
    decision = LeaseStore(engine, "beat", "a", 15).claim()
    after = time.time()
    # The database server is this machine here; its clock agrees with ours.
    assert before + 15 - 1 <= decision.lease.expires_at <= after + 15 + 1


def test_an_unreachable_database_is_hub_unavailable() -> None:
    dead = create_engine_for(
        "postgresql+psycopg://postgres@127.0.0.1:1/none", connect_args={"connect_timeout": 2}
    )
    try:
        with pytest.raises(HubUnavailable):
            LeaseStore(dead, "beat", "a", 15).claim()
        with pytest.raises(HubUnavailable):
            LeaseStore(dead, "beat", "a", 15).release()
    finally:
        dead.dispose()


# -- the scheduler ---------------------------------------------------------------------

LEASE_S = 1.0


@pytest.fixture
def beat_app(store_url: str, tmp_path: Path) -> Iterator[Celery]:
    settings = load_settings(
        environ={
            "REACH_DATABASE_URL": store_url,
            "REACH_HOME": str(tmp_path),  # the embedded broker: nothing shared
            "REACH_BEAT__LOCK_LEASE_S": str(LEASE_S),
            "REACH_BEAT__LOCK_RENEW_S": "0.3",
            "REACH_BEAT__LOCK_POLL_S": "0.2",
        }
    )
    app = create_celery(settings)
    yield app
    app.close()


def test_a_standby_scheduler_sends_nothing_and_asks_again_within_the_poll(
    beat_app: Celery,
) -> None:
    first, second = LeasedScheduler(app=beat_app), LeasedScheduler(app=beat_app)
    try:
        first.tick()
        delay = second.tick()
        assert first.active and not second.active
        assert 0 <= delay <= 0.2
        deadline = time.monotonic() + 1.5  # the outbox relay is due every second
        while time.monotonic() < deadline:
            first.tick()
            second.tick()
            time.sleep(0.05)
        assert first.active and not second.active
        assert sum(entry.total_run_count for entry in first.schedule.values()) > 0
        assert sum(entry.total_run_count for entry in second.schedule.values()) == 0

        first.close()  # a stopping beat hands over: no waiting for the lease to lapse
        time.sleep(0.25)  # the standby's next poll
        second.tick()
        assert second.active
    finally:
        first.close()
        second.close()


def test_a_beat_that_cannot_confirm_its_lease_stops_when_the_lease_would_lapse(
    beat_app: Celery, engine: Engine
) -> None:
    scheduler = LeasedScheduler(app=beat_app)
    try:
        scheduler.tick()
        assert scheduler.active
        LeaseRow.__table__.drop(engine)  # every claim now fails in the database
        scheduler.tick()
        time.sleep(0.4)  # past a renewal: the claim fails, the lease still runs
        scheduler.tick()
        assert scheduler.active
        time.sleep(LEASE_S)
        scheduler.tick()
        assert not scheduler.active  # a standby may have taken over by now
        LeaseRow.__table__.create(engine)
        time.sleep(0.3)
        scheduler.tick()
        assert scheduler.active
    finally:
        scheduler.close()
    assert LeaseStore(engine, LEASE_NAME, "someone", 15).claim().ours  # released on close


def test_the_leases_table_comes_and_goes_with_its_migration(engine: Engine, store_url: str) -> None:
    downgrade_database(store_url, "0007")
    assert "leases" not in inspect(engine).get_table_names()
    upgrade_database(store_url)
    assert "leases" in inspect(engine).get_table_names()
    assert LeaseStore(engine, LEASE_NAME, "a", 15).claim().ours


def test_a_beat_whose_broker_channel_closes_reconnects_and_sends_again(
    beat_app: Celery,
) -> None:
    """Celery's scheduler keeps its producer for good: a channel closed under it made every
    later send fail ("channel disconnected") and the periodic scans stopped for good."""
    scheduler = LeasedScheduler(app=beat_app)
    try:
        scheduler.tick()
        assert scheduler.active
        first = scheduler.producer
        first.channel.close()  # what a broken broker connection leaves behind
        before = sum(entry.total_run_count for entry in scheduler.schedule.values())
        deadline = time.monotonic() + 3  # the outbox relay is due every second
        while time.monotonic() < deadline:
            scheduler.tick()
            time.sleep(0.05)
        assert scheduler.producer is not first  # a fresh producer on a fresh connection
        assert scheduler.producer.channel.connection is not None
        sent = sum(entry.total_run_count for entry in scheduler.schedule.values())
        assert sent > before + 1  # sends after the reconnect went through
    finally:
        scheduler.close()
