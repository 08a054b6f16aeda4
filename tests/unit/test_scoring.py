"""Tables for the pure ReachScore module: sub-scores, the score, config checks, probe window."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import pytest

from reach.core.fleet.scoring import (
    DEFAULT_SCORE_CONFIG,
    DEFAULT_WINDOW_SIZE,
    ProbeSample,
    ProbeWindow,
    ScoreConfig,
    ScoreConfigError,
    heartbeat_subscore,
    loss_subscore,
    reach_score,
    rtt_subscore,
)

CFG = DEFAULT_SCORE_CONFIG


def ok(rtt_ms: float, at: float = 0.0) -> ProbeSample:
    return ProbeSample(ok=True, rtt_ms=rtt_ms, at=at)


def fail(at: float = 0.0) -> ProbeSample:
    return ProbeSample(ok=False, rtt_ms=None, at=at)


def window(*samples: ProbeSample, size: int = DEFAULT_WINDOW_SIZE) -> ProbeWindow:
    w = ProbeWindow(size=size)
    for s in samples:
        w = w.push(s)
    return w


# --- the worked example from DESIGN.md -------------------------------------------------------


def test_worked_example() -> None:
    assert CFG.heartbeat_weight * heartbeat_subscore(12, CFG) == pytest.approx(45.0, abs=0.05)
    assert CFG.rtt_weight * rtt_subscore(150, CFG) == pytest.approx(21.9, abs=0.05)
    assert CFG.loss_weight * loss_subscore(0.05, CFG) == pytest.approx(16.7, abs=0.05)
    assert reach_score(12, 150, 0.05) == pytest.approx(83.5, abs=0.1)


# --- sub-score boundaries and clamping -------------------------------------------------------


@pytest.mark.parametrize(
    ("age_s", "expected"),
    [
        (None, 0.0),  # never heard from
        (-5.0, 1.0),  # hub clock stepped back: fresh, not an error
        (0.0, 1.0),
        (10.0, 1.0),  # good bound: full credit
        (20.0, 0.5),
        (29.0, 0.05),
        (30.0, 0.0),  # bad bound: nothing
        (31.0, 0.0),
        (1e9, 0.0),
        (math.inf, 0.0),
        (math.nan, 0.0),
    ],
)
def test_heartbeat_subscore(age_s: float | None, expected: float) -> None:
    assert heartbeat_subscore(age_s, CFG) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("rtt_ms", "expected"),
    [
        (None, 0.0),  # no successful probe yet
        (0.0, 1.0),
        (-1.0, 1.0),
        (20.0, 1.0),
        (260.0, 0.5),
        (500.0, 0.0),
        (501.0, 0.0),
        (math.inf, 0.0),
        (math.nan, 0.0),
    ],
)
def test_rtt_subscore(rtt_ms: float | None, expected: float) -> None:
    assert rtt_subscore(rtt_ms, CFG) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("loss_rate", "expected"),
    [
        (-0.1, 1.0),
        (0.0, 1.0),
        (0.15, 0.5),
        (0.30, 0.0),
        (0.31, 0.0),
        (1.0, 0.0),
        (1.5, 0.0),
        (math.nan, 0.0),
    ],
)
def test_loss_subscore(loss_rate: float, expected: float) -> None:
    assert loss_subscore(loss_rate, CFG) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("age_s", "rtt_ms", "loss_rate", "expected"),
    [
        (10, 20, 0.0, 100.0),  # every channel at its good bound
        (0, 0, 0.0, 100.0),
        (-3, -3, -0.5, 100.0),  # clamped, never above 100
        (30, 500, 0.30, 0.0),  # every channel at its bad bound
        (31, 501, 0.31, 0.0),
        (1e9, 1e9, 1.0, 0.0),
        (None, None, 0.0, 20.0),  # brand-new instance: only the empty window's zero loss
        (5, None, 0.0, 70.0),  # heartbeats but no successful probe yet
        (math.inf, 10, 0.0, 50.0),  # probes fine, heartbeat lost
        (20, 260, 0.15, 50.0),  # every channel half way
    ],
)
def test_reach_score_table(
    age_s: float | None, rtt_ms: float | None, loss_rate: float, expected: float
) -> None:
    score = reach_score(age_s, rtt_ms, loss_rate)
    assert score == pytest.approx(expected)
    assert 0.0 <= score <= 100.0


# --- custom weights and bounds ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "args", "expected"),
    [
        # Probes only: heartbeat ignored entirely.
        (ScoreConfig(heartbeat_weight=0, rtt_weight=50, loss_weight=50), (None, 20, 0.0), 100.0),
        # Heartbeat only.
        (ScoreConfig(heartbeat_weight=100, rtt_weight=0, loss_weight=0), (20, None, 1.0), 50.0),
        # Fractional weights that sum to 100 only within float tolerance.
        (ScoreConfig(heartbeat_weight=33.3, rtt_weight=33.3, loss_weight=33.4), (0, 0, 0), 100.0),
        # Tighter heartbeat (5 s -> 15 s): 10 s is half way.
        (ScoreConfig(heartbeat_good_s=5, heartbeat_bad_s=15), (10, 20, 0.0), 75.0),
        # Looser RTT (100 ms -> 1100 ms): 600 ms is half way.
        (ScoreConfig(rtt_good_ms=100, rtt_bad_ms=1100), (0, 600, 0.0), 85.0),
        # Loss tolerated up to 10 %, zero at 50 %: 30 % is half way.
        (ScoreConfig(loss_good=0.10, loss_bad=0.50), (0, 0, 0.30), 90.0),
        (ScoreConfig(loss_good=0.10, loss_bad=0.50), (0, 0, 0.10), 100.0),
        # Loss bounds at the edges of [0, 1].
        (ScoreConfig(loss_good=0.0, loss_bad=1.0), (0, 0, 0.5), 90.0),
    ],
)
def test_custom_config(
    cfg: ScoreConfig, args: tuple[float | None, float | None, float], expected: float
) -> None:
    assert reach_score(*args, cfg=cfg) == pytest.approx(expected)


def test_default_config_values() -> None:
    assert ScoreConfig() == DEFAULT_SCORE_CONFIG
    assert (CFG.heartbeat_weight, CFG.rtt_weight, CFG.loss_weight) == (50, 30, 20)
    assert (CFG.heartbeat_good_s, CFG.heartbeat_bad_s) == (10, 30)
    assert (CFG.rtt_good_ms, CFG.rtt_bad_ms) == (20, 500)
    assert (CFG.loss_good, CFG.loss_bad) == (0.0, 0.30)


def test_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        CFG.rtt_weight = 10  # type: ignore[misc]


# --- invalid configurations name the field ---------------------------------------------------

WEIGHTS = "heartbeat_weight+rtt_weight+loss_weight"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        # Weights must sum to 100.
        ({"heartbeat_weight": 60}, WEIGHTS),
        ({"rtt_weight": 0}, WEIGHTS),
        ({"heartbeat_weight": 0, "rtt_weight": 0, "loss_weight": 0}, WEIGHTS),
        # Nothing negative.
        ({"heartbeat_weight": -10, "rtt_weight": 90}, "heartbeat_weight"),
        ({"rtt_weight": -1}, "rtt_weight"),
        ({"loss_weight": -1}, "loss_weight"),
        ({"heartbeat_good_s": -1}, "heartbeat_good_s"),
        ({"heartbeat_bad_s": -1}, "heartbeat_bad_s"),
        ({"rtt_good_ms": -1}, "rtt_good_ms"),
        ({"rtt_bad_ms": -1}, "rtt_bad_ms"),
        ({"loss_good": -0.1}, "loss_good"),
        ({"loss_bad": -0.1}, "loss_bad"),
        # Loss bounds are fractions.
        ({"loss_bad": 1.5}, "loss_bad"),
        ({"loss_good": 1.2, "loss_bad": 1.5}, "loss_good"),
        ({"loss_bad": 30}, "loss_bad"),  # percent given instead of a fraction
        # good < bad, strictly.
        ({"heartbeat_good_s": 30}, "heartbeat_good_s"),
        ({"heartbeat_good_s": 40}, "heartbeat_good_s"),
        ({"rtt_good_ms": 500}, "rtt_good_ms"),
        ({"rtt_good_ms": 20, "rtt_bad_ms": 10}, "rtt_good_ms"),
        ({"loss_good": 0.30}, "loss_good"),
        ({"loss_good": 0.5, "loss_bad": 0.4}, "loss_good"),
        # Not a finite number.
        ({"rtt_bad_ms": math.inf}, "rtt_bad_ms"),
        ({"heartbeat_bad_s": math.nan}, "heartbeat_bad_s"),
        ({"rtt_weight": "30"}, "rtt_weight"),
        ({"loss_weight": True}, "loss_weight"),
    ],
)
def test_invalid_config_names_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(ScoreConfigError) as info:
        ScoreConfig(**overrides)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}:")
    assert isinstance(info.value, ValueError)


def test_replace_revalidates() -> None:
    with pytest.raises(ScoreConfigError, match="rtt_good_ms"):
        replace(CFG, rtt_good_ms=600)


# --- probe samples ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"ok": True, "rtt_ms": None, "at": 0.0}, "rtt_ms"),  # success without an RTT
        ({"ok": True, "rtt_ms": -1.0, "at": 0.0}, "rtt_ms"),
        ({"ok": True, "rtt_ms": math.nan, "at": 0.0}, "rtt_ms"),
        ({"ok": True, "rtt_ms": "12", "at": 0.0}, "rtt_ms"),
        ({"ok": 1, "rtt_ms": 12.0, "at": 0.0}, "ok"),
        ({"ok": False, "rtt_ms": None, "at": None}, "at"),
        ({"ok": False, "rtt_ms": None, "at": math.inf}, "at"),
    ],
)
def test_invalid_probe_sample(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}:"):
        ProbeSample(**kwargs)


# --- probe window ----------------------------------------------------------------------------


def test_empty_window() -> None:
    w = ProbeWindow()
    assert w.size == DEFAULT_WINDOW_SIZE == 10
    assert w.samples == ()
    assert w.loss_rate == 0.0
    assert w.smoothed_rtt_ms is None
    assert w.consecutive_failures == 0
    assert w.to_list() == []


def test_push_returns_new_window() -> None:
    empty = ProbeWindow()
    one = empty.push(ok(10))
    assert empty.samples == ()
    assert one.samples == (ok(10),)
    assert one is not empty


@pytest.mark.parametrize(
    ("size", "pushed", "kept_ats"),
    [
        (10, 9, list(range(9))),
        (10, 10, list(range(10))),
        (10, 11, list(range(1, 11))),  # the oldest is evicted
        (10, 25, list(range(15, 25))),
        (3, 5, [2, 3, 4]),
        (1, 4, [3]),
    ],
)
def test_window_eviction(size: int, pushed: int, kept_ats: list[int]) -> None:
    w = window(*(ok(10, at=i) for i in range(pushed)), size=size)
    assert len(w.samples) == min(pushed, size)
    assert [s.at for s in w.samples] == kept_ats


@pytest.mark.parametrize(
    ("samples", "loss_rate"),
    [
        ([ok(10)], 0.0),
        ([fail()], 1.0),
        ([ok(10), fail()], 0.5),
        ([ok(10), fail(), ok(10), ok(10)], 0.25),
        ([fail(), fail(), fail(), ok(10), ok(10), ok(10), ok(10), ok(10), ok(10), ok(10)], 0.3),
        # Eleven pushes into ten slots: the leading failure is evicted.
        ([fail()] + [ok(10)] * 10, 0.0),
        ([ok(10)] + [fail()] * 10, 1.0),
    ],
)
def test_loss_rate(samples: list[ProbeSample], loss_rate: float) -> None:
    assert window(*samples).loss_rate == pytest.approx(loss_rate)


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([], 0),
        ([ok(10)], 0),
        ([fail()], 1),
        ([fail(), fail(), fail()], 3),
        ([fail(), fail(), ok(10)], 0),  # a success resets the count
        ([fail(), fail(), ok(10), fail()], 1),
        ([ok(10), fail(), ok(10), fail(), fail()], 2),
        ([fail()] * 12, 10),  # bounded by the window
    ],
)
def test_consecutive_failures(samples: list[ProbeSample], expected: int) -> None:
    assert window(*samples).consecutive_failures == expected


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([], None),
        ([fail(), fail()], None),
        ([ok(40)], 40.0),
        ([ok(10), ok(30)], 20.0),
        ([ok(10), ok(30), ok(1000)], 30.0),
        # A failed probe's elapsed time is never read as an RTT.
        ([ok(10), ProbeSample(ok=False, rtt_ms=5000.0, at=0.0), ok(30)], 20.0),
        # One spike among ten probes: the median ignores it (a mean would say 218 ms).
        ([ok(20)] * 9 + [ok(2000)], 20.0),
        # A lasting slowdown shows once it covers half of the successful probes.
        ([ok(20)] * 5 + [ok(300)] * 5, 160.0),
        ([ok(20)] * 4 + [ok(300)] * 6, 300.0),
    ],
)
def test_smoothed_rtt(samples: list[ProbeSample], expected: float | None) -> None:
    assert window(*samples).smoothed_rtt_ms == expected


def test_one_spike_does_not_move_the_score() -> None:
    steady = window(*[ok(20)] * 10)
    spiked = steady.push(ok(2000))
    before = reach_score(5, steady.smoothed_rtt_ms, steady.loss_rate)
    after = reach_score(5, spiked.smoothed_rtt_ms, spiked.loss_rate)
    assert before == after == 100.0


@pytest.mark.parametrize(
    "samples",
    [
        [],
        [ok(12.5, at=1_700_000_000.25)],
        [ok(10, at=1), fail(at=2), ProbeSample(ok=False, rtt_ms=3000.0, at=3), ok(7, at=4)],
        [ok(float(i), at=float(i)) for i in range(10)],
    ],
)
def test_list_round_trip(samples: list[ProbeSample]) -> None:
    w = window(*samples)
    data = w.to_list()
    assert ProbeWindow.from_list(json.loads(json.dumps(data))) == w
    assert ProbeWindow.from_list(data).to_list() == data


def test_to_list_shape() -> None:
    assert window(ok(12.5, at=100.0), fail(at=105.0)).to_list() == [
        {"ok": True, "rtt_ms": 12.5, "at": 100.0},
        {"ok": False, "rtt_ms": None, "at": 105.0},
    ]


def test_from_list_keeps_newest_when_size_shrinks() -> None:
    data = window(*(ok(10, at=i) for i in range(10))).to_list()
    w = ProbeWindow.from_list(data, size=3)
    assert w.size == 3
    assert [s.at for s in w.samples] == [7, 8, 9]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([{"ok": True, "at": 0.0}], r"items\[0\]: missing field 'rtt_ms'"),
        ([[True, 1.0, 0.0]], r"items\[0\]: must be an object"),
        ([{"ok": True, "rtt_ms": 1.0, "at": 0.0}, {"rtt_ms": None, "at": 0.0}], r"items\[1\]"),
        ([{"ok": "yes", "rtt_ms": 1.0, "at": 0.0}], r"items\[0\]\.ok:"),
        ([{"ok": True, "rtt_ms": None, "at": 0.0}], r"items\[0\]\.rtt_ms:"),
        ([{"ok": False, "rtt_ms": None, "at": "now"}], r"items\[0\]\.at:"),
    ],
)
def test_from_list_rejects_malformed(items: list[Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProbeWindow.from_list(items)


@pytest.mark.parametrize("size", [0, -1, True, 2.5])
def test_invalid_window_size(size: Any) -> None:
    with pytest.raises(ValueError, match=r"^size:"):
        ProbeWindow(size=size)
    with pytest.raises(ValueError, match=r"^size:"):
        ProbeWindow.from_list([], size=size)


def test_window_rejects_too_many_samples() -> None:
    with pytest.raises(ValueError, match=r"^samples:"):
        ProbeWindow(samples=(ok(1), ok(2), ok(3)), size=2)
