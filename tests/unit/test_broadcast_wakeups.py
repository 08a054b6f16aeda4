"""How many more answers a waiting broadcast needs before re-reading can complete it.
Too high and a waiter sleeps past its answer; too low only costs a read."""

from __future__ import annotations

from typing import Any

import pytest

from reach.hub.api.routes.broadcasts import _answers_missing


def _view(statuses: list[str], min_results: int) -> dict[str, Any]:
    return {
        "results": [{"status": s} for s in statuses],
        "min_results": min_results,
        "succeeded": statuses.count("success"),
    }


@pytest.mark.parametrize(
    ("statuses", "min_results", "missing"),
    [
        (["pending"] * 5, 5, 5),  # all five must answer
        (["pending"] * 5, 3, 3),  # three successes complete it
        (["success", "success", "pending", "pending", "pending"], 3, 1),
        (["dead", "dead", "pending", "pending", "pending"], 5, 3),  # failures still end it
        (["success", "dead", "dead", "dead", "pending"], 3, 1),  # the last one ends it anyway
        (["success", "success", "success", "pending", "pending"], 3, 0),  # complete already
        (["dispatching", "executing", "success"], 2, 1),
    ],
)
def test_answers_missing(statuses: list[str], min_results: int, missing: int) -> None:
    assert _answers_missing(_view(statuses, min_results)) == missing
