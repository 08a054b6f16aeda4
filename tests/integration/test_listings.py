"""The operator's lists on SQLite and PostgreSQL: tasks, DAG runs and alerts, filtered,
newest first, paged by keyset cursor -- every row once across pages, none skipped, a
forged cursor refused, and a caller's or agent's key shown only what it may read.

The alerts are the records the hub's own decisions leave (a sweep that finds an instance
gone, a breaker that opens and closes, a link suspected of a dependency loop, a 429 at
submit), written here by the same functions the hub calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from reach.core.flow.breakers import BreakerPolicy, BreakerState, Transition
from reach.core.flow.loops import LinkCounts
from reach.core.ledger.statuses import DagRunStatus, TaskStatus
from reach.core.ops.paging import DagRunFilter, Page, TaskFilter
from reach.core.orchestration import dags
from reach.core.security.auth import Principal, Scope
from reach.errors import Backpressure, BadCursor, InvalidQuery
from reach.hub.clock import ManualClock
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.flow import admission, breakers
from reach.hub.flow.loops import LinkWatch
from reach.hub.ledger import tasks as ledger
from reach.hub.ops.alerts import KINDS, BackpressureLog, list_alerts
from reach.hub.ops.listings import list_dag_runs, list_tasks
from reach.hub.orchestration import dagruns
from reach.hub.settings import load_settings
from reach.hub.storage.models import AgentRow, DagRunRow, TaskRow
from reach.wire.schemas import RegisterRequest
from reach.worker.context import HubContext

T0 = 1_800_000_000.0
STATUSES = [TaskStatus.SUCCESS, TaskStatus.FAILED, TaskStatus.DEAD, TaskStatus.PENDING]
AGENTS = ["doc-analyzer-01", "doc-analyzer-02", "pay-01"]
CALLERS = ["key:aaaa", "key:bbbb", "agent:doc-analyzer-01"]


@pytest.fixture
def ctx(store_url: str, engine: Engine, tmp_path: Path) -> Iterator[HubContext]:
    env = {"REACH_DATABASE_URL": store_url, "REACH_HOME": str(tmp_path)}
    yield HubContext(
        settings=load_settings(environ=env), engine=engine, clock=ManualClock(start=T0)
    )


def add_tasks(ctx: HubContext, n: int, *, start: int = 0, tie_every: int = 3) -> list[str]:
    """``n`` tasks spread over agents, callers, statuses, methods and db; every
    ``tie_every``-th pair shares a created_at (a page boundary must split ties exactly)."""
    ids = []
    with ctx.transaction() as s:
        for i in range(start, start + n):
            at = T0 + (i - i % 2 if i % tie_every == 0 else i)
            task_id = f"t-{i:04d}"
            s.add(
                TaskRow(
                    task_id=task_id,
                    agent_id=AGENTS[i // 3 % 3],
                    target={"agent_id": AGENTS[i // 3 % 3]},
                    method="analyze" if i % 2 else "summarize",
                    payload={"i": i},
                    status=STATUSES[i % 4].value,
                    session_id=f"s-{i % 5}",
                    caller=CALLERS[i % 3],
                    result={"big": "x" * 100},
                    created_at=at,
                    updated_at=at,
                )
            )
            ids.append(task_id)
    return ids


def everything(fetch: Any, limit: int) -> list[dict[str, Any]]:
    """Every item of a listing, page by page (``fetch(cursor, limit) -> Page``)."""
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(1000):
        page: Page = fetch(cursor, limit)
        assert len(page.items) <= limit
        items.extend(page.items)
        if page.next_cursor is None:
            return items
        assert page.items, "a page with a next cursor holds rows"
        cursor = page.next_cursor
    raise AssertionError("the cursor never ran out")


def order_key(item: dict[str, Any]) -> tuple[float, str]:
    return item["created_at"], item["task_id"]


@pytest.mark.parametrize("limit", [1, 4, 7, 50])
def test_tasks_page_newest_first_without_gaps_or_repeats(ctx: HubContext, limit: int) -> None:
    ids = add_tasks(ctx, 23)
    got = everything(lambda c, n: list_tasks(ctx, TaskFilter(), c, n), limit)
    assert sorted(t["task_id"] for t in got) == sorted(ids)  # none missing
    assert len({t["task_id"] for t in got}) == len(got)  # none twice
    ats = [t["created_at"] for t in got]
    assert ats == sorted(ats, reverse=True)
    assert "result" not in got[0] and got[0]["caller"] in CALLERS  # the compact view


def test_rows_written_between_pages_neither_shift_nor_repeat(ctx: HubContext) -> None:
    add_tasks(ctx, 10)
    first = list_tasks(ctx, TaskFilter(), None, 4)
    add_tasks(ctx, 5, start=100)  # newer than all: they belong before page one
    rest = everything(lambda c, n: list_tasks(ctx, TaskFilter(), c or first.next_cursor, n), 4)
    seen = [t["task_id"] for t in first.items + rest]
    assert len(seen) == len(set(seen)) == 10
    assert not any(t.startswith("t-01") for t in seen)


@pytest.mark.parametrize(
    ("filters", "wanted"),
    [
        (TaskFilter(statuses=frozenset({TaskStatus.FAILED})), lambda i: i % 4 == 1),
        (
            TaskFilter(statuses=frozenset({TaskStatus.FAILED, TaskStatus.DEAD})),
            lambda i: i % 4 in (1, 2),
        ),
        (TaskFilter(agent_id="doc-analyzer-02"), lambda i: i // 3 % 3 == 1),
        (TaskFilter(capability="analyze"), lambda i: i % 2 == 1),
        (TaskFilter(caller="key:bbbb"), lambda i: i % 3 == 1),
        (TaskFilter(session_id="s-3"), lambda i: i % 5 == 3),
        (TaskFilter(since=T0 + 10), lambda i: i >= 10),
        (TaskFilter(until=T0 + 10), lambda i: i < 10),
        (TaskFilter(since=T0 + 4, until=T0 + 12), lambda i: 4 <= i < 12),
        (
            TaskFilter(
                statuses=frozenset({TaskStatus.SUCCESS}), agent_id="doc-analyzer-01", since=T0
            ),
            lambda i: i % 4 == 0 and i // 3 % 3 == 0,
        ),
        (TaskFilter(agent_id="nobody"), lambda i: False),
    ],
)
def test_each_task_filter(ctx: HubContext, filters: TaskFilter, wanted: Any) -> None:
    add_tasks(ctx, 30, tie_every=10**6)  # no ties: created_at is T0 + i
    got = everything(lambda c, n: list_tasks(ctx, filters, c, n), 4)
    assert sorted(t["task_id"] for t in got) == [f"t-{i:04d}" for i in range(30) if wanted(i)]


def test_a_forged_cursor_is_refused(ctx: HubContext) -> None:
    add_tasks(ctx, 5)
    page = list_tasks(ctx, TaskFilter(), None, 2)
    assert page.next_cursor is not None
    body, _, check = page.next_cursor.partition(".")
    for forged in ("garbage", body[:-1] + ("A" if body[-1] != "A" else "B") + "." + check):
        with pytest.raises(BadCursor):
            list_tasks(ctx, TaskFilter(), forged, 2)
    with pytest.raises(BadCursor):  # a task cursor is not a DAG run cursor
        list_dag_runs(ctx, DagRunFilter(), page.next_cursor, 2)
    with pytest.raises(InvalidQuery, match="limit"):
        list_tasks(ctx, TaskFilter(), None, 501)


def test_a_caller_key_lists_only_its_own_tasks(ctx: HubContext) -> None:
    add_tasks(ctx, 24)
    bbbb = Principal(Scope.CALLER, key_id="bbbb")
    mine = everything(lambda c, n: list_tasks(ctx, TaskFilter(), c, n, principal=bbbb), 5)
    assert mine and {t["caller"] for t in mine} == {"key:bbbb"}
    assert len(mine) == 8
    # naming another caller does not widen it
    theirs = list_tasks(ctx, TaskFilter(caller="key:aaaa"), None, 50, principal=bbbb)
    assert theirs.items == []
    # an agent key: what its agent submitted and what was delivered to it
    agent = Principal(Scope.AGENT, key_id="cccc", agent_pattern="doc-analyzer-0*")
    with ctx.transaction() as s:  # the glob is matched against the registered agents
        register(s, ctx, "doc-analyzer-01", "i-1")
        register(s, ctx, "doc-analyzer-02", "i-2")
    seen = everything(lambda c, n: list_tasks(ctx, TaskFilter(), c, n, principal=agent), 5)
    assert {t["task_id"] for t in seen} == {
        f"t-{i:04d}" for i in range(24) if i // 3 % 3 in (0, 1) or i % 3 == 2
    }  # routed to doc-analyzer-0x, or submitted by agent:doc-analyzer-01
    assert len(seen) < 24
    for viewer in (Principal(Scope.VIEWER, key_id="vvvv"), Principal(Scope.ADMIN), None):
        assert len(list_tasks(ctx, TaskFilter(), None, 500, principal=viewer).items) == 24
    approver = Principal(Scope.APPROVER, key_id="pppp")
    assert list_tasks(ctx, TaskFilter(), None, 50, principal=approver).items == []


def register(s: Session, ctx: HubContext, agent_id: str, instance_id: str) -> None:
    registry.register(
        s,
        RegisterRequest(
            agent_id=agent_id,
            instance_id=instance_id,
            addr=f"10.1.1.{sum(map(ord, instance_id)) % 250 + 1}:7000",
            capabilities=[{"type": "m"}],
        ),
        ctx.clock.now(),
        ctx.policy,
    )


SPEC = {"name": "flow", "nodes": [{"id": "a", "agent_id": "doc-analyzer-01", "method": "m"}]}


def test_dag_runs_page_filter_and_ownership(ctx: HubContext) -> None:
    clock = ctx.clock
    assert isinstance(clock, ManualClock)
    with ctx.transaction() as s:
        register(s, ctx, "doc-analyzer-01", "i-1")
    runs = []
    for i in range(9):
        spec = dags.parse_dag({**SPEC, "name": "flow" if i % 3 else "other"})
        with ctx.transaction() as s:
            run_id = dagruns.start_run(
                s, spec, {"i": i}, clock.now(), caller="key:aaaa" if i % 2 else "key:bbbb"
            )
            if i % 4 == 0:
                s.execute(
                    update(DagRunRow).where(DagRunRow.run_id == run_id).values(status="failed")
                )
        runs.append(run_id)
        clock.advance(0 if i == 4 else 1)  # runs 4 and 5 share an instant: id breaks the tie
    got = everything(lambda c, n: list_dag_runs(ctx, DagRunFilter(), c, n), 2)
    assert [r["run_id"] for r in got] == runs[::-1]
    assert got[0]["nodes"] == {dagruns.NODE_PENDING: 1}
    assert "input" not in got[0] and "spec" not in got[0]
    failed = list_dag_runs(ctx, DagRunFilter(statuses=frozenset({DagRunStatus.FAILED})), None, 50)
    assert sorted(r["run_id"] for r in failed.items) == sorted(runs[i] for i in (0, 4, 8))
    named = list_dag_runs(ctx, DagRunFilter(name="other"), None, 50)
    assert sorted(r["run_id"] for r in named.items) == sorted(runs[i] for i in (0, 3, 6))
    since = list_dag_runs(ctx, DagRunFilter(since=T0 + 5), None, 50)
    assert {r["run_id"] for r in since.items} == set(runs[6:])
    mine = list_dag_runs(ctx, DagRunFilter(), None, 50, principal=Principal(Scope.CALLER, "aaaa"))
    assert {r["run_id"] for r in mine.items} == {runs[i] for i in range(9) if i % 2}


# -- alerts -----------------------------------------------------------------------------


def raise_every_alert(ctx: HubContext) -> None:
    """The hub's own functions, leaving the records they leave in production."""
    clock = ctx.clock
    assert isinstance(clock, ManualClock)
    with ctx.transaction() as s:
        register(s, ctx, "doc-analyzer-01", "0123456789abcdef-inst")
        register(s, ctx, "pay-01", "pay-inst-1")
    clock.advance(60)  # heartbeats long missed: both go offline on the sweep
    with ctx.transaction() as s:
        assert monitoring.sweep(s, clock.now(), ctx.policy)
    clock.advance(1)
    ticket = breakers.Ticket("pay-inst-1", "pay-01", 0.0, False)
    policy = BreakerPolicy()
    assert breakers.open_breaker(
        ctx.db, ticket, Transition(BreakerState.OPEN, 15, 20), clock.now(), policy
    )
    clock.advance(1)
    assert breakers.close(ctx.db, ticket, clock.now())
    clock.advance(1)
    watch = LinkWatch(ctx.shared_counts, threshold=20, window_s=300)
    with ctx.transaction() as s:
        watch.settle(s, "doc-analyzer-01", "pay-01", LinkCounts(25, 23), clock.now())
    clock.advance(1)
    with ctx.transaction() as s:
        watch.settle(s, "doc-analyzer-01", "pay-01", LinkCounts(2, 1), clock.now())
    clock.advance(1)
    log = BackpressureLog(every_s=10)
    with ctx.transaction() as s:
        s.execute(update(AgentRow).where(AgentRow.agent_id == "pay-01").values(max_queue=1))
        s.add(
            TaskRow(
                task_id="t-full",
                agent_id="pay-01",
                method="m",
                payload={},
                status="pending",
                created_at=clock.now(),
                updated_at=clock.now(),
            )
        )
    for _ in range(3):  # one row for the first, the next two counted in the following one
        with pytest.raises(Backpressure) as full:
            with ctx.transaction() as s:
                admission.admit(s, ["pay-01"], admission.Limits(), clock.now(), named=True)
        log.record(ctx, full.value, "key:aaaa")
    clock.advance(11)
    log.record(ctx, full.value, "key:aaaa")
    clock.advance(1)
    with ctx.transaction() as s:  # a task out of retries: the dead-letter queue's row
        task = s.scalars(select(TaskRow).where(TaskRow.task_id == "t-full")).one()
        task.payload = {"card": "4111-secret"}
        ledger.dead_letter(
            s, task, clock.now(), reason="retries exhausted", error={"kind": "timeout"}
        )


