"""Hot paths do not scan the fleet: the work of a submit check, a candidate load, a
registration and a probe claim stays the same when 500 unrelated instances join.

Work is what the database itself reports, not time: on SQLite the virtual-machine steps
of the queries (a progress handler called on every step), on PostgreSQL the tuples read
(``pg_stat_xact_user_tables``, with sequential scans priced out so that a query without a
usable index shows up as the scan it is). A scan of 500 rows costs thousands of SQLite
steps and 500 PostgreSQL tuples; the bounds below allow a deeper B-tree and no more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, text, update
from sqlalchemy.orm import Session, sessionmaker

from reach.core.fleet.routing import RouteFilter
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.fleet.reachability import Policy
from reach.hub.intake import submission
from reach.hub.settings import Settings
from reach.hub.storage import session_factory
from reach.hub.storage.models import InstanceRow
from reach.wire.schemas import DeregisterRequest, RegisterRequest, RegisterResponse, SubmitRequest

NOW = 1_800_000_000.0
UNRELATED = 500
GROWTH = {"sqlite": 400, "postgresql": 25}  # allowed extra work: far below one scan
CAP = {"type": "doc.target", "params_schema": {"type": "object"}}


@pytest.fixture
def policy() -> Policy:
    return Policy.from_settings(Settings())


@pytest.fixture
def db(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def register(
    s: Session, policy: Policy, agent_id: str, addr: str, **declared: Any
) -> RegisterResponse:
    req = RegisterRequest(
        agent_id=agent_id,
        instance_id=f"{agent_id}-{addr.replace(':', '-')}",
        addr=addr,
        allow_loopback=True,
        heartbeat_interval=10,
        **declared,
    )
    return registry.register(s, req, NOW, policy)


def targets(db: sessionmaker[Session], policy: Policy) -> None:
    """The agents every measured operation is about."""
    with db.begin() as s:
        for n in range(3):
            register(
                s,
                policy,
                f"target-{n}",
                f"10.1.0.{n + 1}:7000",
                tags=["target"],
                capabilities=[CAP],
            )


def unrelated_fleet(db: sessionmaker[Session], policy: Policy) -> None:
    """Live agents with other tags and capabilities (probed a moment ago, so not due),
    and deregistered instances: the churn that stays for the audit trail."""
    with db.begin() as s:
        for n in range(UNRELATED):
            addr = f"10.2.{n // 250}.{n % 250 + 1}:7000"
            register(
                s,
                policy,
                f"other-{n}",
                addr,
                tags=[f"team-{n % 7}", "other"],
                capabilities=[{"type": f"other.cap{n % 11}"}],
            )
            if n % 2:
                registry.deregister(
                    s,
                    DeregisterRequest(
                        agent_id=f"other-{n}", instance_id=f"other-{n}-{addr.replace(':', '-')}"
                    ),
                    NOW,
                )
        s.execute(
            update(InstanceRow)
            .where(InstanceRow.agent_id.like("other-%"))
            .where(InstanceRow.status != "deregistered")  # those keep their last (past) time
            .values(next_probe_at=NOW + 5)
        )


@contextmanager
def measured(engine: Engine, db: sessionmaker[Session]) -> Iterator[tuple[Session, list[int]]]:
    """A transaction whose database work is counted into the list it yields (one total)."""
    work = [0]
    with db.begin() as s:
        raw = s.connection().connection.dbapi_connection
        if engine.dialect.name == "sqlite":

            def step() -> int:
                work[0] += 1
                return 0

            raw.set_progress_handler(step, 1)  # type: ignore[union-attr]
            try:
                yield s, work
                s.flush()
            finally:
                raw.set_progress_handler(None, 1)  # type: ignore[union-attr]
        else:
            s.execute(text("SET LOCAL enable_seqscan = off"))
            before = _tuples_read(s)
            yield s, work
            s.flush()
            work[0] = _tuples_read(s) - before
        s.rollback()


def _tuples_read(s: Session) -> int:
    return int(
        s.execute(
            text(
                "SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0)"
                " FROM pg_stat_xact_user_tables"
                " WHERE relname IN ('agents', 'instances', 'agent_tags', 'agent_capabilities')"
            )
        ).scalar_one()
    )


def check_target(s: Session, req: SubmitRequest, now: float) -> None:
    """Submission's target check, for a request that names its method."""
    assert req.method is not None
    submission._check_target(s, req, req.method, now)


def submit_by_capability(s: Session, policy: Policy) -> None:
    req = SubmitRequest(capability="doc.target", method="doc.target", payload={})
    check_target(s, req, NOW)


def submit_by_tag(s: Session, policy: Policy) -> None:
    req = SubmitRequest(tags=["target"], method="doc.target", payload={})
    check_target(s, req, NOW)


def candidates(s: Session, policy: Policy) -> None:
    found = registry.load_candidates(s, RouteFilter(tags=("target",)), NOW, policy, "doc.target")
    assert len(found) == 3


def registration(s: Session, policy: Policy) -> None:
    register(s, policy, "target-0", "10.1.9.9:7000", tags=["target"], capabilities=[CAP])


def probe_claim(s: Session, policy: Policy) -> None:
    claimed, skipped = monitoring.claim_due_probes(s, NOW, policy)
    assert (len(claimed), skipped) == (3, 0)  # the targets are due, the fleet is not


OPERATIONS: list[Callable[[Session, Policy], None]] = [
    submit_by_capability,
    submit_by_tag,
    candidates,
    registration,
    probe_claim,
]


def test_hot_paths_do_the_same_work_whatever_the_fleet(
    engine: Engine, db: sessionmaker[Session], policy: Policy
) -> None:
    targets(db, policy)

    def work() -> dict[str, int]:
        out = {}
        for operation in OPERATIONS:
            with measured(engine, db) as (s, counted):
                operation(s, policy)
            out[operation.__name__] = counted[0]
        return out

    alone = work()
    unrelated_fleet(db, policy)
    beside_fleet = work()
    growth = {name: beside_fleet[name] - alone[name] for name in alone}
    assert all(w > 0 for w in alone.values()), alone  # the meter measures something
    limit = GROWTH[engine.dialect.name]
    assert all(g <= limit for g in growth.values()), (growth, alone, beside_fleet)


def test_the_refusal_still_names_agents_that_lack_the_method(
    db: sessionmaker[Session], policy: Policy
) -> None:
    from reach.errors import NoSuitableAgent

    targets(db, policy)
    with db.begin() as s, pytest.raises(NoSuitableAgent) as refused:
        check_target(s, SubmitRequest(tags=["target"], method="doc.other", payload={}), NOW)
    assert "target-0, target-1, target-2 match but declare no capability" in str(refused.value)


def test_a_new_declaration_replaces_the_indexed_one(
    db: sessionmaker[Session], policy: Policy
) -> None:
    """Re-registering with other tags and capabilities: the old ones no longer find it."""
    from reach.errors import NoSuitableAgent

    with db.begin() as s:
        register(s, policy, "mover", "10.3.0.1:7000", tags=["old"], capabilities=[CAP])
    with db.begin() as s:  # the only instance re-registers: the declaration may change
        register(
            s, policy, "mover", "10.3.0.1:7000", tags=["new"], capabilities=[{"type": "doc.new"}]
        )
    with db.begin() as s:
        check_target(s, SubmitRequest(tags=["new"], method="doc.new"), NOW)
        for req in (
            SubmitRequest(tags=["old"], method="doc.new"),
            SubmitRequest(capability="doc.target", method="doc.target"),
        ):
            with pytest.raises(NoSuitableAgent):
                check_target(s, req, NOW)
