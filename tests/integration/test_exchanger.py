"""A worker process's exchanger, on real stores (SQLite, PostgreSQL) and a real agent
endpoint on loopback that holds its answers and counts what it holds at once.

* a hand-over returns at once, and the exchange ends recorded by the exchanger itself;
* an exchange longer than its lease keeps the lease renewed (the relay's net would
  otherwise take the attempt from a live worker);
* `drain` lets exchanges end, and gives back the leases of those that do not, so the
  relay's net delivers them again at once instead of after the lease;
* never more than an instance's ``max_concurrency`` at that instance, never more than
  ``max_in_flight`` in all: the next hand-over waits for a place.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from reach.core.security.auth import OPEN
from reach.hub.delivery import outbox
from reach.hub.delivery.exchanger import Exchanger
from reach.hub.delivery.pipeline import Pipeline
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.delivery.routing import Dispatch
from reach.hub.delivery.transports import AgentTransport
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.flow.breakers import Breakers
from reach.hub.gates import sessions as user_sessions
from reach.hub.intake import submission
from reach.hub.ledger.tasks import Publish
from reach.hub.settings import Settings
from reach.hub.storage import session_factory
from reach.hub.storage.models import InstanceRow, TaskRow
from reach.wire.schemas import RegisterRequest, SubmitRequest
from tests.support.waiting import wait_until

SETTINGS = Settings.model_validate({"exchanges": {"lease_s": 1.0}})


class HoldingAgent:
    """Answers each delivery once released (or after ``hold`` s), counting how many it
    holds at once."""

    def __init__(self, hold: float = 30.0, slots: int = 0) -> None:
        self.hold = hold
        self.slots = slots  # past these at once it answers 429, as an SDK agent (0: none)
        self.busy = 0  # 429s answered
        self.tokens: list[str] = []  # each request's Authorization header
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.calls += 1
                    outer.tokens.append(self.headers.get("Authorization", ""))
                    busy = 0 < outer.slots <= outer.now
                    outer.busy += busy
                if busy:
                    self._answer(429, {"code": 429, "message": "agent at max_concurrency"})
                    return
                with outer.lock:
                    outer.now += 1
                    outer.most = max(outer.most, outer.now)
                outer.release.wait(outer.hold)
                with outer.lock:
                    outer.now -= 1
                self._answer(200, {"code": 0, "data": {"done": body["task_id"]}})

            def _answer(self, status: int, answer: dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def held(self) -> int:
        with self.lock:
            return self.now

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def db(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.fixture
def agent() -> Iterator[HoldingAgent]:
    server = HoldingAgent()
    yield server
    server.close()


@pytest.fixture
def transport() -> AgentTransport:
    return AgentTransport()


def pipeline(db: sessionmaker[Session]) -> Pipeline:
    return Pipeline(
        db,
        time.time,
        Policy.from_settings(SETTINGS),
        DeliveryPolicy.from_settings(SETTINGS),
        random.Random(1),
        Breakers(),
    )


def tasks(
    db: sessionmaker[Session],
    addr: str,
    n: int,
    max_concurrency: int = 100,
    session_id: str | None = None,
) -> list[str]:
    with db.begin() as s:
        registry.register(
            s,
            RegisterRequest(
                agent_id="a", addr=addr, allow_loopback=True, capabilities=[{"type": "m"}],
                max_concurrency=max_concurrency,
            ),
            time.time(),
            Policy.from_settings(SETTINGS),
        )  # fmt: skip
        ids = []
        for _ in range(n):
            request = SubmitRequest(agent_id="a", method="m", session_id=session_id)
            view, _ = submission.submit(s, request, time.time())
            ids.append(str(view["task_id"]))
    return ids


def begun(p: Pipeline, task_id: str) -> Dispatch:
    d = p.begin(task_id, 1)
    assert isinstance(d, Dispatch), d
    return d


def row(db: sessionmaker[Session], task_id: str) -> TaskRow:
    with db() as s:
        found = s.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
        assert found is not None
        return found


def exchanger(p: Pipeline, transport: AgentTransport, **kw: Any) -> Exchanger:
    published: list[Publish] = []
    return Exchanger(p, transport, published.extend, **kw)


def test_a_hand_over_returns_at_once_and_the_exchanger_records_the_end(
    db: sessionmaker[Session], agent: HoldingAgent, transport: AgentTransport
) -> None:
    p = pipeline(db)
    ids = tasks(db, agent.addr, 20)
    ex = exchanger(p, transport)
    started = time.monotonic()
    for task_id in ids:
        ex.hand_over(begun(p, task_id))
    assert time.monotonic() - started < agent.hold  # none waited on the agent
    wait_until(lambda: agent.held() == 20, timeout=10, what="all 20 at the agent at once")
    assert ex.in_flight == 20
    agent.release.set()
    wait_until(lambda: ex.in_flight == 0, timeout=10, what="all recorded")
    assert {row(db, t).status for t in ids} == {"success"}
    assert agent.calls == 20


def test_an_exchange_longer_than_its_lease_keeps_it_renewed(
    db: sessionmaker[Session], agent: HoldingAgent, transport: AgentTransport
) -> None:
    p = pipeline(db)
    (task_id,) = tasks(db, agent.addr, 1)
    ex = exchanger(p, transport)
    ex.hand_over(begun(p, task_id))
    first = row(db, task_id).lease_until
    assert first is not None
    # the first lease covers connect + 1 s + the margin: wait past it, renewed meanwhile
    wait_until(
        lambda: time.time() > first + 0.5, timeout=30, interval=0.2, what="the first lease over"
    )
    now = row(db, task_id)
    assert (now.status, now.attempt_seq) == ("dispatching", 1)
    assert now.lease_until is not None and now.lease_until > time.time()
    # the relay's net sees nothing lapsed: the attempt stays with its live exchange
    with db.begin() as s:
        recovery = outbox.recover(s, time.time(), p.dpolicy, random.Random(1))
    assert recovery.redelivered == 0
    agent.release.set()
    wait_until(lambda: row(db, task_id).status == "success", timeout=10, what="success")


def test_drain_gives_back_what_is_still_in_flight(
    db: sessionmaker[Session], agent: HoldingAgent, transport: AgentTransport
) -> None:
    p = pipeline(db)
    ids = tasks(db, agent.addr, 3)
    ex = exchanger(p, transport)
    for task_id in ids:
        ex.hand_over(begun(p, task_id))
    wait_until(lambda: agent.held() == 3, timeout=10, what="at the agent")
    assert ex.drain(timeout=0.3) == 3
    # their leases ended with the drain: the relay's net redelivers them now, not in ~12 s
    with db.begin() as s:
        recovery = outbox.recover(s, time.time() + 0.01, p.dpolicy, random.Random(1))
    assert recovery.redelivered == 3
    assert {(row(db, t).status, row(db, t).attempt_seq) for t in ids} == {("pending", 2)}


def test_at_most_max_concurrency_at_one_instance(
    db: sessionmaker[Session], transport: AgentTransport
) -> None:
    agent = HoldingAgent(hold=0.3)
    try:
        p = pipeline(db)
        ids = tasks(db, agent.addr, 8, max_concurrency=2)
        ex = exchanger(p, transport)
        for task_id in ids:
            ex.hand_over(begun(p, task_id))
        wait_until(lambda: ex.in_flight == 0, timeout=30, what="all recorded")
        assert {row(db, t).status for t in ids} == {"success"}
        assert agent.most == 2  # the others waited on the loop, not at the agent (no 429)
    finally:
        agent.close()


def test_a_busy_instance_429_is_sent_again_from_the_loop_not_deferred(
    db: sessionmaker[Session], transport: AgentTransport
) -> None:
    """Two exchangers, as two prefork children of one worker, each keeping its own count
    of an instance's 2 slots: 4 exchanges reach it and it answers 429 to those past 2.
    Each is sent again from the loop until taken: every task succeeds on its first
    attempt, none deferred (before, each 429 was deferred through the store)."""
    agent = HoldingAgent(hold=0.2, slots=2)
    try:
        p = pipeline(db)
        ids = tasks(db, agent.addr, 12, max_concurrency=2)
        children = [exchanger(p, transport) for _ in range(2)]
        for n, task_id in enumerate(ids):
            children[n % 2].hand_over(begun(p, task_id))
        wait_until(
            lambda: all(ex.in_flight == 0 for ex in children), timeout=60, what="all recorded"
        )
        rows = [row(db, t) for t in ids]
        assert {r.status for r in rows} == {"success"}
        assert agent.busy > 0  # the instance did refuse some as busy
        assert [(r.deferrals, r.attempt_seq) for r in rows] == [(0, 1)] * len(ids)
        assert agent.calls == len(ids) + agent.busy  # each 429 sent again, nothing else
        # each send with a reach token of its own: an agent's replay guard refuses a
        # token it has seen, even on a request it answered 429
        assert all(t.startswith("Bearer ") for t in agent.tokens)
        assert len(set(agent.tokens)) == agent.calls
    finally:
        agent.close()


def test_past_max_in_flight_a_hand_over_waits_for_a_place(
    db: sessionmaker[Session], agent: HoldingAgent, transport: AgentTransport
) -> None:
    p = pipeline(db)
    ids = tasks(db, agent.addr, 3)
    ex = exchanger(p, transport, max_in_flight=2)
    for task_id in ids[:2]:
        ex.hand_over(begun(p, task_id))
    third = begun(p, ids[2])
    handed = threading.Event()
    threading.Thread(target=lambda: (ex.hand_over(third), handed.set()), daemon=True).start()
    time.sleep(0.5)
    assert not handed.is_set() and agent.held() == 2
    agent.release.set()
    assert handed.wait(10)
    wait_until(lambda: ex.in_flight == 0, timeout=10, what="all recorded")
    assert {row(db, t).status for t in ids} == {"success"}


def test_an_attempt_whose_instance_breaker_opened_while_it_waited_is_not_sent(
    db: sessionmaker[Session], agent: HoldingAgent, transport: AgentTransport
) -> None:
    """The hub's own 429 for an attempt that waited while the instance's breaker opened
    is recorded as backpressure (a deferral), never sent again from the loop as an
    instance's busy answer would be."""
    p = pipeline(db)
    ids = tasks(db, agent.addr, 2, max_concurrency=1)
    ex = exchanger(p, transport)
    first = begun(p, ids[0])
    ex.hand_over(first)
    ex.hand_over(begun(p, ids[1]))
    wait_until(lambda: agent.held() == 1, timeout=10, what="the first at the agent")
    with db.begin() as s:
        s.execute(
            update(InstanceRow)
            .where(InstanceRow.instance_id == first.instance_id)
            .values(breaker_open_until=time.time() + 300)
        )
    agent.release.set()
    wait_until(lambda: ex.in_flight == 0, timeout=10, what="both ended")
    time.sleep(0.3)  # a resend from the loop would come within 0.1 s
    assert agent.calls == 1  # the waiting one was never sent
    waited = row(db, ids[1])
    assert (waited.status, waited.deferrals) == ("pending", 1)


