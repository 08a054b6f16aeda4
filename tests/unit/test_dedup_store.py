"""The dedup guard's contract, in memory and in a SQLite file; and the file surviving a restart.

A restart is a new guard object on the same file: what the first one stored, the second
answers with (the first is never closed, as a SIGKILLed process would not close it).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reach.sdk.dedup import IdempotencyGuard, SqliteIdempotencyGuard, answer_size

Factory = Callable[..., IdempotencyGuard]


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def answer(n: int) -> tuple[int, dict[str, Any]]:
    return 200, {"code": 0, "data": "x" * n}


@pytest.fixture(params=["memory", "sqlite"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    if request.param == "memory":
        return IdempotencyGuard
    return lambda **kw: SqliteIdempotencyGuard(tmp_path / "dedup.sqlite", **kw)


def remember(guard: IdempotencyGuard, task_id: str, value: Any) -> None:
    assert guard.begin(task_id).action == "run"
    guard.finish(task_id, value, remember=True)


def test_a_remembered_answer_is_given_back_as_it_was(make: Factory) -> None:
    guard = make()
    remember(guard, "t", answer(3))
    begin = guard.begin("t")
    assert (begin.action, begin.answer) == ("done", answer(3))
    assert isinstance(begin.answer, tuple)  # (status, envelope), not a JSON list


def test_a_transient_failure_is_not_remembered(make: Factory) -> None:
    guard = make()
    guard.begin("t")
    guard.finish("t", (500, {"code": -1}), remember=False)
    assert guard.begin("t").action == "run"


def test_a_duplicate_while_running_waits_for_the_first(make: Factory) -> None:
    guard = make()
    assert guard.begin("t").action == "run"
    second = guard.begin("t")
    assert second.action == "running" and second.running is not None
    threading.Timer(0.05, guard.finish, ("t", answer(1), True)).start()
    assert second.running.wait(5)
    assert guard.answer_of("t") == answer(1)


def test_at_most_capacity_answers(make: Factory) -> None:
    guard = make(capacity=5)
    for i in range(20):
        remember(guard, f"t{i}", answer(1))
    assert len(guard) == 5
    assert guard.begin("t0").action == "run"
    assert guard.begin("t19").action == "done"


def test_at_most_max_bytes_least_recently_used_first(make: Factory) -> None:
    one = answer_size(answer(100))
    guard = make(max_bytes=2 * one)
    remember(guard, "a", answer(100))
    remember(guard, "b", answer(100))
    assert guard.begin("a").action == "done"  # "a" is now the most recently used
    remember(guard, "c", answer(100))
    assert (guard.answer_of("a"), guard.answer_of("b")) == (answer(100), None)
    assert guard.bytes_held <= guard.max_bytes


def test_an_answer_larger_than_the_budget_is_not_kept(make: Factory) -> None:
    guard = make(max_bytes=100)
    remember(guard, "huge", answer(1000))
    assert guard.answer_of("huge") is None
    assert guard.begin("huge").action == "run"


def test_answers_expire_after_ttl(make: Factory) -> None:
    clock = Clock()
    guard = make(ttl=60, timer=clock)
    remember(guard, "t", answer(1))
    clock.t += 59
    assert guard.begin("t").action == "done"
    clock.t += 2
    assert guard.begin("t").action == "run"
    assert len(guard) == 0


def test_a_restarted_guard_answers_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "dedup.sqlite"
    first = SqliteIdempotencyGuard(path)
    remember(first, "done-before-kill", answer(2))
    assert first.begin("running-at-kill").action == "run"  # never finished: the kill

    second = SqliteIdempotencyGuard(path)  # the restarted process, same file
    begin = second.begin("done-before-kill")
    assert (begin.action, begin.answer) == ("done", answer(2))
    assert second.begin("running-at-kill").action == "run"  # runs again: nobody holds it


def test_ttl_counts_across_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "dedup.sqlite"
    remember(SqliteIdempotencyGuard(path, ttl=60, timer=clock), "t", answer(1))
    clock.t += 61  # the agent was down a minute: the answer aged meanwhile
    assert SqliteIdempotencyGuard(path, ttl=60, timer=clock).begin("t").action == "run"


def test_bounds_apply_to_what_a_restart_finds(tmp_path: Path) -> None:
    path = tmp_path / "dedup.sqlite"
    big = SqliteIdempotencyGuard(path, capacity=100)
    for i in range(10):
        remember(big, f"t{i}", answer(1))
    small = SqliteIdempotencyGuard(path, capacity=3)
    remember(small, "new", answer(1))
    assert len(small) == 3
    assert small.answer_of("new") == answer(1)


def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "dedup.sqlite"
    SqliteIdempotencyGuard(path)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_atomic_commits_the_side_effect_and_the_answer_together(tmp_path: Path) -> None:
    path = tmp_path / "dedup.sqlite"
    guard = SqliteIdempotencyGuard(path)
    guard._db.execute("CREATE TABLE orders (task_id TEXT PRIMARY KEY)")
    guard.begin("t")
    with guard.atomic("t") as tx:
        tx.db.execute("INSERT INTO orders VALUES ('t')")
        tx.answer = {"order": 1}
    restarted = SqliteIdempotencyGuard(path)
    assert restarted.answer_of("t") == (200, {"code": 0, "data": {"order": 1}})
    assert restarted._db.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


def test_atomic_rolls_back_both_when_the_handler_fails(tmp_path: Path) -> None:
    path = tmp_path / "dedup.sqlite"
    guard = SqliteIdempotencyGuard(path)
    guard._db.execute("CREATE TABLE orders (task_id TEXT PRIMARY KEY)")
    guard.begin("t")
    with pytest.raises(RuntimeError), guard.atomic("t") as tx:
        tx.db.execute("INSERT INTO orders VALUES ('t')")
        tx.answer = {"order": 1}
        raise RuntimeError("payment gateway down")
    assert guard.answer_of("t") is None
    assert guard._db.execute("SELECT count(*) FROM orders").fetchone()[0] == 0


def test_agent_keeps_answers_in_its_store(tmp_path: Path) -> None:
    from reach import Agent

    store = tmp_path / "dedup.sqlite"
    runs: list[str] = []

    def make_agent() -> Agent:
        agent = Agent("a", addr="127.0.0.1:9", allow_loopback=True, dedup_store=store)

        @agent.route("work.do")
        def work(task_id: str, payload: dict[str, Any]) -> int:
            runs.append(task_id)
            return len(runs)

        return agent

    body = {"task_id": "t1", "payload": {}, "attempt_seq": 1}
    assert make_agent().invoke("work.do", body) == (200, {"code": 0, "data": 1})
    assert make_agent().invoke("work.do", {**body, "attempt_seq": 2}) == (
        200,
        {"code": 0, "data": 1},
    )
    assert runs == ["t1"]  # the restarted agent answered from the file


def test_agent_takes_one_dedup_option(tmp_path: Path) -> None:
    from reach import Agent

    with pytest.raises(ValueError):
        Agent(
            "a",
            addr="127.0.0.1:9",
            allow_loopback=True,
            dedup_store=tmp_path / "d.sqlite",
            dedup=IdempotencyGuard(),
        )
    guard = IdempotencyGuard(capacity=3)
    assert Agent("a", addr="127.0.0.1:9", allow_loopback=True, dedup=guard).dedup is guard
