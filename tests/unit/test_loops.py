"""The loop check and the dependency-entropy decision (`reach.core.flow.loops`), as tables."""

from __future__ import annotations

from typing import Any

import pytest

from reach.core.flow.loops import LinkCounts, LinkVerdict, check, child_trace, cycle_of, judge_link
from reach.errors import LoopDetected


@pytest.mark.parametrize(
    ("path", "target", "cycle"),
    [
        ([], "A", None),
        (["A"], "A", ["A", "A"]),  # self-reach A -> A
        (["A", "B"], "A", ["A", "B", "A"]),
        (["A", "B"], "B", ["B", "B"]),
        (["A", "B", "C"], "D", None),
        (["A", "B", "A", "C"], "A", ["A", "C", "A"]),  # from its latest appearance
        (["X", "A", "B", "C", "D"], "B", ["B", "C", "D", "B"]),
    ],
)
def test_cycle_of(path: list[str], target: str, cycle: list[str] | None) -> None:
    assert cycle_of(path, target) == cycle


@pytest.mark.parametrize(
    ("path", "hops", "targets", "max_hops", "off", "cycle"),
    [
        ([], 0, ["A"], 8, ["A"], None),  # an edge reach
        ([], 0, [], 8, [], None),  # nothing eligible: not this check's refusal
        (["A"], 1, ["A"], 8, None, ["A", "A"]),  # self-reach
        (["A"], 1, ["B"], 8, ["B"], None),
        (["A", "B"], 2, ["A"], 8, None, ["A", "B", "A"]),
        (["A", "B"], 2, ["C"], 8, ["C"], None),
        # a route: only the agents off the path go on
        (["A", "B"], 2, ["A", "C"], 8, ["C"], None),
        # every eligible agent on the path: the shortest cycle is named
        (["A", "B", "C"], 3, ["A", "B"], 8, None, ["B", "C", "B"]),
        # the hops limit: equal passes, one more is refused (the chain is named)
        ([f"a{i}" for i in range(8)], 8, ["z"], 8, ["z"], None),
        ([f"a{i}" for i in range(9)], 9, ["z"], 8, None, [*[f"a{i}" for i in range(9)], "z"]),
        # a long chain of distinct agents within a generous limit
        ([f"a{i}" for i in range(40)], 40, ["z"], 64, ["z"], None),
        # a long chain back to its start
        ([f"a{i}" for i in range(40)], 40, ["a0"], 64, None, [*[f"a{i}" for i in range(40)], "a0"]),
        # a cycle is named as such even past the hops limit
        (["A", "B"], 20, ["A"], 8, None, ["A", "B", "A"]),
    ],
)
def test_check(
    path: list[str],
    hops: int,
    targets: list[str],
    max_hops: int,
    off: list[str] | None,
    cycle: list[str] | None,
) -> None:
    if off is not None:
        assert check(path, hops, targets, max_hops) == off
        return
    with pytest.raises(LoopDetected) as caught:
        check(path, hops, targets, max_hops)
    assert caught.value.extra["cycle"] == cycle
    assert " -> ".join(cycle or []) in caught.value.detail
    problem = caught.value.to_problem()
    assert problem["status"] == 508
    assert problem["type"] == "urn:agent-reach:problem:loop-detected"


def test_hops_refusal_says_so() -> None:
    with pytest.raises(LoopDetected) as caught:
        check(["A", "B", "C"], 4, ["D"], 3)
    assert "max_hops" in caught.value.detail
    assert caught.value.extra["max_hops"] == 3


@pytest.mark.parametrize(
    ("parent_trace", "parent_agent", "expected"),
    [
        (
            {"root_id": "r", "parent_task_id": None, "hops": 0, "path": []},
            "A",
            {"root_id": "r", "parent_task_id": "p", "hops": 1, "path": ["A"]},
        ),
        (
            {"root_id": "r", "parent_task_id": "q", "hops": 3, "path": ["X", "Y", "Z"]},
            "A",
            {"root_id": "r", "parent_task_id": "p", "hops": 4, "path": ["X", "Y", "Z", "A"]},
        ),
        # a parent stored without a trace (or an empty one) is its own root
        (None, "A", {"root_id": "p", "parent_task_id": "p", "hops": 1, "path": ["A"]}),
        ({}, None, {"root_id": "p", "parent_task_id": "p", "hops": 1, "path": []}),
    ],
)
def test_child_trace(
    parent_trace: dict[str, Any] | None, parent_agent: str | None, expected: dict[str, Any]
) -> None:
    assert child_trace("p", parent_trace, parent_agent) == expected


@pytest.mark.parametrize(
    ("forward", "backward", "suspected", "verdict"),
    [
        (0, 0, False, LinkVerdict.QUIET),
        (50, 0, False, LinkVerdict.QUIET),  # one-way traffic is a dependency, not a loop
        (0, 50, False, LinkVerdict.QUIET),
        (20, 50, False, LinkVerdict.QUIET),  # at the threshold is not above it
        (21, 21, False, LinkVerdict.SUSPECTED),
        (21, 21, True, LinkVerdict.HOT),  # already alerted: no second alert
        (5, 50, True, LinkVerdict.CALMED),
        (50, 20, True, LinkVerdict.CALMED),
        (0, 0, True, LinkVerdict.CALMED),
    ],
)
def test_judge_link(forward: int, backward: int, suspected: bool, verdict: LinkVerdict) -> None:
    assert judge_link(LinkCounts(forward, backward), 20, suspected) is verdict
