"""Background yields to waiting online work, on a real store against a real agent endpoint.

The decision is `reach.core.flow.priority` (table-tested); here: what the hub measures (online
tasks waiting, background deliveries in flight, the slots workers reported), the
deferral it writes (a new attempt on ``reach.background``, no retry spent, a ``deferred``
event, left unpublished for the outbox relay until it is due), its bound, and that every
way an attempt is re-created keeps the task's queue.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Exchange
from kombu import Queue as KombuQueue
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from reach.core.flow.priority import BACKGROUND_QUEUE, ONLINE_QUEUE, WORKER_QUEUES
from reach.hub.clock import ManualClock
from reach.hub.delivery import outbox
from reach.hub.delivery.claims import claim
from reach.hub.delivery.pipeline import deliver_attempt
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.delivery.transports import AgentTransport
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.flow import priority
from reach.hub.flow.breakers import Breakers
from reach.hub.intake import submission
from reach.hub.ledger.tasks import Publish
from reach.hub.ops import deadletters
from reach.hub.settings import Settings
from reach.hub.storage import session_factory
from reach.hub.storage.models import DeadLetterRow, OutboxRow, TaskEventRow, TaskRow
from reach.wire.schemas import RegisterRequest, SubmitRequest
from reach.worker.factory import celery_config
from tests.support.envelope_server import EnvelopeServer

SETTINGS = Settings.model_validate(
    {
        "router": {
            "backoff_base": 0.5,
            "read_timeout": 5,
            "max_retry": 1,
            "background_share": 0.5,
            "background_defer_s": 0.5,
            "background_max_wait_s": 3,
        }
    }
)
DPOLICY = DeliveryPolicy.from_settings(SETTINGS)


@pytest.fixture
def db(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.fixture
def agent() -> Iterator[EnvelopeServer]:
    server = EnvelopeServer()
    yield server
    server.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def register(db: sessionmaker[Session], clock: ManualClock, addr: str) -> None:
    with db.begin() as s:
        registry.register(
            s,
            RegisterRequest(
                agent_id="a", addr=addr, allow_loopback=True, capabilities=[{"type": "m"}]
            ),
            clock.now(),
            Policy.from_settings(SETTINGS),
        )


def send(db: sessionmaker[Session], clock: ManualClock, priority_: str) -> str:
    with db.begin() as s:
        view, _ = submission.submit(
            s, SubmitRequest(agent_id="a", method="m", priority=priority_), clock.now()
        )
    assert view["priority"] == priority_
    return str(view["task_id"])


def attempt(
    db: sessionmaker[Session], clock: ManualClock, task_id: str, seq: int
) -> Publish | None:
    return deliver_attempt(
        db,
        task_id,
        seq,
        now=clock.now,
        policy=Policy.from_settings(SETTINGS),
        dpolicy=DPOLICY,
        transport=AgentTransport(),
        rng=random.Random(1),
        breakers=Breakers(),
    )


def row(db: sessionmaker[Session], task_id: str) -> TaskRow:
    with db() as s:
        found = s.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        assert found is not None
        return found


def events(db: sessionmaker[Session], task_id: str) -> list[TaskEventRow]:
    with db() as s:
        query = select(TaskEventRow).where(TaskEventRow.task_id == task_id)
        return list(s.scalars(query.order_by(TaskEventRow.id)))


def queue_of_outbox(db: sessionmaker[Session], task_id: str, seq: int) -> str:
    with db() as s:
        found = s.scalar(
            select(OutboxRow).where(OutboxRow.task_id == task_id, OutboxRow.attempt_seq == seq)
        )
        assert found is not None
        return outbox.queue_of(found.message)


def relayed(db: sessionmaker[Session], now: float) -> list[Publish]:
    """What the outbox relay claims as due and scheduled at ``now``."""
    with db.begin() as s:
        return outbox.scheduled(s, now)


def busy_background(db: sessionmaker[Session], clock: ManualClock) -> str:
    """A background task another worker is delivering (its lease live)."""
    task_id = send(db, clock, "background")
    with db.begin() as s:
        assert claim(s, task_id, 1, clock.now(), DPOLICY) is not None
    return task_id


def report_slots(db: sessionmaker[Session], clock: ManualClock, slots: int) -> None:
    with db.begin() as s:
        priority.record_slots(s, "w1@test", slots, clock.now())


def test_first_attempts_carry_their_queue(
    db: sessionmaker[Session], clock: ManualClock, agent: EnvelopeServer
) -> None:
    register(db, clock, agent.addr)
    online, background = send(db, clock, "online"), send(db, clock, "background")
    assert queue_of_outbox(db, online, 1) == ONLINE_QUEUE
    assert queue_of_outbox(db, background, 1) == BACKGROUND_QUEUE
    clock.advance(60)
    with db.begin() as s:  # the relay rebuilds each attempt with its queue
        relayed = {p.task_id: p.queue for p in outbox.unpublished(s, clock.now(), grace=1)}
    assert relayed == {online: ONLINE_QUEUE, background: BACKGROUND_QUEUE}


def test_background_yields_its_slot_while_online_waits(
    db: sessionmaker[Session], clock: ManualClock, agent: EnvelopeServer
) -> None:
    register(db, clock, agent.addr)
    report_slots(db, clock, 2)  # share 0.5: background may hold one slot
    busy_background(db, clock)
    online = send(db, clock, "online")
    task_id = send(db, clock, "background")

    # nothing for the worker to publish: no countdown message held in a worker
    assert attempt(db, clock, task_id, 1) is None
    assert agent.calls[task_id] == 0  # not delivered
    task = row(db, task_id)
    assert (task.status, task.attempt_seq, task.retries) == ("pending", 2, 0)  # no retry spent
    last = events(db, task_id)[-1]
    assert last.kind == "deferred"
    assert last.detail["reason"] == "priority"
    assert (last.detail["background_busy"], last.detail["slots"]) == (1, 2)
    assert queue_of_outbox(db, task_id, 2) == BACKGROUND_QUEUE
    # the relay publishes it once due (0.5 s), without the grace of a left-behind row
    assert relayed(db, clock.now() + 0.49) == []
    assert relayed(db, clock.now() + 0.5) == [Publish(task_id, 2, 0.0, BACKGROUND_QUEUE)]
    assert relayed(db, clock.now() + 60) == []  # claimed: published once

    # the online task is delivered; while online traffic is live background keeps to its
    # share (a slot freed after an online task arrives is too late for it), then runs
    assert attempt(db, clock, online, 1) is None
    clock.advance(0.5)
    assert attempt(db, clock, task_id, 2) is None
    assert (row(db, task_id).attempt_seq, events(db, task_id)[-1].kind) == (
        3,
        "deferred",
    )
    clock.advance(priority.ONLINE_RECENT_S)
    assert attempt(db, clock, task_id, 3) is None
    assert row(db, task_id).status == "success"
    assert agent.calls[task_id] == 1


def test_background_within_its_share_runs_while_online_waits(
    db: sessionmaker[Session], clock: ManualClock, agent: EnvelopeServer
) -> None:
    register(db, clock, agent.addr)
    report_slots(db, clock, 4)  # share 0.5: two slots; one is busy
    busy_background(db, clock)
    send(db, clock, "online")
    task_id = send(db, clock, "background")
    assert attempt(db, clock, task_id, 1) is None
    assert row(db, task_id).status == "success"


def test_background_admissions_take_turns_for_the_last_slot_of_the_share(
    db: sessionmaker[Session], clock: ManualClock, agent: EnvelopeServer
) -> None:
    """Two workers admitting background attempts at once: the second counts only after the
    first committed its claim, so both cannot take the one slot left in the share."""
    register(db, clock, agent.addr)
    report_slots(db, clock, 2)  # share 0.5: background may hold one slot
    send(db, clock, "online")  # online waits throughout
    first, second = send(db, clock, "background"), send(db, clock, "background")
    now = clock.now()
    answer: list[bool] = []
    counted = threading.Event()

    def other_worker() -> None:
        with db.begin() as s:
            claimed = claim(s, second, 1, now, DPOLICY)
            assert claimed is not None
            answer.append(priority.yield_to_online(s, claimed.task_id, now, DPOLICY.priority))
        counted.set()

    with db.begin() as s:
        claimed = claim(s, first, 1, now, DPOLICY)
        assert claimed is not None
        assert priority.yield_to_online(s, claimed.task_id, now, DPOLICY.priority) is False  # runs
        worker = threading.Thread(target=other_worker, daemon=True)
        worker.start()
        assert not counted.wait(0.5), "the second admission counted before the first committed"
    worker.join(10)
    assert answer == [True]  # it saw the first one's slot taken: deferred
    assert row(db, second).attempt_seq == 2


def test_a_deferred_background_task_runs_after_the_maximum_wait(
    db: sessionmaker[Session], clock: ManualClock, agent: EnvelopeServer
) -> None:
    register(db, clock, agent.addr)
    report_slots(db, clock, 2)
    busy_background(db, clock)
    send(db, clock, "online")  # never delivered: online waits throughout
    task_id = send(db, clock, "background")
    seq = 1
    while attempt(db, clock, task_id, seq) is None and row(db, task_id).status == ("pending"):
        seq = row(db, task_id).attempt_seq
        clock.advance(1)
        with db.begin() as s:  # the busy one's lease and the slots stay live
            s.execute(update(TaskRow).where(TaskRow.status == "dispatching").values(
                lease_until=clock.now() + 60))  # fmt: skip
            priority.record_slots(s, "w1@test", 2, clock.now())
        assert seq < 10, "deferred past its bound"
    kinds = [e.kind for e in events(db, task_id)]
    assert kinds.count("deferred") == 3  # at 0, 1 and 2 s after the first: 3 s is the bound
    assert row(db, task_id).status == "success"
    assert row(db, task_id).retries == 0


def test_background_runs_when_no_worker_reported_slots(
    db: sessionmaker[Session], clock: ManualClock, agent: EnvelopeServer
) -> None:
    register(db, clock, agent.addr)
    with db.begin() as s:  # a worker that went silent
        priority.record_slots(s, "w1@test", 2, clock.now() - priority.SLOTS_TTL_S - 1)
    busy_background(db, clock)
    send(db, clock, "online")
    task_id = send(db, clock, "background")
    assert attempt(db, clock, task_id, 1) is None
    assert row(db, task_id).status == "success"


def test_slots_add_up_across_workers_and_leave_with_them(
    db: sessionmaker[Session], clock: ManualClock
) -> None:
    with db.begin() as s:
        priority.record_slots(s, "w1", 2, clock.now())
        priority.record_slots(s, "w2", 4, clock.now())
        priority.record_slots(s, "w1", 3, clock.now() + 1)  # a later report replaces the first
    with db() as s:
        assert priority.hub_slots(s, clock.now() + 1) == 7
    with db.begin() as s:
        priority.forget_slots(s, "w2")
    with db() as s:
        assert priority.hub_slots(s, clock.now() + 1) == 3
        assert priority.hub_slots(s, clock.now() + 100) is None


def test_retries_and_replays_of_background_stay_background(
    db: sessionmaker[Session], clock: ManualClock
) -> None:
    failing = EnvelopeServer(status=503)
    try:
        register(db, clock, failing.addr)
        task_id = send(db, clock, "background")
        retry = attempt(db, clock, task_id, 1)
        assert retry is not None and retry.queue == BACKGROUND_QUEUE
        assert queue_of_outbox(db, task_id, 2) == BACKGROUND_QUEUE
        clock.advance(5)
        assert attempt(db, clock, task_id, 2) is None  # max_retry 1: dead-lettered
    finally:
        failing.close()
    assert row(db, task_id).status == "dead"
    with db.begin() as s:
        dead = s.scalar(select(DeadLetterRow).where(DeadLetterRow.task_id == task_id))
        assert dead is not None
        replayed = deadletters.replay(s, dead.id, clock.now())
    assert replayed.queue == BACKGROUND_QUEUE
    assert queue_of_outbox(db, task_id, replayed.attempt_seq) == BACKGROUND_QUEUE


def test_outbox_rows_written_before_priorities_go_online() -> None:
    assert outbox.queue_of({"task_id": "t", "attempt_seq": 1}) == ONLINE_QUEUE
    assert outbox.queue_of({"queue": "elsewhere"}) == ONLINE_QUEUE
    assert outbox.queue_of(None) == ONLINE_QUEUE
    assert outbox.queue_of({"queue": BACKGROUND_QUEUE}) == BACKGROUND_QUEUE


def test_the_embedded_broker_serves_online_first(tmp_path: Path) -> None:
    """Real kombu over a SQLite file: a worker consuming probe, online, background in that
    order gets every online message before any background one, whatever arrived first."""
    url = f"sqlite:///{tmp_path}/broker.db"
    queues = [KombuQueue(name, Exchange(name), routing_key=name) for name in WORKER_QUEUES]
    with Connection(url, transport="reach.worker.embedded_broker:Transport") as conn:
        producer = conn.Producer()
        for name, n in [(BACKGROUND_QUEUE, 3), (ONLINE_QUEUE, 2), (BACKGROUND_QUEUE, 1)]:
            for i in range(n):
                producer.publish(
                    {"q": name, "i": i}, exchange=name, routing_key=name, declare=queues
                )
        got: list[str] = []

        def take(body: dict[str, Any], message: Any) -> None:
            got.append(body["q"])
            message.ack()

        with conn.Consumer(queues, callbacks=[take], prefetch_count=1):
            while len(got) < 6:
                conn.drain_events(timeout=5)
    assert got == [ONLINE_QUEUE] * 2 + [BACKGROUND_QUEUE] * 4


def test_redis_workers_take_queues_in_order() -> None:
    config = celery_config(
        Settings.model_validate({"storage": {"broker_url": "redis://127.0.0.1:6379/0"}})
    )
    assert config["broker_transport_options"]["queue_order_strategy"] == "priority"
