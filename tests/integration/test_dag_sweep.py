"""The beat sweep against a real store: a run whose canvas never ran (or died) is resumed
while it may still finish, finished from its nodes' results when only its closing task is
missing, and failed — naming its stuck nodes — once it is older than it could ever run.
Every move is a conditional UPDATE: two sweepers at once act once."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
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
from reach.wire.schemas import RegisterRequest

SPEC = dags.parse_dag(
    {
        "name": "chain",
        "nodes": [
            {"id": "first", "agent_id": "a", "method": "m", "timeout_ms": 2000},
            {
                "id": "second",
                "agent_id": "a",
                "method": "m",
                "timeout_ms": 2000,
                "dependencies": ["first"],
            },
        ],
    }
)
PLAN = dags.compile_plan(SPEC)
MARGIN = 1.0
WORST = dagruns.worst_case_seconds(SPEC, PLAN)  # 2 levels of 2 s, plus the retry budget


@pytest.fixture
def hub(engine: Engine) -> Iterator[tuple[sessionmaker[Session], ManualClock, str]]:
    """A run recorded but whose canvas was never published (as if the chord died at once)."""
    db, clock = session_factory(engine), ManualClock()
    with db.begin() as s:
        registry.register(
            s,
            RegisterRequest(agent_id="a", addr="10.1.1.1:7000", capabilities=[{"type": "m"}]),
            clock.now(),
            Policy.from_settings(Settings()),
        )
        run_id = dagruns.start_run(s, SPEC, {}, clock.now())
    yield db, clock, run_id


def sweep(db: sessionmaker[Session], clock: ManualClock) -> dagruns.SweepReport:
    with db.begin() as s:
        return dagruns.sweep(s, clock.now(), MARGIN)


def view(db: sessionmaker[Session], run_id: str) -> dict[str, object]:
    with db() as s:
        return dagruns.view(s, run_id)


def test_a_run_whose_canvas_never_ran_is_resumed_then_abandoned_within_its_bound(
    hub: tuple[sessionmaker[Session], ManualClock, str],
) -> None:
    db, clock, run_id = hub
    clock.advance(2.0 + MARGIN)  # silent as long as a node may be: still left alone
    assert sweep(db, clock) == dagruns.SweepReport()
    clock.advance(0.1)  # longer: its canvas is presumed dead and published again, once
    resumed = sweep(db, clock).resumed
    assert [(r.run_id, r.from_level) for r in resumed] == [(run_id, 0)]
    assert sweep(db, clock).resumed == []  # a second sweeper finds it claimed
    with db.begin() as s:  # the resumed canvas submits the first node... and dies
        assert dagruns.advance_node(s, run_id, "first", clock.now()).submitted_task
    clock.advance(WORST + MARGIN)  # older than the run could ever take
    report = sweep(db, clock)
    assert report.abandoned == [run_id] and report.resumed == []
    run = view(db, run_id)
    assert run["status"] == "failed" and run["finished_at"] == clock.now()
    assert "never finished: first (running), second (pending)" in str(run["reason"])
    nodes = {n["node_id"]: n for n in run["nodes"]}  # type: ignore[attr-defined]
    assert nodes["first"]["status"] == NodeStatus.FAILED
    assert nodes["first"]["error"]["kind"] == "RunAbandoned"
    assert nodes["second"]["status"] == NodeStatus.SKIPPED
    assert "never started" in nodes["second"]["reason"]
    assert sweep(db, clock) == dagruns.SweepReport()  # idempotent
    # a copy of the dead canvas turning up late changes nothing
    with db.begin() as s:
        late = dagruns.advance_node(s, run_id, "second", clock.now()).result
        assert late is not None and late.status is NodeStatus.SKIPPED
        assert dagruns.finish_run(s, run_id, clock.now()) == "failed"
    assert view(db, run_id)["reason"] == run["reason"]


def test_a_resume_starts_at_the_first_unfinished_level(
    hub: tuple[sessionmaker[Session], ManualClock, str],
) -> None:
    db, clock, run_id = hub
    with db.begin() as s:
        dagruns.advance_node(s, run_id, "first", clock.now())
        task = load_for_update(s, f"{run_id}.first")
        assert task is not None
        finish(s, task, "success", clock.now(), result={"ok": True})
        assert dagruns.advance_node(s, run_id, "first", clock.now()).result is not None
    clock.advance(2.0 + MARGIN + 0.1)
    assert [r.from_level for r in sweep(db, clock).resumed] == [1]


def test_a_run_whose_closing_task_went_missing_is_settled_from_its_results(
    hub: tuple[sessionmaker[Session], ManualClock, str],
) -> None:
    db, clock, run_id = hub
    for node in ("first", "second"):
        with db.begin() as s:
            dagruns.advance_node(s, run_id, node, clock.now())
            task = load_for_update(s, f"{run_id}.{node}")
            assert task is not None
            finish(s, task, "success", clock.now(), result={"ok": True})
            assert dagruns.advance_node(s, run_id, node, clock.now()).result is not None
    assert sweep(db, clock) == dagruns.SweepReport()  # dag_finish is due any moment
    clock.advance(MARGIN + 0.1)
    assert sweep(db, clock).finished == [run_id]
    assert view(db, run_id)["status"] == "success"


def test_two_sweepers_at_once_abandon_a_run_once(
    hub: tuple[sessionmaker[Session], ManualClock, str],
) -> None:
    db, clock, run_id = hub
    clock.advance(WORST + MARGIN + 1)
    first_swept = threading.Event()
    reports: dict[str, dagruns.SweepReport] = {}

    def holder() -> None:  # sweeps, then holds its transaction open a moment
        with db.begin() as s:
            reports["holder"] = dagruns.sweep(s, clock.now(), MARGIN)
            first_swept.set()
            threading.Event().wait(0.5)

    thread = threading.Thread(target=holder)
    thread.start()
    assert first_swept.wait(10)
    reports["other"] = sweep(db, clock)  # blocks on the run's row, then finds it done
    thread.join(10)
    assert sorted(len(r.abandoned) for r in reports.values()) == [0, 1]
    assert view(db, run_id)["status"] == "failed"
