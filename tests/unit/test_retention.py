"""The retention cut-offs: pure arithmetic on the hub's clock and the policy."""

from __future__ import annotations

import pytest

from reach.core.ops.retention import Cutoffs, RetentionPolicy, cutoffs

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (
            RetentionPolicy(),
            Cutoffs(NOW - 30 * 86_400, NOW - 24 * 3_600, NOW - 14 * 86_400, NOW - 90 * 86_400),
        ),
        (
            RetentionPolicy(days=1, offline_instance_hours=1, dead_letter_days=2, audit_days=3),
            Cutoffs(NOW - 86_400, NOW - 3_600, NOW - 2 * 86_400, NOW - 3 * 86_400),
        ),
        # seconds, for tests: REACH_RETENTION__DAYS=0.0001 is 8.64 s
        (
            RetentionPolicy(
                days=0.0001, offline_instance_hours=0.001, dead_letter_days=0.0001, audit_days=1
            ),
            Cutoffs(NOW - 8.64, NOW - 3.6, NOW - 8.64, NOW - 86_400),
        ),
    ],
    ids=["defaults", "one-day-one-hour", "fractions"],
)
def test_cutoffs(policy: RetentionPolicy, expected: Cutoffs) -> None:
    got = cutoffs(NOW, policy)
    assert got.records == pytest.approx(expected.records)
    assert got.offline == pytest.approx(expected.offline)
    assert got.dead_letters == pytest.approx(expected.dead_letters)
    assert got.audit == pytest.approx(expected.audit)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"days": 0},
        {"days": -1},
        {"offline_instance_hours": 0},
        {"dead_letter_days": 0},
        {"audit_days": -1},
        {"batch_size": 0},
        {"batches": 0},
    ],
)
def test_policy_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetentionPolicy(**kwargs)  # type: ignore[arg-type]


def test_settings_carry_the_documented_defaults_and_env_floats() -> None:
    from reach.hub.settings import load_settings

    r = load_settings(environ={}).retention
    assert (r.days, r.sweep_interval_s, r.offline_instance_hours) == (30.0, 300.0, 24.0)
    r = load_settings(environ={"REACH_RETENTION__DAYS": "0.0001"}).retention
    assert r.days == 0.0001
