"""Tables for the pure reachability decision: status from heartbeats and probes, cadence."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from reach.core.fleet.health import InstanceStatus
from reach.core.fleet.reachability import (
    DEFAULT_REACHABILITY_CONFIG,
    Alert,
    Assessment,
    HeartbeatState,
    ReachabilityConfig,
    ReachabilityConfigError,
    assess,
    next_probe_delay,
    rise_streak,
)
from reach.core.fleet.scoring import ProbeSample, ProbeWindow, ScoreConfig

ONLINE = InstanceStatus.ONLINE
DEGRADED = InstanceStatus.DEGRADED
UNREACHABLE = InstanceStatus.UNREACHABLE
OFFLINE = InstanceStatus.OFFLINE
DEREGISTERED = InstanceStatus.DEREGISTERED

HB_LOST = Alert.HEARTBEAT_LOST
BUSY = Alert.BUSINESS_UNREACHABLE
FAILING = Alert.FAILING

NOW = 1_700_000_000.0
INTERVAL = 10.0  # with the defaults: heartbeat lost at 30 s, grace over at 90 s


def heartbeat(
    age: float = 0.0,
    *,
    interval: float = INTERVAL,
    in_flight: int = 0,
    max_concurrency: int = 8,
    streak: int = 0,
    failures: int = 0,
    deregistered: bool = False,
) -> HeartbeatState:
    return HeartbeatState(
        last_heartbeat=NOW - age,
        interval=interval,
        in_flight=in_flight,
        max_concurrency=max_concurrency,
        in_flight_rise_streak=streak,
        consecutive_failure_count=failures,
        deregistered=deregistered,
    )


def probes(pattern: str = "", newest_age: float = 1.0, rtt_ms: float = 5.0) -> ProbeWindow:
    """'S' a successful probe, 'F' a failed one, oldest first, one second apart.

    The newest probe was taken ``newest_age`` seconds before NOW.
    """
    window = ProbeWindow(size=max(10, len(pattern)))
    start = NOW - newest_age - (len(pattern) - 1)
    for i, ch in enumerate(pattern):
        ok = ch == "S"
        window = window.push(ProbeSample(ok=ok, rtt_ms=rtt_ms if ok else None, at=start + i))
    return window


# --- assess: every rule, its boundaries and the precedence between rules ---------------------


@pytest.mark.parametrize(
    ("hb", "window", "status", "routable", "alerts"),
    [
        # 1. deregistered beats everything
        pytest.param(heartbeat(deregistered=True), probes("SSS"), DEREGISTERED, False, (),
                     id="deregistered-healthy"),
        pytest.param(
            heartbeat(3600, in_flight=8, streak=9, failures=9, deregistered=True),
            probes("FFF"), DEREGISTERED, False, (), id="deregistered-beats-everything",
        ),
        pytest.param(heartbeat(40, deregistered=True), probes("S"), DEREGISTERED, False, (),
                     id="deregistered-beats-heartbeat-grace"),
        # 2. heartbeat lost: exactly 3 intervals, fresh probe, grace, stale probe
        pytest.param(heartbeat(29.999), probes(), ONLINE, True, (), id="just-under-3-intervals"),
        pytest.param(heartbeat(30), probes(), OFFLINE, False, (), id="3-intervals-no-probes"),
        pytest.param(heartbeat(30), probes("S"), ONLINE, True, (HB_LOST,),
                     id="3-intervals-fresh-probe-alerts"),
        pytest.param(heartbeat(89.999), probes("S"), ONLINE, True, (HB_LOST,),
                     id="grace-last-moment"),
        pytest.param(heartbeat(90), probes("S"), OFFLINE, False, (), id="grace-over-exactly"),
        pytest.param(heartbeat(3600), probes("S"), OFFLINE, False, (), id="grace-long-over"),
        pytest.param(heartbeat(30), probes("S", newest_age=15.0), ONLINE, True, (HB_LOST,),
                     id="probe-exactly-fresh-limit"),
        pytest.param(heartbeat(30), probes("S", newest_age=15.001), OFFLINE, False, (),
                     id="stale-probe-offline"),
        pytest.param(heartbeat(30), probes("SSSSF"), OFFLINE, False, (),
                     id="newest-probe-failed-offline"),
        pytest.param(heartbeat(30), probes("FFFS"), ONLINE, True, (HB_LOST,),
                     id="newest-probe-recovered"),
        pytest.param(heartbeat(30), probes("FFF"), OFFLINE, False, (),
                     id="heartbeat-lost-beats-unreachable"),
        pytest.param(heartbeat(30, in_flight=8), probes("S"), DEGRADED, True, (HB_LOST, BUSY),
                     id="grace-at-capacity-degraded"),
        pytest.param(heartbeat(30, streak=3), probes("S"), DEGRADED, True, (HB_LOST, BUSY),
                     id="grace-rising-degraded"),
        pytest.param(heartbeat(30, failures=3), probes("S"), ONLINE, False, (HB_LOST, FAILING),
                     id="grace-failing-not-routable"),
        pytest.param(heartbeat(90, in_flight=8, failures=3), probes("S"), OFFLINE, False, (),
                     id="offline-carries-no-alerts"),
        # 3. consecutive failed probes
        pytest.param(heartbeat(), probes("SSSFF"), ONLINE, True, (), id="2-failed-probes"),
        pytest.param(heartbeat(), probes("SSSFFF"), UNREACHABLE, False, (), id="3-failed-probes"),
        pytest.param(heartbeat(), probes("FFF"), UNREACHABLE, False, (), id="only-3-failures"),
        pytest.param(heartbeat(), probes("F" * 10), UNREACHABLE, False, (), id="10-failures"),
        pytest.param(heartbeat(), probes("FFFFFS"), ONLINE, True, (), id="success-resets"),
        pytest.param(heartbeat(), probes("FFSFF"), ONLINE, True, (), id="failures-not-trailing"),
        pytest.param(heartbeat(29.9), probes("FFF"), UNREACHABLE, False, (),
                     id="unreachable-old-but-live-heartbeat"),
        pytest.param(heartbeat(in_flight=8), probes("FFF"), UNREACHABLE, False, (),
                     id="unreachable-beats-at-capacity"),
        pytest.param(heartbeat(streak=5), probes("FFF"), UNREACHABLE, False, (),
                     id="unreachable-beats-rising"),
        pytest.param(heartbeat(failures=5), probes("FFF"), UNREACHABLE, False, (),
                     id="unreachable-beats-failing"),
        # 4. alive but not consuming
        pytest.param(heartbeat(in_flight=7), probes("S"), ONLINE, True, (), id="below-capacity"),
        pytest.param(heartbeat(in_flight=8), probes("S"), DEGRADED, True, (BUSY,),
                     id="in-flight-equals-max"),
        pytest.param(heartbeat(in_flight=9), probes("S"), DEGRADED, True, (BUSY,),
                     id="in-flight-above-max"),
        pytest.param(heartbeat(in_flight=1, max_concurrency=1), probes("S"), DEGRADED, True,
                     (BUSY,), id="single-slot-busy"),
        pytest.param(heartbeat(in_flight=4, streak=2), probes("S"), ONLINE, True, (),
                     id="streak-2"),
        pytest.param(heartbeat(in_flight=4, streak=3), probes("S"), DEGRADED, True, (BUSY,),
                     id="streak-3"),
        pytest.param(heartbeat(in_flight=8, streak=3), probes("S"), DEGRADED, True, (BUSY,),
                     id="at-capacity-and-rising-one-alert"),
        pytest.param(heartbeat(in_flight=8), probes(), DEGRADED, True, (BUSY,),
                     id="at-capacity-no-probes-yet"),
        pytest.param(heartbeat(in_flight=8), probes("SSSFF"), DEGRADED, True, (BUSY,),
                     id="at-capacity-2-failed-probes"),
        # 5. task failures take it out of the routing pool
        pytest.param(heartbeat(failures=2), probes("S"), ONLINE, True, (), id="failures-2"),
        pytest.param(heartbeat(failures=3), probes("S"), ONLINE, False, (FAILING,),
                     id="failures-3"),
        pytest.param(heartbeat(failures=3), probes(), ONLINE, False, (FAILING,),
                     id="failures-3-no-probes-yet"),
        pytest.param(heartbeat(in_flight=8, failures=3), probes("S"), DEGRADED, False,
                     (BUSY, FAILING), id="degraded-and-failing"),
        # 6. healthy
        pytest.param(heartbeat(), probes(), ONLINE, True, (), id="no-probes-yet"),
        pytest.param(heartbeat(), probes("S" * 10), ONLINE, True, (), id="all-good"),
        pytest.param(heartbeat(-5.0), probes("S"), ONLINE, True, (),
                     id="heartbeat-in-the-future"),
    ],
)  # fmt: skip
def test_assess(
    hb: HeartbeatState,
    window: ProbeWindow,
    status: InstanceStatus,
    routable: bool,
    alerts: tuple[Alert, ...],
) -> None:
    result = assess(hb, window, NOW)
    assert (result.status, result.routable, result.alerts) == (status, routable, alerts)
    assert result.reason
    assert "\n" not in result.reason
    assert 0.0 <= result.reach_score <= 100.0


@pytest.mark.parametrize(
    ("cfg_changes", "hb", "window", "status", "routable"),
    [
        pytest.param({"missed_intervals": 1}, heartbeat(9.9), probes(), ONLINE, True,
                     id="missed-1-under"),
        pytest.param({"missed_intervals": 1}, heartbeat(10), probes(), OFFLINE, False,
                     id="missed-1-exact"),
        pytest.param({"heartbeat_lost_grace_s": 0.0}, heartbeat(30), probes("S"), OFFLINE,
                     False, id="no-grace"),
        pytest.param({"heartbeat_lost_grace_s": 5.0}, heartbeat(34.9), probes("S"), ONLINE,
                     True, id="short-grace-open"),
        pytest.param({"heartbeat_lost_grace_s": 5.0}, heartbeat(35), probes("S"), OFFLINE,
                     False, id="short-grace-over"),
        pytest.param({"probe_fresh_s": 2.0}, heartbeat(30), probes("S", newest_age=2.5),
                     OFFLINE, False, id="short-freshness"),
        pytest.param({"probe_fail_threshold": 1}, heartbeat(), probes("SF"), UNREACHABLE,
                     False, id="fail-threshold-1"),
        pytest.param({"probe_fail_threshold": 5}, heartbeat(), probes("FFFF"), ONLINE, True,
                     id="fail-threshold-5-under"),
        pytest.param({"degraded_rise_streak": 1}, heartbeat(in_flight=1, streak=1), probes(),
                     DEGRADED, True, id="rise-streak-1"),
        pytest.param({"routing_failure_threshold": 1}, heartbeat(failures=1), probes(), ONLINE,
                     False, id="routing-failure-1"),
    ],
)  # fmt: skip
def test_assess_follows_config(
    cfg_changes: dict[str, Any],
    hb: HeartbeatState,
    window: ProbeWindow,
    status: InstanceStatus,
    routable: bool,
) -> None:
    cfg = dataclasses.replace(DEFAULT_REACHABILITY_CONFIG, **cfg_changes)
    result = assess(hb, window, NOW, cfg)
    assert (result.status, result.routable) == (status, routable)


@pytest.mark.parametrize(
    ("hb", "window", "fragment"),
    [
        (heartbeat(deregistered=True), probes(), "deregistered"),
        (heartbeat(45), probes(), "no heartbeat for 45.0 s"),
        (heartbeat(45), probes("S", newest_age=20), "stale"),
        (heartbeat(45), probes("F"), "last probe failed"),
        (heartbeat(95), probes("S"), "grace is over"),
        (heartbeat(45), probes("S"), "kept for up to 45.0 s more"),
        (heartbeat(), probes("FFF"), "3 consecutive probes failed"),
        (heartbeat(in_flight=8), probes(), "at capacity (in_flight 8 of 8)"),
        (heartbeat(in_flight=5, streak=3), probes(), "rose on 3 successive heartbeats"),
        (heartbeat(failures=4), probes(), "4 consecutive task failures"),
        (heartbeat(2), probes("S"), "heartbeat 2.0 s old, probes succeed"),
        (heartbeat(2), probes(), "no probe yet"),
    ],
)
def test_reason_says_why(hb: HeartbeatState, window: ProbeWindow, fragment: str) -> None:
    assert fragment in assess(hb, window, NOW).reason


# --- ReachScore through assess ----------------------------------------------------------------


def test_fresh_heartbeat_and_fast_probes_score_100() -> None:
    assert assess(heartbeat(), probes("S" * 10, rtt_ms=5.0), NOW).reach_score == 100.0


def test_design_worked_example_scores_83_5() -> None:
    # 1 failure in 20 probes = 5 % loss; the failure is oldest so no trailing failures.
    window = probes("F" + "S" * 19, rtt_ms=150.0)
    assert window.loss_rate == pytest.approx(0.05)
    result = assess(heartbeat(12), window, NOW)
    assert result.status is ONLINE
    assert result.reach_score == pytest.approx(83.5, abs=0.1)


@pytest.mark.parametrize(
    ("hb", "window", "score"),
    [
        pytest.param(heartbeat(), probes(), 70.0, id="no-probes-no-rtt-credit"),
        pytest.param(heartbeat(30), probes("S"), 50.0, id="heartbeat-lost-no-heartbeat-credit"),
        pytest.param(heartbeat(), probes("F" * 10), 50.0, id="all-lost"),
        pytest.param(heartbeat(deregistered=True), probes("S"), 100.0, id="deregistered-scored"),
    ],
)
def test_score_values(hb: HeartbeatState, window: ProbeWindow, score: float) -> None:
    assert assess(hb, window, NOW).reach_score == pytest.approx(score)


def test_score_config_is_passed_through() -> None:
    heartbeat_only = ScoreConfig(heartbeat_weight=100.0, rtt_weight=0.0, loss_weight=0.0)
    result = assess(heartbeat(20), probes("F" * 10), NOW, score_cfg=heartbeat_only)
    assert result.reach_score == pytest.approx(50.0)


# --- rise_streak ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "new", "streak", "expected"),
    [
        pytest.param(0, 1, 0, 1, id="first-rise"),
        pytest.param(1, 2, 1, 2, id="second-rise"),
        pytest.param(2, 3, 2, 3, id="third-rise"),
        pytest.param(2, 7, 1, 2, id="a-jump-is-one-rise"),
        pytest.param(3, 3, 2, 2, id="plateau-holds"),
        pytest.param(3, 3, 0, 0, id="plateau-without-streak"),
        pytest.param(3, 2, 2, 0, id="fall-resets"),
        pytest.param(5, 4, 9, 0, id="any-fall-resets"),
        pytest.param(3, 0, 2, 0, id="drained-resets"),
        pytest.param(0, 0, 4, 0, id="idle-is-zero"),
    ],
)
def test_rise_streak(previous: int, new: int, streak: int, expected: int) -> None:
    assert rise_streak(previous, new, streak) == expected


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((-1, 0, 0), "previous_in_flight"),
        ((0, -1, 0), "new_in_flight"),
        ((0, 0, -1), "previous_streak"),
        ((0, 1.5, 0), "new_in_flight"),
        ((True, 1, 0), "previous_in_flight"),
    ],
)
def test_rise_streak_rejects_bad_input(args: tuple[Any, Any, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        rise_streak(*args)


def test_rising_in_flight_degrades_on_the_third_rise_and_a_completion_clears_it() -> None:
    seen: list[InstanceStatus] = []
    previous, streak = 0, 0
    for in_flight in (0, 1, 2, 3, 3, 2):
        streak = rise_streak(previous, in_flight, streak)
        previous = in_flight
        seen.append(assess(heartbeat(in_flight=in_flight, streak=streak), probes("S"), NOW).status)
    assert seen == [ONLINE, ONLINE, ONLINE, DEGRADED, DEGRADED, ONLINE]


# --- next_probe_delay --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "score", "delay"),
    [
        pytest.param(ONLINE, 100.0, 5.0, id="healthy"),
        pytest.param(ONLINE, 60.0, 5.0, id="score-60"),
        pytest.param(ONLINE, 59.9, 1.0, id="score-59.9"),
        pytest.param(ONLINE, 0.0, 1.0, id="score-0"),
        pytest.param(DEGRADED, 80.0, 5.0, id="degraded-high-score"),
        pytest.param(DEGRADED, 59.9, 1.0, id="degraded-low-score"),
        pytest.param(UNREACHABLE, 100.0, 1.0, id="unreachable-high-score"),
        pytest.param(UNREACHABLE, 10.0, 1.0, id="unreachable-low-score"),
        pytest.param(OFFLINE, 20.0, 30.0, id="offline"),
        pytest.param(DEREGISTERED, 100.0, math.inf, id="deregistered"),
    ],
)
def test_next_probe_delay(status: InstanceStatus, score: float, delay: float) -> None:
    assert next_probe_delay(status, score) == delay


def test_next_probe_delay_follows_config() -> None:
    cfg = ReachabilityConfig(
        probe_interval_s=7.0,
        probe_fast_interval_s=0.5,
        probe_retry_interval_s=120.0,
        fast_below_score=80.0,
    )
    assert next_probe_delay(ONLINE, 80.0, cfg) == 7.0
    assert next_probe_delay(ONLINE, 79.9, cfg) == 0.5
    assert next_probe_delay(UNREACHABLE, 100.0, cfg, failures=3) == 0.5
    assert next_probe_delay(UNREACHABLE, 100.0, cfg, failures=20) == 120.0
    assert next_probe_delay(OFFLINE, 100.0, cfg, failures=3) == 120.0


@pytest.mark.parametrize(
    ("failures", "delay"),
    [
        pytest.param(0, 1.0, id="no-streak-known"),
        pytest.param(3, 1.0, id="just-unreachable"),
        pytest.param(4, 2.0, id="one-more"),
        pytest.param(5, 4.0, id="two-more"),
        pytest.param(7, 16.0, id="four-more"),
        pytest.param(8, 30.0, id="capped-at-retry"),
        pytest.param(10, 30.0, id="a-full-window"),
        pytest.param(10_000, 30.0, id="huge-streak"),
    ],
)
def test_an_unreachable_instance_is_probed_again_soon_then_less_often(
    failures: int, delay: float
) -> None:
    """Its heartbeats still come: a busy moment passes in a second, a dead address costs a
    probe per retry interval after a few."""
    assert next_probe_delay(UNREACHABLE, 100.0, failures=failures) == delay
    assert next_probe_delay(OFFLINE, 100.0, failures=failures) == 30.0


def test_heartbeat_lost_but_probed_is_probed_fast() -> None:
    result = assess(heartbeat(30), probes("S"), NOW)
    assert result.status is ONLINE
    assert next_probe_delay(result.status, result.reach_score) == 1.0


# --- a scenario on a simulated clock ------------------------------------------------------------


def test_port_closes_after_ten_good_probes() -> None:
    """Heartbeats keep arriving every 10 s; the hub's probes start failing after ten."""
    t = NOW
    window = ProbeWindow()
    results: list[Assessment] = []
    delays: list[float] = []
    for ok in [True] * 10 + [False] * 3:
        window = window.push(ProbeSample(ok=ok, rtt_ms=5.0 if ok else None, at=t))
        # The agent's heartbeat lands on every 10 s tick; the newest one at or before t.
        hb = dataclasses.replace(heartbeat(), last_heartbeat=t - (t - NOW) % INTERVAL)
        result = assess(hb, window, t)
        results.append(result)
        delays.append(
            next_probe_delay(
                result.status, result.reach_score, failures=window.consecutive_failures
            )
        )
        t += delays[-1]

    assert [r.status for r in results[:12]] == [ONLINE] * 12
    assert all(r.routable for r in results[:12])
    assert results[9].reach_score == 100.0
    assert delays[:12] == [5.0] * 12
    assert results[12].status is UNREACHABLE
    assert results[12].routable is False
    assert delays[12] == 1.0  # probed again soon: it may only have been busy
    assert t - NOW == 12 * 5.0 + 1.0


