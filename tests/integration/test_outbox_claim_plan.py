"""The lapsed-claim net reads ``ix_outbox_claimed``, the partial index of open claims,
whatever the planner knows: on a table of confirmed publications never analysed (this
net once turned into a hash join over the whole outbox on stale statistics), after
ANALYZE, and once the statement is prepared with a generic plan."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from reach.hub.delivery import outbox
from reach.hub.storage.engine import skip_locked
from reach.hub.storage.models import OutboxRow, TaskRow

CONFIRMED = 200_000  # published and settled: no open claim
OPEN = 3  # claimed at 10, never settled

_CONFIRMED_ROWS = """
INSERT INTO outbox (task_id, agent_id, attempt_seq, message, created_at, available_at,
                    published_at)
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < :count)
SELECT 'done-' || n, 'a', 1, CAST('{}' AS JSON), 1.0, 1.0, 10.0 FROM g
"""


def _fill(engine: Engine) -> None:
    """A large outbox of settled publications, never analysed, and three open claims of
    attempts still waiting."""
    with Session(engine) as s, s.begin():
        s.execute(text(_CONFIRMED_ROWS), {"count": CONFIRMED})
        for i in range(OPEN):
            s.add(
                TaskRow(
                    task_id=f"t{i}",
                    agent_id="a",
                    target={"agent_id": "a"},
                    method="m",
                    payload={},
                    status="pending",
                    attempt_seq=1,
                    created_at=1.0,
                    updated_at=1.0,
                )
            )
            s.add(
                OutboxRow(
                    task_id=f"t{i}",
                    agent_id="a",
                    attempt_seq=1,
                    message={},
                    created_at=1.0,
                    available_at=1.0,
                    published_at=10.0,
                    claimed_at=10.0,
                )
            )


def _sql(engine: Engine) -> str:
    with Session(engine) as s:
        stmt = skip_locked(s, outbox.open_claims(100.0, 500))
    return str(stmt.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True}))


def _plan(engine: Engine) -> str:
    sql = _sql(engine)
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", (100.0, 500, 0)).all()
            return " ".join(str(r[-1]) for r in rows)
        params = {"claimed_at_1": 100.0, "param_1": 500}
        return "\n".join(conn.exec_driver_sql(f"EXPLAIN {sql}", params).scalars().all())


@pytest.mark.parametrize("analysed", [False, True], ids=["never-analysed", "analysed"])
def test_the_net_finds_only_open_claims_through_their_index(engine: Engine, analysed: bool) -> None:
    _fill(engine)
    if analysed:
        with engine.connect() as conn:
            conn.execute(text("ANALYZE"))
            conn.commit()
    plan = _plan(engine)
    assert "ix_outbox_claimed" in plan, plan
    with Session(engine) as s, s.begin():
        lapsed = sorted(r.task_id for r in outbox._lapsed_claims(s, 100.0, 500))
    assert lapsed == [f"t{i}" for i in range(OPEN)]


def test_postgres_generic_plan_still_reads_the_claim_index(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        return  # SQLite plans every statement afresh
    _fill(engine)
    sql = _sql(engine).replace("%(claimed_at_1)s", "$1").replace("%(param_1)s", "$2")
    assert "$1" in sql and "$2" in sql, sql
    with engine.connect() as conn:
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(f"PREPARE open_claims(float8, int) AS {sql}")
        plan = conn.exec_driver_sql("EXPLAIN EXECUTE open_claims(100, 500)").scalars().all()
        assert "ix_outbox_claimed" in "\n".join(plan), plan
        rows = conn.exec_driver_sql("EXECUTE open_claims(100, 500)").all()
        assert len(rows) == OPEN