def test_a_task_refused_as_busy_whose_session_closes_is_not_sent_again(
    db: sessionmaker[Session], transport: AgentTransport
) -> None:
    """Refused as busy, a task is not in the agent's hands: while it is sent again from
    the loop, a close of its session cancels it before the next send."""
    agent = HoldingAgent(slots=1)
    try:
        p = pipeline(db)
        ids = tasks(db, agent.addr, 2, max_concurrency=1, session_id="chat-2")
        children = [exchanger(p, transport) for _ in range(2)]  # two processes' counts
        children[0].hand_over(begun(p, ids[0]))
        wait_until(lambda: agent.held() == 1, timeout=10, what="the first at the agent")
        children[1].hand_over(begun(p, ids[1]))
        wait_until(lambda: agent.busy >= 2, timeout=10, what="the second refused, sent again")
        with db.begin() as s:
            user_sessions.close(s, "chat-2", OPEN, time.time(), reason="user left")
        wait_until(lambda: children[1].in_flight == 0, timeout=10, what="the second ended")
        assert row(db, ids[1]).status == "cancelled"
        refused = agent.busy
        time.sleep(1.5)  # longer than any wait between resends
        assert agent.busy == refused  # not sent again once cancelled
        agent.release.set()
        wait_until(lambda: children[0].in_flight == 0, timeout=10, what="the first ended")
    finally:
        agent.close()


def test_an_attempt_whose_session_closed_while_it_waited_is_cancelled_unsent(
    db: sessionmaker[Session], agent: HoldingAgent, transport: AgentTransport
) -> None:
    """A task waiting in the hub for its instance's place is not in the agent's hands: a
    close of its session (or its expiry) cancels it before it is sent."""
    p = pipeline(db)
    ids = tasks(db, agent.addr, 2, max_concurrency=1, session_id="chat-1")
    ex = exchanger(p, transport)
    for task_id in ids:
        ex.hand_over(begun(p, task_id))
    wait_until(lambda: agent.held() == 1, timeout=10, what="the first at the agent")
    with db.begin() as s:
        user_sessions.close(s, "chat-1", OPEN, time.time(), reason="user left")
    agent.release.set()
    wait_until(lambda: ex.in_flight == 0, timeout=10, what="both ended")
    assert row(db, ids[1]).status == "cancelled"
    assert agent.calls == 1  # the waiting one was never sent
