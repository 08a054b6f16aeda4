"""Probing against real sockets with a controlled clock, on both stores."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from reach.core.fleet.scoring import rtt_subscore
from reach.hub.clock import ManualClock
from reach.hub.fleet import reachability as monitoring
from reach.hub.fleet import registry
from reach.hub.fleet.probing import ProbeTarget, probe_once
from reach.hub.fleet.reachability import Policy
from reach.hub.settings import Settings
from reach.hub.storage import session_factory
from reach.hub.storage.models import InstanceRow
from reach.wire.schemas import RegisterRequest
from tests.support.listeners import SlowHttpListener, closed_port


@pytest.fixture
def policy() -> Policy:
    return Policy.from_settings(Settings())


@pytest.fixture
def db(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


def register(
    db: sessionmaker[Session], clock: ManualClock, policy: Policy, addr: str, iid: str = "i-1"
) -> None:
    req = RegisterRequest(
        agent_id="a", instance_id=iid, addr=addr, allow_loopback=True, heartbeat_interval=10
    )
    with db.begin() as s:
        registry.register(s, req, clock.now(), policy)


def probe_round(db: sessionmaker[Session], clock: ManualClock, policy: Policy) -> list[ProbeTarget]:
    """One beat tick: claim what is due, probe it for real, record it."""
    with db.begin() as s:
        targets, _ = monitoring.claim_due_probes(s, clock.now(), policy)
    for target in targets:
        outcome = probe_once(target, policy.probe_timeout, clock.now)
        with db.begin() as s:
            monitoring.record_probe(s, outcome, clock.now(), policy)
    return targets


def row(db: sessionmaker[Session], iid: str = "i-1") -> InstanceRow:
    with db() as s:
        r = s.get(InstanceRow, iid)
        assert r is not None
        return r


def keep_heartbeating(db: sessionmaker[Session], clock: ManualClock, policy: Policy) -> None:
    from reach.wire.schemas import HeartbeatRequest

    with db.begin() as s:
        registry.heartbeat(
            s, HeartbeatRequest(agent_id="a", instance_id="i-1"), clock.now(), policy
        )


def test_closed_port_is_unreachable_after_exactly_three_failures_then_probed_less_and_less(
    db: sessionmaker[Session], policy: Policy
) -> None:
    clock = ManualClock()
    register(db, clock, policy, f"127.0.0.1:{closed_port()}")
    seen = []
    for _ in range(3):
        assert len(probe_round(db, clock, policy)) == 1
        r = row(db)
        seen.append((r.status, r.probe_status, r.next_probe_at - clock.now()))
        clock.advance(1.0)
        keep_heartbeating(db, clock, policy)
    assert seen == [
        ("online", "failing", 1.0),  # score 50 (< 60): fast cadence
        ("online", "failing", 1.0),
        ("unreachable", "unreachable", 1.0),  # it still heartbeats: it may only be busy
    ]
    r = row(db)
    assert r.routable is False and r.last_probe_error == "connection refused"
    # then 1, 2, 4, 8, 16 s apart, and every 30 s (the retry interval), whatever the beat tick
    times = []
    for _ in range(130):
        keep_heartbeating(db, clock, policy)
        if probe_round(db, clock, policy):
            times.append(clock.now())
        clock.advance(1.0)
    assert [b - a for a, b in itertools.pairwise(times)] == [
        2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0,
    ]  # fmt: skip
    assert row(db).status == "unreachable"


def test_an_instance_too_busy_to_answer_three_probes_is_routable_a_second_after_it_answers(
    db: sessionmaker[Session], policy: Policy
) -> None:
    """Its heartbeats kept coming: it was probed again a second later, not after the whole
    retry interval (30 s) its tasks' retries would have run out in."""
    policy = dataclasses.replace(policy, probe_timeout=0.3)
    clock = ManualClock()
    busy = SlowHttpListener(delay=1.0)  # answers, but past the probe's timeout
    try:
        register(db, clock, policy, busy.addr)
        for _ in range(3):
            assert len(probe_round(db, clock, policy)) == 1
            clock.advance(1.0)
            keep_heartbeating(db, clock, policy)
        r = row(db)
        assert (r.status, r.routable, r.probe_status) == ("unreachable", False, "unreachable")
        busy.delay = 0.0  # the busy moment passes
        assert len(probe_round(db, clock, policy)) == 1  # due a second after the third
        r = row(db)
        assert (r.status, r.routable, r.probe_status) == ("online", True, "ok")
    finally:
        busy.close()


def test_live_listener_scores_above_95(db: sessionmaker[Session], policy: Policy) -> None:
    clock = ManualClock()
    listener = SlowHttpListener(delay=0.0)
    try:
        register(db, clock, policy, listener.addr)
        for _ in range(10):
            probe_round(db, clock, policy)
            clock.advance(5.0)
            keep_heartbeating(db, clock, policy)
    finally:
        listener.close()
    r = row(db)
    assert r.status == "online" and r.probe_status == "ok"
    assert r.reach_score > 95
    assert len(r.probe_window) == 10 and r.loss_rate == 0.0


def test_added_latency_gives_the_predicted_rtt_subscore(
    db: sessionmaker[Session], policy: Policy
) -> None:
    clock = ManualClock()
    listener = SlowHttpListener(delay=0.150)
    try:
        register(db, clock, policy, listener.addr)
        for _ in range(10):
            probe_round(db, clock, policy)
            clock.advance(5.0)
            keep_heartbeating(db, clock, policy)
    finally:
        listener.close()
    r = row(db)
    assert r.rtt_ms is not None and 150 <= r.rtt_ms < 200
    predicted_rtt_points = 30 * (500 - 150) / (500 - 20)  # 21.875 at exactly 150 ms
    measured_rtt_points = 30 * rtt_subscore(r.rtt_ms, policy.score)
    assert measured_rtt_points == pytest.approx(predicted_rtt_points, abs=1.0)
    # and the whole score is heartbeat (fresh: 50) + rtt + loss (0 %: 20)
    assert r.reach_score == pytest.approx(50 + measured_rtt_points + 20, abs=0.01)


def test_probe_limit_skips_and_counts(db: sessionmaker[Session], policy: Policy) -> None:
    clock = ManualClock()
    for n in range(12):
        register(db, clock, policy, f"10.9.0.{n + 1}:7000", iid=f"i-{n}")
    with db.begin() as s:
        targets, skipped = monitoring.claim_due_probes(s, clock.now(), policy)
    assert (len(targets), skipped) == (8, 4)
    with db.begin() as s:  # leases held: nothing more may start
        assert monitoring.claim_due_probes(s, clock.now(), policy) == ([], 4)
    clock.advance(policy.probe_timeout + 6)  # leases lapse (a prober died): reclaimable
    with db.begin() as s:
        targets, skipped = monitoring.claim_due_probes(s, clock.now(), policy)
    assert (len(targets), skipped) == (8, 4)
