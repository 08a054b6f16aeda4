"""Hub-wide windows: what two processes' handles add is one count, on both stores."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from reach.hub.flow.shared_counts import SharedCounts, window_start
from reach.hub.storage import read_session_factory, session_factory
from reach.hub.storage.models import FlowCountRow
from tests.support.waiting import wait_until


@pytest.fixture
def db(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def test_two_handles_share_one_window(db: sessionmaker[Session]) -> None:
    a = SharedCounts(db, flush_every=0.0, background=False)
    b = SharedCounts(db, flush_every=0.0, background=False)
    for i in range(5):
        a.add("requests", "orders", 1000.0 + i)
    for i in range(3):
        b.add("requests", "orders", 1002.0 + i)
    b.add("requests", "other", 1003.0)
    a.flush(1004.5, force=True)
    b.flush(1004.5, force=True)
    assert a.total("requests", "orders", 1004.5, window_s=10) == 8
    # a window of two seconds sees only buckets 1003 and 1004
    assert b.total("requests", "orders", 1004.5, window_s=2) == 4
    assert a.totals("requests", ["orders", "other", "none"], 1004.5, 10) == {
        "orders": 8,
        "other": 1,
        "none": 0,
    }


def test_unflushed_increments_count_for_their_own_process(db: sessionmaker[Session]) -> None:
    slow = SharedCounts(db, read_ttl=0.0, background=False)
    slow.add("retries", "t", 10.0)
    slow.flush(10.0)  # the first flush is due at once
    slow.add("retries", "t", 10.5)
    slow.add("retries", "t", 11.0)
    assert slow.total("retries", "t", 11.0, 10) == 3
    slow.flush(10.9)  # not due yet (flush_every 1 s): nothing written
    other = SharedCounts(db, read_ttl=0.0, background=False)
    assert other.total("retries", "t", 11.0, 10) == 1  # the rest is still in slow's buffer
    slow.flush(11.0, force=True)
    assert other.total("retries", "t", 11.0, 10) == 3
    with db.begin() as s:
        assert s.scalar(select(func.count()).select_from(FlowCountRow)) == 2  # 10 s and 11 s


def test_window_start_covers_whole_seconds() -> None:
    assert window_start(100.2, 10) == 91
    assert window_start(100.0, 1) == 100
    assert window_start(100.0, 0.5) == 100  # never less than the current second


def test_the_flusher_thread_writes_without_the_caller_and_inside_its_transaction(
    db: sessionmaker[Session],
) -> None:
    """A caller inside its own write transaction (a delivery's claim) adds and reads: on
    SQLite a flush in its thread would wait for the lock it holds itself."""
    reads = read_session_factory(db.kw["bind"])
    counts = SharedCounts(db, read_db=reads, flush_every=0.05, read_ttl=0.0)
    with db.begin() as held:
        held.execute(select(FlowCountRow).limit(1))
        held.add(FlowCountRow(name="held", key="k", bucket=1, count=1))
        held.flush()
        counts.add("requests", "agent", 500.0)
        assert counts.total("requests", "agent", 500.0, 10) == 1  # its own, unflushed
    reader = SharedCounts(db, read_ttl=0.0, background=False)
    try:
        wait_until(lambda: reader.total("requests", "agent", 500.0, 10) == 1, 10, what="flush")
    finally:
        counts.close()


def test_breaker_streaks_stay_per_process_over_hub_wide_windows(
    db: sessionmaker[Session],
) -> None:
    """With shared windows each process still keeps its own streak: two processes seeing
    two failing tasks each open nothing at a streak of 3; a third in one of them does,
    and a success it saw ends only its own run."""
    from reach.core.flow.breakers import BreakerPolicy, BreakerState, Transition
    from reach.hub.flow.breakers import Breakers, Ticket

    policy = BreakerPolicy(min_volume=1000, streak=3)
    ticket = Ticket("i-1", "a", 0.0, False)
    a = Breakers(shared=SharedCounts(db, read_ttl=0.0, background=False))
    b = Breakers(shared=SharedCounts(db, read_ttl=0.0, background=False))
    for proc, task in ((a, "t1"), (b, "t2"), (a, "t3"), (b, "t4")):
        assert proc.record(ticket, False, 100.0, policy, task_id=task) is None
    assert b.record(ticket, True, 100.1, policy, task_id="t5") is None  # b's run ends
    assert b.record(ticket, False, 100.2, policy, task_id="t6") is None
    opened = a.record(ticket, False, 100.2, policy, task_id="t7")
    assert opened == Transition(BreakerState.OPEN, 3, 3, "streak")
    # the evidence that opened it opens nothing again in that process
    assert a.record(ticket, False, 100.3, policy, task_id="t8") is None


def test_a_total_during_a_flush_counts_its_increments_once(engine: Engine) -> None:
    """The increments a flush is writing are neither buffered nor stored until it commits:
    a total read then still holds them (a loop guard's tipping reach must see the whole
    other way), and a total read after the commit, before the flush is done, does not
    count them twice."""
    writes = session_factory(engine)
    counts = SharedCounts(
        writes, read_db=read_session_factory(engine), read_ttl=60.0, background=False
    )
    for i in range(4):
        counts.add("link", "e>f", 100.0 + i * 0.1)
    seen: dict[str, int] = {}

    def while_writing(state: Any) -> None:  # the upsert, before it runs
        seen.setdefault("writing", counts.total("link", "e>f", 100.5, 10))

    def after_commit(session: Session) -> None:  # committed, the flush not yet done
        seen["committed"] = counts.total("link", "e>f", 100.5, 10)

    event.listen(writes, "do_orm_execute", while_writing)
    event.listen(writes, "after_commit", after_commit)
    counts.flush(100.5, force=True)
    assert seen == {"writing": 4, "committed": 4}
    assert counts.total("link", "e>f", 100.5, 10) == 4
    other = SharedCounts(session_factory(engine), read_ttl=0.0, background=False)
    assert other.total("link", "e>f", 100.5, 10) == 4


class _ReadThenFlush(SharedCounts):
    """A handle whose first read returns only after a flush (another thread's) committed."""

    def _read(self, name: str, keys: list[str], first: int) -> dict[str, int]:
        got = super()._read(name, keys, first)
        if not getattr(self, "flushed_once", False):
            self.flushed_once = True
            flusher = threading.Thread(
                target=self.flush, args=(first + 9.5,), kwargs={"force": True}
            )
            flusher.start()
            flusher.join()
        return got


def test_a_read_that_overlaps_a_commit_is_read_again_and_not_cached(engine: Engine) -> None:
    """A read whose snapshot predates a flush's commit, returning after it: its stale sum
    must neither be the answer nor be cached over the flush's invalidation (a breaker or a
    loop guard would then miss the flushed counts for the whole ``read_ttl``)."""
    counts = _ReadThenFlush(
        session_factory(engine),
        read_db=read_session_factory(engine),
        read_ttl=60.0,
        background=False,
    )
    for i in range(5):
        counts.add("breaker", "i-1:fail", 200.0 + i * 0.1)
    assert counts.total("breaker", "i-1:fail", 200.5, 10) == 5
    assert counts.total("breaker", "i-1:fail", 200.6, 10) == 5  # from the cache
    with session_factory(engine).begin() as s:
        assert s.scalar(select(func.sum(FlowCountRow.count))) == 5
