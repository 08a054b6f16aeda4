"""Dependency loops: the pure decisions behind refusing A -> B -> A and spotting A <-> B.

Two mechanisms, both decided here without I/O (``reach.hub.flow.loops`` feeds them):

* **The loop check** at submit. A reach's trace path lists the agents that handled its
  chain so far, oldest first (the caller's own agent last). A target that already
  appears on that path closes a cycle; a reach deeper than ``max_hops`` is taken for a
  loop that rotates through enough agents to escape the path check. Either is refused
  with `LoopDetected`, naming the cycle (``["A", "B", "A"]``) so the operator sees it.
  A route by tags or capability is refused only when *every* eligible agent is on the
  path; otherwise it goes on to the agents off it (delivery skips those on it).
* **The dependency-entropy alert.** Chains that never repeat within one root (each reach
  a fresh root: a retry loop, two agents polling each other) escape the check; what
  shows them is busy traffic both ways between two agents. `judge_link` decides, from
  the windowed counts of A -> B and B -> A, whether that link becomes suspected, stays
  so, or calms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from reach.errors import LoopDetected

__all__ = ["LinkVerdict", "check", "child_trace", "cycle_of", "edge_trace", "judge_link"]


def edge_trace(task_id: str) -> dict[str, Any]:
    """The trace of a reach that starts a chain (no parent): its own root, no hops."""
    return {"root_id": task_id, "parent_task_id": None, "hops": 0, "path": []}


def child_trace(
    parent_task_id: str, parent_trace: dict[str, Any] | None, parent_agent: str | None
) -> dict[str, Any]:
    """The trace of a reach sent while handling ``parent_task_id`` (stored with
    ``parent_trace``, delivered to ``parent_agent``; None while not yet routed): one hop
    further on the same root, the parent's agent appended to the path."""
    base = parent_trace or {}
    path = [str(a) for a in base.get("path") or []]
    if parent_agent:
        path.append(parent_agent)
    return {
        "root_id": str(base.get("root_id") or parent_task_id),
        "parent_task_id": parent_task_id,
        "hops": int(base.get("hops") or 0) + 1,
        "path": path,
    }


def cycle_of(path: Sequence[str], target: str) -> list[str] | None:
    """The cycle a reach to ``target`` closes on ``path`` (from the target's latest
    appearance, back to it), or None when the target is not on the path."""
    for i in range(len(path) - 1, -1, -1):
        if path[i] == target:
            return [*path[i:], target]
    return None


def check(path: Sequence[str], hops: int, targets: Sequence[str], max_hops: int) -> list[str]:
    """The ``targets`` (eligible agents of one reach) that are off ``path``; raises
    `LoopDetected` when none is (naming the shortest cycle) or when ``hops`` exceeds
    ``max_hops``. An empty ``targets`` passes through (the caller refuses it otherwise)."""
    if not targets:
        return []
    off = [t for t in targets if t not in path]
    if not off:
        cycles = [c for c in (cycle_of(path, t) for t in targets) if c is not None]
        cycle = min(cycles, key=len)
        raise LoopDetected(
            f"dependency loop: {' -> '.join(cycle)} (agent {cycle[0]!r} is already on "
            "this reach's path)",
            cycle=cycle,
            path=list(path),
            hops=hops,
        )
    if hops > max_hops:
        chain = [*path, off[0]] if len(off) == 1 else [*path]
        raise LoopDetected(
            f"dependency chain too deep: {hops} hops exceed router.max_hops ({max_hops}): "
            f"{' -> '.join(chain)}",
            cycle=chain,
            path=list(path),
            hops=hops,
            max_hops=max_hops,
        )
    return off


class LinkVerdict(StrEnum):
    """What one reach over an agent link does to that link's state."""

    QUIET = "quiet"  # not suspected, and no reason to be
    SUSPECTED = "suspected"  # both ways busy: raise the alert, demote the link
    HOT = "hot"  # already suspected and still busy: keep the demotion going
    CALMED = "calmed"  # suspected, and the traffic fell below the threshold: lift it


@dataclass(frozen=True, slots=True)
class LinkCounts:
    """Reaches each way between two agents within the alert window."""

    forward: int  # caller agent -> target agent (this reach included)
    backward: int  # target agent -> caller agent


def judge_link(counts: LinkCounts, threshold: int, suspected: bool) -> LinkVerdict:
    """Both directions above ``threshold``: suspected, or still hot when the link already
    is (``suspected``: alerted and not calmed since, its demotion lapsed or not); a
    suspected link whose counts fell back calms; anything else is quiet."""
    busy = counts.forward > threshold and counts.backward > threshold
    if busy:
        return LinkVerdict.HOT if suspected else LinkVerdict.SUSPECTED
    return LinkVerdict.CALMED if suspected else LinkVerdict.QUIET
