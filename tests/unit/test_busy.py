"""`reach.core.delivery.busy`: when an exchange refused as busy (429) is sent again."""

from __future__ import annotations

import random

import pytest

from reach.core.delivery.busy import CAP_S, FIRST_S, MAX_RESENDS, SEND_MIN_S, resend_after


@pytest.mark.parametrize(
    ("status", "resends", "left", "why"),
    [
        (200, 0, 60.0, "an answer"),
        (503, 0, 60.0, "a failure: the retry policy's"),
        (None, 0, 60.0, "no answer at all"),
        (429, MAX_RESENDS, 60.0, "resent as often as it may be"),
        (429, 0, FIRST_S * 0.5 + SEND_MIN_S - 0.001, "no budget left after even the shortest wait"),
        (429, 0, 0.0, "no budget at all"),
    ],
)
def test_kept_as_answered(status: int | None, resends: int, left: float, why: str) -> None:
    assert resend_after(status, resends, left, random.Random(1)) is None, why


def test_a_busy_answer_is_sent_again_after_a_growing_jittered_wait() -> None:
    rng = random.Random(7)
    for resends in range(MAX_RESENDS):
        nominal = min(CAP_S, FIRST_S * 2**resends)
        waits = [resend_after(429, resends, 600.0, rng) for _ in range(50)]
        assert all(w is not None and 0.5 * nominal <= w <= 1.5 * nominal for w in waits)
        assert len(set(waits)) > 1  # jittered: processes waiting on one agent spread out


def test_the_wait_never_outlasts_the_budget() -> None:
    rng = random.Random(3)
    for left in (0.6, 1.0, 1.5, 2.0):
        for resends in range(8):
            wait = resend_after(429, resends, left, rng)
            assert wait is None or wait + SEND_MIN_S <= left
