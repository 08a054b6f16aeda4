"""Whose report a task takes: only its current attempt's, from the instance it went to."""

from __future__ import annotations

import pytest

from reach.core.ledger.reports import AWAITING_REPORT, Verdict, judge_report
from reach.core.ledger.statuses import LIVE, TERMINAL, TaskStatus

S, V = TaskStatus, Verdict


@pytest.mark.parametrize(
    ("status", "current", "instance", "claimed", "by", "verdict"),
    [
        (S.EXECUTING, 2, "i-1", 2, "i-1", V.APPLY),  # after its 202
        (S.DISPATCHING, 2, "i-1", 2, "i-1", V.APPLY),  # reported before the 202 was seen
        (S.EXECUTING, 2, "i-1", 1, "i-1", V.STALE),  # an older attempt: a retry moved on
        (S.EXECUTING, 2, "i-1", 3, "i-1", V.STALE),  # an attempt that does not exist yet
        (S.EXECUTING, 2, "i-1", 2, "i-2", V.STALE),  # a stranger
        (S.DISPATCHING, 2, "i-2", 2, "i-1", V.STALE),  # redelivered elsewhere (lease lapsed)
        (S.PENDING, 2, "i-1", 2, "i-1", V.STALE),  # attempt 2 queued, not dispatched yet
        (S.PENDING, 2, None, 2, "i-1", V.STALE),
        (S.AWAITING_APPROVAL, 1, None, 1, "i-1", V.STALE),
        (S.SUCCESS, 2, "i-1", 2, "i-1", V.LATE),  # first result wins
        (S.SUCCESS, 2, "i-1", 1, "i-9", V.LATE),  # late is late, whoever sends it
        (S.FAILED, 1, "i-1", 1, "i-1", V.LATE),
        (S.DEAD, 1, "i-1", 1, "i-1", V.LATE),
        (S.CANCELLED, 1, None, 1, "i-1", V.LATE),
    ],
)
def test_judge_report(
    status: TaskStatus, current: int, instance: str | None, claimed: int, by: str, verdict: Verdict
) -> None:
    assert judge_report(status, current, instance, claimed, by) is verdict


def test_every_status_has_a_verdict_and_only_live_ones_can_apply() -> None:
    applies = {s for s in TaskStatus if judge_report(s, 1, "i", 1, "i") is V.APPLY}
    assert applies == AWAITING_REPORT
    assert AWAITING_REPORT <= LIVE
    assert {s for s in TaskStatus if judge_report(s, 1, "i", 1, "i") is V.LATE} == TERMINAL
