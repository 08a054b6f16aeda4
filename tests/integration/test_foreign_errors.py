"""Foreign exceptions stop at their edge and come out as the right `ReachError`.

* SQLAlchemy's errors in a delivery or a breaker write become `HubUnavailable` (never a
  raw ``OperationalError`` into Celery), and the Celery shell retries with a countdown,
  a bounded number of times -- real unreachable databases and a real PostgreSQL session
  killed while the agent works, no mocks.
* A 2xx that is not the JSON the API promises is a `ProtocolError`, not a ``KeyError``.
* A bad task, broadcast or DAG-run request is not an `InvalidRegistration`, and a unique
  race lost on a task write is a `TaskConflict`, not a `RegistrationConflict`.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

import reach
from reach.core.delivery.retry import Outcome
from reach.errors import (
    DagError,
    HubUnavailable,
    InvalidRegistration,
    InvalidTaskRequest,
    ProtocolError,
    RegistryError,
    TaskConflict,
    TaskError,
)
from reach.hub.api import create_app
from reach.hub.clock import ManualClock
from reach.hub.delivery.pipeline import deliver_attempt
from reach.hub.delivery.policy import DeliveryPolicy
from reach.hub.delivery.transports import AgentTransport
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.flow import breakers
from reach.hub.flow.breakers import Breakers, Ticket
from reach.hub.intake import submission
from reach.hub.ledger.tasks import dead_letter, load_for_update
from reach.hub.settings import Settings, load_settings
from reach.hub.storage import create_engine_for, session_factory
from reach.hub.storage.models import OutboxRow, TaskRow
from reach.wire.schemas import RegisterRequest, SubmitRequest
from reach.worker.context import HubContext
from tests.integration.test_registry_api import TYPE, reg
from tests.support.envelope_server import EnvelopeServer
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.stores import PG_ADMIN_DSN, fresh_store
from tests.support.uvicorn_thread import uvicorn_serving

SETTINGS = Settings.model_validate({"router": {"read_timeout": 5}})


def _deliver(db: sessionmaker[Session], task_id: str, seq: int = 1) -> object:
    return deliver_attempt(
        db,
        task_id,
        seq,
        now=ManualClock(start=1_800_000_000.0).now,
        policy=Policy.from_settings(SETTINGS),
        dpolicy=DeliveryPolicy.from_settings(SETTINGS),
        transport=AgentTransport(),
        rng=random.Random(1),
        breakers=Breakers(),
    )


# -- (a) the database behind a delivery fails ---------------------------------------------
def _unreachable_postgres(tmp_path: Path) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/reach"  # nobody listens


def _sqlite_on_a_directory(tmp_path: Path) -> str:
    (tmp_path / "reach.db").mkdir()  # "unable to open database file"
    return f"sqlite:///{tmp_path / 'reach.db'}"


@pytest.mark.parametrize("url_of", [_unreachable_postgres, _sqlite_on_a_directory])
def test_a_delivery_whose_database_is_unreachable_raises_hub_unavailable(
    url_of: Any, tmp_path: Path
) -> None:
    engine = create_engine_for(url_of(tmp_path))
    try:
        with pytest.raises(HubUnavailable, match="delivery of an attempt") as caught:
            _deliver(session_factory(engine), "t-1")
        assert caught.value.extra["cause"] == "OperationalError"
    finally:
        engine.dispose()


def test_a_breaker_write_whose_database_is_unreachable_raises_hub_unavailable(
    tmp_path: Path,
) -> None:
    engine = create_engine_for(_unreachable_postgres(tmp_path))
    trial = Ticket("i-1", "a", opened_at=1.0, trial=True)  # a good trial closes: a write
    try:
        with pytest.raises(HubUnavailable, match="circuit breaker"):
            breakers.observe(
                session_factory(engine),
                Breakers(),
                trial,
                Outcome.SUCCESS,
                2.0,
                DeliveryPolicy.from_settings(SETTINGS).breaker,
            )
    finally:
        engine.dispose()


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_store("postgres", tmp_path, request) as url:
        yield url


@pytest.mark.postgres
def test_the_database_lost_while_the_agent_works_is_hub_unavailable(pg_url: str) -> None:
    """PostgreSQL drops the worker's connections mid-call (as a restart does): the
    delivery's next transaction fails, and leaves as HubUnavailable; the task keeps its
    lease, for the lapsed-lease net."""
    engine = create_engine_for(pg_url)
    db = session_factory(engine)
    agent = EnvelopeServer(delay=1.0)
    now = 1_800_000_000.0
    try:
        with db.begin() as s:
            registry.register(
                s,
                RegisterRequest(
                    agent_id="a", addr=agent.addr, allow_loopback=True, capabilities=[{"type": "m"}]
                ),
                now,
                Policy.from_settings(SETTINGS),
            )
            view, _ = submission.submit(s, SubmitRequest(agent_id="a", method="m"), now)
        task_id = str(view["task_id"])
        database = make_url(pg_url).database

        def drop_connections_during_the_call() -> None:
            while not agent.calls[task_id]:
                threading.Event().wait(0.02)
            with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (database,),
                )

        killer = threading.Thread(target=drop_connections_during_the_call, daemon=True)
        killer.start()
        with pytest.raises(HubUnavailable, match="recording an attempt's answer"):
            _deliver(db, task_id)
        killer.join(10)
        assert agent.calls[task_id] == 1
        with db() as s:  # the pool recovers on its own; the attempt waits for the net
            task = s.scalar(select(TaskRow).where(TaskRow.task_id == task_id))
            assert task is not None
            assert (task.status, task.attempt_seq) == ("dispatching", 1)
            assert task.lease_until is not None
    finally:
        agent.close()
        engine.dispose()


def test_the_celery_shell_retries_an_unavailable_database_with_a_countdown_then_stops(
    tmp_path: Path,
) -> None:
    """The real task shell, applied by Celery (eagerly, so each retry runs at once): six
    retries with growing countdowns, then it leaves the attempt to the outbox's nets."""
    script = """
import json
from celery.signals import task_retry
seen = []
def on_retry(request=None, reason=None, **_):
    seen.append([type(reason.exc).__name__, reason.when])
task_retry.connect(on_retry, weak=False)
from reach.worker.app import app  # binds the shared tasks
from reach.tasks.delivery import deliver
result = deliver.apply(args=("t-1", 1))
print(json.dumps({"state": result.state, "result": repr(result.result), "retries": seen}))
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_")}
    env.update(
        REACH_DATABASE_URL=_unreachable_postgres(tmp_path),
        REACH_BROKER_URL="memory://",
        REACH_RESULT_BACKEND="cache+memory://",
        REACH_HOME=str(tmp_path),
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["state"] == "SUCCESS", outcome  # not a crash with OperationalError
    assert [kind for kind, _ in outcome["retries"]] == ["HubUnavailable"] * 6
    countdowns = [when for _, when in outcome["retries"]]
    assert all(0 < w <= 30 for w in countdowns), countdowns
    assert countdowns[-1] > countdowns[0]
    assert "gave up after 6 database retries" in done.stderr


# -- (b) a 2xx that is not the hub's JSON -------------------------------------------------
class _NotAHub:
    """Answers every request 200 with ``body`` (a proxy's page, a wrong URL ...)."""

    def __init__(self, body: bytes, content_type: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        pytest.param(b"<html>Welcome to nginx!</html>", "text/html", id="html"),
        pytest.param(b"", "text/plain", id="empty"),
        pytest.param(b"[1, 2]", "application/json", id="json-array"),
        pytest.param(b'{"ok": true}', "application/json", id="json-without-the-fields"),
    ],
)
def test_a_2xx_without_the_hubs_json_is_a_protocol_error(body: bytes, content_type: str) -> None:
    fake = _NotAHub(body, content_type)
    try:
        calls = [
            lambda: reach.send(agent_id="a", method="m", hub=fake.url),
            lambda: reach.wait_for_result("t-1", timeout=1, hub=fake.url),
            lambda: reach.get_task("t-1", hub=fake.url),
            lambda: reach.broadcast(capability="c", method="m", timeout=1, hub=fake.url),
            lambda: reach.report_result("t-1", attempt_seq=1, instance_id="i", hub=fake.url),
        ]
        for call in calls:
            with pytest.raises(ProtocolError) as caught:
                call()
            assert isinstance(caught.value, HubUnavailable)  # retryable, like an outage
            assert caught.value.extra["http_status"] == 200
    finally:
        fake.close()


