"""Delivery against a real agent endpoint and a real store, with a controlled clock:
duplicate messages, stale messages and lost workers never run a task twice."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from reach.hub.clock import ManualClock
from reach.hub.delivery import outbox
from reach.hub.delivery.pipeline import deliver_attempt
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.delivery.transports import AgentTransport
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.flow.breakers import Breakers
from reach.hub.intake import submission
from reach.hub.ledger.tasks import Publish
from reach.hub.settings import Settings
from reach.hub.storage import session_factory
from reach.hub.storage.models import OutboxRow, TaskEventRow, TaskRow
from reach.wire.schemas import RegisterRequest, SubmitRequest
from tests.support.envelope_server import EnvelopeServer

SETTINGS = Settings.model_validate({"router": {"backoff_base": 0.5, "read_timeout": 5}})


@pytest.fixture
def db(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.fixture
def agent() -> Iterator[EnvelopeServer]:
    server = EnvelopeServer(delay=0.3)
    yield server
    server.close()


def setup(db: sessionmaker[Session], clock: ManualClock, addr: str) -> str:
    policy = Policy.from_settings(SETTINGS)
    with db.begin() as s:
        registry.register(
            s,
            RegisterRequest(
                agent_id="a", addr=addr, allow_loopback=True, capabilities=[{"type": "m"}]
            ),
            clock.now(),
            policy,
        )
        task, created = submission.submit(s, SubmitRequest(agent_id="a", method="m"), clock.now())
    assert created
    return str(task["task_id"])


def attempt(
    db: sessionmaker[Session], clock: ManualClock, task_id: str, seq: int
) -> Publish | None:
    return deliver_attempt(
        db,
        task_id,
        seq,
        now=clock.now,
        policy=Policy.from_settings(SETTINGS),
        dpolicy=DeliveryPolicy.from_settings(SETTINGS),
        transport=AgentTransport(),
        rng=random.Random(1),
        breakers=Breakers(),
    )


def task(db: sessionmaker[Session], task_id: str) -> TaskRow:
    with db() as s:
        row = s.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        assert row is not None
        return row


def test_submit_writes_task_event_and_outbox_together(
    db: sessionmaker[Session], agent: EnvelopeServer
) -> None:
    task_id = setup(db, ManualClock(), agent.addr)
    with db() as s:
        assert s.scalar(select(TaskRow.status).where(TaskRow.task_id == task_id)) == "pending"
        (event,) = s.scalars(select(TaskEventRow).where(TaskEventRow.task_id == task_id)).all()
        (row,) = s.scalars(select(OutboxRow).where(OutboxRow.task_id == task_id)).all()
    assert (event.kind, row.attempt_seq, row.published_at) == ("accepted", 1, None)


def test_concurrent_duplicate_messages_deliver_once(
    db: sessionmaker[Session], agent: EnvelopeServer
) -> None:
    clock = ManualClock()
    task_id = setup(db, clock, agent.addr)
    results: list[object] = []
    threads = [
        threading.Thread(target=lambda: results.append(attempt(db, clock, task_id, 1)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert agent.calls[task_id] == 1
    assert results == [None, None]
    assert task(db, task_id).status == "success"
    # a stale copy arriving later finds a terminal task: nothing is sent
    assert attempt(db, clock, task_id, 1) is None
    assert agent.calls[task_id] == 1


def test_lost_worker_is_recovered_and_its_zombie_copy_is_fenced(
    db: sessionmaker[Session], agent: EnvelopeServer
) -> None:
    clock = ManualClock()
    task_id = setup(db, clock, agent.addr)
    dpolicy = DeliveryPolicy.from_settings(SETTINGS)
    from reach.hub.delivery.claims import claim

    with db.begin() as s:  # a worker claims the attempt, then dies before sending
        assert claim(s, task_id, 1, clock.now(), dpolicy) is not None
    with db.begin() as s:  # the lease is still alive: nothing to recover yet
        assert outbox.recover(s, clock.now(), dpolicy, random.Random(1)).publish == []
    clock.advance(dpolicy.lease_for(task(db, task_id)) + 1)
    with db.begin() as s:
        recovery = outbox.recover(s, clock.now(), dpolicy, random.Random(1))
    assert [(p.task_id, p.attempt_seq) for p in recovery.publish] == [(task_id, 2)]
    assert attempt(db, clock, task_id, 1) is None  # the zombie's message: fenced out
    assert agent.calls[task_id] == 0
    assert attempt(db, clock, task_id, 2) is None
    assert agent.calls[task_id] == 1
    row = task(db, task_id)
    assert (row.status, row.attempt_seq, row.redeliveries) == ("success", 2, 1)
    assert agent.bodies[0]["attempt_seq"] == 2
    assert agent.bodies[0]["idempotency_key"] == task_id


def test_transient_failure_schedules_a_retry_with_an_outbox_row(
    db: sessionmaker[Session],
) -> None:
    server = EnvelopeServer(status=503)
    try:
        clock = ManualClock()
        task_id = setup(db, clock, server.addr)
        retry = attempt(db, clock, task_id, 1)
        assert retry is not None and retry.attempt_seq == 2
        assert 0.4 <= retry.delay <= 0.6  # base 0.5 s, +-20 %
        row = task(db, task_id)
        assert (row.status, row.retries, row.attempt_seq) == ("pending", 1, 2)
        with db() as s:
            seqs = s.scalars(select(OutboxRow.attempt_seq).where(OutboxRow.task_id == task_id))
            assert sorted(seqs) == [1, 2]
    finally:
        server.close()


def test_overdue_pending_attempt_is_republished(
    db: sessionmaker[Session], agent: EnvelopeServer
) -> None:
    clock = ManualClock()
    task_id = setup(db, clock, agent.addr)
    dpolicy = DeliveryPolicy.from_settings(SETTINGS)
    clock.advance(dpolicy.republish_grace + 1)  # its message vanished (e.g. a broker restart)
    with db.begin() as s:
        recovery = outbox.recover(s, clock.now(), dpolicy, random.Random(1))
        left = outbox.unpublished(s, clock.now(), grace=2.0)
    assert [(p.task_id, p.attempt_seq) for p in recovery.publish] == [(task_id, 1)]
    assert [(p.task_id, p.attempt_seq) for p in left] == [(task_id, 1)]
    with db.begin() as s:  # published once: not again within the grace
        assert outbox.recover(s, clock.now(), dpolicy, random.Random(1)).publish == []
        assert outbox.unpublished(s, clock.now(), grace=2.0) == []


@pytest.mark.parametrize(
    ("backlog", "republished"),
    [(None, True), (0, True), (10, True), (11, False), (5000, False)],
)
def test_overdue_attempts_behind_a_backlog_are_waiting_not_lost(
    db: sessionmaker[Session],
    agent: EnvelopeServer,
    backlog: int | None,
    republished: bool,
) -> None:
    """Behind a deep queue an overdue attempt is waiting its turn: republishing it would
    add a copy to the very backlog that delays it. Once the queue drains, it is."""
    clock = ManualClock()
    task_id = setup(db, clock, agent.addr)
    dpolicy = DeliveryPolicy.from_settings(SETTINGS)
    assert dpolicy.republish_backlog == 10
    clock.advance(dpolicy.republish_grace + 1)
    with db.begin() as s:
        recovery = outbox.recover(s, clock.now(), dpolicy, random.Random(1), backlog=backlog)
    assert [p.task_id for p in recovery.publish] == ([task_id] if republished else [])
    assert recovery.republished == (1 if republished else 0)
    if not republished:  # the queue drained: now it is presumed lost
        with db.begin() as s:
            recovery = outbox.recover(s, clock.now(), dpolicy, random.Random(1), backlog=0)
        assert [p.task_id for p in recovery.publish] == [task_id]


def test_the_broker_is_asked_for_its_backlog_only_when_an_attempt_is_overdue(
    db: sessionmaker[Session], agent: EnvelopeServer
) -> None:
    """The relay ticks every second: a queue-depth round trip to the broker on each tick
    (a fresh connection) was most of an idle tick's CPU, and it decides nothing unless
    an attempt is overdue."""
    asked: list[int] = []

    def depth() -> int:
        asked.append(1)
        return 5000  # a deep queue: the overdue attempt is waiting its turn

    clock = ManualClock()
    task_id = setup(db, clock, agent.addr)
    dpolicy = DeliveryPolicy.from_settings(SETTINGS)
    with db.begin() as s:  # pending, not yet overdue
        recovery = outbox.recover(s, clock.now(), dpolicy, random.Random(1), backlog=depth)
    assert recovery.publish == []
    assert asked == []
    clock.advance(dpolicy.republish_grace + 1)
    with db.begin() as s:
        recovery = outbox.recover(s, clock.now(), dpolicy, random.Random(1), backlog=depth)
    assert asked == [1] and recovery.publish == []
    with db.begin() as s:  # the queue drained
        recovery = outbox.recover(s, clock.now(), dpolicy, random.Random(1), backlog=lambda: 0)
    assert [p.task_id for p in recovery.publish] == [task_id]


@pytest.mark.parametrize(
    ("timeout_ms", "read"),
    [(60_000, 5.0), (2_000, 2.0), (10, 0.05)],  # the router's cap, the task's own, the floor
)
def test_claim_leases_for_connect_plus_read_plus_margin(
    db: sessionmaker[Session], agent: EnvelopeServer, timeout_ms: int, read: float
) -> None:
    from reach.hub.delivery.claims import claim

    clock = ManualClock()
    task_id = setup(db, clock, agent.addr)
    with db.begin() as s:
        s.execute(update(TaskRow).where(TaskRow.task_id == task_id).values(timeout_ms=timeout_ms))
    dpolicy = DeliveryPolicy.from_settings(SETTINGS)
    with db.begin() as s:
        first = claim(s, task_id, 1, clock.now(), dpolicy)
        second = claim(s, task_id, 1, clock.now(), dpolicy)  # the lease is alive: refused
    assert first is not None and second is None
    row = task(db, task_id)
    expected = clock.now() + dpolicy.connect_timeout + read + dpolicy.lease_margin
    assert row.status == "dispatching" and row.lease_token == first.lease_token
    assert row.lease_until == pytest.approx(expected)
    assert row.lease_until == pytest.approx(clock.now() + dpolicy.lease_for(row))
    with db.begin() as s:  # a stale attempt_seq never claims
        assert claim(s, task_id, 2, clock.now() + 1000, dpolicy) is None


def test_claim_after_a_lapsed_lease_counts_a_redelivery(
    db: sessionmaker[Session], agent: EnvelopeServer
) -> None:
    from reach.hub.delivery.claims import claim

    clock = ManualClock()
    task_id = setup(db, clock, agent.addr)
    dpolicy = DeliveryPolicy.from_settings(SETTINGS)
    with db.begin() as s:
        first = claim(s, task_id, 1, clock.now(), dpolicy)
    clock.advance(dpolicy.lease_for(task(db, task_id)) + 0.01)
    with db.begin() as s:
        again = claim(s, task_id, 1, clock.now(), dpolicy)
    assert first is not None and again is not None and again.lease_token != first.lease_token
    assert task(db, task_id).redeliveries == 1


def test_candidate_cache_reuses_for_its_ttl_and_forgets_on_clear(
    db: sessionmaker[Session], agent: EnvelopeServer
) -> None:
    from reach.core.fleet.routing import RouteFilter
    from reach.hub.fleet.registry import CandidateCache

    clock = ManualClock()
    setup(db, clock, agent.addr)
    policy = Policy.from_settings(SETTINGS)
    cache = CandidateCache(0.5)
    flt = RouteFilter(agent_id="a")
    with db() as s:
        first = cache.get(s, flt, clock.now(), policy, "m")
        assert [c.agent_id for c in first] == ["a"]
        assert cache.get(s, flt, clock.now() + 0.4, policy, "m") is first  # within the ttl
        assert cache.get(s, flt, clock.now() + 0.6, policy, "m") is not first  # reloaded
        again = cache.get(s, flt, clock.now() + 0.6, policy, "m")
        cache.clear()
        assert cache.get(s, flt, clock.now() + 0.6, policy, "m") is not again
        assert CandidateCache(0).get(s, flt, clock.now(), policy, "m") == first  # no caching
