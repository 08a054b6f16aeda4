"""DAG node steps against a real store: idempotent under duplicate delivery (a chord
pitfall), and failures become node results instead of exceptions."""

from __future__ import annotations

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from reach.core.orchestration import dags
from reach.core.orchestration.dags import NodeStatus
from reach.hub.clock import ManualClock
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.ledger.tasks import finish, load_for_update
from reach.hub.orchestration import dagruns
from reach.hub.settings import Settings
from reach.hub.storage import session_factory
from reach.hub.storage.models import TaskRow
from reach.wire.schemas import RegisterRequest

SPEC = dags.parse_dag(
    {
        "name": "two",
        "nodes": [
            {"id": "first", "agent_id": "a", "method": "m", "payload": {"x": 1}},
            {
                "id": "second",
                "agent_id": "a",
                "method": "m",
                "dependencies": ["first"],
                "inputs": {"prev": "$nodes.first.data.value"},
            },
        ],
    }
)


def setup(engine: Engine) -> tuple[sessionmaker[Session], ManualClock, str]:
    db, clock = session_factory(engine), ManualClock()
    with db.begin() as s:
        registry.register(
            s,
            RegisterRequest(agent_id="a", addr="10.1.1.1:7000", capabilities=[{"type": "m"}]),
            clock.now(),
            Policy.from_settings(Settings()),
        )
        run_id = dagruns.start_run(s, SPEC, {}, clock.now())
    return db, clock, run_id


def step(db: sessionmaker[Session], clock: ManualClock, run_id: str, node: str) -> dagruns.Step:
    with db.begin() as s:
        return dagruns.advance_node(s, run_id, node, clock.now())


def tasks(db: sessionmaker[Session]) -> int:
    with db() as s:
        return int(s.scalar(select(func.count()).select_from(TaskRow)) or 0)


def test_duplicate_node_deliveries_submit_once_and_agree(engine: Engine) -> None:
    db, clock, run_id = setup(engine)
    first = step(db, clock, run_id, "first")
    assert first.result is None and first.submitted_task == f"{run_id}.first"
    again = step(db, clock, run_id, "first")  # a duplicate copy of the header task
    assert again.result is None and again.submitted_task is None
    assert tasks(db) == 1
    with db.begin() as s:
        task = load_for_update(s, f"{run_id}.first")
        assert task is not None
        finish(s, task, "success", clock.now(), result={"value": 42})
    done = step(db, clock, run_id, "first")
    dup = step(db, clock, run_id, "first")
    assert done.result == dup.result
    assert done.result is not None and done.result.status is NodeStatus.SUCCESS
    # the next level reads its inputs from the stored state, not from chord arguments
    second = step(db, clock, run_id, "second")
    with db() as s:
        payload = s.scalar(select(TaskRow.payload).where(TaskRow.task_id == second.submitted_task))
    assert payload == {"prev": 42}


def test_a_node_that_cannot_be_submitted_fails_without_raising(engine: Engine) -> None:
    db, clock, run_id = setup(engine)
    with db.begin() as s:  # the agent leaves before the run reaches it
        from reach.wire.schemas import DeregisterRequest

        instance = s.scalar(select(registry.InstanceRow.instance_id))
        assert instance is not None
        registry.deregister(s, DeregisterRequest(agent_id="a", instance_id=instance), clock.now())
    result = step(db, clock, run_id, "first").result
    assert result is not None and result.status is NodeStatus.FAILED
    assert "NoSuitableAgent" in str(result.error)
    skipped = step(db, clock, run_id, "second").result
    assert skipped is not None and skipped.status is NodeStatus.SKIPPED
    with db.begin() as s:
        assert dagruns.finish_run(s, run_id, clock.now()) == "failed"
        assert "first" in dagruns.view(s, run_id)["reason"]


def test_node_timeout_is_retried_from_the_run_budget_then_enforced(engine: Engine) -> None:
    db, clock, run_id = setup(engine)
    submitted = [step(db, clock, run_id, "first").submitted_task]
    for _ in range(dagruns.MAX_RUN_RETRIES):
        clock.advance(31)  # timeout_ms defaults to 30 s: re-attempted under a new task id
        again = step(db, clock, run_id, "first")
        assert again.result is None and again.submitted_task is not None
        submitted.append(again.submitted_task)
    clock.advance(31)  # the run's budget of 3 retries is spent
    result = step(db, clock, run_id, "first").result
    assert result is not None and result.status is NodeStatus.TIMEOUT
    assert submitted == [f"{run_id}.first", *(f"{run_id}.first.r{n}" for n in (1, 2, 3))]
    with db() as s:
        assert dagruns.view(s, run_id)["retries"] == 3


def test_a_dead_node_task_is_retried_but_a_business_failure_is_not(engine: Engine) -> None:
    db, clock, run_id = setup(engine)
    step(db, clock, run_id, "first")
    with db.begin() as s:
        task = load_for_update(s, f"{run_id}.first")
        assert task is not None
        finish(s, task, "dead", clock.now(), error={"kind": "unreachable"})
    retried = step(db, clock, run_id, "first")
    assert retried.submitted_task == f"{run_id}.first.r1"
    with db.begin() as s:
        task = load_for_update(s, f"{run_id}.first.r1")
        assert task is not None
        finish(s, task, "failed", clock.now(), error={"kind": "business", "code": 7})
    result = step(db, clock, run_id, "first").result
    assert result is not None and result.status is NodeStatus.FAILED


def test_runs_that_could_outlive_their_chord_state_are_refused() -> None:
    import pytest

    from reach.errors import DagError

    long = dags.parse_dag(
        {
            "name": "long",
            "nodes": [
                {
                    "id": f"n{i}",
                    "agent_id": "a",
                    "method": "m",
                    "timeout_ms": 3_600_000,
                    "dependencies": [f"n{i - 1}"] if i else [],
                }
                for i in range(20)
            ],
        }
    )
    plan = dags.compile_plan(long)
    assert dagruns.worst_case_seconds(long, plan) == 23 * 3600  # 20 levels + 3 retries
    with pytest.raises(DagError) as err:
        dagruns.check_fits_chord_lifetime(long, plan, 23 * 3600)
    assert err.value.extra["node"] == "n0"
    dagruns.check_fits_chord_lifetime(long, plan, 23 * 3600 + 1)  # fits: accepted
