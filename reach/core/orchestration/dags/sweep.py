"""What the beat sweep does with a DAG run still ``running``: the decision, without I/O.

A run advances only while its chord does. A worker SIGKILLed with node messages reserved,
or a broker restart that loses the queues and the chord counter, leaves a run no task will
ever touch again. The sweep tells such a run apart from a slow healthy one by two bounds:
silence longer than any node may take (then its remaining levels are published again;
node steps are idempotent, so a duplicate canvas is harmless), and age beyond the longest
the whole run could take (then it is failed, naming the nodes that never finished).

Time spent waiting for a human (a node's task parked for approval) is neither: a run with
a parked task is left alone (the approval expires on its own), and the time its tasks
waited is left out of its age.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SweepAction(StrEnum):
    LEAVE = "leave"  # within what its nodes may take: nothing to do
    FINISH = "finish"  # every node has its result; only the closing task went missing
    RESUME = "resume"  # silent longer than any node may take: publish its levels again
    ABANDON = "abandon"  # older than it could possibly run: fail it, naming stuck nodes


@dataclass(frozen=True, slots=True)
class RunClock:
    """The times of one run that the decision needs (seconds, the hub's clock)."""

    created_at: float
    last_progress: float  # the latest submit, finish or resume of any of its nodes
    worst_case_s: float  # the longest a healthy run may take (levels, retry budget)
    longest_node_s: float  # the longest a node may stay silent (its timeout)
    waited_s: float = 0.0  # spent with a task parked for a human decision (not its age)
    parked: bool = False  # a task of the run waits for a human decision right now


def sweep_action(run: RunClock, all_finished: bool, now: float, margin_s: float) -> SweepAction:
    """``margin_s`` absorbs queueing and poll intervals, so a healthy run is never touched."""
    silent = now - run.last_progress
    if all_finished:
        return SweepAction.FINISH if silent > margin_s else SweepAction.LEAVE
    if run.parked:
        return SweepAction.LEAVE
    if now - run.created_at - run.waited_s > run.worst_case_s + margin_s:
        return SweepAction.ABANDON
    if silent > run.longest_node_s + margin_s:
        return SweepAction.RESUME
    return SweepAction.LEAVE