# -- (c) each resource's own error types ----------------------------------------------------
@pytest.fixture
def ctx(store_url: str, engine: Engine, tmp_path: Path) -> HubContext:
    settings = load_settings(environ={"REACH_DATABASE_URL": store_url, "REACH_HOME": str(tmp_path)})
    return HubContext(settings=settings, engine=engine, clock=ManualClock(start=1_800_000_000.0))


@pytest.fixture
def hub(ctx: HubContext) -> Iterator[str]:
    with uvicorn_serving(create_app(ctx), free_port()) as url:
        yield url


def test_bad_requests_get_the_type_of_their_resource(hub: str) -> None:
    assert requests.post(f"{hub}/v1/agents/register", json=reg(allow_loopback=True)).ok
    with pytest.raises(InvalidTaskRequest) as task:
        reach.send(agent_id="doc-analyzer-01", method="m", timeout_ms=0, hub=hub)
    assert isinstance(task.value, TaskError) and not isinstance(task.value, RegistryError)
    assert "timeout_ms" in task.value.detail
    with pytest.raises(InvalidTaskRequest):
        reach.broadcast(capability="c", method="m", min_results=0, hub=hub)
    with pytest.raises(InvalidTaskRequest):
        reach.report_result("t-1", hub=hub)  # names neither attempt nor instance
    with pytest.raises(InvalidTaskRequest):
        reach.get_task("t-1", wait=-1, hub=hub)
    run = requests.post(f"{hub}/api/v1/dag-runs", json={"dag": {}, "colour": "blue"})
    assert (run.status_code, run.json()["type"]) == (422, TYPE + "dag-error")
    dead = requests.get(f"{hub}/api/v1/dead-letters/0")
    assert (dead.status_code, dead.json()["type"]) == (422, TYPE + "invalid-task-request")
    # the registry keeps its own
    bad = requests.post(f"{hub}/v1/agents/register", json=reg(max_concurrency=0))
    assert (bad.status_code, bad.json()["type"]) == (422, TYPE + "invalid-request")
    with pytest.raises(InvalidRegistration):
        reach.Agent("bad id!", addr="10.0.0.5:1")