def test_alerts_of_every_kind_newest_first(ctx: HubContext) -> None:
    raise_every_alert(ctx)
    page = list_alerts(ctx, None, None, None, 100)
    assert page.next_cursor is None
    kinds = [a["kind"] for a in page.items]
    assert set(kinds) >= {
        "offline",
        "breaker_opened",
        "breaker_closed",
        "dependency_loop_suspected",
        "dependency_loop_calmed",
        "backpressure",
        "dead_letter",
    }, kinds
    assert set(kinds) <= KINDS
    ats = [a["at"] for a in page.items]
    assert ats == sorted(ats, reverse=True)
    by_kind = {a["kind"]: a for a in page.items}
    opened = by_kind["breaker_opened"]
    assert opened["agent_id"] == "pay-01" and opened["instance_id"] == "pay-inst-1"
    assert (
        opened["summary"]
        == "pay-01/pay-inst-1: breaker opened: 15 of 20 answers failed within 10 s"
    )
    offline = [a for a in page.items if a["kind"] == "offline"]
    assert {a["agent_id"] for a in offline} == {"doc-analyzer-01", "pay-01"}
    short = next(a for a in offline if a["agent_id"] == "doc-analyzer-01")
    assert short["summary"].startswith("doc-analyzer-01/0123456789ab: ")  # 12 characters
    assert short["instance_id"] == "0123456789abcdef-inst"  # the full id in the data
    loop = by_kind["dependency_loop_suspected"]
    assert "doc-analyzer-01<->pay-01" in loop["summary"] and loop["instance_id"] is None
    refusals = [a for a in page.items if a["kind"] == "backpressure"]
    assert [a["details"]["refused"] for a in refusals] == [3, 1]  # newest first
    assert refusals[0]["agent_id"] == "pay-01" and "3 submits refused" in refusals[0]["summary"]
    assert "queue full (1 of 1)" in refusals[1]["summary"]
    dead = by_kind["dead_letter"]  # the newest: the last one raised
    assert page.items[0] is dead and dead["agent_id"] == "pay-01"
    assert dead["summary"] == (
        "pay-01: task t-full (m) dead-lettered after 0 attempts: retries exhausted"
    )
    assert dead["details"]["task_id"] == "t-full" and dead["source"] == "dead_letter"
    assert "4111-secret" not in str(dead)  # never the payload
    for alert in page.items:
        assert alert["summary"] and "\n" not in alert["summary"]
        assert isinstance(alert["details"], dict)


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_alerts_page_across_the_tables_without_gaps(ctx: HubContext, limit: int) -> None:
    raise_every_alert(ctx)
    whole = list_alerts(ctx, None, None, None, 500).items
    got = everything(lambda c, n: list_alerts(ctx, None, None, c, n), limit)
    assert got == whole


def test_alert_filters(ctx: HubContext) -> None:
    raise_every_alert(ctx)
    whole = list_alerts(ctx, None, None, None, 500).items
    for kinds in (
        {"offline"},
        {"breaker_opened", "backpressure"},
        {"dependency_loop_calmed"},
        {"dead_letter"},
        {"dead_letter", "offline"},
    ):
        got = list_alerts(ctx, kinds, None, None, 500).items
        assert got == [a for a in whole if a["kind"] in kinds]
    since = whole[2]["at"]
    assert list_alerts(ctx, None, since, None, 500).items == [a for a in whole if a["at"] >= since]
    with pytest.raises(InvalidQuery, match="kind"):
        list_alerts(ctx, {"meteor_strike"}, None, None, 10)
    with pytest.raises(BadCursor):
        list_alerts(ctx, None, None, "garbage", 10)
    assert list_alerts(ctx, {"heartbeat_lost"}, None, None, 10).items == []
