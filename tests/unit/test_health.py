"""Table for ``liveness``: a pure function of the last heartbeat, the interval and now."""

from __future__ import annotations

import pytest

from reach.core.fleet.health import HeartbeatFacts, InstanceStatus, heartbeat_age, liveness

ONLINE = InstanceStatus.ONLINE
OFFLINE = InstanceStatus.OFFLINE
DEREGISTERED = InstanceStatus.DEREGISTERED

T0 = 1_700_000_000.0


@pytest.mark.parametrize(
    ("age", "interval", "missed", "deregistered", "expected"),
    [
        pytest.param(0.0, 10.0, 3, False, ONLINE, id="age-0"),
        pytest.param(10.0, 10.0, 3, False, ONLINE, id="one-interval"),
        pytest.param(29.999, 10.0, 3, False, ONLINE, id="just-under-3-intervals"),
        pytest.param(30.0, 10.0, 3, False, OFFLINE, id="exactly-3-intervals"),
        pytest.param(30.001, 10.0, 3, False, OFFLINE, id="just-over-3-intervals"),
        pytest.param(3600.0, 10.0, 3, False, OFFLINE, id="long-silent"),
        pytest.param(0.49, 0.5, 1, False, ONLINE, id="missed-1-under"),
        pytest.param(0.5, 0.5, 1, False, OFFLINE, id="missed-1-exact"),
        pytest.param(49.9, 10.0, 5, False, ONLINE, id="missed-5-under"),
        pytest.param(50.0, 10.0, 5, False, OFFLINE, id="missed-5-exact"),
        pytest.param(0.0, 10.0, 3, True, DEREGISTERED, id="deregistered-fresh"),
        pytest.param(3600.0, 10.0, 3, True, DEREGISTERED, id="deregistered-silent"),
        pytest.param(-5.0, 10.0, 3, False, ONLINE, id="heartbeat-in-the-future"),
        pytest.param(-1000.0, 10.0, 3, False, ONLINE, id="heartbeat-far-in-the-future"),
    ],
)
def test_liveness(
    age: float, interval: float, missed: int, deregistered: bool, expected: InstanceStatus
) -> None:
    facts = HeartbeatFacts(last_heartbeat=T0, interval=interval, deregistered=deregistered)
    assert liveness(facts, now=T0 + age, missed_intervals=missed) is expected


def test_liveness_defaults_to_three_missed_intervals() -> None:
    facts = HeartbeatFacts(last_heartbeat=T0, interval=2.0)
    assert liveness(facts, now=T0 + 5.999) is ONLINE
    assert liveness(facts, now=T0 + 6.0) is OFFLINE


@pytest.mark.parametrize(
    ("now", "expected"),
    [(T0, 0.0), (T0 + 7.5, 7.5), (T0 - 3.0, 0.0)],
)
def test_heartbeat_age_is_never_negative(now: float, expected: float) -> None:
    assert heartbeat_age(HeartbeatFacts(last_heartbeat=T0, interval=1.0), now) == expected


def test_statuses_are_strings_on_the_wire() -> None:
    assert [s.value for s in InstanceStatus] == [
        "online",
        "degraded",
        "unreachable",
        "offline",
        "deregistered",
    ]
    assert isinstance(InstanceStatus.OFFLINE, str)
    assert f"{InstanceStatus.OFFLINE}" == "offline"