# --- config and state validation ---------------------------------------------------------------


def test_defaults_match_the_design() -> None:
    cfg = ReachabilityConfig()
    assert cfg == DEFAULT_REACHABILITY_CONFIG
    assert (cfg.missed_intervals, cfg.probe_fail_threshold) == (3, 3)
    assert (cfg.probe_interval_s, cfg.probe_fast_interval_s, cfg.probe_retry_interval_s) == (
        5.0,
        1.0,
        30.0,
    )
    assert (cfg.fast_below_score, cfg.routing_failure_threshold) == (60.0, 3)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("missed_intervals", 0),
        ("missed_intervals", -1),
        ("missed_intervals", 1.5),
        ("missed_intervals", True),
        ("heartbeat_lost_grace_s", -1.0),
        ("heartbeat_lost_grace_s", math.nan),
        ("heartbeat_lost_grace_s", math.inf),
        ("heartbeat_lost_grace_s", "60"),
        ("probe_fail_threshold", 0),
        ("probe_interval_s", 0.0),
        ("probe_interval_s", -5.0),
        ("probe_fast_interval_s", 0.0),
        ("probe_retry_interval_s", 0.0),
        ("probe_retry_interval_s", False),
        ("fast_below_score", -0.1),
        ("fast_below_score", 100.1),
        ("fast_below_score", math.nan),
        ("degraded_rise_streak", 0),
        ("routing_failure_threshold", 0),
        ("routing_failure_threshold", 3.0),
        ("probe_fresh_s", 0.0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ReachabilityConfigError, match=f"^{field}: ") as info:
        ReachabilityConfig(**{field: value})
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("heartbeat_lost_grace_s", 0.0),
        ("fast_below_score", 0.0),
        ("fast_below_score", 100.0),
        ("probe_interval_s", 5),
        ("missed_intervals", 1),
    ],
)
def test_config_accepts_edge_values(field: str, value: Any) -> None:
    assert getattr(ReachabilityConfig(**{field: value}), field) == value


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"interval": 0.0}, "interval"),
        ({"interval": math.nan}, "interval"),
        ({"last_heartbeat": math.inf}, "last_heartbeat"),
        ({"in_flight": -1}, "in_flight"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"in_flight_rise_streak": -1}, "in_flight_rise_streak"),
        ({"consecutive_failure_count": -1}, "consecutive_failure_count"),
        ({"consecutive_failure_count": 1.0}, "consecutive_failure_count"),
        ({"deregistered": 1}, "deregistered"),
    ],
)
def test_heartbeat_state_rejects_bad_values(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        dataclasses.replace(heartbeat(), **changes)


def test_values_are_frozen_and_alerts_are_strings() -> None:
    result = assess(heartbeat(), probes(), NOW)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.routable = False  # type: ignore[misc]
    assert [a.value for a in Alert] == ["heartbeat_lost", "business_unreachable", "failing"]
