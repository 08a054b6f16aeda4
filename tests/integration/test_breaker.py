"""The circuit breaker against a real store and a real agent endpoint, with a controlled
clock: failures open it, an open breaker keeps deliveries away and refuses submits, one
trial per interval goes through, and a successful trial closes it."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from reach.core.ledger.statuses import InstanceStatus
from reach.errors import CircuitOpen
from reach.hub.clock import ManualClock
from reach.hub.delivery.pipeline import deliver_attempt
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.delivery.transports import AgentTransport
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.flow.breakers import Breakers, claim_trial
from reach.hub.intake import submission
from reach.hub.ledger.tasks import Publish
from reach.hub.settings import Settings
from reach.hub.storage import session_factory
from reach.hub.storage.models import InstanceEventRow, InstanceRow, TaskEventRow
from reach.wire.schemas import HeartbeatRequest, RegisterRequest, SubmitRequest
from tests.support.envelope_server import EnvelopeServer
from tests.support.stores import snapshot

SETTINGS = Settings.model_validate(
    {
        "router": {
            "backoff_base": 0.5,
            "read_timeout": 5,
            "max_retry": 10,
            "breaker_min_volume": 3,
            "breaker_trial_interval": 30,
        }
    }
)
POLICY = Policy.from_settings(SETTINGS)
DPOLICY = DeliveryPolicy.from_settings(SETTINGS)


@pytest.fixture
def db(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.fixture
def failing() -> Iterator[EnvelopeServer]:
    server = EnvelopeServer(status=503)
    yield server
    server.close()


class Hub:
    """Submit and deliver in-process, as the API and one worker process would."""

    def __init__(
        self, db: sessionmaker[Session], addr: str, dpolicy: DeliveryPolicy = DPOLICY
    ) -> None:
        self.db = db
        self.dpolicy = dpolicy
        self.clock = ManualClock()
        self.breakers = Breakers()
        with db.begin() as s:
            answer = registry.register(
                s,
                RegisterRequest(
                    agent_id="flaky", addr=addr, allow_loopback=True, capabilities=[{"type": "m"}]
                ),
                self.clock.now(),
                POLICY,
            )
        self.instance_id = answer.instance_id

    def at(self, t: float) -> None:
        """Move the clock; the agent keeps heart-beating (it is alive, only failing)."""
        self.clock.set(t)
        with self.db.begin() as s:
            beat = HeartbeatRequest(agent_id="flaky", instance_id=self.instance_id)
            registry.heartbeat(s, beat, t, POLICY)

    def submit(self) -> str:
        with self.db.begin() as s:
            task, _ = submission.submit(
                s, SubmitRequest(agent_id="flaky", method="m"), self.clock.now()
            )
            return str(task["task_id"])

    def deliver(self, task_id: str, seq: int) -> Publish | None:
        return deliver_attempt(
            self.db,
            task_id,
            seq,
            now=self.clock.now,
            policy=POLICY,
            dpolicy=self.dpolicy,
            transport=AgentTransport(),
            rng=random.Random(1),
            breakers=self.breakers,
        )

    def instance(self) -> InstanceRow:
        with self.db() as s:
            row = s.get(InstanceRow, self.instance_id)
            assert row is not None
            return row

    def breaker_events(self) -> list[InstanceEventRow]:
        with self.db() as s:
            return list(
                s.scalars(
                    select(InstanceEventRow)
                    .where(InstanceEventRow.kind.like("breaker%"))
                    .order_by(InstanceEventRow.id)
                )
            )

    def task_events(self, task_id: str) -> list[TaskEventRow]:
        with self.db() as s:
            rows = s.scalars(
                select(TaskEventRow)
                .where(TaskEventRow.task_id == task_id)
                .order_by(TaskEventRow.id)
            )
            return list(rows)


def opened_total() -> float:
    return REGISTRY.get_sample_value("agentreach_breaker_open_total", {"agent_id": "flaky"}) or 0.0


def test_failures_open_the_breaker_and_a_successful_trial_closes_it(
    db: sessionmaker[Session], engine: Engine, failing: EnvelopeServer
) -> None:
    hub = Hub(db, failing.addr)
    before = opened_total()
    tasks = [hub.submit() for _ in range(3)]
    retries = [hub.deliver(t, 1) for t in tasks]
    assert all(r is not None for r in retries) and sum(failing.calls.values()) == 3

    # three failures of three within the window: open until the first trial
    opened_at = hub.clock.now()
    row = hub.instance()
    assert (row.breaker_open_until, row.breaker_opened_at) == (opened_at + 30, opened_at)
    (event,) = hub.breaker_events()
    assert event.kind == "breaker_open"
    assert event.detail == {
        "rule": "window",
        "failures": 3,
        "total": 3,
        "window_s": 10,
        "open_until": opened_at + 30,
    }
    assert opened_total() == before + 1
    view = registry.instance_view(row, hub.clock.now(), POLICY)
    assert view["breaker"] == "open"

    # a new submit fails fast and writes nothing
    untouched = snapshot(engine)
    with pytest.raises(CircuitOpen) as refused:
        hub.submit()
    assert refused.value.extra["agents"] == ["flaky"]
    assert refused.value.extra["retry_after"] == 30
    assert refused.value.headers() == {"Retry-After": "30"}
    assert snapshot(engine) == untouched

    # retries of accepted tasks find no route only because the breaker is open: they wait
    # for its trial without spending a retry (issue 14), and the agent hears nothing
    hub.clock.advance(1)
    first = retries[0]
    assert first is not None
    again = hub.deliver(first.task_id, first.attempt_seq)
    assert again is not None and sum(failing.calls.values()) == 3
    waited = hub.task_events(first.task_id)[-1].detail
    assert waited["reason"] == "breaker_open" and waited["breaker_wait"] is True
    assert waited["next_trial_at"] == opened_at + 30
    assert again.delay >= opened_at + 30 - hub.clock.now()

    # the trial is due: submits are accepted again, one delivery is the trial, it fails
    hub.at(opened_at + 30)
    trial_task = hub.submit()
    assert hub.deliver(trial_task, 1) is not None
    assert failing.calls[trial_task] == 1
    dispatched = [e for e in hub.task_events(trial_task) if e.kind == "dispatched"]
    assert dispatched[0].detail["breaker_trial"] is True
    assert hub.instance().breaker_open_until == opened_at + 60  # open for another interval
    assert [e.kind for e in hub.breaker_events()] == ["breaker_open"]  # not opened twice
    # while that trial holds the breaker, nobody else gets through
    assert hub.deliver(again.task_id, again.attempt_seq) is not None
    assert sum(failing.calls.values()) == 4

    # the agent recovers; the next trial succeeds and closes the breaker
    failing.status = 200
    hub.at(opened_at + 60)
    healed = hub.submit()
    assert hub.deliver(healed, 1) is None
    row = hub.instance()
    assert row.breaker_open_until is None
    assert [e.kind for e in hub.breaker_events()] == ["breaker_open", "breaker_closed"]
    # and traffic flows as usual
    for _ in range(5):
        assert hub.deliver(hub.submit(), 1) is None
    assert hub.instance().breaker_open_until is None


def test_exactly_one_of_racing_deliveries_claims_the_trial(
    db: sessionmaker[Session], failing: EnvelopeServer
) -> None:
    hub = Hub(db, failing.addr)
    due = hub.clock.now()
    with db.begin() as s:
        row = s.get(InstanceRow, hub.instance_id)
        assert row is not None
        row.breaker_open_until, row.breaker_opened_at = due, due - 30
    start = threading.Barrier(4)
    won: list[bool] = []

    def race() -> None:
        start.wait()
        with db.begin() as s:
            won.append(claim_trial(s, hub.instance_id, due, DPOLICY.breaker))

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(won) == [False, False, False, True]
    assert hub.instance().breaker_open_until == due + 30


@pytest.mark.parametrize(("status", "code"), [(200, 7), (429, 0)], ids=["business", "429"])
def test_answers_that_are_not_faults_never_open_it(
    db: sessionmaker[Session], status: int, code: int
) -> None:
    """Business errors (the agent answered) and 429 (flow control) do not count as failures."""
    server = EnvelopeServer(status=status, code=code)
    try:
        hub = Hub(db, server.addr)
        for _ in range(6):
            hub.deliver(hub.submit(), 1)
        assert sum(server.calls.values()) == 6
        assert hub.instance().breaker_open_until is None
        assert hub.breaker_events() == []
    finally:
        server.close()


# only the streak can open it here: the ratio rule would need 1,000 answers
STREAK = DeliveryPolicy.from_settings(
    Settings.model_validate(
        {
            "router": {
                **SETTINGS.router.model_dump(include={"backoff_base", "read_timeout"}),
                "max_retry": 10,
                "breaker_min_volume": 1000,
                "breaker_streak": 3,
            }
        }
    )
)


def test_a_streak_of_distinct_failing_tasks_opens_it_at_once(
    db: sessionmaker[Session], failing: EnvelopeServer
) -> None:
    hub = Hub(db, failing.addr, STREAK)
    # one task failing again and again is one task: its retries open nothing
    lone = hub.submit()
    retry = hub.deliver(lone, 1)
    for _ in range(4):
        assert retry is not None
        hub.clock.advance(1)
        retry = hub.deliver(retry.task_id, retry.attempt_seq)
    assert failing.calls[lone] == 5 and hub.breaker_events() == []

    # a success ends a run: two more failing tasks, a success, two more, stay closed
    def fail_new() -> None:
        assert hub.deliver(hub.submit(), 1) is not None

    fail_new()
    failing.status = 200
    assert hub.deliver(hub.submit(), 1) is None
    failing.status = 503
    fail_new()
    fail_new()
    assert hub.breaker_events() == []

    # the third distinct task failing in a row opens it, far below the ratio's volume
    fail_new()
    (event,) = hub.breaker_events()
    assert event.detail["rule"] == "streak" and event.detail["failures"] == 3
    assert hub.instance().breaker_open_until == hub.clock.now() + 30


# a breaker that stays open longer than an instance takes to go offline
LONG_TRIAL = DeliveryPolicy.from_settings(
    Settings.model_validate(
        {"router": {**SETTINGS.router.model_dump(), "breaker_trial_interval": 300}}
    )
)


def test_an_offline_instance_does_not_keep_a_submit_from_failing_fast(
    db: sessionmaker[Session], engine: Engine, failing: EnvelopeServer
) -> None:
    """A dead incarnation of the agent (killed, then restarted elsewhere or not at all)
    stays registered as offline for a while. It takes no work, so with the live instance's
    breaker open a submit is refused at once, not accepted to wait behind it. An offline
    instance whose own breaker is open still counts as open; with every instance offline
    and no breaker open the submit is accepted (the task waits for one to return)."""
    hub = Hub(db, failing.addr, LONG_TRIAL)
    with db.begin() as s:
        dead = registry.register(
            s,
            RegisterRequest(
                agent_id="flaky",
                addr="http://127.0.0.1:9/",
                allow_loopback=True,
                capabilities=[{"type": "m"}],
            ),
            hub.clock.now(),
            POLICY,
        ).instance_id
    # the dead one misses its heartbeats; the hub's sweep records it offline
    hub.at(hub.clock.now() + 120)
    with db.begin() as s:
        monitoring.sweep(s, hub.clock.now(), POLICY)
    with db() as s:
        row = s.get(InstanceRow, dead)
        assert row is not None and row.status == InstanceStatus.OFFLINE.value
    for task in [hub.submit() for _ in range(3)]:
        assert hub.deliver(task, 1) is not None
    opened_at = hub.clock.now()
    assert hub.instance().breaker_open_until == opened_at + 300
    assert sum(failing.calls.values()) == 3  # the offline instance got nothing

    untouched = snapshot(engine)
    with pytest.raises(CircuitOpen) as refused:
        hub.submit()
    assert refused.value.extra["agents"] == ["flaky"]
    assert snapshot(engine) == untouched

    # the live one dies too, its breaker still open: refused as before
    hub.clock.advance(120)
    with db.begin() as s:
        monitoring.sweep(s, hub.clock.now(), POLICY)
    assert hub.instance().status == InstanceStatus.OFFLINE.value
    with pytest.raises(CircuitOpen):
        hub.submit()
    # its trial falls due: nothing live and no breaker open, accepted to wait for one
    hub.clock.set(opened_at + 300)
    assert hub.submit()


def test_it_recovers_gradually_and_a_failure_while_recovering_reopens_it_at_once(
    db: sessionmaker[Session], failing: EnvelopeServer
) -> None:
    """Seed 004's "restore step by step": a successful trial closes the breaker into
    ``breaker_recovery_windows`` (3) windows of 10 s in which one failure is enough to
    open it again; after them a failure is one failure among the window's answers."""
    hub = Hub(db, failing.addr)
    for task_id in [hub.submit() for _ in range(3)]:
        hub.deliver(task_id, 1)
    opened_at = hub.clock.now()
    assert hub.instance().breaker_open_until == opened_at + 30

    failing.status = 200
    hub.at(opened_at + 30)
    assert hub.deliver(hub.submit(), 1) is None  # the trial succeeds: closed, recovering
    closed_at = hub.clock.now()
    assert hub.instance().breaker_closed_at == closed_at

    failing.status = 503  # 5 s later, within the first recovery window
    hub.at(closed_at + 5)
    assert hub.deliver(hub.submit(), 1) is not None
    assert hub.instance().breaker_open_until == closed_at + 5 + 30  # one failure: open
    reopened = hub.breaker_events()[-1]
    assert (reopened.kind, reopened.detail["rule"]) == ("breaker_open", "recovery")
    assert (reopened.detail["failures"], reopened.detail["total"]) == (1, 1)

    failing.status = 200
    hub.at(closed_at + 35)
    assert hub.deliver(hub.submit(), 1) is None  # the next trial closes it again
    healed_at = hub.clock.now()
    failing.status = 503
    hub.at(healed_at + 31)  # past its three recovery windows
    assert hub.deliver(hub.submit(), 1) is not None
    row = hub.instance()
    assert row.breaker_open_until is None  # one failure of one is no window's evidence
    assert [e.kind for e in hub.breaker_events()].count("breaker_open") == 2
