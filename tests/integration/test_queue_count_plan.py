"""The queue count on every submit reads ``ix_tasks_agent_live``, PostgreSQL's partial
index of live task versions, and keeps reading it once the statement is prepared
(psycopg prepares a statement on its fifth run; a generic plan cannot prove that bound
statuses match a partial index's predicate, literal ones it can)."""

from __future__ import annotations

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from reach.core.ledger.statuses import TaskStatus
from reach.hub.flow.admission import _QUEUES_OF, _queues
from reach.hub.storage.models import AgentRow, TaskRow

STATUSES = [TaskStatus.SUCCESS] * 300 + [
    TaskStatus.PENDING,
    TaskStatus.DISPATCHING,
    TaskStatus.EXECUTING,
    TaskStatus.WAITING,
    TaskStatus.FAILED,
]


def _fill(engine: Engine) -> None:
    with Session(engine) as s, s.begin():
        for agent in ("a", "b"):
            s.add(AgentRow(agent_id=agent, created_at=1.0, updated_at=1.0))
        s.flush()
        for i, status in enumerate(STATUSES):
            s.add(
                TaskRow(
                    task_id=f"t{i}",
                    agent_id="a" if i % 2 == 0 or status is not TaskStatus.SUCCESS else "b",
                    target={"agent_id": "a"},
                    method="m",
                    payload={},
                    status=status.value,
                    attempt_seq=1,
                    created_at=1.0,
                    updated_at=1.0,
                )
            )
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        conn.commit()


def _sql(engine: Engine) -> str:
    """The hot path's statement as the driver receives it (one agent)."""
    compiled = _QUEUES_OF.params(b_agents=["a"]).compile(
        dialect=engine.dialect, compile_kwargs={"render_postcompile": True}
    )
    return str(compiled)


def test_the_count_is_right_and_reads_the_live_index(engine: Engine) -> None:
    _fill(engine)
    with Session(engine) as s:
        queues = {q.agent_id: q.depth for q in _queues(s, ["a", "b"], 1000)}
    assert queues == {"a": 4, "b": 0}  # four live statuses; finished ones never count
    sql = _sql(engine)
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":  # no dead entries to skip: the full index
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}", ("a",)).all()
            assert "ix_tasks_agent_status" in " ".join(str(r[-1]) for r in plan), plan
            return
        conn.exec_driver_sql("SET enable_seqscan = off")  # a small table: make it choose
        plan = conn.exec_driver_sql(f"EXPLAIN {sql}", {"b_agents_1": "a"}).scalars().all()
        assert "ix_tasks_agent_live" in "\n".join(plan), plan


def test_postgres_generic_plan_still_reads_the_live_index(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        return  # SQLite plans every statement afresh
    _fill(engine)
    sql = _sql(engine).replace("%(b_agents_1)s", "$1")
    assert "$1" in sql, sql
    with engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")
        conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
        conn.exec_driver_sql(f"PREPARE queue_count(text) AS {sql}")
        plan = conn.exec_driver_sql("EXPLAIN EXECUTE queue_count('a')").scalars().all()
        assert "ix_tasks_agent_live" in "\n".join(plan), plan
        depth = conn.exec_driver_sql("EXECUTE queue_count('a')").one()
        assert depth.depth == 4
