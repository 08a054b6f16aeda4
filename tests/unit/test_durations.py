"""Tables for ``reach.core.ops.durations``: the human durations settings take."""

from __future__ import annotations

import pytest

from reach.core.ops.durations import DurationError, in_unit, seconds_of


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("5s", 5.0),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1m30s", 90.0),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("0s", 0.0),
        (" 30s ", 30.0),
        ("1s500ms", 1.5),
    ],
)
def test_seconds_of(text: str, seconds: float) -> None:
    assert seconds_of(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", " ", "5", "5 s", "s", "-5s", "+5s", "5x", "5sec", "5S", "1h 30m", "5s!", "ms", "1e3s"],
)
def test_what_is_no_duration(text: str) -> None:
    with pytest.raises(DurationError, match="duration"):
        seconds_of(text)


@pytest.mark.parametrize(
    ("value", "unit_s", "expected"),
    [
        ("2m", 1.0, 120.0),  # a seconds setting
        ("2m", 0.001, 120_000.0),  # a milliseconds setting (score.rtt_bad_ms)
        ("12h", 86400.0, 0.5),  # a days setting (retention.days)
        ("30m", 3600.0, 0.5),  # an hours setting
        ("5", 1.0, "5"),  # a bare number stays the field's to validate, in its unit
        ("2.5", 1.0, "2.5"),
        (7, 1.0, 7),
        (None, 1.0, None),
        (True, 1.0, True),  # not ours to judge: the field refuses it
    ],
)
def test_in_unit(value: object, unit_s: float, expected: object) -> None:
    assert in_unit(value, unit_s) == expected
