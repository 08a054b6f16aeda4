"""A sweep tick that cannot reach the database is skipped with one log line, not raised."""

from __future__ import annotations

import logging

import pytest

from reach.errors import HubUnavailable, UnknownTask
from reach.worker.sweeps import skip_when_unavailable


@skip_when_unavailable
def down() -> int:
    raise HubUnavailable("the hub's database is unavailable: connection refused")


@skip_when_unavailable
def up(n: int) -> int:
    return n + 1


@skip_when_unavailable
def broken() -> int:
    raise UnknownTask("t-1")


def test_an_outage_skips_the_tick_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "reach.worker.sweeps"):
        assert down() is None
    assert [r.getMessage() for r in caplog.records] == [
        "down skipped this tick: the hub's database is unavailable: connection refused"
    ]
    assert not any(r.exc_info for r in caplog.records)  # one line, no traceback


def test_other_outcomes_pass_through() -> None:
    assert up(1) == 2
    with pytest.raises(UnknownTask):  # only an outage is a skipped tick; bugs still raise
        broken()
