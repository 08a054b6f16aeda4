"""A node step that raises never stalls its run: on a real chord (a Celery worker on Redis,
a real store), a step raising HubUnavailable, UnknownTask, RegistrationConflict or anything
else ends as a stored failed node, and the run's closing task still settles the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from reach.tasks import dags as dag_tasks
from sqlalchemy import delete
from sqlalchemy.orm import Session

from reach.core.orchestration import dags
from reach.core.orchestration.dags import NodeStatus
from reach.errors import HubUnavailable, RegistrationConflict, UnknownTask
from reach.hub.clock import ManualClock
from reach.hub.fleet import registry
from reach.hub.orchestration import dagruns
from reach.hub.settings import Settings
from reach.hub.storage.models import TaskRow
from reach.wire.schemas import RegisterRequest
from reach.worker.canvas import canvas
from reach.worker.context import HubContext
from reach.worker.factory import create_celery
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.redis,
    # Celery's Redis result backend (5.x) calls redis-py's deprecated setex
    pytest.mark.filterwarnings("ignore:Call to deprecated setex:DeprecationWarning"),
]

SPEC = dags.parse_dag(
    {
        "name": "two",
        "nodes": [
            {"id": "first", "agent_id": "a", "method": "m"},
            {"id": "second", "agent_id": "a", "method": "m", "dependencies": ["first"]},
        ],
    }
)


@pytest.fixture
def hub(store_url: str, redis_db: str, tmp_path: Path) -> Iterator[HubContext]:
    settings = Settings(
        storage={
            "home": str(tmp_path),
            "database_url": store_url,
            "broker_url": redis_db,
            "result_backend": redis_db,
        }
    )
    ctx = HubContext.from_settings(settings)
    with ctx.transaction() as s:
        registry.register(
            s,
            RegisterRequest(agent_id="a", addr="10.1.1.1:7000", capabilities=[{"type": "m"}]),
            ctx.clock.now(),
            ctx.policy,
        )
    yield ctx
    ctx.engine.dispose()


@pytest.fixture
def worker(hub: HubContext, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Celery worker thread on the hub's broker whose tasks use this test's store."""
    import reach.worker.app

    monkeypatch.setattr(reach.worker.app, "runtime", lambda: hub)
    app = create_celery(hub.settings)
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        yield app


def run_to_end(app: Any, hub: HubContext) -> dict[str, Any]:
    run_id = hub.write(lambda s: dagruns.start_run(s, SPEC, {}, hub.clock.now()))
    canvas(app, run_id, dags.compile_plan(SPEC)).apply_async()

    def settled() -> dict[str, Any] | None:
        with hub.reading() as s:
            view = dagruns.view(s, run_id)
        return view if view["status"] != "running" else None

    return dict(wait_until(settled, timeout=30, interval=0.1, what=f"run {run_id} settled"))


@pytest.mark.parametrize(
    "error",
    [
        UnknownTask("run row gone mid-step"),
        RegistrationConflict("a concurrent request changed the same record; retry"),
        HubUnavailable("the hub's database is unavailable: connection refused"),
        RuntimeError("a bug in a step"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_step_that_raises_ends_as_a_stored_failure_and_the_run_settles(
    worker: Any, hub: HubContext, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    real = dagruns.advance_node
    calls: list[str] = []

    def broken(session: Session, run_id: str, node_id: str, now: float, *args: Any) -> dagruns.Step:
        calls.append(node_id)
        if node_id == "first":
            raise error
        return real(session, run_id, node_id, now, *args)

    monkeypatch.setattr(dagruns, "advance_node", broken)
    monkeypatch.setattr(dag_tasks, "UNAVAILABLE_RETRY_S", (0.05, 0.05))
    started = time.monotonic()
    run = run_to_end(worker, hub)
    nodes = {n["node_id"]: n for n in run["nodes"]}
    assert run["status"] == "failed"
    assert "first" in run["reason"]
    assert nodes["first"]["status"] == NodeStatus.FAILED
    assert nodes["first"]["error"]["kind"] == type(error).__name__
    assert str(error) in nodes["first"]["error"]["message"]
    assert nodes["second"]["status"] == NodeStatus.SKIPPED  # the next level did run
    # the database unavailable is retried (bounded) before it is a stated failure
    expected = 1 + len(dag_tasks.UNAVAILABLE_RETRY_S) if isinstance(error, HubUnavailable) else 1
    assert calls.count("first") == expected
    assert time.monotonic() - started < 20


def test_a_node_whose_task_vanished_fails_instead_of_raising(store_url: str) -> None:
    from reach.hub.storage import create_engine_for, session_factory

    engine = create_engine_for(store_url)
    sessions, clock = session_factory(engine), ManualClock()
    try:
        with sessions.begin() as s:
            registry.register(
                s,
                RegisterRequest(agent_id="a", addr="10.1.1.1:7000", capabilities=[{"type": "m"}]),
                clock.now(),
                HubContext.from_settings(Settings()).policy,
            )
            run_id = dagruns.start_run(s, SPEC, {}, clock.now())
        with sessions.begin() as s:
            assert dagruns.advance_node(s, run_id, "first", clock.now()).submitted_task
        with sessions.begin() as s:  # retention (or an operator) deletes it under the run
            s.execute(delete(TaskRow))
        with sessions.begin() as s:
            result = dagruns.advance_node(s, run_id, "first", clock.now()).result
        assert result is not None and result.status is NodeStatus.FAILED
        assert result.error is not None and result.error["kind"] == "UnknownTask"
        with sessions() as s:
            assert dagruns.view(s, run_id)["nodes"][0]["status"] == "failed"
    finally:
        engine.dispose()
