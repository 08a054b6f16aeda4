"""Retention on both stores: exactly the old finished records go, in batches, and nothing a
live task, an unresolved dead letter or a running DAG still needs; long-offline instances
are removed and no longer probed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

from reach.core.ledger.statuses import InstanceStatus, TaskStatus
from reach.core.ops.retention import RetentionPolicy
from reach.hub.clock import ManualClock
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.ops import retention
from reach.hub.settings import Settings, load_settings
from reach.hub.storage import session_factory
from reach.hub.storage.models import (
    AgentCapabilityRow,
    AgentLinkRow,
    AgentRow,
    AgentTagRow,
    ApprovalRow,
    AuditRow,
    BroadcastRow,
    CallbackRow,
    DagNodeRunRow,
    DagRunRow,
    DeadLetterRow,
    InstanceEventRow,
    InstanceRow,
    OutboxRow,
    SessionRow,
    TaskEventRow,
    TaskRow,
    UiSignOutRow,
)
from reach.wire.schemas import RegisterRequest
from reach.worker.context import HubContext

pytestmark = pytest.mark.timeout(60)

NOW = 1_700_000_000.0
DAY = 86_400.0
OLD = NOW - 31 * DAY  # past the default 30 days
NEW = NOW - 29 * DAY
DL_OLD = NOW - 15 * DAY  # an unresolved dead letter past the default 14 days
DL_NEW = NOW - 13 * DAY


@pytest.fixture
def db(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def add_task(s: Session, task_id: str, status: TaskStatus, at: float, *, finished: bool) -> None:
    """A task with one event and one outbox row, as delivery leaves them."""
    s.add(
        TaskRow(
            task_id=task_id,
            agent_id="a",
            target={"agent_id": "a"},
            method="m",
            payload={},
            status=status.value,
            attempt_seq=1,
            created_at=at,
            updated_at=at,
            finished_at=at if finished else None,
        )
    )
    s.add(TaskEventRow(task_id=task_id, agent_id="a", attempt_seq=1, kind="x", detail={}, at=at))
    s.add(
        OutboxRow(
            task_id=task_id,
            agent_id="a",
            attempt_seq=1,
            message={},
            created_at=at,
            available_at=at,
            published_at=at,
        )
    )


def add_dead_letter(s: Session, task_id: str, at: float, replayed_at: float | None) -> None:
    s.add(
        DeadLetterRow(
            task_id=task_id,
            agent_id="a",
            method="m",
            payload={},
            attempts=5,
            last_error={},
            reason="r",
            created_at=at,
            replayed_at=replayed_at,
        )
    )


def add_run(s: Session, run_id: str, status: str, at: float, finished: bool) -> None:
    s.add(
        DagRunRow(
            run_id=run_id,
            name="d",
            spec={},
            input={},
            status=status,
            reason="",
            created_at=at,
            updated_at=at,
            finished_at=at if finished else None,
        )
    )
    for node in ("n1", "n2"):
        s.add(DagNodeRunRow(run_id=run_id, node_id=node, status="success", reason=""))


def seed(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        # old and finished: go with their events, outbox rows and resolved dead letters
        for status in (TaskStatus.SUCCESS, TaskStatus.FAILED, TaskStatus.CANCELLED):
            add_task(s, f"old-{status.value}", status, OLD, finished=True)
        add_task(s, "old-dead-replayed", TaskStatus.FAILED, OLD, finished=True)
        add_dead_letter(s, "old-dead-replayed", OLD - DAY, replayed_at=OLD - 1)
        # kept: an unresolved dead letter (replayable, within dead_letter_days), live
        # tasks, recent tasks
        add_task(s, "old-dead-unresolved", TaskStatus.DEAD, OLD, finished=True)
        add_dead_letter(s, "old-dead-unresolved", DL_NEW, replayed_at=None)
        for status in (TaskStatus.PENDING, TaskStatus.EXECUTING, TaskStatus.AWAITING_APPROVAL):
            add_task(s, f"old-live-{status.value}", status, OLD, finished=False)
        add_task(s, "new-success", TaskStatus.SUCCESS, NEW, finished=True)
        # dead letters alone: replayed long ago (task gone: goes; task live again: kept)
        add_dead_letter(s, "gone-task", OLD, replayed_at=OLD)
        add_dead_letter(s, "old-live-pending", OLD, replayed_at=OLD)
        add_dead_letter(s, "gone-unresolved", DL_NEW, replayed_at=None)
        # DAG runs: finished long ago go (with their nodes), running ones stay
        add_run(s, "run-old-success", "success", OLD, finished=True)
        add_run(s, "run-old-failed", "failed", OLD, finished=True)
        add_run(s, "run-old-running", "running", OLD, finished=False)
        add_run(s, "run-new-success", "success", NEW, finished=True)
        for bid, at in (("b-old", OLD), ("b-new", NEW)):
            s.add(
                BroadcastRow(
                    broadcast_id=bid,
                    request={},
                    targets=[],
                    min_results=1,
                    created_at=at,
                    deadline=at + 30,
                )
            )
        for kind, at in (("old", OLD), ("new", NEW)):
            s.add(InstanceEventRow(instance_id="i", agent_id="a", kind=kind, detail={}, at=at))


def column(db: sessionmaker[Session], col: Any) -> set[Any]:
    with db() as s:
        return set(s.scalars(select(col)))


def test_exactly_the_old_finished_records_go(db: sessionmaker[Session]) -> None:
    seed(db)
    policy = RetentionPolicy(batch_size=2, batches=100)  # many small batches
    deleted = retention.sweep(db.begin, NOW, policy)

    kept_tasks = {
        "old-dead-unresolved",
        "old-live-pending",
        "old-live-executing",
        "old-live-awaiting_approval",
        "new-success",
    }
    assert column(db, TaskRow.task_id) == kept_tasks
    assert column(db, TaskEventRow.task_id) == kept_tasks
    assert column(db, OutboxRow.task_id) == kept_tasks
    assert column(db, DeadLetterRow.task_id) == {
        "old-dead-unresolved",
        "old-live-pending",
        "gone-unresolved",
    }
    assert column(db, DagRunRow.run_id) == {"run-old-running", "run-new-success"}
    assert column(db, DagNodeRunRow.run_id) == {"run-old-running", "run-new-success"}
    assert column(db, BroadcastRow.broadcast_id) == {"b-new"}
    assert column(db, InstanceEventRow.kind) == {"new"}
    assert deleted == {
        "tasks": 4,
        "task_events": 4,
        "outbox": 4,
        "dead_letters": 2,  # the replayed one with its task, the orphan replayed one
        "dag_runs": 2,
        "dag_node_runs": 4,
        "broadcasts": 1,
        "instance_events": 1,
    }
    assert retention.sweep(db.begin, NOW, policy) == {}  # nothing left to do


def test_a_sweep_deletes_in_bounded_batches(db: sessionmaker[Session]) -> None:
    with db.begin() as s:
        for i in range(7):
            add_task(s, f"t{i}", TaskStatus.SUCCESS, OLD + i, finished=True)
    policy = RetentionPolicy(batch_size=3, batches=2)  # at most 6 tasks per sweep
    assert retention.sweep(db.begin, NOW, policy)["tasks"] == 6
    assert column(db, TaskRow.task_id) == {"t6"}  # the oldest went first
    assert retention.sweep(db.begin, NOW, policy)["tasks"] == 1
    assert column(db, TaskRow.task_id) == set()


def register(db: sessionmaker[Session], instance_id: str, now: float) -> None:
    with db.begin() as s:
        registry.register(
            s,
            RegisterRequest(
                agent_id="a", instance_id=instance_id, addr="127.0.0.1:9", allow_loopback=True
            ),
            now,
            Policy.from_settings(Settings()),
        )


def set_status(db: sessionmaker[Session], instance_id: str, status: str, at: float) -> None:
    with db.begin() as s:
        row = s.get(InstanceRow, instance_id)
        assert row is not None
        row.status, row.status_changed_at, row.next_probe_at = status, at, 0.0


@pytest.fixture
def hub(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubContext]:
    """A hub whose retention is counted in seconds, as REACH_RETENTION__* floats allow."""
    import reach.worker.app

    settings = load_settings(
        environ={
            "REACH_DATABASE_URL": store_url,
            "REACH_HOME": str(tmp_path),
            "REACH_RETENTION__DAYS": str(60 / DAY),  # one minute
            "REACH_RETENTION__OFFLINE_INSTANCE_HOURS": str(10 / 3600),  # ten seconds
        }
    )
    ctx = HubContext.from_settings(settings, clock=ManualClock(NOW))
    monkeypatch.setattr(reach.worker.app, "runtime", lambda: ctx)
    yield ctx
    ctx.engine.dispose()


def test_an_instance_long_offline_is_removed_and_no_longer_probed(hub: HubContext) -> None:
    from reach.tasks.maintenance import retention_sweep

    for instance_id in ("long-offline", "just-offline", "online"):
        register(hub.db, instance_id, NOW - 100)
    set_status(hub.db, "long-offline", InstanceStatus.OFFLINE.value, NOW - 11)
    set_status(hub.db, "just-offline", InstanceStatus.OFFLINE.value, NOW - 9)
    with hub.transaction() as s:  # offline instances are probed (they may come back) ...
        due, _ = monitoring.claim_due_probes(s, NOW, hub.policy)
        assert "long-offline" in {t.instance_id for t in due}
        for row in s.scalars(select(InstanceRow)):
            row.probe_lease_until = None

    deleted = retention_sweep()  # the beat task, on settings from the environment

    assert deleted == {"instances": 1}
    assert column(hub.db, InstanceRow.instance_id) == {"just-offline", "online"}
    with hub.transaction() as s:  # ... until retention removed them
        due, _ = monitoring.claim_due_probes(s, NOW, hub.policy)
        assert "long-offline" not in {t.instance_id for t in due}
        removed = s.scalars(
            select(InstanceEventRow).where(InstanceEventRow.instance_id == "long-offline")
        ).all()
    assert [e.kind for e in removed][-1] == "removed"


def test_the_beat_schedule_runs_retention_at_its_interval() -> None:
    from reach.worker.schedule import beat_schedule

    entry = beat_schedule(Settings())["reach.retention-sweep"]
    assert (entry["task"], entry["schedule"]) == ("reach.retention_sweep", 300.0)


def add_callback(s: Session, task_id: str, at: float) -> None:
    s.add(CallbackRow(task_id=task_id, url="https://example.invalid/cb", status="delivered",
                      created_at=at, delivered_at=at))  # fmt: skip


def add_approval(s: Session, task_id: str, at: float) -> None:
    s.add(
        ApprovalRow(
            approval_id=f"ap-{task_id}", task_id=task_id, capability="pay", method="pay",
            payload_hash="0" * 64, requested_at=at, expires_at=at + 3600, status="approved",
        )
    )  # fmt: skip


def add_agent(s: Session, agent_id: str, at: float, *, override: int | None = None) -> None:
    s.add(AgentRow(agent_id=agent_id, tags=["t"], capabilities=[{"type": "c"}], meta={},
                   created_at=at, updated_at=at, max_queue_override=override))  # fmt: skip
    s.flush()
    s.add(AgentTagRow(agent_id=agent_id, tag="t"))
    s.add(AgentCapabilityRow(agent_id=agent_id, capability="c"))


def test_every_table_is_bounded(db: sessionmaker[Session]) -> None:
    """Each table grows with rows past their retention and rows within it; one sweep
    leaves exactly the latter (issue 39: audit_log, callbacks, approvals, db,
    agents without instances, orphans of deleted tasks, unresolved dead letters)."""
    with db.begin() as s:
        # an old finished task takes its callbacks and approvals along
        add_task(s, "old-paid", TaskStatus.SUCCESS, OLD, finished=True)
        add_callback(s, "old-paid", OLD)
        add_approval(s, "old-paid", OLD)
        add_task(s, "new-paid", TaskStatus.SUCCESS, NEW, finished=True)
        add_callback(s, "new-paid", NEW)
        add_approval(s, "new-paid", NEW)
        # orphans: the task went before this version deleted them with it
        add_callback(s, "deleted-long-ago", OLD)
        add_approval(s, "deleted-long-ago", OLD)
        # unresolved dead letters: past dead_letter_days they go with their task
        add_task(s, "dl-old", TaskStatus.DEAD, DL_OLD, finished=True)
        add_dead_letter(s, "dl-old", DL_OLD, replayed_at=None)
        add_task(s, "dl-new", TaskStatus.DEAD, DL_NEW, finished=True)
        add_dead_letter(s, "dl-new", DL_NEW, replayed_at=None)
        # db: closed or expired long ago go; open or recently closed stay
        for sid, closed, expires in (
            ("s-closed-old", OLD, None),
            ("s-expired-old", None, OLD),
            ("s-closed-new", NEW, None),
            ("s-open", None, NOW + DAY),
            ("s-open-no-ttl", None, None),
        ):
            status = "closed" if closed else "open"
            s.add(SessionRow(session_id=sid, status=status, opened_at=OLD - DAY,
                             closed_at=closed, expires_at=expires))  # fmt: skip
        s.add(AgentLinkRow(src="a", dst="b", suspected_at=OLD, demoted_until=OLD))
        s.add(AgentLinkRow(src="b", dst="a", suspected_at=OLD, demoted_until=NOW + 60))
        s.add(AuditRow(at=NOW - 91 * DAY, actor="admin", action="keys.create", outcome="ok"))
        s.add(AuditRow(at=NOW - 89 * DAY, actor="admin", action="keys.revoke", outcome="ok"))
        # agents: one left without instances long ago goes; one an admin configured, one
        # still registered and one that lost its instances just now stay
        add_agent(s, "ag-alone-old", NOW - 2 * DAY)
        add_agent(s, "ag-configured", NOW - 2 * DAY, override=5)
        add_agent(s, "ag-alone-new", NOW - 3600)
    register(db, "i-deregistered", NOW - 2 * DAY)  # agent "a"
    set_status(db, "i-deregistered", InstanceStatus.DEREGISTERED.value, NOW - 2 * DAY)
    register(db, "i-live", NOW - 2 * DAY)
    set_status(db, "i-live", InstanceStatus.ONLINE.value, NOW - 2 * DAY)

    deleted = retention.sweep(db.begin, NOW, RetentionPolicy(batch_size=2, batches=100))

    assert column(db, TaskRow.task_id) == {"new-paid", "dl-new"}
    assert column(db, CallbackRow.task_id) == {"new-paid"}
    assert column(db, ApprovalRow.task_id) == {"new-paid"}
    assert column(db, DeadLetterRow.task_id) == {"dl-new"}
    assert column(db, SessionRow.session_id) == {"s-closed-new", "s-open", "s-open-no-ttl"}
    assert column(db, AgentLinkRow.src) == {"b"}
    assert column(db, AuditRow.action) == {"keys.revoke"}
    assert column(db, InstanceRow.instance_id) == {"i-live"}
    assert column(db, AgentRow.agent_id) == {"a", "ag-configured", "ag-alone-new"}
    assert column(db, AgentTagRow.agent_id) == {"ag-configured", "ag-alone-new"}
    assert "ag-alone-old" not in column(db, AgentCapabilityRow.agent_id)
    assert deleted["callbacks"] == 2 and deleted["approvals"] == 2
    assert deleted["sessions"] == 2 and deleted["agents"] == 1 and deleted["audit_log"] == 1
    assert deleted["instances"] == 1 and deleted["agent_links"] == 1
    policy = RetentionPolicy(batch_size=2, batches=100)
    assert retention.sweep(db.begin, NOW, policy) == {}  # bounded: nothing left to do


def test_a_sign_out_is_kept_until_its_session_would_have_expired(
    db: sessionmaker[Session],
) -> None:
    """The record that refuses a signed-out dashboard cookie (issue 37, item 14) goes once
    the cookie has expired anyway, and not before."""
    with db.begin() as s:
        for sid, expires_at in (("expired", NOW - 1), ("live", NOW + 3600)):
            s.add(UiSignOutRow(sid=sid, key_id="k", signed_out_at=NOW - 60, expires_at=expires_at))
    deleted = retention.sweep(db.begin, NOW, RetentionPolicy())
    assert deleted == {"ui_sign_outs": 1}
    assert column(db, UiSignOutRow.sid) == {"live"}