def test_a_unique_race_lost_on_a_task_write_is_a_task_conflict(ctx: HubContext, hub: str) -> None:
    """A dead letter whose next attempt's outbox row exists already: the replay's insert
    hits the unique key on both tries, which is the task's conflict, not the registry's."""
    now = ctx.clock.now()

    def dead_task(session: Session) -> tuple[str, int]:
        registry.register(
            session,
            RegisterRequest(agent_id="a", addr="127.0.0.1:9", allow_loopback=True),
            now,
            ctx.policy,
        )
        view, _ = submission.submit(session, SubmitRequest(agent_id="a", method="m"), now)
        task = load_for_update(session, str(view["task_id"]))
        assert task is not None
        dead_letter(session, task, now, reason="test", error={"kind": "test"})
        session.add(
            OutboxRow(
                task_id=task.task_id,
                agent_id=task.agent_id or "-",
                attempt_seq=task.attempt_seq + 1,
                message={},
                created_at=now,
                available_at=now,
            )
        )
        return task.task_id, task.attempt_seq

    task_id, _ = ctx.write(dead_task)
    (entry,) = requests.get(f"{hub}/api/v1/dead-letters").json()["dead_letters"]
    replay = requests.post(f"{hub}/api/v1/dead-letters/{entry['id']}/replay")
    assert replay.status_code == 409, replay.text
    assert replay.json()["type"] == TYPE + "task-conflict"
    with ctx.db() as s:
        assert s.scalar(select(TaskRow.status).where(TaskRow.task_id == task_id)) == "dead"


def test_write_maps_a_lost_race_to_the_callers_type(ctx: HubContext) -> None:
    def duplicate(session: Session) -> None:
        for _ in range(2):
            session.add(
                OutboxRow(
                    task_id="t", agent_id="a", attempt_seq=1, message={}, created_at=0.0,
                    available_at=0.0,
                )
            )  # fmt: skip
        session.flush()

    with pytest.raises(DagError, match="concurrent request"):
        ctx.write(duplicate, conflict=DagError)
    with pytest.raises(TaskConflict):
        ctx.write(duplicate, conflict=TaskConflict)
